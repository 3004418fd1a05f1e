"""The Aner language server: creates the pygls server and registers every feature on it. Run with
`aner lsp` or `python -m aner_lsp.server` (stdio).

Start-up imports only the protocol, pygls and the feature registrations; the parser, checker and
registry load once the client has its answer to `initialize` (`initialized`)."""

from __future__ import annotations

import sys

from lsprotocol import types as lsp

from aner_lsp.documents import AnerServer
from aner_lsp.features import register_all

SWITCH_INTERVAL_S = 0.0005


def initialized(ls: AnerServer, params: lsp.InitializedParams) -> None:
    """Warm up (parser, checker, registry) once the client has its answer to `initialize`."""
    import aner_lang.check  # noqa: F401  (imported for its cost, paid now instead of on first use)
    from aner_lang.builtins import registry

    registry()


server = AnerServer()
server.feature(lsp.INITIALIZED)(initialized)
register_all(server)


def main() -> int:
    """Serve on stdio (what editors and `aner lsp` use). A short GIL switch interval lets the
    request loop take turns with a background analysis often (the default 5 ms per hand-off
    made a completion wait hundreds of milliseconds behind a re-analysis)."""
    sys.setswitchinterval(SWITCH_INTERVAL_S)
    server.start_io()
    return 0


if __name__ == "__main__":
    main()
