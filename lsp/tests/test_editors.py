"""The editor files are valid: JSON parses, every TextMate regex compiles, the grammar knows every
keyword the language has, and the VS Code extension points at files that exist."""

from __future__ import annotations

import json
import re
from pathlib import Path

from aner_lsp.lexer import KEYWORDS

VSCODE = Path(__file__).resolve().parents[1] / "editors" / "vscode"


def _patterns(node):
    if isinstance(node, dict):
        for key in ("match", "begin", "end"):
            if key in node:
                yield node[key]
        for value in node.values():
            yield from _patterns(value)
    elif isinstance(node, list):
        for value in node:
            yield from _patterns(value)


def test_textmate_grammar_compiles_and_covers_keywords():
    grammar = json.loads((VSCODE / "syntaxes" / "aner.tmLanguage.json").read_text())
    regexes = list(_patterns(grammar))
    assert len(regexes) > 10
    compiled = [re.compile(r) for r in regexes]
    for word in KEYWORDS:
        assert any(c.fullmatch(word) or c.search(f" {word} ") for c in compiled), word
    numbers = grammar["repository"]["number"]["patterns"]
    assert re.search(numbers[0]["match"], "page_bytes: 2 MiB").group() == "2 MiB"


def test_vscode_extension_files_exist():
    manifest = json.loads((VSCODE / "package.json").read_text())
    assert (VSCODE / manifest["main"]).exists()
    assert (VSCODE / manifest["contributes"]["grammars"][0]["path"]).exists()
    assert (VSCODE / manifest["contributes"]["languages"][0]["configuration"]).exists()
    assert manifest["contributes"]["configuration"]["properties"]["aner.server.command"][
        "default"
    ] == ["aner", "lsp"]
    json.loads((VSCODE / "language-configuration.json").read_text())
