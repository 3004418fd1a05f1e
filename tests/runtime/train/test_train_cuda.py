"""The trainer on CUDA (run on the GPU machine): paged AdamW in managed memory, fp16 QLoRA with
dynamic loss scaling over fused NF4 kernels, bf16, determinism."""

from __future__ import annotations

import pytest
import torch

from aner_lang.runtime import adapters as A
from aner_lang.runtime.io.host_copy import host_copies
from aner_lang.runtime.tasks.data import from_texts
from aner_lang.runtime.train.optim import AdamW, PagedAdamW
from aner_lang.runtime.train.profile import profile

pytestmark = pytest.mark.cuda
if not torch.cuda.is_available():
    pytest.skip("needs a CUDA GPU", allow_module_level=True)

TEXTS = [
    "Aner makes model adaptation explicit and reproducible.",
    "The quiet mountain lake reflects the clear morning sky.",
]


def test_paged_adamw_keeps_large_moments_managed_and_matches_adamw():
    pytest.importorskip("cupy")
    gen = torch.Generator(device="cuda").manual_seed(0)
    shapes = {"big": (600, 400), "small": (10,)}  # 240,000 elements are paged, 10 are not
    start = {k: torch.randn(s, device="cuda", generator=gen) for k, s in shapes.items()}
    plain = AdamW({k: v.clone() for k, v in start.items()}, lr=1e-3, weight_decay=0.01)
    paged = PagedAdamW(
        {k: v.clone() for k, v in start.items()}, page_bytes=64 << 10, lr=1e-3, weight_decay=0.01
    )
    for _ in range(4):
        grads = {k: torch.randn(s, device="cuda", generator=gen) for k, s in shapes.items()}
        plain.step(grads)
        paged.step(grads)
    torch.cuda.synchronize()
    for k in shapes:
        assert torch.equal(plain.params[k], paged.params[k])
    assert paged.managed_bytes() == 2 * 600 * 400 * 4
    assert "managed memory" in paged.report()
    saved = host_copies(paged.state_tensors())  # what a snapshot keeps
    again = PagedAdamW({k: v.clone() for k, v in paged.params.items()}, page_bytes=64 << 10)
    again.load_state_tensors(saved)
    assert again.managed_bytes() == paged.managed_bytes()
    assert torch.equal(again.state["big"].exp_avg.cpu(), saved["optim/exp_avg/big"])


@pytest.fixture(scope="module")
def nf4_model(smollm2_path):
    from aner_lang.runtime.load.loader import load_model

    return load_model(smollm2_path, storage="nf4_double_quant", device="cuda")


@pytest.mark.parametrize("precision", ["float16", "bfloat16"])
def test_qlora_on_cuda_learns_and_is_deterministic(nf4_model, precision):
    from aner_lang.runtime.train.trainer import train

    data = from_texts(TEXTS, context=32)
    prof = profile(precision=precision, optimizer="paged_adamw", kernel="fused")
    runs = []
    for _ in range(2):
        a = A.lora(nf4_model, rank=2, alpha=4.0, seed=71)
        runs.append((a, train(a, data, prof, steps=8, learning_rate=2e-3, micro_batch=2)))
    (a, r), (b, r2) = runs
    assert r.loss_history == r2.loss_history
    assert all(torch.equal(a.params[k], b.params[k]) for k in a.params)
    assert r.loss_history[-1] < r.loss_history[0]
    assert r.updates == 8 and r.skipped_updates <= 1
    if precision == "float16":
        assert r.loss_scale > 0 and a.state.meta["loss_scale"]["kind"] == "dynamic"
    else:
        assert a.state.meta["loss_scale"]["kind"] == "none"


@pytest.mark.parametrize("activations", ["keep", "checkpoint"])
@pytest.mark.parametrize("precision", ["float32", "bfloat16", "float16"])
def test_cuda_graphs_replay_the_eager_bits(tiny_bytes_gguf, tmp_path, precision, activations):
    """Updates replayed from CUDA graphs (one per batch shape, accumulation included) give the
    same adapter, bit for bit, as the same updates run eagerly; with checkpointed layers too,
    whose recomputation the graph records inside the backward. Validation after every update
    runs in the graphs' pool between replays (`GraphSteps.sharing_memory`) and corrupts
    nothing: the same validation losses and the same adapter."""
    import json

    from aner_lang.runtime.load.loader import load_model
    from aner_lang.runtime.train.trainer import train

    model = load_model(tiny_bytes_gguf, storage="nf4_double_quant", device="cuda")
    # byte-level tokens: three lengths under the context, so three batch shapes
    data = from_texts(["A short text.", "A text of middling length.", "A third, much longer text "
                       "makes the batches change shape."], 96)  # fmt: skip
    out = {}
    for graphs in (False, True):
        adapter = A.lora(model, rank=4, alpha=8.0, targets=["q_proj", "v_proj", "down_proj"])
        log = tmp_path / f"{precision}-{activations}-{graphs}.jsonl"
        prof = profile(precision=precision, graphs=graphs, activations=activations)
        run = train(adapter, data, prof, steps=5, learning_rate=1e-2, micro_batch=2,
                    accumulation=2, seed=3, log=str(log), validation=data,
                    eval_every=1)  # fmt: skip
        start, *_, end = (json.loads(line) for line in log.read_text().splitlines())
        out[graphs] = (adapter, run, start["cuda_graphs"])
        # the process's peak so far as torch's allocator counts it: held, and reserved around it
        assert 0 < end["peak_gpu_allocated_bytes"] <= end["peak_gpu_reserved_bytes"]
    assert out[False][2].startswith("off") and out[True][2] == "on"
    assert out[False][1].loss_history == out[True][1].loss_history
    assert out[False][1].validation_history == out[True][1].validation_history
    assert len(out[True][1].validation_history) == 5
    for name, p in out[False][0].params.items():
        assert torch.equal(p, out[True][0].params[name]), name


def test_a_recording_collects_only_young_garbage_and_holds_the_collector_off(
    tiny_bytes_gguf, monkeypatch
):
    """Before each CUDA graph recording the collector runs on the young generations only (a full
    collection costs 0.1-0.2 s per recording in a process holding a model), and never during
    the recording, where freeing an unreachable earlier graph would invalidate the capture."""
    import gc

    from aner_lang.runtime.load.loader import load_model
    from aner_lang.runtime.train import graphs, trainer

    collected: list[int] = []
    collect = gc.collect
    monkeypatch.setattr(gc, "collect", lambda generation=2: collected.append(generation) or 0)
    seen: list[tuple[bool, bool]] = []
    step = trainer._Loop._forward_backward

    def watched(self, *args):  # type: ignore[no-untyped-def]
        seen.append((torch.cuda.is_current_stream_capturing(), gc.isenabled()))
        return step(self, *args)

    monkeypatch.setattr(trainer._Loop, "_forward_backward", watched)
    model = load_model(tiny_bytes_gguf, storage="nf4_double_quant", device="cuda")
    adapter = A.lora(model, rank=4, alpha=8.0, targets=["q_proj", "v_proj"])
    # byte-level tokens: three lengths under the context, so three batch shapes
    data = from_texts(["A short text.", "A text of middling length.", "A third, much longer text "
                       "makes the batches change shape."], 96)  # fmt: skip
    trainer.train(adapter, data, profile(), steps=3, micro_batch=1, seed=3)
    monkeypatch.setattr(gc, "collect", collect)
    recordings = sum(capturing for capturing, _ in seen)
    assert recordings >= 2  # two shapes at least
    assert collected == [graphs.COLLECT_BEFORE_RECORDING] * recordings
    assert all(not enabled for capturing, enabled in seen if capturing)


def test_a_recorded_micro_batch_adds_its_own_gradient_once():
    """The warm-up before a recording is the recorded micro-batch's own step: its gradient is
    added once to those held before (a mid-window recording of a new shape) and to zeros for
    those made for the recording, and its loss is the eager step's; the next micro-batch of the
    shape replays the graph and adds its own, bit for bit as eagerly."""
    from aner_lang.runtime.train.graphs import GraphSteps

    gen = torch.Generator(device="cuda").manual_seed(0)
    held = torch.randn(6, 4, device="cuda", generator=gen).requires_grad_()
    fresh = torch.randn(4, device="cuda", generator=gen).requires_grad_()
    before = torch.randn(6, 4, device="cuda", generator=gen)
    ref_held, ref_fresh = (t.detach().clone().requires_grad_() for t in (held, fresh))
    held.grad, ref_held.grad = before.clone(), before.clone()

    def stepping(w, b):  # type: ignore[no-untyped-def]
        def step(ids, targets, positions, scored, scale):  # type: ignore[no-untyped-def]
            loss = (((ids.float() @ w + b) - targets.float()) ** 2).sum() / scored
            loss.backward()
            return loss.detach()

        return step

    ids = torch.randint(0, 5, (3, 6), device="cuda", generator=gen)
    targets = torch.randint(0, 5, (3, 4), device="cuda", generator=gen)
    steps = GraphSteps(stepping(held, fresh), [held, fresh], None)
    eager = stepping(ref_held, ref_fresh)
    scored = torch.tensor(12.0, device="cuda")
    for _ in range(2):  # the warm-up of the recording, then a replay
        loss = steps(ids, targets, None, 12, None).clone()
        assert torch.equal(loss, eager(ids, targets, None, scored, None))
        assert torch.equal(held.grad, ref_held.grad) and torch.equal(fresh.grad, ref_fresh.grad)
        assert steps.on and len(steps._graphs) == 1
    steps.release()


def test_eager_work_between_replays_reuses_the_graphs_memory_and_leaves_their_bits():
    """Work inside `sharing_memory` (validation's place) allocates from the blocks the recorded
    step frees, on the graphs' stream: no memory is reserved for it beside them, and the next
    replay gives the eager step's loss and gradient as before."""
    from aner_lang.runtime.train.graphs import GraphSteps

    gen = torch.Generator(device="cuda").manual_seed(1)
    w = torch.randn(1024, 1024, device="cuda", generator=gen).requires_grad_()
    ref = w.detach().clone().requires_grad_()

    def stepping(weight):  # type: ignore[no-untyped-def]
        def step(ids, targets, positions, scored, scale):  # type: ignore[no-untyped-def]
            h = torch.tanh(ids.float() @ weight) @ weight  # 8 MB transients, freed in the step
            loss = ((h - targets.float()) ** 2).sum() / scored
            loss.backward()
            return loss.detach()

        return step

    ids = torch.randn(2048, 1024, device="cuda", generator=gen).half()  # .float() copies
    targets = torch.randn(2048, 1024, device="cuda", generator=gen)
    steps = GraphSteps(stepping(w), [w], None)
    eager = stepping(ref)
    scored = torch.tensor(7.0, device="cuda")
    steps(ids, targets, None, 7, None)  # the recording's warm-up
    eager(ids, targets, None, scored, None)
    torch.cuda.synchronize()
    torch.cuda.empty_cache()  # no cached block outside the graphs' pool could serve the work
    reserved = torch.cuda.memory_reserved()
    with steps.sharing_memory():
        junk = torch.full((2048, 1024), float("nan"), device="cuda")  # in the step's free blocks
        total = float(junk.nan_to_num().sum())
        size = junk.nbytes
        del junk
    # 16 MB of work: outside the pool it would reserve a 20 MB segment at least; inside, at most
    # a small-block segment for the scalar (2 MB) if the step left none free
    assert total == 0.0 and torch.cuda.memory_reserved() - reserved < size
    loss = steps(ids, targets, None, 7, None).clone()
    assert torch.equal(loss, eager(ids, targets, None, scored, None))
    assert torch.equal(w.grad, ref.grad)
    steps.release()


def test_each_call_records_on_the_same_stream_so_memory_does_not_grow_per_call():
    """A `train` call's graphs (one GraphSteps, released as the call ends) record on the process's
    graph stream: torch keeps a cuBLAS workspace for every stream a GEMM ran on, so a stream
    made per call left tens of MiB allocated per call. The recording's host seconds are counted
    once."""
    from aner_lang.runtime.train.graphs import GraphSteps

    gen = torch.Generator(device="cuda").manual_seed(2)
    w = torch.randn(512, 512, device="cuda", generator=gen).requires_grad_()
    ids = torch.randn(256, 512, device="cuda", generator=gen)

    def step(ids, targets, positions, scored, scale):  # type: ignore[no-untyped-def]
        loss = (ids @ w).square().sum() / scored
        loss.backward()
        return loss.detach()

    allocated = []
    for _ in range(3):
        steps = GraphSteps(step, [w], None)
        steps(ids, ids, None, 1, None)  # warm-up and recording
        steps(ids, ids, None, 1, None)  # a replay
        assert steps.take_recording_seconds() > 0 and steps.take_recording_seconds() == 0
        steps.release()
        del steps
        torch.cuda.synchronize()
        allocated.append(torch.cuda.memory_allocated())
    assert allocated[1] == allocated[2], allocated


def test_a_call_on_the_same_adapter_replays_the_graphs_the_last_one_kept(tiny_bytes_gguf, tmp_path):
    """A finished call keeps its graphs and its state's device tensors; the next call on the same
    adapter with the same settings replays the graphs without recording (`cuda_graphs_kept`, no
    `recording_seconds`), continues from the device tensors, and gives the bits of calls that
    record again and continue from the host copies (everything released between calls). A call
    on another adapter releases them."""
    import json

    from aner_lang.runtime.load.loader import load_model
    from aner_lang.runtime.train import kept as keeping
    from aner_lang.runtime.train.trainer import train

    model = load_model(tiny_bytes_gguf, storage="nf4_double_quant", device="cuda")
    data = from_texts(["A short text.", "A text of middling length, longer."], 48)
    prof = profile(precision="bfloat16")

    def calls(release_between: bool) -> tuple[object, list[dict[str, object]]]:
        adapter = A.lora(model, rank=4, alpha=8.0, targets=["q_proj", "v_proj"], seed=5)
        events = []
        for n, steps in enumerate((3, 6)):
            if release_between:
                keeping.release_kept()
            log = tmp_path / f"{release_between}-{n}.jsonl"
            train(adapter, data, prof, steps=steps, learning_rate=1e-2, seed=3, log=str(log))
            events.append([json.loads(line) for line in log.read_text().splitlines()])
        return adapter, events

    again, recorded = calls(True)
    kept, replayed = calls(False)
    assert recorded[1][0]["cuda_graphs_kept"] == 0
    assert replayed[1][0]["cuda_graphs_kept"] == 2  # the two lengths' shapes
    assert any("recording_seconds" in e for e in recorded[1])
    assert not any("recording_seconds" in e for e in replayed[1])
    for name, p in again.params.items():  # type: ignore[attr-defined]
        assert torch.equal(p, kept.params[name]), name  # type: ignore[attr-defined]
    assert keeping._KEPT and keeping._KEPT[0].owner() is kept
    other = A.lora(model, rank=4, alpha=8.0, targets=["q_proj"], seed=6)
    train(other, data, profile(precision="float32"), steps=1, learning_rate=1e-2)
    assert keeping._KEPT and keeping._KEPT[0].owner() is other  # the first adapter's went
    keeping.release_kept()


def test_a_fresh_adapter_of_a_recorded_kind_records_without_a_warm_up(tiny_bytes_gguf, monkeypatch):
    """A fresh adapter of the same kind on the same model and profile as one this process has
    recorded (a sweep's next call) records its step straight away, with no eager warm-up before,
    and replays the graph for the first micro-batch: the adapter is the bits of the same calls
    run eagerly. One of another kind (another rank) still warms up first."""
    from aner_lang.runtime.load.loader import load_model
    from aner_lang.runtime.train import kept as keeping
    from aner_lang.runtime.train import trainer

    seen: list[bool] = []
    step = trainer._Loop._forward_backward

    def watched(self, *args):  # type: ignore[no-untyped-def]
        seen.append(torch.cuda.is_current_stream_capturing())
        return step(self, *args)

    monkeypatch.setattr(trainer._Loop, "_forward_backward", watched)
    model = load_model(tiny_bytes_gguf, storage="nf4_double_quant", device="cuda")
    data = from_texts(["One length of text, and only one."] * 2, 48)

    def call(rank: int, graphs: bool = True) -> tuple[A.Adapter, list[bool]]:
        keeping.release_kept()
        seen.clear()
        adapter = A.lora(model, rank=rank, alpha=8.0, targets=["q_proj", "v_proj"], seed=5)
        trainer.train(adapter, data, profile(precision="bfloat16", graphs=graphs), steps=3,
                      learning_rate=1e-2, seed=3)  # fmt: skip
        return adapter, list(seen)

    call(4)  # this kind's first recording, after its warm-up
    fresh, fresh_seen = call(4)
    assert fresh_seen[0], fresh_seen  # recorded at once: no eager step before it
    assert sum(fresh_seen) == 1 and len(fresh_seen) == 1  # replays run no Python step
    eager, _ = call(4, graphs=False)
    for name, p in eager.params.items():
        assert torch.equal(p, fresh.params[name]), name
    _, other_seen = call(8)
    assert other_seen[:2] == [False, True]  # a warm-up, then the recording
    keeping.release_kept()


def test_a_sweeps_next_adapter_replays_the_graphs_the_last_call_kept(tiny_bytes_gguf, tmp_path):
    """A fresh adapter of the same form as the last call's (a sweep's next call; `train.kept`)
    moves into the tensors its graphs read and replays them: nothing recorded
    (`cuda_graphs_kept`, no `recording_seconds`), whether the last adapter is still alive or
    already collected. It trains to the bits of the same calls run eagerly, and the last
    adapter keeps its own values. One with another alpha records its own."""
    import json

    from aner_lang.runtime.load.loader import load_model
    from aner_lang.runtime.train import kept as keeping
    from aner_lang.runtime.train.trainer import train

    model = load_model(tiny_bytes_gguf, storage="nf4_double_quant", device="cuda")
    data = from_texts(["A short text.", "A text of middling length, longer."], 48)

    def call(seed: int, alpha: float = 8.0, graphs: bool = True) -> tuple[A.Adapter, list]:
        adapter = A.lora(model, rank=4, alpha=alpha, targets=["q_proj", "v_proj"], seed=seed)
        log = tmp_path / f"{seed}-{alpha}-{graphs}.jsonl"
        train(adapter, data, profile(precision="bfloat16", graphs=graphs), steps=4,
              learning_rate=1e-2, seed=3, log=str(log))  # fmt: skip
        return adapter, [json.loads(line) for line in log.read_text().splitlines()]

    keeping.release_kept()
    first, recorded = call(1)
    first_values = {n: t.clone() for n, t in first.params.items()}
    second, alive = call(2)  # `first` alive
    for name, t in first.params.items():
        assert torch.equal(t, first_values[name]), name
    del first
    third, collected = call(3)  # `first` collected, `second` alive
    del second
    for events in (alive, collected):
        assert events[0]["cuda_graphs_kept"] == 2, events[0]  # the two lengths' shapes
        assert not any("recording_seconds" in e for e in events)
    assert recorded[0]["cuda_graphs_kept"] == 0
    assert any("recording_seconds" in e for e in recorded)
    keeping.release_kept()
    eager, _ = call(3, graphs=False)
    for name, p in eager.params.items():
        assert torch.equal(p, third.params[name]), name
    _, other = call(3, alpha=16.0)
    assert other[0]["cuda_graphs_kept"] == 0 and any("recording_seconds" in e for e in other)
    keeping.release_kept()


def test_a_scripts_sweep_replays_its_first_calls_graphs(tiny_bytes_gguf, tmp_path):
    """Through the interpreter: a sweep that saves each adapter and makes the next one's profile
    and adapter between its `train` calls replays the first call's graphs in the later ones
    (`cuda_graphs_kept`, nothing recorded)."""
    import io
    import json

    from aner_lang.check import analyze
    from aner_lang.interp import ExecContext, run

    source = f"""
let m = load_model("{tiny_bytes_gguf}", storage: nf4_double_quant, device: cuda)
let d = texts(["A short text.", "A text of middling length, longer."], context: 48)
fn tuned(seed: Int, log: String) -> Adapter {{
    let a = lora(m, rank: 4, alpha: 8.0, targets: [q_proj, v_proj], seed: seed)
    train(a, d, profile(precision: bfloat16), steps: 3, learning_rate: 0.01, log: log)
    save_adapter(a, "adapter_${{seed}}")
    return a
}}
let one = tuned(1, "one.jsonl")
let two = tuned(2, "two.jsonl")
let three = tuned(3, "three.jsonl")
"""
    path = tmp_path / "sweep.aner"
    analysis = analyze(source, str(path))
    assert not [d for d in analysis.diagnostics if d.severity == "error"], analysis.diagnostics
    run(analysis, ExecContext(script_dir=tmp_path, stdout=io.StringIO(), script_path=path))
    logs = {
        name: [json.loads(line) for line in (tmp_path / f"{name}.jsonl").read_text().splitlines()]
        for name in ("one", "two", "three")
    }
    assert logs["one"][0]["cuda_graphs_kept"] == 0
    assert any("recording_seconds" in e for e in logs["one"])
    for name in ("two", "three"):
        assert logs[name][0]["cuda_graphs_kept"] == 2, logs[name][0]
        assert not any("recording_seconds" in e for e in logs[name]), name
