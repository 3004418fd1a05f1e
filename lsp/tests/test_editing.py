"""Diagnostics, completion and signature help through the real server subprocess."""

from __future__ import annotations

import pytest
from lsp_helpers import at, open_doc, publications
from lsprotocol import types

pytestmark = pytest.mark.asyncio(loop_scope="module")

BROKEN = """let base = load_model("m.gguf", storage: nf4_double_quant)
let a = lora(base, rank: 2 alpha: 4.0)
let note = "ok"
fn broken(x: Int) -> Int {
  return x +
}
let r = lora(base, rank: 0)
"""


def labels(result) -> list[str]:
    items = result.items if isinstance(result, types.CompletionList) else result
    return [i.label for i in items]


async def complete(client, uri, text, marker, delta=0):
    return labels(
        await client.text_document_completion_async(
            types.CompletionParams(
                text_document=types.TextDocumentIdentifier(uri), position=at(text, marker, delta)
            )
        )
    )


async def test_two_broken_declarations_still_diagnose_and_complete(client):
    uri = "file:///tmp/broken.aner"
    diags = await open_doc(client, uri, BROKEN)
    lines = sorted(d.range.start.line for d in diags)
    assert 1 in lines and (4 in lines or 5 in lines), lines  # both syntax errors reported
    assert any(d.range.start.line == 6 and "rank" in d.message for d in diags), [
        d.message for d in diags
    ]
    text = BROKEN + "let z = no"
    client.text_document_did_change(
        types.DidChangeTextDocumentParams(
            types.VersionedTextDocumentIdentifier(uri=uri, version=2),
            [types.TextDocumentContentChangeWholeDocument(text=text)],
        )
    )
    await publications(client).after(uri, 3)  # opened (twice), then the edit analysed
    got = await complete(client, uri, text, "let z = no", len("let z = no"))
    assert "note" in got and "base" in got and "lora" in got and "let" in got


async def test_member_completion_by_receiver_type(client):
    text = 'let e = evaluate(load_model("m.gguf"), texts(["a"], context: 8))\nprint(e.)\n'
    await open_doc(client, "file:///tmp/member.aner", text)
    got = await complete(client, "file:///tmp/member.aner", text, "e.)", 2)
    assert {"loss", "perplexity", "scored_tokens"} <= set(got)
    assert "load_model" not in got and "let" not in got


async def test_named_arguments_not_given_and_enum_members(client):
    text = 'let m = load_model("m.gguf")\nlet a = lora(m, rank: 2, )\nlet b = load_model("x", storage: )\n'
    uri = "file:///tmp/named.aner"
    await open_doc(client, uri, text)
    got = await complete(client, uri, text, "rank: 2, ", len("rank: 2, "))
    assert "alpha:" in got and "targets:" in got
    assert "rank:" not in got and "model:" not in got
    got = await complete(client, uri, text, "storage: ", len("storage: "))
    assert got[:3] == ["float32", "float16", "nf4_double_quant"] or {
        "float32",
        "nf4_double_quant",
    } <= set(got)


async def test_import_path_completion(client, tmp_path_factory):
    root = tmp_path_factory.mktemp("imp")
    (root / "lib").mkdir()
    (root / "lib" / "shared.aner").write_text("let k = 1\n")
    (root / "notes.txt").write_text("x")
    text = 'import "lib/'
    uri = (root / "main.aner").as_uri()
    await open_doc(client, uri, text)
    assert await complete(client, uri, text, "lib/", 4) == ["shared.aner"]
    assert "lib/" in await complete(client, uri, 'import "', '"', 1)


async def test_signature_help_overloads_and_active_parameter(client):
    text = 'let m = load_model("m.gguf")\nlet a = lora(m, rank: 2, alpha: \nlet n = len(\nlet g = lora(m, 4, '
    uri = "file:///tmp/sig.aner"
    await open_doc(client, uri, text)

    async def sig(marker, delta):
        return await client.text_document_signature_help_async(
            types.SignatureHelpParams(
                text_document=types.TextDocumentIdentifier(uri), position=at(text, marker, delta)
            )
        )

    h = await sig("alpha: ", len("alpha: "))
    active = h.signatures[h.active_signature]
    start, end = active.parameters[h.active_parameter].label
    assert active.label[start:end].startswith("alpha: Float")
    h = await sig("len(", 4)
    assert len(h.signatures) == 2  # List and String overloads
    h = await sig("lora(m, 4, ", len("lora(m, 4, "))
    active = h.signatures[h.active_signature]
    start, end = active.parameters[h.active_parameter].label
    assert h.active_parameter == 2 and active.label[start:end].startswith("alpha: ")


async def test_enum_members_inside_a_list_argument_and_methods(client):
    text = 'let m = load_model("m.gguf")\nlet a = lora(m, targets: [q_proj, ])\nprint(m.)\n'
    uri = "file:///tmp/list_enum.aner"
    await open_doc(client, uri, text)
    got = await complete(client, uri, text, "q_proj, ", len("q_proj, "))
    assert {"q_proj", "v_proj", "o_proj"} <= set(got)
    assert "alpha:" not in got  # not a place for a named argument
    got = await complete(client, uri, text, "m.)", 2)
    assert {"generate", "chat", "evaluate", "lora"} <= set(got)  # functions taking a Model first
    assert "print" not in got and "len" not in got


async def test_completion_right_after_an_edit_uses_the_live_text(client):
    """Completion sent before the edit is analysed: names come from the previous analysis, the
    call context from the live text."""
    uri = "file:///tmp/live.aner"
    text = 'let m = load_model("m.gguf")\nlet width = 3\n'
    await open_doc(client, uri, text)
    text2 = text + "let q = lora(m, rank: width, "
    client.text_document_did_change(
        types.DidChangeTextDocumentParams(
            types.VersionedTextDocumentIdentifier(uri=uri, version=2),
            [types.TextDocumentContentChangeWholeDocument(text=text2)],
        )
    )
    got = await complete(client, uri, text2, "width, ", len("width, "))
    assert "alpha:" in got and "rank:" not in got and "width" in got
    found = await publications(client).after(uri, 3)  # opened (twice), then the edit analysed
    typed = [d for d in found if d.code != "E-GGUF-NOT-FOUND"]  # m.gguf: the file checks'
    assert typed and all(d.range.start.line == 2 for d in typed)
