"""A profile's `memory_budget:` picks the fastest activation policy whose planned peak fits, says
which and why, and stops a run that no policy fits before it trains, at the train call."""

from __future__ import annotations

import json
import re
import shutil
from dataclasses import replace
from pathlib import Path

import pytest
import torch

from aner_lang.cli import main
from aner_lang.problems.errors import AnerRuntimeError
from aner_lang.runtime import adapters as A
from aner_lang.runtime.load.loader import load_model
from aner_lang.runtime.train import budget
from aner_lang.runtime.train.footprint import LayerShape, offload_host_bytes
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


def _on_cuda(adapter):  # type: ignore[no-untyped-def]
    """The CPU adapter as the picker sees one on CUDA (where offload pins host memory)."""
    from types import SimpleNamespace

    return SimpleNamespace(
        method=adapter.method, config=adapter.config, base=adapter.base,
        device=torch.device("cuda"),
    )  # fmt: skip


def _pinned(c, tokens: int) -> int:  # type: ignore[no-untyped-def]
    """Bytes offload pins: per layer the input, the rotated queries, keys and values,
    attention's output and o_proj's in bf16, and attention's fp32 log-sum-exp per head, each
    pinned at exactly its bytes."""
    q, kv = c.num_attention_heads * c.head_dim, c.num_key_value_heads * c.head_dim
    sizes = [tokens * width * 2 for width in (c.hidden_size, q, kv, kv, q, c.hidden_size)]
    sizes.append(tokens * c.num_attention_heads * 4)
    return c.num_hidden_layers * sum(sizes)


def test_the_plan_of_offloads_pinned_memory_against_a_measured_run():
    """At the full Llama-3-8B shape and 14,337 tokens an H100 pinned what `pinned_blocks`
    counts (`benchmarks/offload_copies.py`), the final norm's copies and the LoRA's low-rank
    products included: the plan's offload copies are within that and above nine tenths of it."""
    results = Path(__file__).resolve().parents[3] / "benchmarks" / "results"
    run = json.loads((results / "h100_s28_copies_exact.json").read_text())
    pinned = run["updates"][-1]["exact_pinned_bytes"]
    tokens = run["tokens"][-1]
    planned = offload_host_bytes(32, tokens, LayerShape(4096, 4096, 1024, 14336, 32), 2)
    assert 0.9 * pinned < planned <= pinned


def _inputs_pinned(c, tokens: int) -> int:  # type: ignore[no-untyped-def]
    """Bytes offload pins for the layer inputs alone (bf16)."""
    return c.num_hidden_layers * tokens * c.hidden_size * 2


def test_offload_fits_where_the_host_can_hold_the_layer_inputs(adapter, monkeypatch):
    """The budget picks offload where the host can hold its pinned copies of the layer inputs
    (what else it keeps shrinks to fit, `host_fit`); unknown host memory is no limit."""
    from aner_lang.host import memory

    cuda = _on_cuda(adapter)
    p = profile(activations="keep", precision="bfloat16")
    least = _inputs_pinned(adapter.base.config, tokens=4 * 64)
    peaks = budget.pick(cuda, replace(p, memory_budget=1 << 40), context=64, micro_batch=4,
                        accumulation=1).peaks  # fmt: skip
    tight = replace(p, memory_budget=peaks["offload"])  # only offload fits the GPU
    for host, picked in ((None, "offload"), (least, "offload"), (least - 1, None)):
        monkeypatch.setattr(memory, "available_bytes", lambda host=host: host)
        if picked is None:
            with pytest.raises(AnerRuntimeError) as e:
                budget.pick(cuda, tight, context=64, micro_batch=4, accumulation=1)
            assert e.value.code == "E-PROFILE-BUDGET"
            assert "offload would pin" in str(e.value) and "layer inputs alone" in str(e.value)
        else:
            chosen = budget.pick(cuda, tight, context=64, micro_batch=4, accumulation=1)
            assert chosen.policy == picked


def test_an_offload_run_keeps_what_the_host_can_hold(adapter, monkeypatch):
    """On CUDA an offload run keeps every `kept_through_backward` call the host can hold, in the
    order `OFFLOAD_KEEPS` gives them up, says which when not all, and warns where not even the
    layer inputs fit; off CUDA, under another policy or with the host unknown, all silently."""
    from aner_lang.host import memory
    from aner_lang.runtime.train.footprint import OFFLOAD_KEEPS

    c = adapter.base.config
    offload, checkpoint = profile(activations="offload", precision="bfloat16"), profile()
    everything = budget.HostFit(None, None)
    pinned, least = _pinned(c, tokens=256), _inputs_pinned(c, tokens=256)
    fits = {}
    for host in (None, pinned, pinned - 1, least, least - 1):
        monkeypatch.setattr(memory, "available_bytes", lambda host=host: host)
        fits[host] = budget.host_fit(adapter.base, offload, 256, cuda=True)
        assert budget.host_fit(adapter.base, offload, 256, cuda=False) == everything
        assert budget.host_fit(adapter.base, checkpoint, 256, cuda=True) == everything
    assert fits[None] == fits[pinned] == everything
    assert fits[pinned - 1].keeps == frozenset(OFFLOAD_KEEPS[:-1])
    assert "keeps inputs, attention, qkv in" in fits[pinned - 1].message
    assert "recomputes o_proj" in fits[pinned - 1].message
    assert fits[least].keeps == frozenset()
    assert "recomputes attention, qkv, o_proj" in fits[least].message
    assert fits[least - 1].keeps == frozenset()
    assert "may be killed for memory" in fits[least - 1].message


def test_host_memory_available_is_read_from_meminfo_or_unknown(tmp_path):
    from aner_lang.host.memory import available_bytes

    meminfo = tmp_path / "meminfo"
    meminfo.write_text("MemTotal:       32768 kB\nMemAvailable:    1024 kB\nSwapTotal: 0 kB\n")
    assert available_bytes(meminfo) == 1024 * 1024
    meminfo.write_text("MemTotal:       32768 kB\nMemAvailable:    lots\n")
    assert available_bytes(meminfo) is None
    assert available_bytes(tmp_path / "missing") is None
    meminfo.write_bytes(b"MemTotal: 1 kB\n" * 100_000)  # read within its bound, then unknown
    assert available_bytes(meminfo) is None


def test_plan_says_what_offload_pins_on_the_host(tmp_path, capsys, monkeypatch):
    """`aner plan` of an offloaded CUDA run gives its pinned copies of the layer inputs and what
    attention saves, beside
    the peak, and whether this machine has that much available."""
    from aner_lang.host import memory
    from aner_lang.runtime.train.plan import main as plan_main

    (tmp_path / "model").mkdir()
    (tmp_path / "model" / "config.json").write_text(json.dumps({
        "model_type": "llama", "hidden_size": 64, "intermediate_size": 128,
        "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
        "vocab_size": 512, "max_position_embeddings": 256}))  # fmt: skip
    script = tmp_path / "s.aner"
    script.write_text(
        'let base = load_model("model", storage: nf4_double_quant, device: cuda)\n'
        'let data = texts(["one", "two"], context: 32)\n'
        "let _run = train(lora(base, rank: 4, targets: [q_proj]), data,\n"
        "                 profile(precision: bfloat16, activations: offload), micro_batch: 2)\n"
    )
    # layers x tokens x (the input, queries, keys, values, attention's output and o_proj's in
    # bf16, 4 heads' fp32 log-sum-exp)
    pinned = 2 * 64 * ((64 + 2 * 64 + 2 * 32 + 64) * 2 + 4 * 4)
    monkeypatch.setattr(memory, "available_bytes", lambda: pinned - 1)
    assert plan_main([str(script), "--gpu-memory", "24GB"]) == 0
    out = capsys.readouterr().out
    assert "pinned host memory 82.0 KiB: offload's copies of the layer inputs and what" in out
    assert "more than the 82.0 KiB this machine has available" in out
    script.write_text(script.read_text().replace("offload", "checkpoint"))
    assert plan_main([str(script), "--gpu-memory", "24GB"]) == 0
    assert "pinned host memory" not in capsys.readouterr().out


def test_a_budget_counts_the_memory_the_loaded_model_already_holds(monkeypatch):
    """The budget is the run's whole peak: on a GPU with 10 GiB free after the model took 5, a
    budget of 15 GiB is accepted and one of 15 GiB and a byte is not."""
    from aner_lang.runtime.train import profile as profiles

    gib = 1 << 30
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device=None: (10 * gib, 80 * gib))
    monkeypatch.setattr(torch.cuda, "memory_reserved", lambda device=None: 5 * gib)
    monkeypatch.setattr(profiles, "check_precision_supported", lambda *_: None)
    monkeypatch.setattr(profiles.Profile, "resolved_kernel", lambda *_: "fused")
    cuda = torch.device("cuda")
    profile(memory_budget=15 * gib).validate(cuda)
    with pytest.raises(AnerRuntimeError) as e:
        profile(memory_budget=15 * gib + 1).validate(cuda)
    assert e.value.code == "E-PROFILE-BUDGET"
    assert "10.00 GiB free and 5.00 GiB this process holds" in str(e.value)


def test_a_run_keeps_under_offload_what_host_fit_says_and_says_so(adapter, monkeypatch, capsys):
    """`train` runs its layers under the keep set `budget.host_fit` gives it and prints its word:
    keeping nothing besides the inputs, each layer's q/k/v projections run in its forward and
    again in its recomputation, as under `checkpoint`; keeping all, once."""
    from aner_lang.runtime.model import transformer
    from aner_lang.runtime.tasks.data import from_texts
    from aner_lang.runtime.train.trainer import train

    data = from_texts(["the cat sat on the mat and looked at the dog"] * 2, context=16)
    offload = profile(activations="offload")
    qkv = transformer.LlamaAttention._qkv
    calls = 0

    def projected(self, x):  # type: ignore[no-untyped-def]
        nonlocal calls
        calls += 1
        return qkv(self, x)

    monkeypatch.setattr(transformer.LlamaAttention, "_qkv", projected)
    runs = {}
    for keeps, message in ((None, None), (frozenset(), "activations offload keeps inputs")):
        fit = budget.HostFit(keeps, message)
        monkeypatch.setattr(budget, "host_fit", lambda *args, fit=fit: fit)
        calls = 0
        train(A.lora(adapter.base, rank=2, targets=["q_proj"], seed=1), data, offload, steps=1)
        runs[keeps] = calls
        err = capsys.readouterr().err
        assert (message is not None and f"train: {message}" in err) or "offload keeps" not in err
    layers = adapter.base.config.num_hidden_layers
    assert runs == {None: layers, frozenset(): 2 * layers}
