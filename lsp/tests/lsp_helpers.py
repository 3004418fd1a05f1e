"""Opening buffers and addressing positions by a marker, for the end-to-end tests."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

from lsprotocol import types
from pytest_lsp import LanguageClient

from aner_lsp.positions import LineIndex


class Publications(dict[str, Sequence[types.Diagnostic]]):
    """The client's `diagnostics` (the last published for each URI) that also counts each URI's
    publications, so a test can wait for the one it means: the server publishes each version
    twice, after the analysis and, whole, after the file checks."""

    def __init__(self) -> None:
        super().__init__()
        self.counts: dict[str, int] = {}
        self._changed = asyncio.Event()

    def __setitem__(self, uri: str, diagnostics: Sequence[types.Diagnostic]) -> None:
        super().__setitem__(uri, diagnostics)
        self.counts[uri] = self.counts.get(uri, 0) + 1
        self._changed.set()

    async def after(self, uri: str, count: int) -> Sequence[types.Diagnostic]:
        """The diagnostics of `uri` once it has been published `count` times in all."""
        while self.counts.get(uri, 0) < count:
            self._changed.clear()
            await self._changed.wait()
        return self[uri]


def publications(client: LanguageClient) -> Publications:
    found = client.diagnostics
    assert isinstance(found, Publications)  # conftest installs it
    return found


async def open_doc(client: LanguageClient, uri: str, text: str) -> Sequence[types.Diagnostic]:
    """Open `text` as `uri` and return all the diagnostics the server publishes for it (the
    second publication: after the file checks)."""
    published = publications(client)
    before = published.counts.get(uri, 0)
    client.text_document_did_open(
        types.DidOpenTextDocumentParams(
            types.TextDocumentItem(uri=uri, language_id="aner", version=1, text=text)
        )
    )
    return await published.after(uri, before + 2)


def at(text: str, marker: str, delta: int = 0) -> types.Position:
    """The UTF-16 position of the first `marker` in `text` (plus `delta` characters)."""
    return LineIndex(text).position(text.index(marker) + delta)
