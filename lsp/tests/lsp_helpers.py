"""Opening buffers and addressing positions by a marker, for the end-to-end tests."""

from __future__ import annotations

from lsprotocol import types
from pytest_lsp import LanguageClient

from aner_lsp.positions import LineIndex


async def open_doc(client: LanguageClient, uri: str, text: str) -> list[types.Diagnostic]:
    """Open `text` as `uri` and return the diagnostics the server publishes for it."""
    client.text_document_did_open(
        types.DidOpenTextDocumentParams(
            types.TextDocumentItem(uri=uri, language_id="aner", version=1, text=text)
        )
    )
    await client.wait_for_notification(types.TEXT_DOCUMENT_PUBLISH_DIAGNOSTICS)
    return client.diagnostics[uri]


def at(text: str, marker: str, delta: int = 0) -> types.Position:
    """The UTF-16 position of the first `marker` in `text` (plus `delta` characters)."""
    return LineIndex(text).position(text.index(marker) + delta)
