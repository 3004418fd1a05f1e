"""Checkpoints written in the background: the file format is safetensors' own byte for byte, the
loop goes on while a checkpoint is written, `best` is a second name for the checkpoint's files,
a failed write is an Aner error at the end of `train`, and no writer thread outlives `train`."""

from __future__ import annotations

import io
import os
import threading

import pytest
import torch
from safetensors.torch import save as st_save

from aner_lang.problems.errors import AnerRuntimeError
from aner_lang.runtime import adapters as A
from aner_lang.runtime.io.tensor_file import _DTYPES, TensorFile
from aner_lang.runtime.tasks.data import from_texts
from aner_lang.runtime.train import checkpoint, trainer
from aner_lang.runtime.train.checkpoint_writer import Submitted
from aner_lang.runtime.train.profile import Profile
from aner_lang.runtime.train.state import TrainState
from aner_lang.runtime.train.trainer import train

TEXTS = [f"example number {i} says something about the number {i}" for i in range(5)]


def _adapter(model):
    return A.lora(model, rank=2, alpha=4.0, targets=["q_proj", "v_proj"], seed=1)


def _writer_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == "aner-checkpoint"]


def test_tensor_file_is_the_bytes_safetensors_writes():
    g = torch.Generator().manual_seed(0)
    tensors = {}
    for i, dtype in enumerate(_DTYPES):  # every dtype, two names each, in no particular order
        for name in ("z", "a"):
            values = torch.randint(0, 3, (2, i + 1), generator=g)
            tensors[f"{name}{i}"] = values.to(dtype)
    tensors["scalar"] = torch.tensor(2.5)
    tensors["empty"] = torch.zeros(0, 3)
    tensors["rng"] = torch.Generator().manual_seed(3).get_state()
    out = io.BytesIO()
    written = TensorFile(tensors)
    written.write(out)
    expected = st_save(tensors)
    assert out.getvalue() == expected and written.size == len(expected)


def test_the_loop_runs_on_while_a_checkpoint_is_written(tiny_model, tmp_path, monkeypatch):
    """The first checkpoint's write waits until update 3 has run: were the loop waiting for the
    write, update 3 would never come."""
    update_three = threading.Event()
    waited: list[bool] = []
    save, update = checkpoint.save, trainer._Loop.update

    def slow_save(directory, state, **kwargs):
        if not waited:
            waited.append(update_three.wait(timeout=120))
        return save(directory, state, **kwargs)

    def counting_update(loop, ahead=False):
        event = update(loop, ahead)
        if loop.counters.updates == 3:
            update_three.set()
        return event

    monkeypatch.setattr(checkpoint, "save", slow_save)
    monkeypatch.setattr(trainer._Loop, "update", counting_update)
    a = _adapter(tiny_model)
    train(
        a,
        from_texts(TEXTS, 16),
        Profile(),
        steps=4,
        checkpoints=str(tmp_path / "c"),
        checkpoint_every=2,
    )
    assert waited == [True]
    ck = checkpoint.load(tmp_path / "c")
    assert ck.updates == 4 and not _writer_threads()
    for key, t in a.state.to_tensors().items():
        assert torch.equal(ck.tensors[key], t), key


def test_a_checkpoint_replaces_one_the_disk_has_not_begun_and_the_loop_never_waits(
    tiny_model, tmp_path, monkeypatch, capsys
):
    """The first write is held until the fourth checkpoint has been handed over (a disk still
    flushing): the checkpoints of updates 2 and 3, still waiting for it, are each replaced by the
    next one instead of holding the loop, the events say so, one warning says why, and the
    latest checkpoint is the last update's."""
    import json

    from aner_lang.runtime.train.checkpoint_writer import CheckpointWriter

    fourth = threading.Event()
    saved: list[int] = []
    save, submit = checkpoint.save, CheckpointWriter.submit

    def slow_save(directory, state, **kwargs):
        if state.updates == 1:
            assert fourth.wait(timeout=120)
        saved.append(state.updates)
        return save(directory, state, **kwargs)

    def counting_submit(writer, directory, state, best):
        submitted = submit(writer, directory, state, best)
        if state.updates == 4:
            fourth.set()
        return submitted

    monkeypatch.setattr(checkpoint, "save", slow_save)
    monkeypatch.setattr(CheckpointWriter, "submit", counting_submit)
    log = tmp_path / "run.jsonl"
    train(_adapter(tiny_model), from_texts(TEXTS, 16), Profile(), steps=4,
          checkpoints=str(tmp_path / "c"), checkpoint_every=1, log=str(log))  # fmt: skip
    updates = [json.loads(line) for line in log.read_text().splitlines()][1:-1]
    assert [u.get("checkpoint_replaced") for u in updates] == [None, None, 2, 3]
    assert not any("checkpoint_wait_seconds" in u for u in updates)
    assert saved == [1, 4] and checkpoint.load(tmp_path / "c").updates == 4
    assert not _writer_threads()
    warnings = [line for line in capsys.readouterr().err.splitlines() if "warning" in line]
    assert len(warnings) == 1
    assert "update 3 replaced the one of update 2" in warnings[0]
    assert "checkpoint_every" in warnings[0]


def _held_writer(monkeypatch, tmp_path):
    """A writer whose first write lasts until the returned event is set, and the list of what
    it wrote: update numbers, and ("best", update) for a best copy."""
    from aner_lang.runtime.train.checkpoint_writer import CheckpointWriter

    gate = threading.Event()
    written: list[object] = []

    def save(directory, state, keep=1):
        if state.updates == 1:
            assert gate.wait(timeout=120)
        written.append(state.updates)
        return tmp_path / str(state.updates)

    monkeypatch.setattr(checkpoint, "save", save)
    monkeypatch.setattr(
        checkpoint, "publish_copy", lambda best, f: written.append(("best", f.name))
    )
    return CheckpointWriter(lambda written: None), gate, written


def _state(updates: int) -> TrainState:
    return TrainState({}, {"counters": {"updates": updates}})


@pytest.mark.parametrize(
    "second, third",
    [((True, True), (True, False)), ((True, False), (False, True))],
    ids=["best-by-latest", "latest-by-best-only"],
)
def test_a_waiting_checkpoint_is_replaced_only_by_one_that_takes_each_of_its_roles(
    tmp_path, monkeypatch, second, third
):
    """A waiting checkpoint that is the run's best is never given up for one that is not, nor
    a waiting latest one for a best-only one (which would not move the latest): the loop waits
    for the oldest write instead. A newer best replaces a waiting best."""
    writer, gate, written = _held_writer(monkeypatch, tmp_path)
    best = tmp_path / "best"

    def roles(latest_and_best):
        latest, is_best = latest_and_best
        return (tmp_path if latest else None), (best if is_best else None)

    assert writer.submit(tmp_path, _state(1), None) == Submitted(0.0, None)
    directory, best_dir = roles(second)
    assert writer.submit(directory, _state(2), best_dir) == Submitted(0.0, None)
    threading.Timer(0.3, gate.set).start()
    directory, best_dir = roles(third)
    submitted = writer.submit(directory, _state(3), best_dir)
    assert submitted.replaced is None and submitted.waited >= 0.25
    writer.close()
    assert written[:2] == [1, 2] and 3 in written


def test_a_newer_best_replaces_a_waiting_best(tmp_path, monkeypatch):
    writer, gate, written = _held_writer(monkeypatch, tmp_path)
    best = tmp_path / "best"
    writer.submit(tmp_path, _state(1), None)
    writer.submit(None, _state(2), best)
    assert writer.submit(None, _state(3), best) == Submitted(0.0, 2)
    gate.set()
    writer.close()
    assert written == [1, 3] and not _writer_threads()


@pytest.mark.parametrize("every, learning_rate", [(1, 1e-3), (4, 0.3)])
def test_best_is_a_second_name_for_its_checkpoint_files(tiny_model, tmp_path, every, learning_rate):
    """Small steps on the data it validates on improve every update, so the best is the latest
    checkpoint and shares its files; large ones overshoot, so the best comes before the only
    checkpoint (after update 4) and is written on its own."""
    c = tmp_path / "c"
    data = from_texts(TEXTS, 16)
    run = train(
        _adapter(tiny_model),
        data,
        Profile(),
        steps=4,
        learning_rate=learning_rate,
        validation=data,
        eval_every=1,
        checkpoints=str(c),
        checkpoint_every=every,
    )
    latest, best = checkpoint.load(c), checkpoint.load(c / "best")
    assert latest.updates == 4 and best.updates == run.best_update
    shared = [
        os.path.samefile(latest.folder / name, best.folder / name)
        for name in ("tensors.safetensors", "state.json", "manifest.json")
    ]
    assert shared == [run.best_update == 4] * 3
    assert (run.best_update == 4) == (every == 1)


def test_a_failed_write_is_an_aner_error_and_no_thread_is_left(tiny_model, tmp_path, monkeypatch):
    """A write that fails in the background (a full disk) surfaces as E-IO in the training
    thread; a target of the wrong kind is refused before training (test_output_kinds)."""
    from aner_lang.runtime.train import checkpoint

    def full_disk(directory, state, keep=2):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(checkpoint, "save", full_disk)
    with pytest.raises(AnerRuntimeError) as failed:
        train(
            _adapter(tiny_model),
            from_texts(TEXTS, 16),
            Profile(),
            steps=3,
            checkpoints=str(tmp_path / "c"),
            checkpoint_every=1,
            log=str(tmp_path / "e.jsonl"),
        )
    assert failed.value.code == "E-IO" and str(tmp_path / "c") in failed.value.message
    assert not _writer_threads()
