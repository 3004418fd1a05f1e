"""Signature help: every overload of the call the cursor is in, the active one and the active
parameter (positional or named). Like completion, it reads the call from the live text and never
waits for an analysis."""

from __future__ import annotations

from typing import TYPE_CHECKING

from lsprotocol import types as lsp

from aner_lsp.cursor import context_at
from aner_lsp.documents import AnerServer
from aner_lsp.markup import markdown
from aner_lsp.signatures import active_parameter, signatures_of

if TYPE_CHECKING:
    from aner_lsp.stale import AnalysisView


def signature_help(analysis: AnalysisView, source: str, offset: int) -> lsp.SignatureHelp | None:
    frame = context_at(source, offset).call
    if frame is None:
        return None
    sigs = signatures_of(analysis, frame.callee, offset)
    if not sigs:
        return None
    infos = []
    for sig in sigs:
        params = [
            lsp.ParameterInformation(label=o, documentation=p.doc or None)
            for p, o in zip(sig.params, sig.param_offsets())
        ]
        infos.append(
            lsp.SignatureInformation(
                label=sig.label(),
                parameters=params,
                documentation=markdown(sig.doc) if sig.doc else None,
            )
        )
    actives = [active_parameter(frame, s) for s in sigs]
    best = next(
        (
            i
            for i, a in enumerate(actives)
            if a is not None and set(frame.named) <= {p.name for p in sigs[i].params}
        ),
        0,
    )
    return lsp.SignatureHelp(infos, active_signature=best, active_parameter=actives[best])


def on_signature_help(ls: AnerServer, params: lsp.SignatureHelpParams) -> lsp.SignatureHelp | None:
    analysis, index = ls.live(params.text_document.uri)
    return signature_help(analysis, index.source, index.offset(params.position))


def register(server: AnerServer) -> None:
    server.feature(
        lsp.TEXT_DOCUMENT_SIGNATURE_HELP,
        lsp.SignatureHelpOptions(trigger_characters=["(", ","], retrigger_characters=[":"]),
    )(on_signature_help)
