"""A profile's `memory_budget:` picks the fastest activation policy whose planned peak fits, says
which and why, and stops a run that no policy fits before it trains, at the train call."""

from __future__ import annotations

import json
import re
import shutil

import pytest

from aner_lang.cli import main
from aner_lang.problems.errors import AnerRuntimeError
from aner_lang.runtime import adapters as A
from aner_lang.runtime.load.loader import load_model
from aner_lang.runtime.train import budget
from aner_lang.runtime.train.profile import profile


@pytest.fixture(scope="module")
def adapter(tiny_gguf):
    model = load_model(tiny_gguf, storage="float32", device="cpu")
    return A.lora(model, rank=2, alpha=4.0, dropout=0.0, targets=["q_proj", "v_proj"], seed=1)


def _pick(adapter, bytes_: int, activations: str = "keep") -> budget.Pick:
    p = profile(memory_budget=bytes_, activations=activations)
    return budget.pick(adapter, p, context=64, micro_batch=4, accumulation=1)


def test_the_picked_policy_gets_slower_as_the_budget_shrinks(adapter):
    peaks = _pick(adapter, 1 << 40).peaks
    assert list(peaks) == ["keep", "checkpoint", "offload"]
    assert peaks["keep"] > peaks["checkpoint"] > peaks["offload"]
    for budget_bytes, picked in (
        (1 << 40, "keep"),
        (peaks["keep"], "keep"),  # a peak equal to the budget fits
        (peaks["keep"] - 1, "checkpoint"),
        (peaks["checkpoint"], "checkpoint"),
        (peaks["checkpoint"] - 1, "offload"),
        (peaks["offload"], "offload"),
    ):
        chosen = _pick(adapter, budget_bytes)
        assert chosen.policy == picked, budget_bytes
        assert f"activations {picked}, the fastest" in chosen.reason
        assert chosen.peaks == peaks


def test_a_budget_never_picks_a_faster_policy_than_asked(adapter):
    chosen = _pick(adapter, 1 << 40, activations="checkpoint")
    assert chosen.policy == "checkpoint"
    assert list(chosen.peaks) == ["checkpoint", "offload"]


def test_long_cuda_micro_batches_prefer_offload_to_checkpoint():
    """Where both run eagerly (CUDA, micro-batches of EAGER_FROM_TOKENS tokens or more) offload
    is the faster; below that, and on the CPU, checkpoint is."""
    from aner_lang.runtime.train.footprint import EAGER_FROM_TOKENS

    assert budget.by_speed(True, EAGER_FROM_TOKENS) == ["keep", "offload", "checkpoint"]
    assert budget.by_speed(True, EAGER_FROM_TOKENS - 1) == ["keep", "checkpoint", "offload"]
    assert budget.by_speed(False, EAGER_FROM_TOKENS) == ["keep", "checkpoint", "offload"]


def test_a_budget_no_policy_fits_is_an_error_giving_every_planned_peak(adapter):
    peaks = _pick(adapter, 1 << 40).peaks
    with pytest.raises(AnerRuntimeError) as e:
        _pick(adapter, peaks["offload"] - 1)
    assert e.value.code == "E-PROFILE-BUDGET"
    assert all(mode in str(e.value) for mode in peaks)


SCRIPT = """\
let base = load_model("base.gguf", storage: float32, device: cpu)
let data = texts(["Aner makes model adaptation explicit.", "The lake reflects the sky."],
                 context: 16)
let run = train(lora(base, rank: 2, targets: [q_proj, v_proj]), data,
                profile(memory_budget: {budget}), steps: 2, micro_batch: 2, log: "events.jsonl")
print("updates ${{run.updates}}")
"""


def _run(tmp_path, tiny_gguf, budget_text: str) -> tuple[int, str]:
    """The script's exit code and its event log (empty when train never started)."""
    shutil.copy(tiny_gguf, tmp_path / "base.gguf")
    script = tmp_path / "script.aner"
    script.write_text(SCRIPT.format(budget=budget_text))
    code = main(["run", str(script)])
    events = tmp_path / "events.jsonl"
    return code, events.read_text() if events.exists() else ""


def test_a_run_says_which_policy_its_budget_picked(tmp_path, tiny_gguf, capsys):
    code, events = _run(tmp_path, tiny_gguf, "64 GiB")
    out = capsys.readouterr()
    assert code == 0, out.err
    assert "updates 2" in out.out
    assert re.search(r"train: memory_budget 64\.00 GiB: activations keep, the fastest", out.err)
    start = json.loads(events.splitlines()[0])
    assert start["memory_budget"]["activations"] == "keep"
    assert start["profile"]["activations"] == "keep"
    assert set(start["memory_budget"]["planned_peaks"]) == {"keep", "checkpoint", "offload"}


def test_a_run_whose_budget_no_policy_fits_stops_before_training(tmp_path, tiny_gguf, capsys):
    code, events = _run(tmp_path, tiny_gguf, "4 KiB")
    err = capsys.readouterr().err
    assert code == 1
    assert re.search(r"script\.aner:4:11: error\[E-PROFILE-BUDGET\]: .*memory_budget 4\.0 KiB", err)
    assert "Traceback" not in err
    assert events == ""  # train never started
