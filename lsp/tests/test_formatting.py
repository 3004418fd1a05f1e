"""Formatting through the real server: re-indents a messy script, leaves a broken one alone, and
addresses the whole document in UTF-16 even with non-ASCII text."""

from __future__ import annotations

import pytest
from lsp_helpers import open_doc
from lsprotocol import types

from aner_lsp.features.formatting import format_source

in_server = pytest.mark.asyncio(loop_scope="module")

MESSY = """

record R {
      a: Int


 b: String
}
fn f(x: Int) -> Int {
if x < 2 {
        return x
}
  return f(x - 1) + f(x - 2)
}
let s = "é 😀 ${f(3)}"
let l = [1,
         2]


"""
FORMATTED = """record R {
  a: Int

  b: String
}
fn f(x: Int) -> Int {
  if x < 2 {
    return x
  }
  return f(x - 1) + f(x - 2)
}
let s = "é 😀 ${f(3)}"
let l = [1,
         2]
"""


async def format_doc(client, uri: str, text: str) -> list[types.TextEdit]:
    await open_doc(client, uri, text)
    return await client.text_document_formatting_async(
        types.DocumentFormattingParams(
            text_document=types.TextDocumentIdentifier(uri),
            options=types.FormattingOptions(tab_size=2, insert_spaces=True),
        )
    )


@in_server
async def test_formatting_reindents_whole_document(client):
    edits = await format_doc(client, "file:///tmp/messy.aner", MESSY)
    assert len(edits) == 1
    (edit,) = edits
    assert edit.new_text == FORMATTED
    assert edit.range == types.Range(types.Position(0, 0), types.Position(MESSY.count("\n"), 0))
    assert list(await format_doc(client, "file:///tmp/formatted.aner", FORMATTED)) == []


@in_server
async def test_formatting_range_ends_in_utf16_units(client):
    text = 'let s = "é😀"   '  # no final newline: the range ends inside the line, after the emoji
    (edit,) = await format_doc(client, "file:///tmp/utf16_fmt.aner", text)
    assert edit.new_text == 'let s = "é😀"\n'
    assert edit.range.end == types.Position(0, len(text) + 1)  # the emoji is two UTF-16 units


@in_server
async def test_formatting_refuses_a_broken_script(client):
    assert (
        list(
            await format_doc(
                client, "file:///tmp/broken_fmt.aner", "fn f(x: Int {\n      return x\n}\n"
            )
        )
        == []
    )


def test_formatter_keeps_examples_and_refuses_a_changed_tree():
    for name in ("language_tour", "qlora", "generate"):
        text = open(f"examples/{name}.aner", encoding="utf-8").read()
        assert format_source(text) is not None, name
    # a leading-dot chain continues the statement; re-indenting must not split it: checked by re-parsing
    chained = 'let t = "a b"\nlet n = t\n.len()\n'
    assert format_source(chained) == 'let t = "a b"\nlet n = t\n  .len()\n'
