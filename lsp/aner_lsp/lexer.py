"""A tolerant tokenizer for editor features.

The parser's lexer stops at the first bad character and drops comments; completion, signature
help and semantic tokens need every token of a half-typed buffer, comments and unterminated
strings included, so the server scans with this one regex instead."""

from __future__ import annotations

import re
from dataclasses import dataclass

KEYWORDS = frozenset(
    {
        "let",
        "fn",
        "record",
        "enum",
        "if",
        "else",
        "for",
        "in",
        "return",
        "assert",
        "import",
        "and",
        "or",
        "not",
        "true",
        "false",
        "none",
    }
)

_TOKEN = re.compile(
    r"""
    (?P<comment>\#[^\n]*)
  | (?P<string>"(?:[^"\\\n]++|\\.)*+"?)
  | (?P<number>[0-9][0-9_]*(?:\.[0-9][0-9_]*)?(?:[eE][-+]?[0-9]+)?
      (?:[ \t]*(?:KiB|MiB|GiB|TiB|KB|MB|GB|TB|B)(?![A-Za-z0-9_]))?)
  | (?P<name>[A-Za-z_][A-Za-z0-9_]*)
  | (?P<op>->|==|!=|<=|>=|[-+*/%<>=!?:,.()\[\]{}])
  | (?P<newline>\n)
""",
    re.VERBOSE,
)


@dataclass(frozen=True, slots=True)
class Tok:
    kind: str  # comment | string | number | name | keyword | op | newline
    text: str
    start: int

    @property
    def end(self) -> int:
        return self.start + len(self.text)


def tokens(text: str, base: int = 0) -> list[Tok]:
    """Every token of `text` (offsets shifted by `base`); characters that start no token are skipped."""
    out: list[Tok] = []
    for m in _TOKEN.finditer(text):
        kind = m.lastgroup or "op"
        value = m.group()
        if kind == "name" and value in KEYWORDS:
            kind = "keyword"
        out.append(Tok(kind, value, m.start() + base))
    return out


def statement_start(source: str, offset: int) -> int:
    """Offset of the top-level chunk around `offset`: the last line before it that starts with a
    letter in column 1 (the parser's own recovery boundary), so cursor scans stay short."""
    pos = source.rfind("\n", 0, offset)
    while pos >= 0:
        if pos + 1 < len(source) and (source[pos + 1].isalpha() or source[pos + 1] == "_"):
            return pos + 1
        pos = source.rfind("\n", 0, pos)
    return 0
