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
from aner_lang.runtime.train.profile import Profile
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

    def counting_update(loop):
        event = update(loop)
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


def test_two_checkpoints_may_wait_for_a_slow_disk_and_a_third_waits_for_them(
    tiny_model, tmp_path, monkeypatch
):
    """The first write is held until update 3 has run: the checkpoint of update 2 is handed over
    without waiting for it (update 3 would never come otherwise), the one of update 3 waits, so
    never more than `PENDING` writes are in flight, and every checkpoint is published in order."""
    from aner_lang.runtime.train.checkpoint_writer import PENDING

    update_three = threading.Event()
    waited: list[bool] = []
    saved: list[int] = []
    in_flight: list[int] = []
    save, update = checkpoint.save, trainer._Loop.update

    def slow_save(directory, state, **kwargs):
        if not waited:
            waited.append(update_three.wait(timeout=120))
        saved.append(state.updates)
        return save(directory, state, **kwargs)

    def counting_update(loop):
        event = update(loop)
        in_flight.append(len(_writer_threads()))
        if loop.counters.updates == 3:
            update_three.set()
        return event

    monkeypatch.setattr(checkpoint, "save", slow_save)
    monkeypatch.setattr(trainer._Loop, "update", counting_update)
    train(_adapter(tiny_model), from_texts(TEXTS, 16), Profile(), steps=5,
          checkpoints=str(tmp_path / "c"), checkpoint_every=1)  # fmt: skip
    assert waited == [True] and saved == [1, 2, 3, 4, 5]
    assert in_flight[2] == PENDING == 2 and max(in_flight) <= PENDING
    assert checkpoint.load(tmp_path / "c").updates == 5 and not _writer_threads()


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


def test_a_checkpoint_that_waits_for_the_disk_says_so_once(
    tiny_model, tmp_path, monkeypatch, capsys
):
    """The first write lasts until the third checkpoint has been handed over, and 0.6 s more (a
    slow disk), with a checkpoint every update: the first two are handed over at once, the third
    waits for the first write, its event says how long, and one warning says that checkpoints
    come faster than the disk writes them."""
    import json
    import time

    from aner_lang.runtime.train.checkpoint_writer import CheckpointWriter

    save, submit = checkpoint.save, CheckpointWriter.submit
    third = threading.Event()
    submitted: list[int] = []

    def slow_save(directory, state, **kwargs):
        if state.updates == 1:
            third.wait(timeout=120)
            time.sleep(0.6)
        return save(directory, state, **kwargs)

    def counting_submit(writer, directory, state, best):
        submitted.append(state.updates)
        if len(submitted) == 3:
            third.set()
        return submit(writer, directory, state, best)

    monkeypatch.setattr(checkpoint, "save", slow_save)
    monkeypatch.setattr(CheckpointWriter, "submit", counting_submit)
    monkeypatch.setattr(trainer, "WAIT_WARNING_SECONDS", 0.5)
    log = tmp_path / "run.jsonl"
    train(_adapter(tiny_model), from_texts(TEXTS, 16), Profile(), steps=4,
          checkpoints=str(tmp_path / "c"), checkpoint_every=1, log=str(log))  # fmt: skip
    updates = [json.loads(line) for line in log.read_text().splitlines()][1:-1]
    waits = [u.get("checkpoint_wait_seconds", 0.0) for u in updates]
    assert waits[:2] == [0.0, 0.0] and 0.5 <= waits[2] < updates[2]["checkpoint_seconds"]
    warnings = [line for line in capsys.readouterr().err.splitlines() if "warning" in line]
    assert len(warnings) == 1
    assert "checkpoint of update 3 waited" in warnings[0] and "checkpoint_every" in warnings[0]
