"""A job's event log: ``<job folder>/events.jsonl``, one JSON object a line, each with a `time`.

The job's supervisor is its only writer (its own events, the trainer's events it receives from
the script's process, and the script's output lines as `output` events), so lines never
interleave. Readers (`aner logs`, `wait`) tolerate a last line still being written.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path
from typing import Any, TextIO

from aner_lang.host import json_text

EVENTS = "events.jsonl"


class EventLog:
    """The writer side, shared by the supervisor's threads."""

    def __init__(self, folder: Path) -> None:
        folder.mkdir(parents=True, exist_ok=True)
        self._file: TextIO = open(folder / EVENTS, "a", encoding="utf-8")
        self._lock = threading.Lock()

    def write(self, event: dict[str, Any]) -> None:
        line = json.dumps({"time": round(time.time(), 3), **event})
        with self._lock:
            self._file.write(line + "\n")
            self._file.flush()

    def close(self) -> None:
        self._file.close()


PIECE_LIMIT = 64 << 10
"""The most characters of one line of the script's output (or of one trainer event) that the
supervisor reads at a time: a longer output line is logged as several `output` events (a longer
trainer event, which the trainer never writes, is no JSON and skipped)."""
READ_LIMIT = 1 << 20
"""The most bytes one `read` takes, so a reader's memory stays bounded however long the log
grows. No event the supervisor writes is longer (a `PIECE_LIMIT` piece JSON-escaped is at most
6 bytes a character); a longer line is skipped."""


def read(folder: Path, offset: int = 0) -> tuple[list[dict[str, Any]], int]:
    """The complete events in the `READ_LIMIT` bytes from byte `offset` on, and the offset after
    the last complete line; when those bytes end no line, they are part of a line too long to be
    an event, and the offset is past them (the rest of that line is then no JSON: skipped)."""
    try:
        with open(folder / EVENTS, "rb") as f:
            f.seek(offset)
            data = f.read(READ_LIMIT)
    except FileNotFoundError:
        return [], offset
    end = data.rfind(b"\n") + 1
    if end == 0 and len(data) == READ_LIMIT:
        return [], offset + len(data)
    events = []
    for line in data[:end].splitlines():
        try:
            event = json_text.loads(line)
        except ValueError:
            continue
        if isinstance(event, dict):
            events.append(event)
    return events, offset + end


def follow(folder: Path, finished: Any, poll: float = 0.2) -> Iterator[dict[str, Any]]:
    """Every event, then new ones as they come, until `finished()` is true and the log has been
    read to its end after that (`finished` always true: the events logged so far), read
    `READ_LIMIT` bytes at a time."""
    offset = 0
    while True:
        done = finished()
        before = offset
        events, offset = read(folder, offset)
        yield from events
        if offset != before:  # more may follow at once
            continue
        if done:
            return
        time.sleep(poll)


def describe(event: dict[str, Any]) -> str:
    """One human-readable line for an event."""
    stamp = datetime.fromtimestamp(float(event.get("time", 0))).strftime("%H:%M:%S")
    kind = event.get("event")
    if kind == "output":
        return f"{stamp} [{event.get('stream', 'stdout')}] {event.get('text', '')}"
    if kind == "update":
        train = f"train {event['train']}: " if "train" in event else ""
        text = f"{train}update {event.get('update')}/{event.get('steps', '?')}"
        text += f" loss {float(event.get('loss', float('nan'))):.4f}"
        if "validation_loss" in event:
            text += f" validation {float(event['validation_loss']):.4f}"
        if event.get("skipped"):
            text += " (skipped: overflow)"
        return f"{stamp} {text}"
    detail = {k: v for k, v in event.items() if k not in ("time", "event")}
    shown = " ".join(
        f"{k}={v}" for k, v in detail.items() if v is not None and not isinstance(v, dict)
    )
    return f"{stamp} {kind} {shown}".rstrip()
