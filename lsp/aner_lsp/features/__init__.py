"""The language features, one module per feature.

Each module has the feature as pure functions of an analysis snapshot, the text and an offset,
and a `register(server)` that adds its request or notification handlers to the server, with the
capability options they advertise (pygls derives the server's capabilities from them).

Every feature module is imported before the server answers `initialize`, so none imports the
parser or the checker at module level: functions that need the syntax tree's classes import them
when they run (the analysis has loaded them by then)."""

from __future__ import annotations

from collections.abc import Callable

from aner_lsp.documents import AnerServer
from aner_lsp.features import (
    code_actions,
    completion,
    definition,
    diagnostics,
    formatting,
    hover,
    references,
    semantic_tokens,
    signature_help,
    symbols,
)

REGISTRATIONS: tuple[Callable[[AnerServer], None], ...] = (
    diagnostics.register,
    completion.register,
    signature_help.register,
    hover.register,
    definition.register,
    references.register,
    symbols.register,
    semantic_tokens.register,
    formatting.register,
    code_actions.register,
)


def register_all(server: AnerServer) -> None:
    for register in REGISTRATIONS:
        register(server)
