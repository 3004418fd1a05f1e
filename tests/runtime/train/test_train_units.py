"""AdamW, loss scaling and profile rules against torch's own implementations, and the overflow
path of the trainer on the tiny fixture model."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from aner_lang.problems.errors import AnerRuntimeError
from aner_lang.runtime import adapters as A
from aner_lang.runtime.tasks.data import from_texts
from aner_lang.runtime.train.loss_scale import LossScaler
from aner_lang.runtime.train.optim import AdamW, make_optimizer
from aner_lang.runtime.train.profile import Profile, dynamic, fixed, profile
from aner_lang.runtime.train.schedule import learning_rate_at
from aner_lang.runtime.train.trainer import train


@pytest.mark.parametrize("foreach", [False, True])
def test_adamw_is_bit_identical_to_torch_adamw(foreach):
    gen = torch.Generator().manual_seed(0)
    start = {"a": torch.randn(7, 5, generator=gen), "b": torch.randn(11, generator=gen)}
    ours = {k: v.clone() for k, v in start.items()}
    theirs = [v.clone().requires_grad_(True) for v in start.values()]
    opt = AdamW(ours, lr=3e-3, weight_decay=0.1)
    ref = torch.optim.AdamW(theirs, lr=3e-3, weight_decay=0.1, foreach=foreach)
    for step in range(6):
        grads = [torch.randn(v.shape, generator=gen) for v in start.values()]
        for p, g in zip(theirs, grads):
            p.grad = g.clone()
        ref.step()
        opt.step(dict(zip(ours, grads)))
        for p, q in zip(ours.values(), theirs):
            assert torch.equal(p, q.detach()), step
    for name, p in zip(ours, theirs):
        assert torch.equal(opt.state[name].exp_avg, ref.state[p]["exp_avg"])
        assert torch.equal(opt.state[name].step, ref.state[p]["step"])


def test_a_prepared_step_is_the_step_and_one_never_applied_changes_nothing():
    """The trainer prepares each update's step before it knows whether the update is skipped:
    preparing alone must leave the optimizer as it was, and applying must equal `step`."""
    gen = torch.Generator().manual_seed(1)
    start = {"a": torch.randn(4, 3, generator=gen), "b": torch.randn(5, generator=gen)}
    stepped = AdamW({k: v.clone() for k, v in start.items()}, lr=1e-2, weight_decay=0.1)
    prepared = AdamW({k: v.clone() for k, v in start.items()}, lr=1e-2, weight_decay=0.1)
    for _ in range(3):
        grads = {k: torch.randn(v.shape, generator=gen) for k, v in start.items()}
        stepped.step(grads, lr=5e-3)
        prepared.prepare(grads, lr=5e-3)  # a skipped update: never applied
        prepared.prepare(grads, lr=5e-3).apply()
    for name in start:
        assert torch.equal(stepped.params[name], prepared.params[name])
        assert torch.equal(stepped.state[name].exp_avg_sq, prepared.state[name].exp_avg_sq)
        assert stepped.state[name].count == prepared.state[name].count == 3


def test_paged_adamw_on_cpu_is_plain_adamw_and_says_so():
    opt = make_optimizer("paged_adamw", {"w": torch.zeros(3)}, page_bytes=1 << 21)
    assert opt.managed_bytes() == 0 and "plain AdamW" in opt.report()


def test_loss_scaler_follows_grad_scaler():
    ours = LossScaler(dynamic(initial=8.0, growth_interval=2, max_retries=0))
    ref = torch.amp.GradScaler("cpu", init_scale=8.0, growth_interval=2)
    p = torch.nn.Parameter(torch.ones(3))
    opt = torch.optim.SGD([p], lr=0.0)
    for inf in (False, False, True, False, False, False):
        ref_loss = ref.scale((p * (float("inf") if inf else 1.0)).sum())
        ref_loss.backward()
        ref.step(opt)
        ref.update()
        g = torch.full((3,), float("inf") if inf else ours.state.scale)
        found = bool(ours.unscale_([g]))
        ours.update(found)
        assert found == inf
        assert ours.state.scale == ref.get_scale()
        assert ours.state.growth_tracker == ref.state_dict()["_growth_tracker"]
        opt.zero_grad()


def test_fixed_scale_never_changes():
    s = LossScaler(fixed(4.0))
    s.update(True)
    s.update(False)
    assert s.state.scale == 4.0 and s.state.overflows == 1


def test_profile_rules():
    assert Profile("float16").loss_scale.kind == "dynamic"
    assert Profile("bfloat16").loss_scale.kind == "none"
    with pytest.raises(AnerRuntimeError, match="unknown precision"):
        Profile("float8")
    if not torch.cuda.is_available():
        with pytest.raises(AnerRuntimeError, match="fused needs a CUDA GPU"):
            profile(kernel="fused")
    with pytest.raises(AnerRuntimeError, match="fused needs a CUDA GPU"):
        Profile(kernel="fused").validate(torch.device("cpu"))
    assert Profile().resolved_kernel(torch.device("cpu")) == "host_tiled"


def test_full_rejects_nf4_and_adapters_reject_bad_arguments(tiny_model):
    with pytest.raises(AnerRuntimeError, match="dense base"):
        A.full(SimpleNamespace(storage="nf4_double_quant"))
    with pytest.raises(AnerRuntimeError, match="rank must be at least 1"):
        A.lora(tiny_model, rank=0)
    with pytest.raises(AnerRuntimeError, match="unknown adapter target"):
        A.lora(tiny_model, rank=2, targets=["qproj"])


def test_schedule():
    assert [learning_rate_at(k, 1.0, 4, 2, "linear") for k in range(4)] == [0.5, 1.0, 1.0, 0.5]
    assert learning_rate_at(3, 1.0, 4, 0, "cosine") == pytest.approx(0.5 * (1 + (-(0.5**0.5))))


def test_overflow_retries_then_skips_and_state_is_kept(tiny_model):
    data = from_texts(["a tiny model learns these words"], context=16)
    a = A.lora(tiny_model, rank=2, alpha=4.0, targets=["q_proj", "v_proj"], seed=1)
    before = {k: v.clone() for k, v in a.params.items()}
    # a scale of 1e39 is inf in fp32: every window overflows, retries, backs off, is skipped
    prof = Profile(
        loss_scale=dynamic(initial=3e38, growth_interval=1, backoff_factor=0.5, max_retries=2)
    )
    prof.loss_scale.scale = float("inf")
    run = train(a, data, prof, steps=2, learning_rate=1e-2)
    assert run.skipped_updates == 2 and run.retries == 4 and run.loss_history == []
    assert all(torch.equal(before[k], v) for k, v in a.params.items())
    assert "optim/step/layers.0.self_attn.q_proj.lora_A" not in a.state.tensors
    # a finite scale: updates apply, the scale grows every good update (growth_interval 1)
    b = A.lora(tiny_model, rank=2, alpha=4.0, seed=1)
    run = train(
        b,
        data,
        Profile(loss_scale=dynamic(initial=2.0, growth_interval=1)),
        steps=3,
        learning_rate=1e-2,
    )
    assert run.skipped_updates == 0 and run.loss_scale == 16.0
    assert b.state.meta["loss_scale"]["growth_tracker"] == 0


METHODS = {
    "lora": lambda m: A.lora(m, rank=2, alpha=4.0, dropout=0.1, seed=3),
    "lora_fa": lambda m: A.lora_fa(m, rank=2, alpha=4.0, seed=3),
    "dora": lambda m: A.dora(m, rank=2, alpha=4.0, seed=3),
    "tinylora": lambda m: A.tinylora(m, parameters=13, rank=2, seed=3),
    "tinylora_per_module": lambda m: A.tinylora(m, parameters=3, sharing="per_module"),
    "full": A.full,
}


@pytest.mark.parametrize("method", sorted(METHODS))
@pytest.mark.parametrize("precision", ["float32", "bfloat16"])
def test_every_method_trains_and_resumes_bit_identically(tiny_model, method, precision):
    data = from_texts(["a tiny model learns these words", "and these other words too"], context=16)
    prof = Profile(precision)
    opts = {"learning_rate": 1e-2, "micro_batch": 1, "accumulation": 2, "seed": 2}
    ids = torch.tensor([[1, 2, 3, 4]])
    before = tiny_model.forward(ids).detach()
    straight = METHODS[method](tiny_model)
    run = train(straight, data, prof, steps=2, **opts)
    assert torch.equal(tiny_model.forward(ids), before)  # the shared base is untouched
    assert run.skipped_updates == 0 and run.loss_history[1] != run.loss_history[0]
    half = METHODS[method](tiny_model)
    train(half, data, prof, steps=1, **opts)
    resumed = A.adapter_from_state(tiny_model, half.state)
    train(resumed, data, prof, steps=2, **opts)
    a, b = straight.state.to_tensors(), resumed.state.to_tensors()
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    assert straight.state.to_json()["counters"] == resumed.state.to_json()["counters"]


def test_a_call_continuing_its_adapter_from_the_kept_tensors_matches_one_from_the_host_copies(
    tiny_model,
):
    """The next call on the same adapter continues from the live tensors the call before kept
    (`train.kept`) and lands on the bits of one that continues from the state's host copies."""
    from aner_lang.runtime.train import kept

    data = from_texts(["a tiny model learns these words", "and these other words too"], context=16)
    states = []
    for release in (False, True):
        adapter = A.lora(tiny_model, rank=2, alpha=4.0, seed=3)
        train(adapter, data, Profile("float32"), steps=2, learning_rate=1e-2, seed=2)
        if release:
            kept.release_kept()
        else:
            assert kept._KEPT and kept._KEPT[0].state is adapter.state and kept._KEPT[0].live
        train(adapter, data, Profile("float32"), steps=4, learning_rate=1e-2, seed=2)
        states.append(adapter.state.to_tensors())
    a, b = states
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    kept.release_kept()


def test_a_fresh_adapter_of_the_same_form_moves_into_the_kept_tensors_with_its_values(tiny_model):
    """A kept set holds the tensors its graphs read and write. A fresh adapter of the same form
    moves into them: its values are copied there and its tensors then live there, so the graphs'
    key is its own; an owner still alive keeps its values, at the fresh adapter's former
    storage; once the owner is collected the set stays, its state dropped, for the next one. An
    adapter of another form (alpha, a constant of a recording) does not fit."""
    import gc

    from aner_lang.runtime.train import kept
    from aner_lang.runtime.train.graphs import GraphSteps
    from aner_lang.runtime.train.trainer import adapter_form, graph_key

    prof = Profile("float32")

    def lora(seed: int, alpha: float = 4.0) -> A.Adapter:
        adapter = A.lora_fa(tiny_model, rank=2, alpha=alpha, seed=seed)
        for p in adapter.params.values():
            p.grad = torch.full_like(p, float(seed))
        with torch.no_grad():  # trained values, not B's zeros
            for p in adapter.params.values():
                p.normal_(generator=torch.Generator().manual_seed(seed))
        return adapter

    def values(adapter: A.Adapter) -> dict[str, torch.Tensor]:
        return {n: t.detach().clone() for n, t in adapter.live_tensors().items()}

    def where(adapter: A.Adapter) -> dict[str, int]:
        return {n: t.data_ptr() for n, t in adapter.live_tensors().items()}

    owner = lora(1)
    key = graph_key(owner, prof, "identity")
    steps = GraphSteps(lambda *a: torch.zeros(()), list(owner.params.values()), None)
    kept.keep(owner, key, steps, "state", {"x": torch.zeros(1)}, adapter_form(owner))
    owner_values, slots = values(owner), where(owner)
    fresh = lora(2)
    fresh_values, fresh_was = values(fresh), where(fresh)
    taken = kept.take_kept()
    assert taken is not None and taken.owned_by(owner) and not taken.owned_by(fresh)
    assert not taken.fits(key, adapter_form(lora(3, alpha=8.0)))
    assert taken.fits(graph_key(fresh, prof, "identity"), adapter_form(fresh))
    assert not taken.fits(graph_key(fresh, Profile("bfloat16"), "identity"), adapter_form(fresh))
    taken.move_into(fresh)
    assert where(fresh) == slots and where(owner) == fresh_was
    for name, t in fresh.live_tensors().items():
        assert torch.equal(t, fresh_values[name]), name
    for name, t in owner.live_tensors().items():
        assert torch.equal(t, owner_values[name]), name
    assert all(p.grad is None for p in owner.params.values())
    assert all(torch.equal(p.grad, torch.zeros_like(p)) for p in fresh.params.values())
    assert graph_key(fresh, prof, "identity") == key
    assert taken.owned_by(fresh) and taken.live == {} and taken.state is None
    kept._KEPT.append(taken)
    del owner  # no longer the set's owner: the set is untouched
    gc.collect()
    assert taken.owned_by(fresh) and taken.slots
    del fresh
    assert kept._KEPT == [taken] and taken.owner is None and taken.slots
    third = lora(4)
    third_values = values(third)
    taken = kept.take_kept()
    assert taken is not None and taken.fits(graph_key(third, prof, "identity"), adapter_form(third))
    taken.move_into(third)
    assert where(third) == slots
    for name, t in third.live_tensors().items():
        assert torch.equal(t, third_values[name]), name
    taken.release()


def test_a_trained_adapter_goes_when_the_script_drops_it_without_waiting_for_the_collector(
    tiny_model,
):
    """Nothing a call leaves (its loop, its kept graphs and state) holds the adapter in a
    reference cycle: dropped, it goes at once with what was kept for it (an adapter per call of
    a sweep would otherwise pile up on the GPU until a full collection)."""
    import gc
    import weakref

    from aner_lang.runtime.train import kept

    data = from_texts(["a tiny model learns these words"], context=16)
    adapter = A.lora(tiny_model, rank=2, alpha=4.0, seed=3)
    run = train(adapter, data, Profile("float32"), steps=1, learning_rate=1e-2)
    gone = weakref.ref(adapter)
    assert kept._KEPT
    gc.disable()
    try:
        del adapter, run
        assert gone() is None and not kept._KEPT
    finally:
        gc.enable()


def test_graphs_record_short_micro_batches_and_leave_long_ones_eager():
    """A step is recorded only on CUDA, without dropout or offload, and for micro-batches under
    `EAGER_FROM_TOKENS` tokens; every refusal says why."""
    from aner_lang.runtime.train.graphs import EAGER_FROM_TOKENS, eligibility

    cuda = torch.device("cuda")
    assert eligibility(cuda, 0.0, "checkpoint", True, EAGER_FROM_TOKENS - 1) is None
    assert eligibility(cuda, 0.0, "keep", True, 2 * 1024) is None
    long = eligibility(cuda, 0.0, "checkpoint", True, EAGER_FROM_TOKENS)
    assert long is not None and f"{EAGER_FROM_TOKENS} tokens" in long
    assert "offload" in str(eligibility(cuda, 0.0, "offload", True, 64))
    assert "dropout" in str(eligibility(cuda, 0.1, "keep", True, 64))
    assert "cpu" in str(eligibility(torch.device("cpu"), 0.0, "keep", True, 64))
    assert "graphs: false" in str(eligibility(cuda, 0.0, "keep", False, 64))


def test_one_set_is_kept_and_its_owners_collection_leaves_only_recorded_graphs():
    """One set is kept at a time: keeping another releases it; `take_kept` hands it over once.
    The owner's collection drops the set's state; recorded graphs stay for a fresh adapter of
    their form, a set with nothing recorded goes."""
    import gc

    from aner_lang.runtime.train import graphs, kept

    class Owner:  # an adapter's stand-in: its identity, and no tensors
        def __init__(self) -> None:
            self.params: dict[str, torch.Tensor] = {}
            self.frozen: dict[str, torch.Tensor] = {}

    def recorded() -> graphs.GraphSteps:
        steps = graphs.GraphSteps(lambda *args: torch.zeros(()), [], None)
        steps._graphs[((1, 4), False)] = None  # type: ignore[assignment]  # a recorded shape
        return steps

    a, b = Owner(), Owner()
    steps, live = recorded(), {"x": torch.zeros(2)}
    kept.keep(a, ("key",), steps, "state", live, "form")
    taken = kept.take_kept()
    assert taken is not None and taken.steps is steps and taken.live is live
    assert taken.owned_by(a) and not taken.owned_by(b)
    assert kept.take_kept() is None
    kept.keep(a, ("key",), steps, "state", live, "form")
    kept.keep(b, ("key",), recorded(), "state", live, "form")
    assert steps.shapes == 0 and len(kept._KEPT) == 1  # a's released
    steps = kept._KEPT[0].steps
    del b
    gc.collect()
    assert kept._KEPT and kept._KEPT[0].owner is None and steps.shapes == 1
    assert kept._KEPT[0].state is None and kept._KEPT[0].live == {}
    kept.keep(a, None, graphs.GraphSteps(lambda *args: torch.zeros(()), [], None), "s", live, "f")
    assert steps.shapes == 0  # released by the next keep
    del a
    gc.collect()
    assert not kept._KEPT  # nothing recorded: nothing left for a fresh adapter


def test_a_script_lets_go_of_what_train_holds_before_other_gpu_work_and_at_its_end(tmp_path):
    """`ExecContext.held`: a builtin that needs torch, other than the holder, lets go first; a
    builtin that does not (print) leaves it; the script's end lets go of everything."""
    import io

    from aner_lang.check import analyze
    from aner_lang.interp import ExecContext, run

    released: list[str] = []
    source = 'print("a")\nlet d = texts(["some text"], context: 16)\nprint("b")\n'
    analysis = analyze(source, "held.aner")
    ctx = ExecContext(script_dir=tmp_path, stdout=io.StringIO())
    ctx.held["train"] = lambda: released.append("train")
    ctx.held["texts"] = lambda: released.append("texts")
    run(analysis, ctx)
    assert released == ["train", "texts"]  # before texts() (not its own), then at the end


def test_what_a_sweep_does_between_calls_leaves_what_train_holds_and_gpu_work_lets_it_go(
    tiny_gguf, tmp_path, monkeypatch
):
    """What `train` keeps for its next call (`ExecContext.held`) stays through what a sweep does
    between its calls (saving the adapter, making a profile, a dataset, the next low-rank
    adapter: `Builtin.lets_go`), so the next call finds it, and goes before GPU work, here
    `evaluate`."""
    import io
    import json

    from aner_lang.check import analyze
    from aner_lang.interp import ExecContext, run
    from aner_lang.runtime.train import trainer

    out = io.StringIO()
    monkeypatch.setattr(trainer, "release_kept", lambda: out.write("released\n"))
    (tmp_path / "qa.jsonl").write_text(json.dumps({"q": "Hi?", "a": " Hello."}) + "\n")
    source = f"""
let m = load_model("{tiny_gguf}", storage: float16, device: cpu)
let qa = load_jsonl("qa.jsonl", prompt_field: "q", completion_field: "a", context: 16)
let first = lora(m, rank: 2, alpha: 4.0)
train(first, qa, profile(precision: float32), steps: 1)
save_adapter(first, "first")
let p = profile(precision: float32)
let mixed = shuffle(qa, seed: 3)
let second = lora(m, rank: 2, alpha: 4.0, seed: 1)
let third = dora(m, rank: 2, alpha: 4.0)
print("made")
print(evaluate(m, qa).scored_tokens)
"""
    path = tmp_path / "script.aner"
    analysis = analyze(source, str(path))
    assert not [d for d in analysis.diagnostics if d.severity == "error"]
    run(analysis, ExecContext(script_dir=tmp_path, stdout=out, script_path=path))
    assert out.getvalue().splitlines()[:3] == ["made", "released", "3"]


def test_an_example_longer_than_the_models_context_is_refused_before_training(tiny_model):
    """At the call, naming the data and the limit: not at the first update, after the start-up."""
    limit = tiny_model.config.max_position_embeddings
    long = from_texts([" ".join(["word"] * 2 * limit)], context=4 * limit)
    short = from_texts(["a few words"], context=16)
    for data, validation, name in ((long, None, "training"), (short, long, "validation")):
        adapter = A.lora(tiny_model, rank=2)
        with pytest.raises(AnerRuntimeError) as e:
            train(adapter, data, Profile("float32"), steps=1, validation=validation)
        assert e.value.code == "E-CONTEXT"
        assert f"the longest {name} example has" in e.value.message
        assert f"more than the model's context length {limit}" in e.value.message
        assert adapter.state is None  # nothing trained
