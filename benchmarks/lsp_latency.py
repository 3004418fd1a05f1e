"""Completion and signature-help latency of the real language server on a 2,000-line file
(target: p95 under 50 ms), measured over stdio from a pygls client exactly as an editor talks to it.

Baseline, measured in the same run: the round trip of a hover on a blank line (JSON-RPC,
document lookup and offset conversion, no feature work), so the ratios show what the features
themselves cost. Also printed: completion sent right after an edit (the server is then still
re-analysing in the background and answers from the previous analysis seen through the edit),
and the time from opening the file to its diagnostics.
Run: python benchmarks/lsp_latency.py [lines] [samples]
"""

from __future__ import annotations

import asyncio
import os
import statistics
import sys
import time

from lsprotocol import types
from pygls.lsp.client import LanguageClient

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from check_speed import generate

from aner_lsp.positions import LineIndex

URI = "file:///tmp/lsp_latency.aner"


def p95(xs: list[float]) -> float:
    return statistics.quantiles(xs, n=20)[-1]


async def timed(make_request, samples: list) -> list[float]:
    out = []
    for s in samples:
        t = time.perf_counter()
        await make_request(s)
        out.append((time.perf_counter() - t) * 1000)
    return out


async def main(lines: int, samples: int) -> None:
    text = (
        generate(lines)
        + 'let m = load_model("m.gguf", storage: float16)\nlet a = lora(m, rank: 2, alpha: 4.0)\n'
    )
    index = LineIndex(text)
    doc = types.TextDocumentIdentifier(URI)
    # Cursor positions spread over the file: inside a call after a named argument, and a blank line.
    starts = [i for i in range(len(text)) if text.startswith(", b: ", i)]
    step = max(1, len(starts) // samples)
    in_call = [index.position(i + len(", b: ")) for i in starts[::step]][:samples]
    blank = (
        index.position(text.index("\n\n") + 1)
        if "\n\n" in text
        else types.Position(len(index.starts) - 1, 0)
    )

    client = LanguageClient("lsp-latency", "1")
    diagnostics = asyncio.Event()
    client.feature(types.TEXT_DOCUMENT_PUBLISH_DIAGNOSTICS)(lambda params: diagnostics.set())
    await client.start_io(sys.executable, "-m", "aner_lsp.server")
    await client.initialize_async(types.InitializeParams(capabilities=types.ClientCapabilities()))
    client.initialized(types.InitializedParams())
    t = time.perf_counter()
    client.text_document_did_open(
        types.DidOpenTextDocumentParams(types.TextDocumentItem(URI, "aner", 1, text))
    )
    await diagnostics.wait()
    open_ms = (time.perf_counter() - t) * 1000

    base = await timed(
        lambda p: client.text_document_hover_async(types.HoverParams(doc, p)),
        [blank] * len(in_call),
    )
    comp = await timed(
        lambda p: client.text_document_completion_async(types.CompletionParams(doc, p)), in_call
    )
    sig = await timed(
        lambda p: client.text_document_signature_help_async(types.SignatureHelpParams(doc, p)),
        in_call,
    )
    first_line_end = index.position(text.index("\n"))
    version = iter(range(2, 10**6))

    def type_a_space() -> None:
        """An edit far from the cursor (a space at the end of line 1), as typing elsewhere sends."""
        client.text_document_did_change(
            types.DidChangeTextDocumentParams(
                types.VersionedTextDocumentIdentifier(uri=URI, version=next(version)),
                [
                    types.TextDocumentContentChangePartial(
                        types.Range(first_line_end, first_line_end), " "
                    )
                ],
            )
        )

    async def edit_then_complete(p):
        type_a_space()
        return await client.text_document_completion_async(types.CompletionParams(doc, p))

    edited = await timed(edit_then_complete, in_call)

    async def complete_during_analysis(p):
        type_a_space()
        await asyncio.sleep(0.2)  # past the debounce: the background analysis is running now
        t = time.perf_counter()
        await client.text_document_completion_async(types.CompletionParams(doc, p))
        return time.perf_counter() - t

    during = [1000 * await complete_during_analysis(p) for p in in_call[:20]]
    await client.shutdown_async(None)
    client.exit(None)
    await client.stop()

    print(
        f"file: {len(index.starts)} lines, {len(text)} characters; {len(in_call)} samples per request"
    )
    print(f"open + analyse + diagnostics: {open_ms:.0f} ms")
    print(
        f"baseline (hover on a blank line): p50 {statistics.median(base):.2f} ms, p95 {p95(base):.2f} ms"
    )
    for name, xs in (
        ("completion", comp),
        ("signature help", sig),
        ("completion after an edit", edited),
        ("completion during re-analysis", during),
    ):
        verdict = "OK" if p95(xs) < 50 else "OVER TARGET"
        print(
            f"{name}: p50 {statistics.median(xs):.2f} ms, p95 {p95(xs):.2f} ms "
            f"({p95(xs) / p95(base):.1f}x baseline p95; target p95 < 50 ms: {verdict})"
        )


if __name__ == "__main__":
    asyncio.run(
        main(
            int(sys.argv[1]) if len(sys.argv) > 1 else 2000,
            int(sys.argv[2]) if len(sys.argv) > 2 else 100,
        )
    )
