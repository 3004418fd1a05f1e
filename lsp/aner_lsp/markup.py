"""Documentation text sent to the editor: Markdown, with Aner code in ```aner fences."""

from __future__ import annotations

from lsprotocol import types as lsp


def markdown(text: str) -> lsp.MarkupContent:
    return lsp.MarkupContent(kind=lsp.MarkupKind.Markdown, value=text)


def aner_code(code: str, doc: str = "") -> str:
    """`code` in an ```aner fence, followed by `doc` (if any) on the next line."""
    return f"```aner\n{code}\n```" + (f"\n{doc}" if doc else "")
