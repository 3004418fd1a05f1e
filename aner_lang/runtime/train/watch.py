"""Watching a run: the JSON-lines event log, TensorBoard scalars, and progress on stderr.

Events (one JSON object a line; `docs/finetuning.md` lists their fields): ``start`` (options,
sizes, profile), one ``update`` per accumulation window, ``end`` (how the run stopped, best
validation). Every event carries ``time``, a UTC timestamp. An update's event is written when the
next one arrives (or at the end), long after its values were computed. A value still on the
device (a preference objective's metrics) is read then, which waits for the work queued so far;
the gradient norm comes to the host before the update's own wait for its loss, so reading it
never waits. With a `log_dir`, the same update values
go to TensorBoard event files (`torch.utils.tensorboard`, which needs the `tensorboard` package).

Progress: on a terminal, a bar that stays on screen at the end; otherwise (a log file, a CI job)
a line at the first update and then every `PROGRESS_SECONDS`. Either way a summary line ends the
run.
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any, TextIO

import torch

from aner_lang.problems.errors import AnerRuntimeError

PROGRESS_SECONDS = 10.0
"""Seconds between progress lines when stderr is not a terminal."""
TENSORBOARD = {
    "loss": "train/loss",
    "validation_loss": "validation/loss",
    "learning_rate": "train/learning_rate",
    "grad_norm": "train/grad_norm",
    "loss_scale": "train/loss_scale",
    "tokens_per_second": "train/tokens_per_second",
    "epoch": "train/epoch",
    "rewards_chosen": "train/rewards/chosen",
    "rewards_rejected": "train/rewards/rejected",
    "margin": "train/rewards/margin",
    "accuracy": "train/rewards/accuracy",
    "logps_chosen": "train/logps/chosen",
    "logps_rejected": "train/logps/rejected",
    "kl": "train/kl",
    "validation_accuracy": "validation/accuracy",
    "validation_margin": "validation/margin",
}
"""Update-event fields written to TensorBoard, and their tags."""


def utc_now() -> str:
    return datetime.now(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def _tensorboard(log_dir: str) -> Any:
    try:
        from torch.utils.tensorboard import SummaryWriter
    except ImportError:
        raise AnerRuntimeError(
            "train: log_dir writes TensorBoard files, which needs the tensorboard package",
            code="E-NATIVE-UNAVAILABLE",
            notes=("install it with: pip install 'aner[native]' (or pip install tensorboard)",),
        ) from None
    return SummaryWriter(log_dir)


class EventLog:
    """The event log and TensorBoard writer of one `train` call (either may be off)."""

    def __init__(self, path: str | None, log_dir: str | None) -> None:
        self.board = _tensorboard(log_dir) if log_dir else None
        self.file = open(path, "a", encoding="utf-8") if path else None
        self.pending: dict[str, Any] | None = None

    def add(self, event: dict[str, Any]) -> None:
        self._write_pending()
        self.pending = {"time": utc_now(), **event}

    def _write_pending(self) -> None:
        if self.pending is None:
            return
        ready = {k: float(v) if isinstance(v, torch.Tensor) else v for k, v in self.pending.items()}
        self.pending = None
        if self.file is not None:
            self.file.write(json.dumps(ready) + "\n")
            self.file.flush()
        if self.board is not None and ready.get("event") == "update":
            for key, tag in TENSORBOARD.items():
                if ready.get(key) is not None:
                    self.board.add_scalar(tag, ready[key], ready["update"])

    def close(self) -> None:
        self._write_pending()
        if self.file is not None:
            self.file.close()
        if self.board is not None:
            self.board.close()


def clock_text(seconds: float) -> str:
    """`h:mm:ss` of a duration."""
    return str(timedelta(seconds=round(seconds)))


class Progress:
    """Progress on `stream` (see the module docstring); `clock` is injectable for tests."""

    def __init__(
        self,
        total: int,
        done: int,
        stream: TextIO | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.stream = stream if stream is not None else sys.stderr
        self.total, self.start_done, self.clock = total, done, clock
        self.started = clock()
        self.last_line: float | None = None
        self.bar = None
        if self.stream.isatty():
            from tqdm import tqdm

            self.bar = tqdm(
                total=total, initial=done, desc="train", unit="update", file=self.stream
            )

    def update(self, event: dict[str, Any]) -> None:
        if self.bar is not None:
            self.bar.update(1)
            shown = {"loss": f"{event['loss']:.4f}"}
            if event.get("validation_loss") is not None:
                shown["val"] = f"{event['validation_loss']:.4f}"
            self.bar.set_postfix(shown)
            return
        now = self.clock()
        if self.last_line is None or now - self.last_line >= PROGRESS_SECONDS:
            self.last_line = now
            print(self._line(event, now), file=self.stream, flush=True)

    def _line(self, event: dict[str, Any], now: float) -> str:
        update = event["update"]
        elapsed = now - self.started
        done_here = update - self.start_done
        left = elapsed / done_here * (self.total - update) if done_here else 0.0
        parts = [
            f"train: update {update}/{self.total} ({100 * update // self.total}%)",
            f"epoch {event['epoch']:.2f}",
            f"loss {event['loss']:.4f}",
        ]
        if event.get("validation_loss") is not None:
            parts.append(f"validation {event['validation_loss']:.4f}")
        parts += [
            f"lr {event['learning_rate']:.2e}",
            f"{event['tokens_per_second']:.0f} tokens/s",
            f"elapsed {clock_text(elapsed)}, ~{clock_text(left)} left",
        ]
        return ", ".join(parts)

    def close(self, summary: str | None) -> None:
        if self.bar is not None:
            self.bar.close()
        if summary:
            print(summary, file=self.stream, flush=True)
