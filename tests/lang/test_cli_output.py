"""The `aner` command's output: every command survives a closed output (`aner X | head -c1`) with
no traceback, and nothing is written into the current folder unless a file is named."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from aner_lang.cli import _DELEGATED, command_line, main
from aner_lang.problems.errors import EXIT_OUTPUT_CLOSED


def _commands() -> list[str]:
    sub = next(a for a in command_line()._actions if isinstance(a.choices, dict))
    assert isinstance(sub.choices, dict)
    return sorted(sub.choices)


def _closed_output(argv: list[str], cwd: Path, env: dict[str, str]) -> tuple[int, str]:
    """`aner ARGV` whose stdout is a pipe with no reader (the read end is closed before it
    starts, so its first write fails for certain): (exit status, stderr)."""
    read, write = os.pipe()
    os.close(read)
    try:
        proc = subprocess.run(
            [sys.executable, "-m", "aner_lang.cli", *argv],
            stdout=write,
            stderr=subprocess.PIPE,
            stdin=subprocess.DEVNULL,
            text=True,
            cwd=cwd,
            env=env,
            timeout=300,
        )
    finally:
        os.close(write)
    return proc.returncode, proc.stderr


def _assert_quiet(stderr: str) -> None:
    for sign in ("Traceback", "BrokenPipeError", "Exception ignored", "E-INTERNAL"):
        assert sign not in stderr, stderr


def _env(tmp_path: Path, *, buffered: bool) -> dict[str, str]:
    """The test's environment with its own job database, no GPU, and this checkout first; stdout
    buffered (a closed pipe fails at a flush) or not (it fails at the write itself)."""
    root = str(Path(__file__).resolve().parents[2])
    env = {
        **os.environ,
        "ANER_DATA_DIR": str(tmp_path / "aner-data"),
        "ANER_GPUS": "0",
        "ANER_CACHE_DIR": str(tmp_path / "cache"),
        "PYTHONPATH": os.pathsep.join([root, os.environ.get("PYTHONPATH", "")]),
    }
    env.pop("PYTHONUNBUFFERED", None)
    if not buffered:
        env["PYTHONUNBUFFERED"] = "1"
    return env


def test_every_command_s_help_survives_a_closed_output(tmp_path: Path) -> None:
    commands = _commands()
    assert set(_DELEGATED) < set(commands)
    for command in commands:
        status, stderr = _closed_output(
            [command, "--help"], tmp_path, _env(tmp_path, buffered=True)
        )
        _assert_quiet(stderr)
        assert status == EXIT_OUTPUT_CLOSED, (command, stderr)


def _printing(tmp_path: Path) -> dict[str, list[str]]:
    """An invocation of each command that prints to stdout. The commands left out print only
    diagnostics (stderr), serve a protocol on stdio (`lsp`) or run for minutes (`qualify`);
    their `--help` is covered above."""
    script = tmp_path / "count.aner"
    script.write_text("for i in range(100000) {\n  print(i)\n}\n")
    train = tmp_path / "train.aner"
    train.write_text(
        'let base = load_model("t.gguf", storage: float32)\n'
        'let _run = train(lora(base, rank: 2), texts(["one"], context: 16), steps: 1)\n'
    )
    return {
        "run": ["run", str(script)],
        "builtins": ["builtins"],
        "explain": ["explain"],
        "explain E-SYNTAX": ["explain", "E-SYNTAX"],
        "explain --markdown": ["explain", "--markdown"],
        "fixture": ["fixture", str(tmp_path / "t.gguf"), "--vocab", "bytes", "--layers", "1"],
        "plan": ["plan", str(train), "--gpu-memory", "24GB"],  # of the fixture's model
        "submit": ["submit", str(script)],
        "jobs": ["jobs"],
        "logs": ["logs", "1", "-f"],
    }


@pytest.mark.parametrize("buffered", [True, False], ids=["buffered", "unbuffered"])
def test_every_printing_command_survives_a_closed_output(tmp_path: Path, buffered: bool) -> None:
    printing = _printing(tmp_path)
    env = _env(tmp_path, buffered=buffered)
    for name, argv in printing.items():  # in order: `plan` reads the fixture, `logs` the job
        status, stderr = _closed_output(argv, tmp_path, env)
        _assert_quiet(stderr)
        assert status == EXIT_OUTPUT_CLOSED, (name, status, stderr)
    assert {argv[0] for argv in printing.values()} == set(_commands()) - {
        "check",
        "check-docs",
        "plot",
        "lsp",
        "qualify",
        "cancel",
        "resume",
    }


def test_builtins_without_a_file_prints_and_writes_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.chdir(tmp_path)
    assert main(["builtins"]) == 0
    assert capsys.readouterr().out.startswith("# Aner builtins reference")
    assert list(tmp_path.iterdir()) == []
    assert main(["builtins", "-o", "ref.md"]) == 0
    assert (tmp_path / "ref.md").read_text(encoding="utf-8").startswith("# Aner builtins reference")
