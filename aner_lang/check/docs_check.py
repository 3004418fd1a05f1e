"""`aner check-docs`: type-check the ```aner fenced blocks of Markdown files.

Fence info strings: ``aner`` (must type-check without errors; the files it names need not
exist), ``aner error`` (must report at least one error as `aner check` reports them, the
machine's and the files' checks included: it documents a mistake, some only `aner check`'s
prechecks see, such as a model path that names nothing), ``aner skip`` (not checked). Diagnostics are reported at the
Markdown file's own line and column (`docs/language.md:42:9`). Each block is checked on its own,
with imports relative to the Markdown file's directory.
"""

from __future__ import annotations

import re
from dataclasses import replace
from pathlib import Path

from aner_lang.check import analyze
from aner_lang.check.before_run import check_before_run
from aner_lang.grammar.ast import Span
from aner_lang.host import files
from aner_lang.problems import diagnostics as msg
from aner_lang.problems.diagnostics import Diagnostic
from aner_lang.problems.errors import AnerRuntimeError

_FENCE = re.compile(r"^(\s*)(```+|~~~+)\s*aner\b\s*([A-Za-z-]*)\s*$")


def blocks(text: str) -> list[tuple[int, str, str]]:
    """The aner blocks of a Markdown text as (line of the first code line, mode, code)."""
    out = []
    lines = text.splitlines()
    i = 0
    while i < len(lines):
        m = _FENCE.match(lines[i])
        if m is None:
            i += 1
            continue
        fence, mode = m.group(2), m.group(3) or "check"
        start = i + 1
        j = start
        while j < len(lines) and not lines[j].strip().startswith(fence):
            j += 1
        out.append((start + 1, mode, "\n".join(lines[start:j]) + "\n"))
        i = j + 1
    return out


def _shift(d: Diagnostic, first_line: int, path: str) -> Diagnostic:
    s = d.span
    span = (
        None
        if s is None
        else Span(
            s.line + first_line - 1, s.col, s.end_line + first_line - 1, s.end_col, s.start, s.end
        )
    )
    return replace(d, span=span, path=path)


def check_markdown(path: Path) -> tuple[list[Diagnostic], int]:
    """Diagnostics of one Markdown file (errors only, at Markdown positions) and how many blocks
    were checked."""
    try:
        text = files.read_text(path)
    except AnerRuntimeError as e:
        return [msg.file_error(str(path), e)], 0
    found: list[Diagnostic] = []
    checked = 0
    for first_line, mode, code in blocks(text):
        if mode == "skip":
            continue
        checked += 1
        script = str(path.parent / "<doc-block>.aner")
        if mode == "error":
            if not check_before_run(code, script).errors:
                found.append(
                    msg.doc_block_should_fail(Span(first_line - 1, 1, first_line - 1, 4, 0, 0)).at(
                        str(path)
                    )
                )
            continue
        found += [_shift(d, first_line, str(path)) for d in analyze(code, script).errors]
    return found, checked


def markdown_files(paths: list[str]) -> list[Path]:
    out: list[Path] = []
    for p in map(Path, paths):
        out += sorted(p.rglob("*.md")) if p.is_dir() else [p]
    return out
