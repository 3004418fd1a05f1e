"""Runs you can watch and steer: epochs and shuffling, the event log's fields, progress without a
terminal, TensorBoard files, the best checkpoint, early stopping, and resuming all of it exactly."""

from __future__ import annotations

import io
import json
import re
from datetime import datetime

import pytest
import torch

from aner_lang.problems.errors import AnerRuntimeError
from aner_lang.runtime import adapters as A
from aner_lang.runtime.tasks.data import from_texts
from aner_lang.runtime.tasks.dataset_ops import pack
from aner_lang.runtime.train import checkpoint, watch
from aner_lang.runtime.train.order import Cursor, updates_per_epoch
from aner_lang.runtime.train.profile import Profile
from aner_lang.runtime.train.trainer import train

TEXTS = [f"example number {i} says something about the number {i}" for i in range(7)]
HELD_OUT = ["a held-out sentence about something else entirely"]


def _adapter(model, seed=1):
    return A.lora(model, rank=2, alpha=4.0, targets=["q_proj", "v_proj"], seed=seed)


def test_cursor_windows_stay_inside_an_epoch():
    c = Cursor(5, seed=0, shuffle=False)
    windows = [c.window(2, 2) for _ in range(4)]
    assert windows == [[[0, 1], [2, 3]], [[4]], [[0, 1], [2, 3]], [[4]]]
    assert c.epochs == 2.0 and updates_per_epoch(5, 2, 2) == 2
    shuffled = Cursor(5, seed=0)
    first, second = shuffled.window(5, 1), shuffled.window(5, 1)
    assert sorted(first[0]) == sorted(second[0]) == [0, 1, 2, 3, 4] and first != second


def test_epochs_set_the_length_and_events_carry_what_to_watch(tiny_model, tmp_path):
    data = from_texts(TEXTS, context=24)
    log = tmp_path / "run.jsonl"
    run = train(
        _adapter(tiny_model),
        data,
        Profile(),
        steps=None,
        epochs=1.5,
        micro_batch=2,
        accumulation=2,
        learning_rate=1e-2,
        validation=from_texts(HELD_OUT, context=24),
        eval_every=2,
        log=str(log),
    )
    per_epoch = updates_per_epoch(7, 2, 2)  # 2 windows: 4 examples, then 3
    assert run.updates == 3 == -(-3 * per_epoch // 2) and run.epochs == pytest.approx(1 + 4 / 7)
    events = [json.loads(line) for line in log.read_text().splitlines()]
    assert [e["event"] for e in events] == ["start", "update", "update", "update", "end"]
    for e in events:
        assert datetime.fromisoformat(e["time"].replace("Z", "+00:00")).utcoffset().seconds == 0
    start, *updates, end = events
    assert start["tokens_per_update"] == 2 * 2 * 24 and start["updates_per_epoch"] == 2
    assert start["examples"] == 7
    # the start event says what the process's first seconds held: the fixture's load among them
    before = start["before_start"]
    assert 0 < before["load_model"] < before["seconds"] <= end["startup_seconds"]
    assert 0 < before["train_setup"] < before["seconds"]
    assert [u["update"] for u in updates] == [1, 2, 3]
    assert [u["epoch"] for u in updates] == pytest.approx([4 / 7, 1.0, 1 + 4 / 7])
    for u in updates:
        assert u["tokens_per_second"] > 0 and u["learning_rate"] == 1e-2
        assert u["grad_norm"] > 0 and u["loss_scale"] == 1.0 and not u["skipped"]
        assert u["scored_tokens"] < u["tokens"] <= start["tokens_per_update"]
    assert [("validation_loss" in u) for u in updates] == [True, True, True]
    assert end["stopped"] == "done" and end["best_update"] == run.best_update
    # start-up (the process so far, up to the first update's end) apart from the throughput of
    # the later updates, which counts their tokens only
    assert end["startup_seconds"] > 0 and end["training_tokens_per_second"] > 0
    tokens = [u["tokens"] for u in updates[1:]]
    per_update = [t / u["tokens_per_second"] for t, u in zip(tokens, updates[1:], strict=True)]
    assert end["training_tokens_per_second"] == pytest.approx(sum(tokens) / sum(per_update))
    assert run.training_tokens_per_second == end["training_tokens_per_second"]  # the same figure


def test_events_say_how_long_the_loop_paused_to_validate_and_checkpoint(tiny_model, tmp_path):
    """`validation_seconds` where an update validated; `checkpoint_seconds` where the loop took a
    checkpoint's snapshot and handed it to the background writer (a new best, or one due)."""
    log = tmp_path / "run.jsonl"
    run = train(
        _adapter(tiny_model),
        from_texts(TEXTS, context=24),
        Profile(),
        steps=5,
        learning_rate=1e-2,
        validation=from_texts(HELD_OUT, context=24),
        eval_every=3,
        checkpoints=str(tmp_path / "ckpt"),
        checkpoint_every=2,
        log=str(log),
    )
    updates = [json.loads(line) for line in log.read_text().splitlines()][1:-1]
    validated = [u["update"] for u in updates if "validation_loss" in u]
    assert validated == [1, 3, 5] == [u["update"] for u in updates if "validation_seconds" in u]
    best, lowest = set(), float("inf")  # the updates whose validation was a new best
    for u in updates:
        if u.get("validation_loss", lowest) < lowest:
            best.add(u["update"])
            lowest = u["validation_loss"]
    paused = [u["update"] for u in updates if "checkpoint_seconds" in u]
    assert paused == sorted(best | {2, 4, 5})
    assert all(u["checkpoint_seconds"] > 0 for u in updates if "checkpoint_seconds" in u)
    assert all(
        0 < u["snapshot_seconds"] <= u["checkpoint_seconds"]
        for u in updates
        if "checkpoint_seconds" in u
    )
    assert all(u["validation_seconds"] > 0 for u in updates if "validation_seconds" in u)
    assert run.updates == 5 and checkpoint.has_checkpoint(tmp_path / "ckpt")


def test_steps_or_epochs_not_both(tiny_model):
    with pytest.raises(AnerRuntimeError, match="steps or epochs, not both"):
        train(_adapter(tiny_model), from_texts(TEXTS, 16), Profile(), steps=2, epochs=1.0)
    with pytest.raises(AnerRuntimeError, match="patience stops on the validation loss"):
        train(_adapter(tiny_model), from_texts(TEXTS, 16), Profile(), steps=2, patience=2)


def test_progress_lines_without_a_terminal():
    out = io.StringIO()
    now = [0.0]
    progress = watch.Progress(10, 0, stream=out, clock=lambda: now[0])
    event = {
        "epoch": 0.5,
        "loss": 2.5,
        "learning_rate": 1e-3,
        "tokens_per_second": 1234.0,
    }
    for update, t in [(1, 1.0), (2, 5.0), (3, 11.5), (4, 12.0), (5, 21.6)]:
        now[0] = t
        progress.update(
            {**event, "update": update, "validation_loss": 3.0 if update == 5 else None}
        )
    progress.close("train: done")
    lines = out.getvalue().splitlines()
    assert [line.split(",")[0] for line in lines[:-1]] == [
        "train: update 1/10 (10%)",
        "train: update 3/10 (30%)",
        "train: update 5/10 (50%)",
    ]
    assert lines[0] == (
        "train: update 1/10 (10%), epoch 0.50, loss 2.5000, lr 1.00e-03, 1234 tokens/s, "
        "elapsed 0:00:01, ~0:00:09 left"
    )
    assert "validation 3.0000" in lines[2] and lines[-1] == "train: done"


def test_train_prints_progress_and_a_summary_to_stderr(tiny_model, capsys):
    run = train(_adapter(tiny_model), from_texts(TEXTS, 16), Profile(), steps=2)
    err = capsys.readouterr().err.splitlines()
    assert err[0].startswith("train: update 1/2 (50%), epoch 0.14, loss ")
    assert err[-1].startswith("train: 2/2 updates in 0:00:") and f"{run.final_loss:.4f}" in err[-1]
    assert re.search(r", start-up \d+\.\d s, \d+ tokens/s training, \d+ tokens/s overall$", err[-1])


def test_tensorboard_files(tiny_model, tmp_path):
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    train(
        _adapter(tiny_model),
        from_texts(TEXTS, 16),
        Profile(),
        steps=3,
        validation=from_texts(HELD_OUT, 16),
        log_dir=str(tmp_path / "tb"),
    )
    acc = EventAccumulator(str(tmp_path / "tb"))
    acc.Reload()
    tags = set(acc.Tags()["scalars"])
    assert {"train/loss", "train/learning_rate", "train/grad_norm", "validation/loss"} <= tags
    assert [s.step for s in acc.Scalars("train/loss")] == [1, 2, 3]
    assert [s.step for s in acc.Scalars("validation/loss")] == [1, 3]


def test_best_checkpoint_and_early_stopping(tiny_model, tmp_path):
    data = from_texts(TEXTS, 16)
    held = from_texts(HELD_OUT, 16)
    opts = {"learning_rate": 0.3, "validation": held, "eval_every": 1, "seed": 4, "clip_norm": None}
    a = _adapter(tiny_model)
    run = train(a, data, Profile(), steps=30, patience=2, checkpoints=str(tmp_path / "c"), **opts)
    history = run.validation_history
    assert run.stopped_early and run.updates < 30
    best = min(history, key=lambda h: h[1])
    assert (run.best_update, run.best_validation_loss) == best
    assert [v for _, v in history[-2:]] >= [best[1]] * 2  # two validations without a new best
    assert checkpoint.load(tmp_path / "c" / "best").updates == best[0]
    assert checkpoint.load(tmp_path / "c").updates == run.updates
    again = A.adapter_from_state(tiny_model, a.state)  # a resumed run stays stopped
    assert train(again, data, Profile(), steps=30, patience=2, **opts).updates == run.updates


def test_epochs_packing_and_file_order_resume_exactly(tiny_model):
    data = pack(from_texts(TEXTS, 40))
    opts = {
        "steps": None,
        "epochs": 3.0,
        "shuffle": False,
        "micro_batch": 1,
        "learning_rate": 1e-2,
        "seed": 5,
    }
    straight = _adapter(tiny_model)
    whole = train(straight, data, Profile(), **opts)
    assert whole.updates == 3 * len(data.examples(tiny_model.tokenizer))
    half = _adapter(tiny_model)
    train(half, data, Profile(), **{**opts, "epochs": None, "steps": whole.updates // 2 + 1})
    resumed = A.adapter_from_state(tiny_model, half.state)
    train(resumed, data, Profile(), **opts)
    a, b = straight.state.to_tensors(), resumed.state.to_tensors()
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    assert straight.state.to_json()["counters"] == resumed.state.to_json()["counters"]
    assert straight.state.to_json()["data"] == resumed.state.to_json()["data"]
