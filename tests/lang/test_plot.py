"""`aner plot` and `plot()`: the loss curves of an event log, as PNG or SVG."""

from __future__ import annotations

import json

import pytest

from aner_lang.cli import main
from aner_lang.datafiles.plot import plot, read_curves
from aner_lang.problems.errors import AnerRuntimeError

pytest.importorskip("matplotlib")


def _log(tmp_path, events, name="events.jsonl"):
    path = tmp_path / name
    path.write_text("".join(json.dumps(e) + "\n" for e in events))
    return path


def _update(n, loss, validation=None):
    event = {"time": "2026-01-01T00:00:00.000Z", "event": "update", "update": n, "loss": loss}
    return event if validation is None else {**event, "validation_loss": validation}


RESUMED = [
    {"event": "start", "update": 0},
    _update(1, 3.0, 3.5),
    _update(2, 2.5),
    _update(3, 9.9),  # redone after resuming from the checkpoint of update 2
    {"event": "end", "stopped": "interrupted", "update": 3},
    {"event": "start", "update": 2},
    _update(3, 2.0, 2.8),
    _update(4, 1.5, 2.6),
    {"event": "end", "stopped": "done", "update": 4},
]


def test_curves_follow_the_run_the_adapter_had(tmp_path):
    curves = read_curves(_log(tmp_path, RESUMED))
    assert curves.train == {1: 3.0, 2: 2.5, 3: 2.0, 4: 1.5}
    assert curves.validation == {1: 3.5, 3: 2.8, 4: 2.6}


def test_svg_is_written_and_reproducible(tmp_path):
    log = _log(tmp_path, RESUMED)
    first, second = tmp_path / "a.svg", tmp_path / "out" / "b.svg"
    plot(log, first)
    plot(log, second)
    text = first.read_text()
    assert text.startswith("<?xml") and "<svg" in text and "validation" in text
    assert first.read_bytes() == second.read_bytes()


def test_cli_writes_a_png_next_to_the_log(tmp_path, capsys):
    log = _log(tmp_path, RESUMED)
    assert main(["plot", str(log)]) == 0
    assert (tmp_path / "events.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "4 updates, 3 validations" in capsys.readouterr().err


def test_bad_logs_and_outputs(tmp_path, capsys):
    empty = _log(tmp_path, [{"event": "start", "update": 0}], "empty.jsonl")
    with pytest.raises(AnerRuntimeError, match="no update events to plot") as e:
        plot(empty, tmp_path / "x.svg")
    assert e.value.code == "E-PLOT"
    with pytest.raises(AnerRuntimeError, match=r"\.png or \.svg") as e:
        plot(_log(tmp_path, RESUMED), tmp_path / "x.pdf")
    assert e.value.code == "E-PLOT"
    broken = tmp_path / "broken.jsonl"
    broken.write_text(json.dumps(_update(1, 2.0)) + "\n{not json\n")
    with pytest.raises(AnerRuntimeError, match=r"broken.jsonl:2: not valid JSON"):
        read_curves(broken)
    assert main(["plot", str(empty), "-o", str(tmp_path / "x.png")]) == 1
    assert "error[E-PLOT]" in capsys.readouterr().err and not (tmp_path / "x.png").exists()


def test_an_existing_picture_is_replaced_only_on_request(tmp_path, capsys):
    log = _log(tmp_path, RESUMED)
    mine = tmp_path / "loss.svg"
    mine.write_text("the user's own picture")
    with pytest.raises(AnerRuntimeError, match="already exists") as e:
        plot(log, mine)
    assert e.value.code == "E-FILE-EXISTS" and mine.read_text() == "the user's own picture"
    assert main(["plot", str(log), "-o", str(mine)]) == 1
    assert "error[E-FILE-EXISTS]" in capsys.readouterr().err
    assert mine.read_text() == "the user's own picture"
    assert main(["plot", str(log), "-o", str(mine), "--overwrite"]) == 0
    assert "<svg" in mine.read_text()
    plot(log, mine, overwrite=True)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["events.jsonl", "loss.svg"]  # no temp


def test_a_script_plot_over_an_existing_picture_needs_overwrite(tmp_path, capsys):
    _log(tmp_path, RESUMED)
    (tmp_path / "loss.png").write_bytes(b"mine")
    script = tmp_path / "p.aner"
    script.write_text('print(plot("events.jsonl", "loss.png"))\n')
    assert main(["run", str(script)]) == 1
    assert "E-FILE-EXISTS" in capsys.readouterr().err
    assert (tmp_path / "loss.png").read_bytes() == b"mine"
    script.write_text('print(plot("events.jsonl", "loss.png", overwrite: true))\n')
    assert main(["run", str(script)]) == 0
    assert (tmp_path / "loss.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
