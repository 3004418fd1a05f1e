"""The editor integrations stay in step with the language: the TextMate grammar's regexes compile
and highlight exactly the language's keywords, and the VS Code manifest points at real files."""

from __future__ import annotations

import json
import re
from pathlib import Path

from aner_lsp.lexer import KEYWORDS

VSCODE = Path(__file__).resolve().parents[1] / "editors" / "vscode"


def _patterns(node: object):
    """Every `match`/`begin`/`end` regex anywhere in the grammar."""
    if isinstance(node, dict):
        for key, value in node.items():
            if key in ("match", "begin", "end") and isinstance(value, str):
                yield value
            else:
                yield from _patterns(value)
    elif isinstance(node, list):
        for item in node:
            yield from _patterns(item)


def test_textmate_grammar_compiles_and_covers_every_keyword():
    grammar = json.loads((VSCODE / "syntaxes" / "aner.tmLanguage.json").read_text())
    regexes = [re.compile(p) for p in _patterns(grammar)]
    words = {w for r in regexes for group in re.findall(r"\\b\(([a-z|]+)\)", r.pattern) for w in group.split("|")}
    assert words == KEYWORDS
    assert all(inc["include"].lstrip("#") in grammar["repository"] for inc in grammar["patterns"])


def test_vscode_manifest_points_at_existing_files():
    manifest = json.loads((VSCODE / "package.json").read_text())
    assert (VSCODE / manifest["main"]).is_file()
    language, = manifest["contributes"]["languages"]
    assert language["extensions"] == [".aner"] and (VSCODE / language["configuration"]).is_file()
    grammar, = manifest["contributes"]["grammars"]
    assert json.loads((VSCODE / grammar["path"]).read_text())["scopeName"] == grammar["scopeName"]
    assert manifest["contributes"]["configuration"]["properties"]["aner.server.command"]["default"] == ["aner", "lsp"]
