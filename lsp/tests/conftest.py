"""pytest-lsp harness: one real `aner lsp` server subprocess per test module, driven over stdio."""

from __future__ import annotations

import sys

import pytest_lsp
from lsp_helpers import Publications
from lsprotocol import types
from pytest_lsp import ClientServerConfig, LanguageClient

SERVER = [sys.executable, "-m", "aner_lang.cli", "lsp"]  # what `aner lsp` runs


@pytest_lsp.fixture(scope="module", config=ClientServerConfig(server_command=SERVER))
async def client(lsp_client: LanguageClient):
    lsp_client.diagnostics = Publications()  # counts publications (lsp_helpers.open_doc)
    result = await lsp_client.initialize_session(
        types.InitializeParams(capabilities=pytest_lsp.client_capabilities("visual_studio_code"))
    )
    lsp_client.server_capabilities = result.capabilities  # what the server advertised
    yield
    await lsp_client.shutdown_session()
