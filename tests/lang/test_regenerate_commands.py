"""Every command the documentation gives to regenerate a generated file (README's "regenerate
with `aner ...`", a generated file's "Generated ... by `aner ...`") writes exactly that file when
run as written: a command that prints to stdout, or writes elsewhere, is a stale instruction."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

from aner_lang.cli import main

ROOT = Path(__file__).resolve().parents[2]
_COMMAND = re.compile(
    r"(?:regenerate with|Generated from the registry(?: in `[^`]+`)? by)\s+`(aner [^`]+)`"
)


def _commands() -> list[tuple[str, str]]:
    found = []
    for md in [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]:
        text = md.read_text(encoding="utf-8")
        found += [(md.name, " ".join(m.group(1).split())) for m in _COMMAND.finditer(text)]
    return found


def test_the_docs_name_their_regenerate_commands():
    named = {command for _, command in _commands()}
    assert "aner builtins -o docs/builtins.md" in named
    assert "aner explain --markdown -o docs/errors.md" in named


def test_every_regenerate_command_writes_the_file_it_names(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "docs").mkdir()
    for where, command in _commands():
        args = shlex.split(command)[1:]
        assert "-o" in args, f"{where}: `{command}` writes no file"
        target = args[args.index("-o") + 1]
        assert main(args) == 0, f"{where}: `{command}` failed"
        written = (tmp_path / target).read_text(encoding="utf-8")
        assert written == (ROOT / target).read_text(encoding="utf-8"), f"{where}: `{command}`"
        (tmp_path / target).unlink()
