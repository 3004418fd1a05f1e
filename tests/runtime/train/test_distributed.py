"""Training on 2 ranks (gloo, CPU) against one process: data parallel LoRA, FSDP2 `full`.

One `aner run --nproc 2` launch runs every 2-rank training of this module (starting ranks costs
more than the tiny trainings); the one-process runs happen in the test process. With N ranks and
`micro_batch: k` the windows are those of one process with `micro_batch: k * N`, so the two must
agree within fp32 rounding (the sums over ranks add in another order), and a checkpoint of either
continues on the other. Continuing a 2-rank checkpoint on 2 ranks is bit-exact.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from aner_lang.cli import main as aner
from aner_lang.runtime.train import checkpoint

SETUP = """
let m = load_model("{gguf}", storage: float32, device: {device})
let data = texts(["Aner makes model adaptation explicit.", "The quiet lake reflects the sky.",
                  "Seven engineers share one tree.", "A fourth line, the longest one of all."],
                 context: 24)
let p = profile(precision: float32, optimizer: adamw, kernel: host_tiled)
# Adam turns rounding noise in tiny gradients into steps of the learning rate's size: full's
# is 0.001 (0.0001 over an epoch of validations), so its 2-rank and 1-process results compare
# at fp32 tolerance
fn run(a: Adapter, steps: Int, micro: Int, dir: String, lr: Float) -> Run {{
  return train(a, data, p, steps: steps, micro_batch: micro, accumulation: 2, learning_rate: lr,
               weight_decay: 0.01, clip_norm: 0.5, seed: 5, checkpoints: dir, checkpoint_every: 1)
}}
# 5 examples in order, an epoch of windows of 2 + 2 and 1 (on 2 ranks the last micro-step's share
# is empty on rank 1), validated after every update with the best checkpoint kept
let odd = texts(["Aner makes model adaptation explicit.", "The quiet lake reflects the sky.",
                 "Seven engineers share one tree.", "A fourth line, the longest one of all.",
                 "And a fifth."], context: 24)
fn epoch(a: Adapter, micro: Int, dir: String, lr: Float) -> Run {{
  return train(a, odd, p, epochs: 1.0, micro_batch: micro, accumulation: 2, shuffle: false,
               learning_rate: lr, clip_norm: 0.5, seed: 5, validation: data, eval_every: 1,
               checkpoints: dir)
}}
fn low_rank() -> Adapter {{
  return lora(m, rank: 2, alpha: 4.0, targets: [q_proj, v_proj, down_proj], seed: 3)
}}
let q = load_model("{gguf}", storage: nf4_double_quant, device: {device})
"""
ONE = """
print(run(lora(q, rank: 2, alpha: 4.0, seed: 3), 2, 2, "one/qlora", 0.01))
print(epoch(lora(q, rank: 2, alpha: 4.0, seed: 3), 2, "one/qlora_epoch", 0.01))
print(run(low_rank(), 2, 2, "one/lora", 0.01))
print(run(full(m), 2, 2, "one/full", 0.001))
print(run(full(m), 1, 2, "one/full_first", 0.001))
print(epoch(low_rank(), 2, "one/lora_epoch", 0.01))
print(epoch(full(m), 2, "one/full_epoch", 0.0001))
"""
TWO = """
print(run(lora(q, rank: 2, alpha: 4.0, seed: 3), 2, 1, "two/qlora", 0.01))
print(run(low_rank(), 2, 1, "two/lora", 0.01))
print(run(low_rank(), 1, 1, "two/lora_first", 0.01))
print(run(resume("two/lora_first", model: m), 2, 1, "two/lora_cont", 0.01))
print(run(full(m), 2, 1, "two/full", 0.001))
print(run(full(m), 1, 1, "two/full_first", 0.001))
print(run(resume("two/full_first", model: m), 2, 1, "two/full_cont", 0.001))
print(run(resume("one/full_first", model: m), 2, 1, "two/full_from_one", 0.001))
let again = full(m)
print(run(again, 1, 1, "two/full_again", 0.001))
print(run(again, 2, 1, "two/full_again", 0.001))
let full_memory = memory(full(m), p)
print("memory: trainable=${full_memory.trainable} optimizer=${full_memory.optimizer}")
print(epoch(low_rank(), 1, "two/lora_epoch", 0.01))
print(epoch(full(m), 1, "two/full_epoch", 0.0001))
"""
# The same QLoRA runs on 2 ranks with the NF4 base sharded by rank (ANER_SHARD_BASE=1): with its
# activations kept and checkpointed, over an epoch whose last share is empty on rank 1, then an
# evaluation after `train` (the base whole again) and the memory report of rank 0
SHARDED = """
print(run(lora(q, rank: 2, alpha: 4.0, seed: 3), 2, 1, "shard/qlora", 0.01))
let c = profile(precision: float32, optimizer: adamw, kernel: host_tiled, activations: checkpoint)
let a = lora(q, rank: 2, alpha: 4.0, seed: 3)
print(train(a, data, c, steps: 2, micro_batch: 1, accumulation: 2, learning_rate: 0.01,
            weight_decay: 0.01, clip_norm: 0.5, seed: 5, checkpoints: "shard/qlora_checkpointed",
            checkpoint_every: 1))
print(epoch(lora(q, rank: 2, alpha: 4.0, seed: 3), 1, "shard/qlora_epoch", 0.01))
print("after: ${evaluate(a, data).loss}")
let lora_memory = memory(lora(q, rank: 2, alpha: 4.0, seed: 3), p)
print("memory: packed_base=${lora_memory.packed_base}")
"""
AFTER = """
print(run(resume("two/lora_first", model: m), 2, 2, "one/lora_from_two", 0.01))
print(run(resume("two/full_first", model: m), 2, 2, "one/full_from_two", 0.001))
"""


def _script(folder: Path, name: str, gguf: Path, device: str, body: str) -> str:
    path = folder / name
    path.write_text(SETUP.format(gguf=gguf, device=device) + body, encoding="utf-8")
    return str(path)


@pytest.fixture(scope="module", params=["cpu", pytest.param("cuda", marks=pytest.mark.cuda)])
def runs(
    request: pytest.FixtureRequest,
    tiny_bytes_gguf: Path,
    tmp_path_factory: pytest.TempPathFactory,
) -> tuple[Path, str]:
    """The folder holding every run's checkpoints, and the 2-rank launch's stdout: on the CPU
    over gloo, and on 2 GPUs over NCCL where there are 2."""
    device = request.param
    if device == "cuda" and torch.cuda.device_count() < 2:
        pytest.skip("needs 2 CUDA GPUs")
    folder = tmp_path_factory.mktemp(f"distributed-{device}")
    assert aner(["run", _script(folder, "one.aner", tiny_bytes_gguf, device, ONE)]) == 0
    stdout = _two_ranks(_script(folder, "two.aner", tiny_bytes_gguf, device, TWO))
    assert aner(["run", _script(folder, "after.aner", tiny_bytes_gguf, device, AFTER)]) == 0
    return folder, stdout


def _two_ranks(script: str, **env: str) -> str:
    """`aner run --nproc 2 SCRIPT` in the script's folder (its cache there too); its stdout."""
    folder = Path(script).parent
    proc = subprocess.run(
        [sys.executable, "-m", "aner_lang.cli", "run", "--nproc", "2", Path(script).name],
        cwd=folder,
        capture_output=True,
        text=True,
        env={**os.environ, "ANER_CACHE_DIR": str(folder / "cache"), **env},
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    return proc.stdout


@pytest.fixture(scope="module")
def sharded(runs: tuple[Path, str], tiny_bytes_gguf: Path) -> str:
    """The 2-rank launch of `SHARDED` beside `runs`' folder; its stdout."""
    folder, _ = runs
    device = "cuda" if "cuda" in folder.name else "cpu"
    script = _script(folder, "shard.aner", tiny_bytes_gguf, device, SHARDED)
    return _two_ranks(script, ANER_SHARD_BASE="1")


def _assert_same(a: Path, b: Path, exact: bool) -> None:
    x, y = checkpoint.load(a), checkpoint.load(b)
    assert x.updates == y.updates == 2
    assert set(x.tensors) == set(y.tensors)
    assert any(k.startswith("optim/exp_avg_sq/") for k in x.tensors)
    for key, t in x.tensors.items():
        if exact:
            assert torch.equal(t, y.tensors[key]), key
        else:
            torch.testing.assert_close(t, y.tensors[key], msg=key)
    cx, cy = x.meta["counters"], y.meta["counters"]
    assert cx["scored_tokens"] == cy["scored_tokens"] > 0
    assert x.meta["data"] == y.meta["data"]
    if exact:
        assert x.meta == y.meta
    else:
        losses = [torch.tensor(c["loss_history"], dtype=torch.float32) for c in (cx, cy)]
        torch.testing.assert_close(*losses)  # fp32 tolerance: the losses are fp32 sums


def _moved(folder: Path) -> None:
    """The run trained: its adapter differs from the first checkpoint's initial values."""
    state = checkpoint.load(folder)
    assert any(
        t.abs().sum() > 0 for k, t in state.tensors.items() if k.startswith("optim/exp_avg/")
    )


@pytest.mark.slow
@pytest.mark.parametrize("method", ["lora", "qlora"])
def test_data_parallel_lora_equals_one_process_with_the_combined_batch(runs, method):
    """On a float32 base and on the NF4 base (replicated on every rank)."""
    folder, _ = runs
    _moved(folder / "two" / method)
    _assert_same(folder / "two" / method, folder / "one" / method, exact=False)


@pytest.mark.slow
@pytest.mark.parametrize("method", ["lora", "full"])
def test_an_epoch_with_a_short_last_window_equals_one_process(runs, method):
    """`epochs`, `shuffle: false`, a last micro-step with fewer examples than ranks (an empty
    share: skipped by data parallel, a placeholder with nothing scored under FSDP), validation
    and the best checkpoint, which rank 0 writes."""
    folder, _ = runs
    two, one = folder / "two" / f"{method}_epoch", folder / "one" / f"{method}_epoch"
    _assert_same(two, one, exact=False)
    best_two, best_one = checkpoint.load(two / "best"), checkpoint.load(one / "best")
    assert best_two.updates == best_one.updates
    history = best_two.meta["counters"]["validation_history"]
    assert len(history) == best_two.updates


@pytest.mark.slow
def test_fsdp_full_fine_tuning_equals_one_process(runs):
    folder, _ = runs
    _moved(folder / "two" / "full")
    _assert_same(folder / "two" / "full", folder / "one" / "full", exact=False)


@pytest.mark.slow
@pytest.mark.parametrize("run", ["lora_cont", "full_cont", "full_again"])
def test_one_update_then_one_more_on_two_ranks_is_bit_exact(runs, run):
    """Through a checkpoint and `resume` (`_cont`), or in memory: a second `train` of the same
    adapter, whose state holds only their parts on ranks other than 0 (`full_again`)."""
    folder, _ = runs
    _assert_same(folder / "two" / run, folder / "two" / run.split("_")[0], exact=True)


@pytest.mark.slow
@pytest.mark.parametrize("method", ["lora", "full"])
def test_a_two_rank_checkpoint_continues_in_one_process(runs, method):
    folder, _ = runs
    _assert_same(folder / "one" / f"{method}_from_two", folder / "two" / method, exact=False)


@pytest.mark.slow
def test_a_one_process_checkpoint_continues_on_two_ranks(runs):
    folder, _ = runs
    _assert_same(folder / "two" / "full_from_one", folder / "one" / "full", exact=False)


@pytest.mark.slow
def test_only_rank_zero_prints_and_logs(runs):
    folder, stdout = runs
    assert stdout.count("Run(2 updates") == 9 and stdout.count("Run(1 updates") == 3
    events = (folder / "two" / "full" / "events.jsonl").read_text().splitlines()
    assert len(events) == 4 and '"world_size": 2' in events[0]  # start, 2 updates, end
    assert '"updates_per_epoch": 1' in events[0] and '"event": "end"' in events[-1]
    assert "FSDP" in events[0]  # CUDA graphs off: the step communicates


@pytest.mark.slow
def test_memory_reports_rank_zeros_share_of_a_sharded_full(runs, tiny_bytes_gguf):
    """Rank 0 of 2 holds the first ceil(rows / 2) rows of every master and of its moments."""
    from aner_lang.runtime.adapters import full
    from aner_lang.runtime.load.loader import load_model

    _, stdout = runs
    whole = full(load_model(tiny_bytes_gguf, storage="float32", device="cpu"))  # shapes only
    share = sum(-(-t.shape[0] // 2) * t[0].numel() for t in whole.params.values())
    assert share < whole.trainable_count
    line = next(x for x in stdout.splitlines() if x.startswith("memory: "))
    assert line == f"memory: trainable={4 * share} optimizer={8 * share}", line


@pytest.mark.slow
def test_a_sharded_nf4_base_trains_the_same_bits_as_a_replicated_one(runs, sharded):
    """The gathered bytes are the base's own: 2 ranks with the base sharded give exactly what 2
    ranks with it replicated give, with activations kept or checkpointed (recomputation inside a
    layer's backward finds the layer gathered)."""
    folder, _ = runs
    _moved(folder / "shard" / "qlora")
    _assert_same(folder / "shard" / "qlora", folder / "two" / "qlora", exact=True)
    checkpointed = checkpoint.load(folder / "shard" / "qlora_checkpointed")
    kept = checkpoint.load(folder / "two" / "qlora")
    assert checkpointed.meta["profile"]["activations"] == "checkpoint"
    assert checkpointed.tensors.keys() == kept.tensors.keys()
    assert all(torch.equal(t, kept.tensors[k]) for k, t in checkpointed.tensors.items())
    _assert_same(folder / "shard" / "qlora_epoch", folder / "one" / "qlora_epoch", exact=False)
    events = (folder / "shard" / "qlora" / "events.jsonl").read_text().splitlines()
    assert "sharded NF4 base" in events[0]  # CUDA graphs off: the step communicates


@pytest.mark.slow
def test_memory_reports_rank_zeros_share_of_a_sharded_nf4_base(runs, sharded, tiny_bytes_gguf):
    """Rank 0 keeps ceil(bytes / 2) of each decoder layer's packed NF4 bytes (plus what lies
    outside the layers), and after `train` the base is whole again (evaluation runs)."""
    from aner_lang.runtime.io.world import World
    from aner_lang.runtime.load.loader import load_model
    from aner_lang.runtime.train.distributed.base_shards import bytes_not_held
    from aner_lang.runtime.train.memory import base_bytes

    module = load_model(tiny_bytes_gguf, storage="nf4_double_quant", device="cpu").module
    whole = base_bytes(module)[1]
    share = whole - bytes_not_held(module, World(0, 2))
    assert share < whole * 0.6
    line = next(x for x in sharded.splitlines() if x.startswith("memory: "))
    assert line == f"memory: packed_base={share}", line
    assert any(x.startswith("after: ") for x in sharded.splitlines())


def test_the_layout_of_a_layers_bytes_is_aligned_and_splits_evenly(tiny_bytes_gguf):
    from aner_lang.runtime.load.loader import load_model
    from aner_lang.runtime.train.distributed.base_shards import _tensors, layout

    layer = load_model(tiny_bytes_gguf, storage="nf4_double_quant", device="cpu").module.layers[0]
    sizes = [t.numel() * t.element_size() for *_, t in _tensors(layer)]
    for ranks in (1, 2, 3, 8):
        offsets, size = layout(layer, ranks)
        assert size % ranks == 0 and all(o % 16 == 0 for o in offsets)
        ends = [o + n for o, n in zip(offsets, sizes)]
        assert all(e <= o for e, o in zip(ends, offsets[1:])) and ends[-1] <= size


def test_gradient_buckets_keep_order_and_split_by_size_and_dtype():
    from aner_lang.runtime.train.distributed.buckets import buckets

    a, b, c = torch.zeros(10), torch.zeros(10), torch.zeros(30)
    h = torch.zeros(4, dtype=torch.float16)
    groups = buckets([a, h, b, c], limit=80)
    assert [[id(t) for t in g] for g in groups] == [[id(a), id(b)], [id(c)], [id(h)]]


@pytest.mark.parametrize("n", [0, 1, 3, 4, 7, 8])
@pytest.mark.parametrize("size", [1, 2, 3, 4])
def test_the_shares_of_a_micro_step_are_consecutive_near_equal_and_whole(n, size):
    """`micro_batch * size` examples (or fewer at an epoch's end) split into one consecutive share
    a rank, differing in length by at most one; `k * size` examples give every rank `k`."""
    from aner_lang.runtime.io.world import World
    from aner_lang.runtime.train.distributed import Parallel

    drawn = list(range(n))
    shares = [Parallel(None, None, World(r, size)).share(drawn) for r in range(size)]
    assert [i for share in shares for i in share] == drawn
    assert max(map(len, shares)) - min(map(len, shares)) <= 1
    if n % size == 0:
        assert all(len(share) == n // size for share in shares)


@pytest.mark.parametrize("rows", [1, 5, 8, 9])
@pytest.mark.parametrize("size", [1, 2, 3, 4])
def test_a_ranks_rows_are_fsdp2s_chunk(rows, size):
    """`local_part` cuts what `torch.chunk` (FSDP2's sharding) gives each rank, empty past the
    last chunk, and the parts of all ranks make the whole."""
    from aner_lang.runtime.io.world import World
    from aner_lang.runtime.train.distributed.fsdp import local_part

    whole = torch.arange(rows * 3, dtype=torch.float32).reshape(rows, 3)
    chunks = torch.chunk(whole, size, dim=0)
    parts = [local_part(whole, World(r, size)) for r in range(size)]
    for r, part in enumerate(parts):
        expected = chunks[r] if r < len(chunks) else whole[:0]
        assert torch.equal(part, expected)
    assert torch.equal(torch.cat(parts), whole)


@pytest.mark.parametrize(
    "env", [{"RANK": "2", "WORLD_SIZE": "2"}, {"RANK": "x", "WORLD_SIZE": "2"}]
)
def test_a_rank_outside_its_world_is_a_clear_error(monkeypatch, env):
    from aner_lang.problems.errors import AnerRuntimeError
    from aner_lang.runtime.io.world import world

    for k, v in env.items():
        monkeypatch.setenv(k, v)
    with pytest.raises(AnerRuntimeError) as e:
        world()
    assert e.value.code == "E-DIST-ENV"


def test_nproc_usage_errors(monkeypatch, tmp_path, capsys):
    script = tmp_path / "s.aner"
    script.write_text('print("hi")\n', encoding="utf-8")
    assert aner(["run", "--nproc", "0", str(script)]) == 2
    monkeypatch.setenv("WORLD_SIZE", "2")
    assert aner(["run", "--nproc", "2", str(script)]) == 2
    assert "WORLD_SIZE" in capsys.readouterr().err


def test_ranks_other_than_zero_neither_print_nor_write(monkeypatch, tmp_path, capsys):
    script = tmp_path / "s.aner"
    script.write_text('print("hi")\nwrite_json("out.json", [1])\n', encoding="utf-8")
    monkeypatch.setenv("RANK", "1")
    assert aner(["run", str(script)]) == 0
    assert capsys.readouterr().out == "" and not (tmp_path / "out.json").exists()
    monkeypatch.setenv("RANK", "0")
    assert aner(["run", str(script)]) == 0
    assert capsys.readouterr().out == "hi\n" and (tmp_path / "out.json").exists()


def test_a_sharded_base_gathers_a_layer_only_around_its_use(tiny_bytes_gguf, tmp_path):
    """In one process (a gloo world of one): no layer is gathered between uses, at most two
    during the backward (the one computing and the one above, freed when the gradient reaches
    the layer below), none after it; the loss and gradients are the replicated base's bits, and
    `restore` leaves every layer whole with the hooks gone."""
    import torch.distributed as dist

    from aner_lang.runtime.adapters import lora
    from aner_lang.runtime.io.world import World
    from aner_lang.runtime.load.loader import load_model
    from aner_lang.runtime.train.distributed.base_shards import ShardedBase

    model = load_model(tiny_bytes_gguf, storage="nf4_double_quant", device="cpu")
    adapter = lora(model, rank=2, alpha=4.0, seed=3)
    ids = torch.randint(3, 200, (1, 12))

    def loss_and_grads() -> tuple[torch.Tensor, list[torch.Tensor]]:
        for p in adapter.params.values():
            p.grad = None
        loss = adapter.loss(ids, ids)
        loss.backward()
        return loss.detach(), [p.grad.clone() for p in adapter.params.values()]

    expected = loss_and_grads()
    dist.init_process_group(
        "gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1
    )
    try:
        sharded = ShardedBase(model.module, World(0, 1))
        gathered = lambda: sum(layer.gathered for layer in sharded.layers)  # noqa: E731
        most = []
        original = sharded._pre_backward

        def watched(i, grad):  # type: ignore[no-untyped-def]
            original(i, grad)
            most.append(gathered())

        assert all(layer.flat.untyped_storage().nbytes() == 0 for layer in sharded.layers)
        sharded._pre_backward = watched  # type: ignore[method-assign]
        got = loss_and_grads()
        assert most and max(most) <= 2 and gathered() == 0
        assert torch.equal(got[0], expected[0])
        assert all(torch.equal(a, b) for a, b in zip(got[1], expected[1]))
        with torch.no_grad():
            adapter.loss(ids, ids)
        assert gathered() == 0
        sharded.restore()
        assert gathered() == len(sharded.layers) and not sharded.handles
        assert torch.equal(adapter.loss(ids, ids).detach(), expected[0])
    finally:
        dist.destroy_process_group()


def test_sharding_a_floating_point_base_is_refused(tiny_bytes_gguf):
    from aner_lang.problems.errors import AnerRuntimeError
    from aner_lang.runtime.io.world import World
    from aner_lang.runtime.load.loader import load_model
    from aner_lang.runtime.train.distributed.base_shards import ShardedBase

    module = load_model(tiny_bytes_gguf, storage="float32", device="cpu").module
    with pytest.raises(AnerRuntimeError) as raised:
        ShardedBase(module, World(0, 2))
    assert raised.value.code == "E-DIST-SHARD"
