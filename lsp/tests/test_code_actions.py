"""Quick fixes through the real server subprocess: every did-you-mean suggestion is offered as a
preferred quick fix whose edit, applied to the text, makes it check without errors; a diagnostic
without a suggestion offers none. Edits are applied here in UTF-16 units, independently of the
server's position code."""

from __future__ import annotations

import pytest
from lsp_helpers import open_doc
from lsprotocol import types

from aner_lang.check import analyze

pytestmark = pytest.mark.asyncio(loop_scope="module")

MODEL = 'let m = load_model("m.gguf")\n'
CASES = {
    "E-UNKNOWN-NAME": (MODEL + 'print("😀 " + str(lroa(m, rank: 2)))\n', "lroa", "lora"),
    "E-UNKNOWN-ARG": (MODEL + 'print("😀 " + str(lora(m, rnak: 2)))\n', "rnak", "rank"),
    "E-UNKNOWN-MEMBER": (
        'print("é😀 " + str(load_model("m.gguf", storage: nf4_dobule_quant)))\n',
        "nf4_dobule_quant",
        "nf4_double_quant",
    ),
    "E-UNKNOWN-FIELD": (
        'let e = evaluate(load_model("m.gguf"), texts(["a"], context: 8))\n'
        'print("😀 " + str(e.perplexty))\n',
        "perplexty",
        "perplexity",
    ),
}


def _offset(text: str, pos: types.Position) -> int:
    """The code-point offset of a UTF-16 position."""
    line_start = sum(len(line) for line in text.splitlines(keepends=True)[: pos.line])
    line = text[line_start:].split("\n", 1)[0]
    units = line.encode("utf-16-le")[: 2 * pos.character]
    return line_start + len(units.decode("utf-16-le"))


def apply(text: str, edits: list[types.TextEdit]) -> str:
    for e in sorted(
        edits, key=lambda e: (e.range.start.line, e.range.start.character), reverse=True
    ):
        text = (
            text[: _offset(text, e.range.start)] + e.new_text + text[_offset(text, e.range.end) :]
        )
    return text


async def code_actions(client, uri: str, where: types.Range, only=None):
    return await client.text_document_code_action_async(
        types.CodeActionParams(
            text_document=types.TextDocumentIdentifier(uri),
            range=where,
            context=types.CodeActionContext(diagnostics=[], only=only),
        )
    )


async def test_quick_fix_capability_is_advertised(client):
    provider = client.server_capabilities.code_action_provider
    assert types.CodeActionKind.QuickFix in provider.code_action_kinds


@pytest.mark.parametrize("code", CASES)
async def test_suggestion_quick_fix_makes_the_script_check(client, code):
    text, typo, fix = CASES[code]
    assert analyze(text).errors  # the case really is broken
    uri = f"file:///tmp/fix_{code.lower()}.aner"
    (diag,) = [d for d in await open_doc(client, uri, text) if d.code == code]
    (action,) = await code_actions(client, uri, diag.range)
    assert action.title == f"Change `{typo}` to `{fix}`"
    assert action.kind == types.CodeActionKind.QuickFix and action.is_preferred
    assert [(d.code, d.range) for d in action.diagnostics] == [(code, diag.range)]
    fixed = apply(text, action.edit.changes[uri])
    assert fixed == text.replace(typo, fix, 1)
    assert analyze(fixed).errors == []


async def test_quick_fix_from_a_cursor_at_the_end_of_the_word(client):
    text, typo, fix = CASES["E-UNKNOWN-NAME"]
    uri = "file:///tmp/fix_cursor.aner"
    (diag,) = [d for d in await open_doc(client, uri, text) if d.code == "E-UNKNOWN-NAME"]
    (action,) = await code_actions(client, uri, types.Range(diag.range.end, diag.range.end))
    assert apply(text, action.edit.changes[uri]) == text.replace(typo, fix, 1)
    assert await code_actions(client, uri, diag.range, only=[types.CodeActionKind.Refactor]) is None


async def test_no_action_without_a_suggestion(client):
    text = 'let x: Int = "s"\nprint(zzqqxxv + x)\n'
    uri = "file:///tmp/nofix.aner"
    diags = await open_doc(client, uri, text)
    assert {d.code for d in diags} >= {"E-TYPE", "E-UNKNOWN-NAME"}
    for d in diags:
        assert await code_actions(client, uri, d.range) is None, d.message
