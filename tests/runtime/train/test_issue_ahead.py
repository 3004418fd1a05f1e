"""An update's window issued ahead (`_Loop.update(ahead=True)`, on by default on one CUDA device):
the run is the same run, bit for bit, with validations and checkpoints in between, and a stop
that comes while a window is issued ahead takes it back, so the saved state and its resumption
are those of a run that never issued it. The CPU runs it here with the choice forced on (its
arithmetic does not depend on where the host is when the device computes)."""

from __future__ import annotations

import weakref
from typing import Any

import pytest
import torch

from aner_lang.problems.errors import RunStopped
from aner_lang.runtime import adapters as A
from aner_lang.runtime.tasks.batches import collate
from aner_lang.runtime.tasks.data import from_texts
from aner_lang.runtime.train import control, trainer
from aner_lang.runtime.train.profile import profile

TEXTS = [
    "Aner makes model adaptation explicit and reproducible.",
    "The quiet mountain lake reflects the clear morning sky.",
    "A typed script says what it trains before it trains.",
    "Checkpoints stay atomic and verified on every write.",
    "Every read is bounded and every error names its line.",
]


def _forced(monkeypatch: pytest.MonkeyPatch, ahead: bool, before_ahead: Any = None) -> list[int]:
    """Issuing ahead forced on or off for the next `train` calls; returns the list of the
    updates whose windows are issued ahead, filled as they are (`before_ahead(loop)`, where
    given, runs as each is issued)."""
    init, update, issue = trainer._Loop.__init__, trainer._Loop.update, trainer._Loop._issue
    issued_ahead: list[int] = []
    entered = [0]  # the updates done when the update in progress began

    def forced(self: Any, *args: Any, **kwargs: Any) -> None:
        init(self, *args, **kwargs)
        self.issues_ahead = ahead

    def entering(self: Any, *args: Any, **kwargs: Any) -> Any:
        entered[0] = self.counters.updates
        return update(self, *args, **kwargs)

    def counted(self: Any, mark: Any) -> Any:
        if self.counters.updates > entered[0]:  # after this update's step: the next one's window
            if before_ahead is not None:
                before_ahead(self)
            issued_ahead.append(self.counters.updates + 1)
        return issue(self, mark)

    monkeypatch.setattr(trainer._Loop, "__init__", forced)
    monkeypatch.setattr(trainer._Loop, "update", entering)
    monkeypatch.setattr(trainer._Loop, "_issue", counted)
    return issued_ahead


def _train(
    adapter: Any,
    monkeypatch: pytest.MonkeyPatch,
    ahead: bool,
    tmp: Any,
    validate: bool = True,
    **options: Any,
) -> tuple[Any, list[int]]:
    """`adapter` trained to 9 updates (validation every 3 where `validate`, a checkpoint every
    4; `options` for `train`) with issuing ahead on or off; the run (or the RunStopped) and the
    updates issued ahead."""
    issued = _forced(monkeypatch, ahead)
    validation = from_texts(TEXTS[:2], context=16) if validate else None
    try:
        run: Any = trainer.train(
            adapter, from_texts(TEXTS, context=16), profile(), steps=9, learning_rate=1e-2,
            seed=4, validation=validation, eval_every=3, checkpoints=str(tmp), checkpoint_every=4,
            **options,
        )  # fmt: skip
    except RunStopped as stopped:
        run = stopped
    finally:
        monkeypatch.undo()
    return run, issued


def _lora(model: Any, dropout: float = 0.0) -> Any:
    return A.lora(model, rank=2, alpha=4.0, dropout=dropout, targets=["q_proj", "v_proj"], seed=3)


def _same_state(a: Any, b: Any) -> None:
    assert a.state.meta["data"] == b.state.meta["data"]
    assert a.state.meta["counters"] == b.state.meta["counters"]
    ta, tb = a.state.tensors, b.state.tensors
    assert ta.keys() == tb.keys()
    for name in ta:
        assert torch.equal(ta[name], tb[name]), name


def test_a_run_that_issues_ahead_is_the_same_run(tiny_model, monkeypatch, tmp_path):
    """Same losses, validations and state; and each window's micro-batch was made during the
    window before (collated once each, the first window's alone when it came)."""
    collated = []

    def counted(*args: Any, **kwargs: Any) -> Any:
        collated.append(1)
        return collate(*args, **kwargs)

    plain, ahead = _lora(tiny_model), _lora(tiny_model)
    monkeypatch.setattr(trainer, "collate", counted)
    plain_run, none = _train(plain, monkeypatch, False, tmp_path / "a")
    assert len(collated) == 9
    monkeypatch.setattr(trainer, "collate", counted)
    ahead_run, issued = _train(ahead, monkeypatch, True, tmp_path / "b")
    assert len(collated) == 9 + 10  # the first, then each next one (a tenth past the end)
    assert none == []
    # updates 1, 3, 6 and 9 validate, 4 and 8 checkpoint: only after 2, 5 and 7 is the next
    # update's window issued ahead
    assert issued == [3, 6, 8]
    assert ahead_run.loss_history == plain_run.loss_history
    assert ahead_run.validation_history == plain_run.validation_history
    assert ahead_run.epochs == plain_run.epochs
    _same_state(plain, ahead)


def test_windows_of_several_micro_batches_across_epochs_issued_ahead(
    tiny_model, monkeypatch, tmp_path
):
    """Two micro-batches of two examples a window, 5 examples: two windows an epoch, so windows
    made ahead begin new epochs (a smaller last window, a new order) and the run is the same."""
    plain, ahead = _lora(tiny_model), _lora(tiny_model)
    options = {"micro_batch": 2, "accumulation": 2}
    plain_run, _ = _train(plain, monkeypatch, False, tmp_path / "a", **options)
    ahead_run, issued = _train(ahead, monkeypatch, True, tmp_path / "b", **options)
    assert issued == [3, 6, 8]
    assert ahead_run.epochs == plain_run.epochs == 4.8
    assert ahead_run.loss_history == plain_run.loss_history
    _same_state(plain, ahead)


@pytest.mark.parametrize("dropout", [0.0, 0.25])
def test_a_stop_takes_back_the_window_issued_ahead(tiny_model, monkeypatch, tmp_path, dropout):
    """Asked to stop while update 3's window is queued ahead of update 2's event: the state
    saved is the one after update 2 (with dropout, the generator's too), as in a run that issues
    nothing ahead, and both go on alike."""
    adapters, runs = {}, {}
    for ahead in (False, True):
        emit = control.RunControl.emit

        def emit_and_ask(self: Any, event: dict[str, Any], emit: Any = emit) -> None:
            emit(self, event)
            if event.get("event") == "update" and event["update"] == 1:
                self.stop_requested = True  # seen at update 2's stop check

        monkeypatch.setattr(control.RunControl, "emit", emit_and_ask)
        adapters[ahead] = adapter = _lora(tiny_model, dropout)
        stopped, issued = _train(adapter, monkeypatch, ahead, tmp_path / str(ahead))
        assert isinstance(stopped, RunStopped), stopped
        assert "after update 2 of 9" in str(stopped)
        assert issued == ([3] if ahead else [])  # issued, then taken back
        assert all(p.grad is None or not p.grad.any() for p in adapter.params.values())
    _same_state(adapters[False], adapters[True])
    for ahead, adapter in adapters.items():  # both go on to the end alike
        runs[ahead], _ = _train(adapter, monkeypatch, ahead, tmp_path / f"on{ahead}", False)
    assert runs[True].loss_history == runs[False].loss_history
    _same_state(adapters[False], adapters[True])


def test_a_window_issued_ahead_finds_the_last_updates_gradients_freed(
    tiny_model, monkeypatch, tmp_path
):
    """Eager steps make new gradients each window: those of the update before must be gone when
    the next window is issued ahead, or they would add an adapter's worth of memory to its peak
    (a long context's eager steps)."""
    last: list[weakref.ref[torch.Tensor]] = []
    checked: list[int] = []

    def freed(loop: Any) -> None:
        assert all(ref() is None for ref in last), "the last update's gradients are held"
        checked.append(loop.counters.updates + 1)

    adapter = _lora(tiny_model)
    issued = _forced(monkeypatch, True, freed)
    issue = trainer._Loop._issue  # the counting one

    def watched(self: Any, mark: Any) -> Any:
        window = issue(self, mark)
        last[:] = [weakref.ref(p.grad) for p in self.adapter.params.values() if p.grad is not None]
        return window

    monkeypatch.setattr(trainer._Loop, "_issue", watched)
    trainer.train(adapter, from_texts(TEXTS, context=16), profile(), steps=4, learning_rate=1e-2)
    monkeypatch.undo()
    assert issued == checked == [2, 3, 4]


def test_each_update_is_timed_with_its_own_windows_issuing(tiny_model, monkeypatch):
    """Issuing a window ahead belongs to the update it is for: its time (an eager window's
    issuing waits for the device once the launch queue fills) counts in that update's
    `tokens_per_second` and the steady rate, not in the update before, whose window the first
    update's exclusion from the steady rate would then hide."""
    import time

    _forced(monkeypatch, True)
    issue = trainer._Loop._issue
    pause = 0.25

    def slow(self: Any, mark: Any) -> Any:
        time.sleep(pause)
        return issue(self, mark)

    monkeypatch.setattr(trainer._Loop, "_issue", slow)
    adapter = A.lora(tiny_model, rank=2, targets=["q_proj"], seed=1)
    run = trainer.train(adapter, from_texts(TEXTS, context=16), profile(), steps=4, seed=4)
    tokens = 3 * 16  # the three updates after the first, a full row of 16 tokens each
    assert run.training_tokens_per_second is not None
    assert tokens / run.training_tokens_per_second >= 3 * pause
