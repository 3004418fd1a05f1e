"""`aner plan`: the predicted peak of a train() call from a model's config (no weights), checked
against the peaks measured on an H200 (benchmarks/results/h200_train_scale.json), and the report
of a tiny script on the CPU."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from aner_lang.check import analyze
from aner_lang.runtime.nf4.quant import quantize_nf4
from aner_lang.runtime.train import footprint
from aner_lang.runtime.train.plan import main, parse_bytes, plan_call

ROOT = Path(__file__).resolve().parents[3]
CATEGORIES = (
    "base weights",
    "adapter tensors",
    "optimizer state",
    "gradients",
    "activations",
    "layer backward",
    "loss workspace",
    "nf4 dequant buffer",
)
TINY = {
    "model_type": "llama",
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "vocab_size": 512,
    "tie_word_embeddings": True,
    "max_position_embeddings": 256,
}


def _train_scale():  # type: ignore[no-untyped-def]
    spec = importlib.util.spec_from_file_location("train_scale", ROOT / "benchmarks/train_scale.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _script(tmp_path: Path, config: dict[str, object], text: str) -> Path:
    (tmp_path / "model").mkdir()
    (tmp_path / "model" / "config.json").write_text(json.dumps(config))
    script = tmp_path / "s.aner"
    script.write_text(text)
    return script


MEASURED = (
    "h200_train_scale.json",
    "h200_train_scale_checkpoint.json",
    "h200_train_scale_fp16.json",
    "h200_train_scale_fused.json",
)
"""benchmarks/results files whose Aner rows the plan is checked against."""


def _measured() -> list[tuple[str, str, str, int, int]]:
    """(shape, precision, activations, context, peak CUDA bytes) of every Aner row measured on
    the H200."""
    runs = []
    for name in MEASURED:
        for shape in json.loads((ROOT / "benchmarks/results" / name).read_text()):
            context = shape["job"]["context"]
            for row in shape["rows"]:
                if row["side"].startswith("aner") and "peak_cuda_bytes" in row:
                    runs.append(
                        (
                            shape["shape"],
                            row["precision"],
                            row["activations"],
                            context,
                            row["peak_cuda_bytes"],
                        )
                    )
    return runs


@pytest.mark.parametrize("shape,precision,activations,context,measured", _measured())
def test_plan_within_ten_percent_of_the_measured_h200_peak(
    tmp_path: Path, shape: str, precision: str, activations: str, context: int, measured: int
) -> None:
    bench = _train_scale()
    sizes = dict(bench.SHAPES[shape])
    sizes.pop("context")
    targets = ", ".join(bench.TARGETS)
    script = _script(
        tmp_path,
        {**sizes, "model_type": "llama", "max_position_embeddings": 8192},
        f"""let base = load_model("model", storage: nf4_double_quant, device: cuda)
let data = texts(["a"], context: {context})
let a = lora(base, rank: {bench.RANK}, alpha: {bench.ALPHA}, targets: [{targets}])
let p = profile(precision: {precision}, activations: {activations})
let _run = train(a, data, p, steps: 10, micro_batch: 1)
""",
    )
    analysis = analyze(script.read_text(), str(script))
    assert not analysis.errors
    (info,) = [i for i in analysis.calls.values() if i.name == "train"]
    lines, peak = plan_call(analysis, info, tmp_path)
    assert peak is not None, lines
    assert abs(peak - measured) <= 0.10 * measured, (peak, measured)


def test_plan_prints_every_category_and_the_update_count(tmp_path: Path, capsys) -> None:  # type: ignore[no-untyped-def]
    script = _script(
        tmp_path,
        TINY,
        """let base = load_model("model", storage: nf4_double_quant, device: cuda)
let data = texts(["one", "two", "three"], context: 32)
let a = lora(base, rank: 4, targets: [q_proj, v_proj])
let _run = train(a, data, profile(precision: bfloat16), epochs: 2.0, micro_batch: 2)
""",
    )
    assert main([str(script), "--gpu-memory", "24GB"]) == 0
    out = capsys.readouterr().out
    for category in (*CATEGORIES, "peak"):
        assert f"  {category} " in out
    assert "tokens per update: 64" in out
    assert "updates: 3" in out  # 2 epochs of 3 examples, 2 per update
    assert "fits on the named GPU" in out
    assert "assumed" not in out


def test_a_non_literal_argument_is_assumed_at_its_default(tmp_path: Path, capsys) -> None:  # type: ignore[no-untyped-def]
    script = _script(
        tmp_path,
        TINY,
        """let base = load_model("model", storage: nf4_double_quant, device: cuda)
let data = texts(["one"], context: 32)
let mb = 1 + 1
let _run = train(lora(base, rank: 4), data, steps: 5, micro_batch: mb)
""",
    )
    assert main([str(script), "--gpu-memory", "100MB"]) == 0
    out = capsys.readouterr().out
    assert "train: micro_batch is not a literal; assumed at its default" in out
    assert "tokens per update: 32" in out  # micro_batch 1, its default
    assert "updates: 5" in out


def test_a_run_too_large_for_the_named_gpu_is_said_plainly(tmp_path: Path, capsys) -> None:  # type: ignore[no-untyped-def]
    script = _script(
        tmp_path,
        {**TINY, "num_hidden_layers": 64, "hidden_size": 4096, "intermediate_size": 14336},
        """let base = load_model("model", storage: float32, device: cuda)
let _run = train(lora(base, rank: 8), texts(["one"], context: 256), steps: 1)
""",
    )
    assert main([str(script), "--gpu-memory", "24GB"]) == 1
    assert "will NOT fit on the named GPU (22.35 GiB)" in capsys.readouterr().out


def test_plan_of_a_folder_does_not_import_torch(tmp_path: Path) -> None:
    script = _script(
        tmp_path,
        TINY,
        """let base = load_model("model", storage: nf4_double_quant)
let _run = train(lora(base), texts(["one"]), steps: 1)
""",
    )
    code = (
        "import sys; from aner_lang.runtime.train.plan import main; "
        f"rc = main([{str(script)!r}, '--gpu-memory', '24GB']); "
        "assert 'torch' not in sys.modules; sys.exit(rc)"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    assert "peak" in proc.stdout


def test_nf4_bytes_match_a_quantized_weight() -> None:
    for shape in ((64, 64), (96, 200), (1024, 4160)):
        weight = quantize_nf4(torch.randn(shape))
        assert footprint.nf4_bytes(shape[0] * shape[1]) == weight.packed_nbytes()


def test_gpu_memory_sizes() -> None:
    assert parse_bytes("24GB") == 24 * 10**9
    assert parse_bytes("80 GiB") == 80 << 30
    with pytest.raises(ValueError):
        parse_bytes("lots")
