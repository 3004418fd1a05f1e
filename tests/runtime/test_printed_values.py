"""Every kind of value a script can print reads as Aner, never as a Python repr (`name='x'`,
`field=value`); the memory report prints as a table of its categories in binary units whose
figures are the report's own fields."""

from __future__ import annotations

import io
import json
import re
from pathlib import Path

import pytest

from aner_lang.builtins import registry
from aner_lang.check import analyze
from aner_lang.interp import ExecContext, run

# One value of every builtin type a script can make on a CPU without a job or a service, printed
# as `TYPE: value`.
SCRIPT = """
let m = load_model("{model}", storage: nf4_double_quant, device: cpu)
print("Model: ${{m}}")
print("ModelInfo: ${{model_info(m)}}")
let d = texts(["one two three", "four five six", "seven eight"], context: 16)
print("Dataset: ${{d}}")
print("Split: ${{split(d, fraction: 0.34)}}")
let a = lora(m, rank: 2)
print("Adapter: ${{a}}")
print("Profile: ${{profile()}}")
print("LossScale: ${{fixed(1024.0)}} ${{dynamic(initial: 128.0)}}")
let r = train(a, d, steps: 1, checkpoints: "ck")
print("Run: ${{r}}")
print("Evaluation: ${{evaluate(m, d)}}")
print("Checkpoint: ${{latest_checkpoint("ck")}}")
let pairs = load_pairs("prefs.jsonl", context: 64)
print("Pairs: ${{pairs}}")
print("PairsSplit: ${{split(pairs, fraction: 0.5)}}")
let rated = load_feedback("rated.jsonl", context: 64)
print("Feedback: ${{rated}}")
print("FeedbackSplit: ${{split(rated, fraction: 0.5)}}")
print("PairObjective: ${{dpo(beta: 0.1)}} ${{orpo(lambda: 0.1)}}")
print("FeedbackObjective: ${{kto(beta: 0.1)}}")
print("MemoryReport: ${{memory(a)}}")
let report = memory(a)
for field in [report.weights, report.floating_base, report.packed_base,
    report.gpu_packed_base, report.adapters, report.frozen_adapter, report.trainable,
    report.optimizer, report.managed_optimizer, report.prefetch_window, report.dequant_tile] {{
  print("field ${{field}}")
}}
"""
NEEDS_A_SERVICE_OR_JOB = {"Job", "Service"}
UNITS = {"B": 1, "KiB": 1 << 10, "MiB": 1 << 20, "GiB": 1 << 30}


def _data(tmp_path: Path) -> None:
    turn = [{"role": "user", "content": "Say yes."}]
    pair = {
        "prompt": turn,
        "chosen": [{"role": "assistant", "content": "yes"}],
        "rejected": [{"role": "assistant", "content": "no"}],
    }
    (tmp_path / "prefs.jsonl").write_text(json.dumps(pair) + "\n" + json.dumps(pair) + "\n")
    rated = [
        {"prompt": turn, "completion": [{"role": "assistant", "content": c}], "label": ok}
        for c, ok in (("yes", True), ("no", False))
    ]
    (tmp_path / "rated.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rated))


@pytest.fixture(scope="module")
def printed(tiny_gguf: Path, tmp_path_factory: pytest.TempPathFactory) -> str:
    folder = tmp_path_factory.mktemp("printed")
    _data(folder)
    analysis = analyze(SCRIPT.format(model=tiny_gguf), str(folder / "s.aner"))
    assert not analysis.errors, analysis.errors
    out = io.StringIO()
    run(analysis, ExecContext(script_dir=folder, stdout=out))
    return out.getvalue()


def test_every_type_is_printed_and_none_as_a_python_repr(printed: str) -> None:
    shown = {line.split(":", 1)[0]: line for line in printed.splitlines() if ": " in line}
    assert set(registry().types) - NEEDS_A_SERVICE_OR_JOB <= set(shown)
    for name, line in shown.items():
        if name in registry().types:
            assert not re.search(r"\b\w+=|'", line), line


def test_the_memory_report_is_a_table_of_the_report_s_own_figures(printed: str) -> None:
    lines = printed.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("MemoryReport: "))
    table = lines[start + 1 : start + 16]
    sections = [
        line.strip()
        for line in table
        if line.startswith("  ") and len(line) - len(line.lstrip()) == 2
    ]
    assert sections == ["base model", "adapter", "optimizer", "kernel buffers"]
    rows = [line.split() for line in table if line.startswith("    ")]
    values = [int(line.split()[1]) for line in lines if line.startswith("field ")]
    assert [name for name, _, _ in rows] == [
        "weights",
        "floating_base",
        "packed_base",
        "gpu_packed_base",
        "adapters",
        "frozen_adapter",
        "trainable",
        "optimizer",
        "managed_optimizer",
        "prefetch_window",
        "dequant_tile",
    ]
    assert len(values) == len(rows) and any(values)
    for (name, amount, unit), value in zip(rows, values, strict=True):
        scale = UNITS[unit]
        assert value < 1 << 10 if unit == "B" else value >= scale, (name, value, unit)
        assert abs(float(amount) * scale - value) <= 0.05 * scale + 0.005 * value, (name, value)
