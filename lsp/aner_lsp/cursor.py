"""What the cursor is in, read from the live text before it (which usually does not parse yet).

A stack machine over `lexer.tokens` from the start of the enclosing top-level chunk tracks the
open brackets: for each open call, its callee, receiver (method syntax `x.f(`), how many
positional arguments are complete, the named arguments given and the name being filled now.
This is the interactive-parser idea of research section 3.5, done on tokens so that it works in
every half-typed state the LALR parser rejects."""

from __future__ import annotations

from dataclasses import dataclass, field

from aner_lsp.lexer import Tok, statement_start, tokens


@dataclass
class CallFrame:
    callee: str
    receiver: tuple[Tok, ...] = ()
    """The tokens of `x` in `x.f(`, for method syntax; empty for a plain call."""
    positional: int = 0
    named: list[str] = field(default_factory=list)
    current: str | None = None
    """The named argument whose value is being typed (`rank: |`)."""
    open_offset: int = 0


@dataclass
class Context:
    prefix: str
    """The identifier characters just before the cursor (what completion filters by)."""
    call: CallFrame | None = None
    member_of: tuple[Tok, ...] | None = None
    """After `x.`: the tokens of `x`."""
    import_path: str | None = None
    """Inside `import "...`: the path typed so far."""
    in_string_or_comment: bool = False
    after_let: bool = False
    """Naming a new binding (`let |`, `fn |`): nothing to complete."""
    in_list: bool = False
    """Inside a list literal that is (part of) the argument of `call` (`targets: [q_proj, |`)."""


def _chain_before(toks: list[Tok], end: int) -> tuple[Tok, ...]:
    """The postfix expression (`a.b(c)[0]`) ending just before index `end`."""
    i = end - 1
    depth = 0
    while i >= 0:
        t = toks[i]
        if t.text in (")", "]"):
            depth += 1
        elif t.text in ("(", "["):
            if depth == 0:
                break
            depth -= 1
        elif depth == 0 and not (
            t.kind == "name" or t.text == "." or t.kind in ("string", "number")
        ):
            break
        elif (
            depth == 0
            and t.kind in ("name", "string", "number")
            and i > 0
            and toks[i - 1].kind == "name"
        ):
            break
        i -= 1
    return tuple(toks[i + 1 : end])


def context_at(source: str, offset: int) -> Context:
    start = statement_start(source, offset)
    text = source[start:offset]
    toks = [t for t in tokens(text, start) if t.kind != "newline"]
    prefix = ""
    if toks and toks[-1].end == offset and toks[-1].kind in ("name", "keyword"):
        prefix = toks[-1].text
        toks = toks[:-1]
    ctx = Context(prefix)
    if toks and toks[-1].end == offset and toks[-1].kind in ("comment", "string"):
        last = toks[-1]
        unterminated = last.kind == "string" and (
            len(last.text) == 1 or not last.text.endswith('"')
        )
        if unterminated and len(toks) > 1 and toks[-2].text == "import":
            ctx.import_path = last.text[1:]
        ctx.in_string_or_comment = last.kind == "comment" or unterminated
        return ctx
    stack: list[CallFrame | str] = []  # a call, or the bracket that opened a non-call group
    for i, t in enumerate(toks):
        if t.text in ("(", "[", "{"):
            frame: CallFrame | str = t.text
            if t.text == "(" and i > 0 and toks[i - 1].kind == "name":
                dotted = i > 1 and toks[i - 2].text == "."
                frame = CallFrame(
                    toks[i - 1].text,
                    _chain_before(toks, i - 2) if dotted else (),
                    open_offset=t.start,
                )
            stack.append(frame)
        elif t.text in (")", "]", "}"):
            if stack:
                stack.pop()
        elif stack and isinstance(stack[-1], CallFrame):
            frame = stack[-1]
            if t.text == ",":
                if frame.current is None:
                    frame.positional += 1
                frame.current = None
            elif (
                t.text == ":"
                and i > 0
                and toks[i - 1].kind == "name"
                and (toks[i - 2].text in ("(", ","))
            ):
                frame.current = toks[i - 1].text
                frame.named.append(frame.current)
    for entry in reversed(stack):  # the innermost call, seen through list literals only
        if isinstance(entry, CallFrame):
            ctx.call = entry
            break
        if entry != "[":
            break
        ctx.in_list = True
    if toks and toks[-1].text == ".":
        ctx.member_of = _chain_before(toks, len(toks) - 1)
    ctx.after_let = bool(toks) and toks[-1].text in ("let", "fn", "record", "enum", "for")
    return ctx
