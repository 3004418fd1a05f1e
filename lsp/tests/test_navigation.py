"""Hover, go to definition (across imports), rename, symbols, semantic tokens and UTF-16
positions through the real server subprocess."""

from __future__ import annotations

import pytest
from lsp_helpers import at, open_doc
from lsprotocol import types

from aner_lsp.legend import TOKEN_TYPES

pytestmark = pytest.mark.asyncio(loop_scope="module")

SCRIPT = """record Budget {
  name: String
  share: Float = 1.0
}
enum Level { low, high }
let count = 3
let note = "héllo 😀 wörld " + str(count)
fn twice(n: Int) -> Int {
  return n * 2
}
let total = twice(count) + count
let m = load_model("m.gguf", storage: float16)
"""


def doc(uri):
    return types.TextDocumentIdentifier(uri)


async def test_hover_user_binding_and_builtin(client):
    uri = "file:///tmp/hover.aner"
    await open_doc(client, uri, SCRIPT)
    h = await client.text_document_hover_async(types.HoverParams(doc(uri), at(SCRIPT, "total")))
    assert "total: Int" in h.contents.value
    h = await client.text_document_hover_async(
        types.HoverParams(doc(uri), at(SCRIPT, "load_model", 2))
    )
    assert "load_model(path: String" in h.contents.value and "GGUF" in h.contents.value
    h = await client.text_document_hover_async(
        types.HoverParams(doc(uri), at(SCRIPT, "float16", 1))
    )
    assert "Storage.float16" in h.contents.value
    text = 'let e = evaluate(load_model("m.gguf"), texts(["a"], context: 8))\nprint(e.perplexity)\n'
    await open_doc(client, "file:///tmp/hover_field.aner", text)
    h = await client.text_document_hover_async(
        types.HoverParams(doc("file:///tmp/hover_field.aner"), at(text, "perplexity", 2))
    )
    assert h.contents.value.startswith("```aner\nEvaluation.perplexity: Float\n```")


async def test_utf16_positions_after_non_ascii(client):
    uri = "file:///tmp/utf16.aner"
    await open_doc(client, uri, SCRIPT)
    pos = at(SCRIPT, "count)")
    assert pos.character == SCRIPT.split("\n")[6].index("count") + 1  # the emoji is 2 UTF-16 units
    h = await client.text_document_hover_async(types.HoverParams(doc(uri), pos))
    assert h is not None and "count: Int" in h.contents.value
    assert h.range.start == pos and h.range.end.character == pos.character + len("count")


async def test_definition_across_imports(client, tmp_path):
    (tmp_path / "lib.aner").write_text(
        "let shared_rank = 4\nfn helper(x: Int) -> Int {\n  return x\n}\n"
    )
    text = 'import "lib.aner"\nlet r = helper(shared_rank)\n'
    uri = (tmp_path / "main.aner").as_uri()
    await open_doc(client, uri, text)
    loc = await client.text_document_definition_async(
        types.DefinitionParams(doc(uri), at(text, "helper", 1))
    )
    loc = loc[0] if isinstance(loc, list) else loc
    assert loc.uri == (tmp_path / "lib.aner").as_uri() and loc.range.start == types.Position(1, 3)
    loc = await client.text_document_definition_async(
        types.DefinitionParams(doc(uri), at(text, "shared_rank"))
    )
    loc = loc[0] if isinstance(loc, list) else loc
    assert loc.range.start == types.Position(0, 4)


async def test_rename_local_binding(client):
    uri = "file:///tmp/rename.aner"
    await open_doc(client, uri, SCRIPT)
    edit = await client.text_document_rename_async(
        types.RenameParams(doc(uri), at(SCRIPT, "count = 3"), "n_items")
    )
    edits = edit.changes[uri]
    assert len(edits) == 4  # the definition and three uses
    assert all(
        e.new_text == "n_items" and e.range.end.character - e.range.start.character == 5
        for e in edits
    )


async def test_references_with_and_without_the_declaration(client):
    uri = "file:///tmp/references.aner"
    await open_doc(client, uri, SCRIPT)

    async def refs(marker, declaration):
        return await client.text_document_references_async(
            types.ReferenceParams(
                context=types.ReferenceContext(include_declaration=declaration),
                text_document=doc(uri),
                position=at(SCRIPT, marker),
            )
        )

    lines = sorted(r.range.start.line for r in await refs("count)", True))
    assert lines == [5, 6, 10, 10]  # `let count`, the use after the emoji, two in `total`
    uses = await refs("twice(count)", False)
    assert [(r.uri, r.range.start) for r in uses] == [(uri, types.Position(10, 12))]
    assert await refs("load_model", True) is None  # a builtin: no user definition


async def test_document_symbols(client):
    uri = "file:///tmp/symbols.aner"
    await open_doc(client, uri, SCRIPT)
    symbols = await client.text_document_document_symbol_async(types.DocumentSymbolParams(doc(uri)))
    names = {s.name: s for s in symbols}
    assert {"Budget", "Level", "note", "count", "twice", "total", "m"} <= set(names)
    assert [c.name for c in names["Budget"].children] == ["name", "share"]
    assert names["twice"].kind == types.SymbolKind.Function


async def test_semantic_tokens(client):
    uri = "file:///tmp/tokens.aner"
    await open_doc(client, uri, SCRIPT)
    tokens = await client.text_document_semantic_tokens_full_async(
        types.SemanticTokensParams(doc(uri))
    )
    data, line, col, found = list(tokens.data), 0, 0, {}
    for i in range(0, len(data), 5):
        line += data[i]
        col = data[i + 1] if data[i] else col + data[i + 1]
        found[(line, col)] = (TOKEN_TYPES[data[i + 3]], data[i + 2])
    assert found[(7, 3)] == ("function", 5)  # fn twice (declaration)
    assert found[(0, 0)] == ("keyword", 6)
    row = SCRIPT.split("\n")[6]
    assert found[(6, row.index("count") + 1)] == ("variable", 5)  # after the emoji, in UTF-16 units
    assert found[(11, 8)] == ("function", 10)  # builtin load_model
