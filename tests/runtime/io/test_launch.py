"""`aner run --nproc N`: a script with errors is refused once, before any rank starts; a rank's
failure at run time is reported once as that rank's own error, never torchrun's traceback."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from aner_lang.problems import rank_errors


def _launch(folder: Path, script: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "aner_lang.cli", "run", "--nproc", "2", script],
        cwd=folder,
        capture_output=True,
        text=True,
        env={**os.environ, "ANER_CACHE_DIR": str(folder / "cache")},
        timeout=600,
    )


def _no_wall(err: str) -> None:
    for noise in ("Traceback", "ChildFailedError", "torch.distributed", "exitcode"):
        assert noise not in err, err


@pytest.mark.parametrize(
    "source, where, code",
    [
        ('let x: Int = "s"\nprint(x)\n', "s.aner:1:14:", "E-TYPE"),
        ('print("a"\n', "s.aner:1:", "E-SYNTAX"),
        ('print(read_text("missing.txt"))\n', "s.aner:1:17:", "E-FILE-MISSING"),
    ],
)
def test_a_script_with_errors_is_refused_once_before_the_ranks_start(tmp_path, source, where, code):
    """A type error, a syntax error and a precheck's error (a file the script reads is missing):
    one located error from the launcher, and no rank started (torchrun prints its banner)."""
    (tmp_path / "s.aner").write_text(source, encoding="utf-8")
    proc = _launch(tmp_path, "s.aner")
    assert proc.returncode == 1 and proc.stdout == ""
    errors = [line for line in proc.stderr.splitlines() if "error[" in line]
    assert len(errors) == 1 and errors[0].startswith(where), proc.stderr
    assert f"error[{code}]" in errors[0], proc.stderr
    assert "OMP_NUM_THREADS" not in proc.stderr
    _no_wall(proc.stderr)


def test_an_unreadable_script_is_one_error(tmp_path):
    proc = _launch(tmp_path, "absent.aner")
    assert proc.returncode == 1
    assert len(proc.stderr.strip().splitlines()) == 1 and "absent.aner" in proc.stderr
    _no_wall(proc.stderr)


def test_a_failure_of_every_rank_at_run_time_is_reported_once(tmp_path):
    """Each rank meets the same error (an index computed from a file): it is printed once, as the
    rank rendered it, after what rank 0 printed before failing."""
    (tmp_path / "a.txt").write_text("hello", encoding="utf-8")
    script = 'print("before")\nlet n = len(read_text("a.txt"))\nprint([1][n])\n'
    (tmp_path / "s.aner").write_text(script, encoding="utf-8")
    proc = _launch(tmp_path, "s.aner")
    assert proc.returncode == 1 and proc.stdout == "before\n"
    errors = [line for line in proc.stderr.splitlines() if "error[" in line]
    assert errors == ["s.aner:3:11: error[E-INDEX]: index 5 is out of range for a length of 1"]
    assert "print([1][n])" in proc.stderr and "rank" not in proc.stderr, proc.stderr
    _no_wall(proc.stderr)


def _errors(folder: Path, texts: dict[int, str]) -> None:
    """Rank errors written in the order of `texts` (one nanosecond apart at least)."""
    for i, (rank, text) in enumerate(texts.items()):
        path = folder / f"rank-{rank}.txt"
        path.write_text(text, encoding="utf-8")
        os.utime(path, ns=(i, i))


def test_the_report_is_the_first_ranks_error_noting_a_rank_other_than_zero_or_a_disagreement(
    tmp_path,
):
    same = tmp_path / "same"
    same.mkdir()
    _errors(same, {1: "s.aner:2:1: error[E-X]: bad", 0: "s.aner:2:1: error[E-X]: bad"})
    assert rank_errors.report(same, 2) == "s.aner:2:1: error[E-X]: bad"
    first = tmp_path / "first"
    first.mkdir()
    _errors(first, {1: "s.aner:4:1: error[E-Y]: own", 0: "s.aner:9:1: error[E-INTERNAL]: peer"})
    assert rank_errors.report(first, 2) == (
        "s.aner:4:1: error[E-Y]: own\n  = note: on rank 1 of 2, the first to fail"
    )
    zero = tmp_path / "zero"
    zero.mkdir()
    _errors(zero, {0: "s.aner:1:1: error[E-Z]: only"})
    assert rank_errors.report(zero, 4) == "s.aner:1:1: error[E-Z]: only"
    alone = tmp_path / "alone"
    alone.mkdir()
    _errors(alone, {3: "s.aner:1:1: error[E-Z]: only"})
    assert rank_errors.report(alone, 4) == (
        "s.aner:1:1: error[E-Z]: only\n  = note: on rank 3 of 4, the first to fail"
    )
    empty = tmp_path / "empty"
    empty.mkdir()
    (empty / "rank-x.txt").write_text("not a rank's")
    assert rank_errors.report(empty, 2) is None


def test_a_rank_outside_a_launch_prints_its_own_error(monkeypatch, tmp_path):
    monkeypatch.delenv(rank_errors.FOLDER_VARIABLE, raising=False)
    assert not rank_errors.record("error")
    monkeypatch.setenv(rank_errors.FOLDER_VARIABLE, str(tmp_path))
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setattr(rank_errors, "MAIN_RANK_WAIT", 0.2)
    start = time.monotonic()
    assert rank_errors.record("error") and (tmp_path / "rank-1.txt").read_text() == "error"
    assert time.monotonic() - start >= 0.2  # it waited for rank 0's error, which never came


def test_a_failed_rank_ends_once_rank_0_has_failed_too(monkeypatch, tmp_path):
    monkeypatch.setenv(rank_errors.FOLDER_VARIABLE, str(tmp_path))
    monkeypatch.setenv("RANK", "1")
    (tmp_path / "rank-0.txt").write_text("error")
    start = time.monotonic()
    assert rank_errors.record("error")
    assert time.monotonic() - start < rank_errors.MAIN_RANK_WAIT / 2


@pytest.mark.parametrize(
    "status, printed, code",
    [
        (-9, "aner run: rank 1 of 2 was killed by signal SIGKILL\n", 1),
        (7, "aner run: rank 1 of 2 exited with status 7\n", 1),
        (3, "", 3),
        (130, "", 130),
    ],
)
def test_a_rank_that_ended_without_an_error_is_named_by_its_status(
    tmp_path, capsys, status, printed, code
):
    """Killed, or a crash of the interpreter (its own output came first); a rank stopped on
    request passes its status on, having said how to continue."""
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError, ProcessFailure

    from aner_lang.runtime.io.launch import _failed

    failure = ProcessFailure(1, 1234, status, str(tmp_path / "none.json"))
    assert _failed(ChildFailedError("aner", {1: failure}), tmp_path, 2) == code
    assert capsys.readouterr().err == printed
