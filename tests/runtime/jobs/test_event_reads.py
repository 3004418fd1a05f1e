"""A job's event log is read and written in bounded pieces: `read` takes at most `READ_LIMIT`
bytes, `follow` (what `aner logs` uses, with and without --follow) still yields every event in
order, a line too long to be an event is skipped without stalling the reader, and the supervisor
logs a script's over-long output line in `PIECE_LIMIT` pieces."""

from __future__ import annotations

import io
import json

from aner_lang.runtime.jobs import events, supervisor
from aner_lang.runtime.jobs.events import EVENTS, EventLog


def _write(folder, lines):  # type: ignore[no-untyped-def]
    (folder / EVENTS).write_text("".join(line + "\n" for line in lines))


def test_reads_are_bounded_and_follow_yields_every_event(tmp_path, monkeypatch):
    monkeypatch.setattr(events, "READ_LIMIT", 200)
    lines = [json.dumps({"event": "update", "update": i}) for i in range(40)]
    lines.insert(20, json.dumps({"event": "output", "text": "x" * 1000}))  # > READ_LIMIT
    _write(tmp_path, lines)
    offset, size = 0, (tmp_path / EVENTS).stat().st_size
    while offset < size:
        _, after = events.read(tmp_path, offset)
        assert 0 < after - offset <= 200
        offset = after
    got = list(events.follow(tmp_path, lambda: True, poll=0))
    assert [e["update"] for e in got] == list(range(40))


def test_a_last_line_still_being_written_is_left_for_the_next_read(tmp_path, monkeypatch):
    monkeypatch.setattr(events, "READ_LIMIT", 200)
    (tmp_path / EVENTS).write_text('{"event": "start"}\n{"event": "upd')
    got, offset = events.read(tmp_path)
    assert got == [{"event": "start"}] and offset == len('{"event": "start"}\n')


def test_the_supervisor_logs_a_long_output_line_in_pieces(tmp_path, monkeypatch):
    monkeypatch.setattr(supervisor, "PIECE_LIMIT", 100)
    log = EventLog(tmp_path)
    sup = supervisor.Supervisor.__new__(supervisor.Supervisor)  # only its log is used here
    sup.log, sup.stderr_tail = log, supervisor.deque(maxlen=4)
    sup.pump_output(io.BytesIO(b"a" * 250 + b"\nshort\n"), "stdout")
    log.close()
    texts = [e["text"] for e in events.follow(tmp_path, lambda: True, poll=0)]
    assert texts == ["a" * 100, "a" * 100, "a" * 50, "short"]
