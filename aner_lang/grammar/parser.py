"""Parse Aner source into a `Module` of frozen AST nodes, with syntax errors as diagnostics.

Design:

* One Lark LALR parser, built once per process, with the AST built *inside* the parse
  (``transformer=``): no intermediate tree, which keeps `aner check` on 10,000 lines well under a
  second. `_fast_parse` drives Lark's LALR tables and rule callbacks with a lean loop of its own;
  on a syntax error Lark's own parse is re-run, so errors are exactly Lark's.
* A post-lexer (`_Newlines`) decides which newlines separate statements: it drops newlines inside
  ``( )``/``[ ]``, after a token that cannot end an expression, and before ``}``, ``else`` or ``.``.
* Error recovery: when the whole file does not parse, it is cut into top-level chunks (a line that
  starts in column 1 with a letter at bracket depth 0 starts a chunk) and each chunk is parsed on
  its own, its token positions shifted back to absolute ones. Every broken chunk gives one
  diagnostic; every healthy chunk contributes its statements, so the checker and the LSP keep
  working on a half-typed file.
* String interpolation ``"a ${expr} b"`` parses each ``${...}`` with the same parser (start symbol
  ``expr``), shifted to the position of the expression inside the string.

`parse(source, path) -> (Module, diagnostics)` never raises for bad input.
"""

from __future__ import annotations

import gc
import itertools
import math
import re
import sys
import threading
from collections.abc import Callable, Iterator, Sequence
from fractions import Fraction
from functools import lru_cache
from typing import Any, Literal, Protocol, final, overload

from lark import Lark, Token, Transformer
from lark.common import LexerConf
from lark.exceptions import UnexpectedCharacters, UnexpectedInput, UnexpectedToken
from lark.lexer import Lexer

from aner_lang.grammar import ast
from aner_lang.grammar.ast import Span
from aner_lang.grammar.limits import (
    INT_MAX,
    MAX_NESTING,
    MAX_NUMBER_CHARS,
    ensure_recursion_limit,
    too_deep,
)
from aner_lang.grammar.strings import interpolation_end, string_end
from aner_lang.problems import diagnostics as msg
from aner_lang.problems.diagnostics import Diagnostic

BYTE_UNITS = {
    "B": 1,
    "KB": 1000,
    "MB": 1000**2,
    "GB": 1000**3,
    "TB": 1000**4,
    "KiB": 1024,
    "MiB": 1024**2,
    "GiB": 1024**3,
    "TiB": 1024**4,
}

# Tokens after which a newline cannot end a statement (the expression or declaration goes on).
_CONTINUES = frozenset(
    {
        "LBRACE",
        "COMMA",
        "BINOP",
        "NEG",
        "AND",
        "OR",
        "NOT",
        "EQUAL",
        "COLON",
        "__ANON_0",
        "DOT",
        "LPAR",
        "LSQB",
        "IN",
    }
)
# Tokens before which a newline is dropped: `}`, `else` and a method chain's leading `.`.
_JOINS_PREVIOUS = frozenset({"RBRACE", "ELSE", "DOT"})
_PRECEDENCE = {
    "or": 1,
    "and": 2,
    "==": 4,
    "!=": 4,
    "<": 4,
    "<=": 4,
    ">": 4,
    ">=": 4,
    "+": 5,
    "-": 5,
    "*": 6,
    "/": 6,
    "%": 6,
}
_NOT_PREC = 4
LARGEST = {"Int": f"{INT_MAX:,}", "Bytes": f"{INT_MAX:,} B", "Float": f"{sys.float_info.max:.4g}"}
"""The largest value of each numeric type, as the literal-range errors state it."""
_OPEN = frozenset({"LPAR", "LSQB"})
_CLOSE = frozenset({"RPAR", "RSQB"})

_DISPLAY = {
    "NAME": "a name",
    "INT": "an integer",
    "FLOAT": "a float",
    "BYTES": "a byte size",
    "STRING": "a string",
    "_NL": "a newline",
    "$END": "end of file",
    "BINOP": "an operator",
}


class _State(threading.local):
    """Per-thread parse state: position shifts of nested parses and the diagnostics they add."""

    def __init__(self) -> None:
        self.shifts: list[Shift] = []
        self.diagnostics: list[Diagnostic] = []
        self.interpolation_depth = 0


_state = _State()


@final
class _Token(Token):
    """A token of `_Lexer`: a Lark `Token` whose positions are always set (Lark's are optional)."""

    __slots__ = ()
    start_pos: int
    line: int
    column: int
    end_line: int
    end_column: int
    end_pos: int


Shift = tuple[int, int, int]
"""Where a nested parse's text sits in the file: (line offset, column offset, char offset)."""


class _Lexer(Lexer):
    """Aner's tokenizer, built from the grammar's terminal definitions. One master regex is faster
    than Lark's own lexer loop, and this is also where the statement-separating newlines are chosen
    and where token positions are shifted for chunked / interpolated parses."""

    def __init__(self, conf: LexerConf) -> None:
        name_re = re.compile(conf.terminals_by_name["NAME"].pattern.to_regexp())
        self.keywords: dict[str, str] = {}
        parts: list[str] = []
        terminals = sorted(
            conf.terminals,
            key=lambda t: (-t.priority, -t.pattern.max_width, -len(t.pattern.value), t.name),
        )
        for t in terminals:
            if t.pattern.type == "str" and name_re.fullmatch(t.pattern.value):
                self.keywords[t.pattern.value] = t.name
            else:
                parts.append(f"(?P<{t.name}>{t.pattern.to_regexp()})")
        self.regex = re.compile("|".join(parts))
        self.ignore = frozenset(conf.ignore)

    # Lark's interface-0 custom lexer: Lark calls it with the text alone.
    def lex(self, text: str) -> Iterator[_Token]:  # type: ignore[override]
        line_off, col_off, pos_off = _state.shifts[-1] if _state.shifts else (0, 0, 0)
        match = self.regex.match
        # _Token() minus its deprecated-keyword shim: hot path
        new_token: Callable[..., _Token] = _Token._future_new
        keywords = self.keywords
        ignore = self.ignore
        pos, line, line_start, end = 0, 1, 0, len(text)
        depth = 0
        prev: str | None = None
        pending: _Token | None = None
        str_new = str.__new__
        while pos < end:
            m = match(text, pos)
            if m is None:
                # unshifted: _error_diagnostic applies the shift
                raise UnexpectedCharacters(  # type: ignore[no-untyped-call]  # Lark's is untyped
                    text, pos, line, pos - line_start + 1
                )
            kind = m.lastgroup or ""  # every alternative of the regex is a named group
            if kind == "STRING":  # the opening quote: the scanner finds the end
                string_stop = string_end(text, pos)
                if string_stop is None:
                    raise UnexpectedCharacters(  # type: ignore[no-untyped-call]  # as above
                        text, pos, line, pos - line_start + 1
                    )
                value, new_pos = text[pos:string_stop], string_stop
            else:
                value, new_pos = m.group(), m.end()
            if kind in ignore:
                if "\n" in value:
                    line += value.count("\n")
                    line_start = pos + value.rfind("\n") + 1
                pos = new_pos
                continue
            col = pos - line_start + 1 + (col_off if line == 1 else 0)
            if kind == "_NL":
                if depth == 0 and prev is not None and prev not in _CONTINUES:
                    pending = new_token(
                        "_NL",
                        value,
                        pos + pos_off,
                        line + line_off,
                        col,
                        line + line_off,
                        col + 1,
                        pos + pos_off + 1,
                    )
                line += value.count("\n")
                line_start = pos + value.rfind("\n") + 1
                pos = new_pos
                continue
            if kind == "NAME":
                kind = keywords.get(value, "NAME")
            elif kind in _OPEN:
                depth += 1
            elif kind in _CLOSE and depth:
                depth -= 1
            if pending is not None:
                if kind not in _JOINS_PREVIOUS:
                    yield pending
                pending = None
            prev = kind
            ln = line + line_off
            # Token(...) written out (its constructor is a Python-level call): hot path
            tok = str_new(_Token, value)
            tok.type = kind
            tok.start_pos = pos + pos_off
            tok.value = value
            tok.line = ln
            tok.column = col
            tok.end_line = ln
            tok.end_column = col + len(value)
            tok.end_pos = new_pos + pos_off
            yield tok
            pos = new_pos


def _span_maker() -> Callable[[int, int, int, int, int, int], Span]:
    """`Span(...)` for the parser's hot path: the frozen dataclass's `__init__` goes through
    `object.__setattr__` per field; setting the slots directly builds the same object in half the time."""
    new = object.__new__
    s_line, s_col, s_end_line, s_end_col, s_start, s_end = (
        Span.__dict__[f].__set__ for f in ("line", "col", "end_line", "end_col", "start", "end")
    )

    def span(line: int, col: int, end_line: int, end_col: int, start: int, end: int) -> Span:
        sp = new(Span)
        s_line(sp, line)
        s_col(sp, col)
        s_end_line(sp, end_line)
        s_end_col(sp, end_col)
        s_start(sp, start)
        s_end(sp, end)
        return sp

    return span


_span = _span_maker()


def _tspan(tok: _Token) -> Span:
    return _span(tok.line, tok.column, tok.end_line, tok.end_column, tok.start_pos, tok.end_pos)


class _Spanned(Protocol):
    """An AST node (every node has a span)."""

    @property
    def span(self) -> Span: ...


def _cover(first: _Token | _Spanned, last: _Token | _Spanned) -> Span:
    """The span from the start of `first` to the end of `last` (tokens or nodes); written out
    because it runs for nearly every node of a large file."""
    if type(first) is _Token:
        line, col, start = first.line, first.column, first.start_pos
    else:
        f = first.span
        line, col, start = f.line, f.col, f.start
    if type(last) is _Token:
        return _span(line, col, last.end_line, last.end_column, start, last.end_pos)
    e = last.span
    return _span(line, col, e.end_line, e.end_col, start, e.end)


Items = list[Any]
"""A rule's children as Lark passes them to its callback: tokens (`_Token`), the nodes of
sub-rules, and None for an absent optional part; the grammar rule fixes which is where."""


def _nodes(items: Items) -> tuple[Any, ...]:
    """The child nodes of a rule, without its tokens and absent optional parts."""
    return tuple(i for i in items if i is not None and not isinstance(i, Token))


_ESCAPES = {"n": "\n", "t": "\t", "r": "\r", '"': '"', "\\": "\\", "$": "$", "0": "\0"}
_ESCAPE_OR_INTERPOLATION = re.compile(r"\\(.)|\$\{", re.S)


class _ToAst(Transformer[_Token, object]):
    """Builds AST nodes during the LALR parse (one method per grammar rule or alias). Keyword and
    bracket tokens are named terminals so that each node's span covers them."""

    def start(self, items: Items) -> tuple[ast.Stmt, ...]:
        return _nodes(items)

    def block(self, items: Items) -> ast.Block:
        return ast.Block(_cover(items[0], items[-1]), _nodes(items))

    def let(self, items: Items) -> ast.Let:
        _, name, ann, value = items
        return ast.Let(_cover(items[0], value), str(name), _tspan(name), ann, value)

    def assign(self, items: Items) -> ast.Assign:
        name, value = items
        return ast.Assign(_cover(name, value), str(name), _tspan(name), value)

    def fn_decl(self, items: Items) -> ast.FnDecl:
        kw, name, *rest = items
        params = tuple(p for p in rest[:-2] if p is not None)
        return ast.FnDecl(_cover(kw, rest[-1]), str(name), _tspan(name), params, rest[-2], rest[-1])

    def param(self, items: Items) -> ast.ParamDecl:
        name, typ, default = items
        return ast.ParamDecl(_cover(name, default or typ), str(name), _tspan(name), typ, default)

    def field_decl(self, items: Items) -> ast.FieldDecl:
        name, typ, default = items
        return ast.FieldDecl(_cover(name, default or typ), str(name), _tspan(name), typ, default)

    def record_decl(self, items: Items) -> ast.RecordDecl:
        return ast.RecordDecl(
            _cover(items[0], items[-1]), str(items[1]), _tspan(items[1]), _nodes(items[2:])
        )

    def enum_member(self, items: Items) -> ast.EnumMemberDecl:
        return ast.EnumMemberDecl(_tspan(items[0]), str(items[0]))

    def enum_decl(self, items: Items) -> ast.EnumDecl:
        return ast.EnumDecl(
            _cover(items[0], items[-1]), str(items[1]), _tspan(items[1]), _nodes(items[2:])
        )

    def if_stmt(self, items: Items) -> ast.If:
        kw, cond, then, orelse = items
        return ast.If(_cover(kw, orelse or then), cond, then, orelse)

    def for_stmt(self, items: Items) -> ast.For:
        kw, var, iterable, body = items
        return ast.For(_cover(kw, body), str(var), _tspan(var), iterable, body)

    def return_stmt(self, items: Items) -> ast.Return:
        kw, value = items
        return ast.Return(_cover(kw, value or kw), value)

    def assert_stmt(self, items: Items) -> ast.Assert:
        kw, cond, message = items
        return ast.Assert(_cover(kw, message or cond), cond, message)

    def import_stmt(self, items: Items) -> ast.Import:
        kw, tok = items
        return ast.Import(_cover(kw, tok), _decode_plain(tok), _tspan(tok))

    def expr_stmt(self, items: Items) -> ast.ExprStmt:
        return ast.ExprStmt(items[0].span, items[0])

    # ---- types ----
    def type_name(self, items: Items) -> ast.TypeName:
        name = items[0]
        return ast.TypeName(_cover(name, items[-1] or name), str(name), _nodes(items[1:]))

    def optional_type(self, items: Items) -> ast.OptionalType:
        return ast.OptionalType(_cover(items[0], items[1]), items[0])

    # ---- expressions ----
    def expr(self, items: Items) -> ast.Expr:
        """Group a flat chain `prefix* operand (op prefix* operand)*` by precedence. Prefix `-`
        binds tightest; prefix `not` takes a whole comparison (`not a == b` is `not (a == b)`).

        This is precedence climbing with its recursion kept on an explicit stack, so a chain of
        any length (thousands of `not` or `-`) groups without Python recursion; the nesting bound
        is checked on the finished tree (`limits.too_deep`)."""
        # Pending work, innermost last: ("climb", min_prec, left, op) continues a climb whose
        # `left` (None until its first operand is in) waits for `op`'s right operand;
        # ("-", token) and ("not", token) wrap the operand that comes back.
        pending: list[tuple[Any, ...]] = [("climb", 0, None, None)]
        pos = 0
        n = len(items)
        while True:
            # descend to the next operand, pushing the prefixes before it
            head = items[pos]
            pos += 1
            while type(head) is _Token:
                if head.type == "NEG":
                    pending.append(("-", head))
                else:
                    pending.append(("not", head))
                    pending.append(("climb", _NOT_PREC, None, None))
                head = items[pos]
                pos += 1
            value: ast.Expr = head
            # return `value` up the pending work until a climb takes another operator
            while True:
                frame = pending.pop()
                kind = frame[0]
                if kind == "-" or kind == "not":
                    tok = frame[1]
                    value = ast.Unary(_cover(tok, value), kind, value)
                    continue
                _, min_prec, left, op = frame
                if left is not None:
                    value = ast.Binary(_cover(left, value), str(op), left, value, _tspan(op))
                if pos < n and _PRECEDENCE[str(items[pos])] >= min_prec:
                    op = items[pos]
                    pos += 1
                    pending.append(("climb", min_prec, value, op))
                    pending.append(("climb", _PRECEDENCE[str(op)] + 1, None, None))
                    break
                if not pending:
                    return value

    def call(self, items: Items) -> ast.Call:
        callee, lpar, *args, rpar = items
        return ast.Call(_cover(callee, rpar), callee, _nodes(args), _cover(lpar, rpar))

    def member(self, items: Items) -> ast.Member:
        obj, name = items
        return ast.Member(_cover(obj, name), obj, str(name), _tspan(name))

    def index(self, items: Items) -> ast.Index:
        obj, _, idx, rsqb = items
        return ast.Index(_cover(obj, rsqb), obj, idx)

    def paren(self, items: Items) -> ast.Expr:
        inner: ast.Expr = items[1]
        return inner

    def named_arg(self, items: Items) -> ast.Arg:
        name, value = items
        return ast.Arg(_cover(name, value), str(name), _tspan(name), value)

    def pos_arg(self, items: Items) -> ast.Arg:
        return ast.Arg(items[0].span, None, None, items[0])

    def int_lit(self, items: Items) -> ast.IntLit:
        tok = items[0]
        digits = _number_text(tok, str(tok))
        value = 0
        if digits is not None and (len(digits) > len(str(INT_MAX)) or int(digits) > INT_MAX):
            _out_of_range(tok, "Int")
        elif digits is not None:
            value = int(digits)
        return ast.IntLit(_tspan(tok), value)

    def float_lit(self, items: Items) -> ast.FloatLit:
        tok = items[0]
        digits = _number_text(tok, str(tok))
        value = float(digits) if digits is not None else 0.0
        if math.isinf(value):
            _out_of_range(tok, "Float")
            value = 0.0
        return ast.FloatLit(_tspan(tok), value)

    def bytes_lit(self, items: Items) -> ast.BytesLit:
        tok = items[0]
        m = re.fullmatch(r"([0-9_.]+)[ \t]*([A-Za-z]+)", str(tok))
        if m is None:
            raise AssertionError(f"the BYTES terminal matched {tok!r}")
        number, unit = m.groups()
        span = _tspan(tok)
        digits = _number_text(tok, number)
        amount = Fraction(digits or 0) * BYTE_UNITS[unit]  # exact: no float rounding
        if amount > INT_MAX:
            _out_of_range(tok, "Bytes")
            amount = Fraction(0)
        elif amount.denominator != 1:
            _state.diagnostics.append(
                msg.bad_literal(span, f"`{tok}` is not a whole number of bytes")
            )
        return ast.BytesLit(span, int(amount), " ".join(str(tok).split()))

    def string_lit(self, items: Items) -> ast.StringLit:
        return ast.StringLit(_tspan(items[0]), _string_parts(items[0]))

    def true_lit(self, items: Items) -> ast.BoolLit:
        return ast.BoolLit(_tspan(items[0]), True)

    def false_lit(self, items: Items) -> ast.BoolLit:
        return ast.BoolLit(_tspan(items[0]), False)

    def none_lit(self, items: Items) -> ast.NoneLit:
        return ast.NoneLit(_tspan(items[0]))

    def name(self, items: Items) -> ast.Name:
        return ast.Name(_tspan(items[0]), str(items[0]))

    def list_lit(self, items: Items) -> ast.ListLit:
        return ast.ListLit(_cover(items[0], items[-1]), _nodes(items))


def _number_text(tok: _Token, text: str) -> str | None:
    """The number `text` of the literal `tok` without `_` and leading zeros; None (reported)
    when the literal is longer than `MAX_NUMBER_CHARS`, which no conversion is attempted on."""
    if len(tok) > MAX_NUMBER_CHARS:
        _state.diagnostics.append(
            msg.bad_literal(
                _tspan(tok),
                f"`{_short(tok)}` is longer than {MAX_NUMBER_CHARS:,} characters, "
                "the limit for a number literal",
            )
        )
        return None
    digits = text.replace("_", "").lstrip("0")
    return digits if digits[:1].isdigit() else "0" + digits


def _out_of_range(tok: _Token, type_name: str) -> None:
    _state.diagnostics.append(
        msg.bad_literal(
            _tspan(tok),
            f"`{_short(tok)}` is larger than the largest {type_name} ({LARGEST[type_name]})",
        )
    )


def _short(tok: _Token) -> str:
    """A literal for a message: a long one shortened to its ends."""
    text = str(tok)
    return text if len(text) <= 40 else f"{text[:18]}...{text[-18:]}"


def _decode_plain(tok: _Token) -> str:
    """A string token's text with its escapes decoded and its interpolations kept verbatim."""
    return "".join(
        _ESCAPES.get(text, text)
        if kind == "escape"
        else "${" + text + "}"
        if kind == "expr"
        else text
        for kind, text, _ in _pieces(str(tok)[1:-1])
    )


def _pieces(raw: str) -> Iterator[tuple[Literal["text", "escape", "expr"], str, int]]:
    """A string literal's body (without its quotes) as (kind, text, offset in `raw`): literal
    text, an escape (the character after the backslash) and an interpolation (the expression
    between `${` and its closing `}`, with the offset of the expression)."""
    pos = 0
    while (m := _ESCAPE_OR_INTERPOLATION.search(raw, pos)) is not None:
        if m.start() > pos:
            yield "text", raw[pos : m.start()], pos
        if m.group(1) is not None:
            yield "escape", m.group(1), m.start()
            pos = m.end()
            continue
        close = interpolation_end(raw, m.end())
        if close is None:
            raise AssertionError(f"the lexer made a string with an open interpolation: {raw!r}")
        yield "expr", raw[m.end() : close - 1], m.end()
        pos = close
    if pos < len(raw):
        yield "text", raw[pos:], pos


def _string_parts(tok: _Token) -> tuple[str | ast.Expr, ...]:
    """Split a string token into text and `${expr}` parts, parsing each expression in place.
    Each level of strings nested in interpolations is a nested parse, a few Python frames deep, so
    interpolations inside more than `MAX_NESTING` strings are not parsed: the strings alone are
    then nested past the bound, which `_bound_nesting` reports (`E-NESTING`)."""
    parts: list[str | ast.Expr] = []
    text: list[str] = []
    for kind, piece, offset in _pieces(str(tok)[1:-1]):
        if kind == "text":
            text.append(piece)
            continue
        if kind == "escape":
            if piece not in _ESCAPES:
                _state.diagnostics.append(
                    msg.bad_literal(_tspan(tok), f"unknown escape `\\{piece}`")
                )
            text.append(_ESCAPES.get(piece, piece))
            continue
        if "".join(text):
            parts.append("".join(text))
        text = []
        inner_start = tok.start_pos + 1 + offset  # after the quote and `${`
        col = tok.column + (inner_start - tok.start_pos)
        if _state.interpolation_depth >= MAX_NESTING:
            continue  # the strings around it nest past the bound: `_bound_nesting` reports them
        _state.interpolation_depth += 1
        try:
            expr = _parse_fragment(piece, tok.line, col, inner_start)
        finally:
            _state.interpolation_depth -= 1
        if expr is not None:
            parts.append(expr)
    if "".join(text) or not parts:
        parts.append("".join(text))
    return tuple(parts)


@lru_cache(maxsize=1)
def _parser() -> Lark:
    return Lark.open(
        "aner.lark",
        rel_to=__file__,
        parser="lalr",
        lexer=_Lexer,
        maybe_placeholders=True,
        transformer=_ToAst(),
        start=["start", "expr"],
    )


_Reduce = tuple[int, str, Callable[[Items], Any]]
_Action = tuple[Literal[True], int] | tuple[Literal[False], _Reduce]
_Tables = tuple[
    dict[int, dict[str, _Action]], dict[int, dict[str, int]], dict[str, int], dict[str, int], _Lexer
]


@lru_cache(maxsize=1)
def _tables() -> _Tables:
    """Lark's LALR tables re-keyed for `_fast_parse`: per state, token type -> (True, next state)
    for a shift or (False, (rule size, rule origin, Lark's callback for the rule)) for a reduce;
    and per state, the next state after each symbol it shifts (the goto after a reduce)."""
    lark = _parser()
    inner = lark.parser.parser.parser
    table, callbacks = inner.parse_table, inner.callbacks
    reduces: dict[int, _Reduce] = {}
    states: dict[int, dict[str, _Action]] = {}
    gotos: dict[int, dict[str, int]] = {}
    for state, actions in table.states.items():
        row: dict[str, _Action] = {}
        goto: dict[str, int] = {}
        for sym, (action, arg) in actions.items():
            if action.name == "Shift":
                row[sym] = (True, arg)
                goto[sym] = arg
            else:
                key = id(arg)
                if key not in reduces:
                    reduces[key] = (len(arg.expansion), str(arg.origin.name), callbacks[arg])
                row[sym] = (False, reduces[key])
        states[state] = row
        gotos[state] = goto
    lexer: _Lexer = lark.parser.lexer.lexer  # ours, inside Lark's wrapper for custom lexers
    return states, gotos, table.start_states, table.end_states, lexer


def _fast_parse(text: str, start: str) -> Any:
    """The LALR loop of Lark's parser (same tables, same rule callbacks), minus its per-token
    overhead. Returns None on any syntax error; the caller then re-runs Lark's own parse, which
    raises the usual exception."""
    states, gotos, start_states, end_states, lexer = _tables()
    end_state = end_states[start]
    state = start_states[start]
    state_stack = [state]
    value_stack: list[Any] = []
    push_state = state_stack.append
    push_value = value_stack.append
    row = states[state]
    try:
        for token in lexer.lex(text):
            ttype = token.type
            while True:
                act = row.get(ttype)
                if act is None:
                    return None
                if act[0]:
                    state = act[1]
                    push_state(state)
                    push_value(token)
                    row = states[state]
                    break
                size, origin, callback = act[1]
                if size:
                    values = value_stack[-size:]
                    del state_stack[-size:]
                    del value_stack[-size:]
                else:
                    values = []
                value = callback(values)
                state = gotos[state_stack[-1]][origin]
                push_state(state)
                push_value(value)
                row = states[state]
    except UnexpectedInput:
        return None
    while True:
        act = row.get("$END")
        if act is None or act[0]:
            return None
        size, origin, callback = act[1]
        if size:
            values = value_stack[-size:]
            del state_stack[-size:]
            del value_stack[-size:]
        else:
            values = []
        value = callback(values)
        state = gotos[state_stack[-1]][origin]
        push_state(state)
        push_value(value)
        if state == end_state:
            return value
        row = states[state]


@overload
def _parse_with_shift(text: str, start: Literal["start"], shift: Shift) -> tuple[ast.Stmt, ...]: ...
@overload
def _parse_with_shift(text: str, start: Literal["expr"], shift: Shift) -> ast.Expr: ...
def _parse_with_shift(text: str, start: str, shift: Shift) -> Any:
    """Parse `text` from the rule `start` (the whole file, or an expression), its positions
    shifted to where it sits in the file."""
    _state.shifts.append(shift)
    try:
        kept = len(_state.diagnostics)
        try:
            result = _fast_parse(text, start)
        except UnexpectedInput:
            result = None
        if result is not None:
            return result
        del _state.diagnostics[kept:]  # the failed fast parse's; Lark's parse adds them again
        return _parser().parse(text, start=start)
    finally:
        _state.shifts.pop()


def _error_diagnostic(err: UnexpectedInput, shift: Shift) -> Diagnostic:
    line_off, col_off, pos_off = shift
    if isinstance(err, UnexpectedToken):
        tok = err.token
        expected = sorted({_display(t) for t in (err.accepts or err.expected)} - {"a newline"})
        if isinstance(tok, _Token):  # one of ours; else Lark's end-of-input token
            found = "newline" if tok.type == "_NL" else f"`{tok}`"
            return msg.syntax_unexpected(_tspan(tok), found, expected)
        end = tok.end_pos if tok.end_pos is not None else pos_off
        span = Span(
            tok.end_line or 1 + line_off,
            tok.end_column or 1,
            tok.end_line or 1 + line_off,
            (tok.end_column or 1) + 1,
            end,
            end,
        )
        return msg.syntax_unexpected(span, "end of input", expected)
    line = err.line + line_off
    col = err.column + (col_off if err.line == 1 else 0)
    # Lark declares `pos_in_stream` None; the UnexpectedCharacters of `_Lexer.lex` sets it.
    pos = err.pos_in_stream + pos_off  # type: ignore[operator]
    char = err.char if isinstance(err, UnexpectedCharacters) else "?"
    span = Span(line, col, line, col + 1, pos, pos + 1)
    # a quote always starts a string: one the lexer stopped at is a string left open
    return msg.syntax_open_string(span) if char == '"' else msg.syntax_bad_char(span, char)


def _display(terminal: str) -> str:
    if terminal in _DISPLAY:
        return _DISPLAY[terminal]
    try:
        pattern = _parser().get_terminal(terminal).pattern
    except KeyError:
        return terminal.lower()
    return f"`{pattern.value}`" if pattern.type == "str" else terminal.lower()


def _parse_fragment(text: str, line: int, col: int, pos: int) -> ast.Expr | None:
    """Parse an interpolated expression found at (line, col, pos) of the enclosing file."""
    shift = (line - 1, col - 1, pos)
    try:
        return _parse_with_shift(text, "expr", shift)
    except UnexpectedInput as err:
        _state.diagnostics.append(_error_diagnostic(err, shift))
        return None


def _chunks(source: str) -> Iterator[tuple[int, int, str]]:
    """Top-level chunks as (line offset, char offset, text): a chunk starts at every line that
    begins with a letter in column 1 (other than `else`). Statements inside blocks and the
    continuation lines of long calls are indented, so this finds statement starts even when a
    broken line left a bracket open."""
    line_no = 0
    pos = 0
    bounds = [(0, 0)]
    for line in source.split("\n"):  # the lexer's notion of lines: only \n ends one
        line += "\n"
        if pos and line[:1].isalpha() and not line.startswith("else"):
            bounds.append((line_no, pos))
        pos += len(line)
        line_no += 1
    bounds.append((line_no, max(pos - 1, 0)))
    for (l0, p0), (_, p1) in itertools.pairwise(bounds):
        yield l0, p0, source[p0:p1]


def parse(source: str, path: str | None = None) -> tuple[ast.Module, list[Diagnostic]]:
    """Parse a whole file. Returns the module (with every statement that parsed) and the syntax
    diagnostics, each attributed to `path`."""
    ensure_recursion_limit()  # strings nested in interpolations are parsed recursively
    outer = _state.diagnostics
    _state.diagnostics = []
    # The parse allocates ~10^5 small acyclic objects (tokens, spans, nodes) that all stay alive:
    # the cyclic GC would rescan the growing heap again and again for nothing (it was ~40% of a
    # large file's parse), so it is paused for the parse and resumed after.
    gc_was_enabled = gc.isenabled()
    gc.disable()
    try:
        body: Sequence[ast.Stmt]
        broken: list[Span] = []
        try:
            body = _parse_with_shift(source, "start", (0, 0, 0))
        except UnexpectedInput:
            _state.diagnostics = []
            body, broken = _recover(source)
        body, broken = _bound_nesting(body, broken)
        diags = [d.at(path) for d in _state.diagnostics]
    finally:
        _state.diagnostics = outer
        if gc_was_enabled:
            gc.enable()
    return ast.Module(path, tuple(body), tuple(broken)), diags


def _bound_nesting(
    body: Sequence[ast.Stmt], broken: list[Span]
) -> tuple[list[ast.Stmt], list[Span]]:
    """The statements without those nested deeper than `MAX_NESTING` (each reported where the
    bound is crossed, and its span marked broken so that the checker reports no cascades)."""
    deep = too_deep(body)
    if not deep:
        return list(body), broken
    for top, node in deep:
        sp = node.span
        _state.diagnostics.append(
            msg.too_deep(
                Span(sp.line, sp.col, sp.line, sp.col + 1, sp.start, sp.start + 1), MAX_NESTING
            )
        )
        broken.append(top.span)
    dropped = {id(top) for top, _ in deep}
    return [s for s in body if id(s) not in dropped], broken


_SALVAGE_ATTEMPTS = 4


def _recover(source: str) -> tuple[list[ast.Stmt], list[Span]]:
    """Parse chunk by chunk. A broken chunk reports its first error, then is salvaged for the
    checker and the LSP: missing closing braces are added, or the offending line is blanked, a few
    times over. Returns the statements and the spans of the broken chunks."""
    body: list[ast.Stmt] = []
    broken: list[Span] = []
    for line_off, pos_off, text in _chunks(source):
        shift = (line_off, 0, pos_off)
        try:
            body.extend(_parse_with_shift(text, "start", shift))
            continue
        except UnexpectedInput as err:
            first = _error_diagnostic(err, shift)
        _state.diagnostics.append(first)
        n_lines = text.count("\n")
        broken.append(
            Span(line_off + 1, 1, line_off + n_lines + 1, 1, pos_off, pos_off + len(text))
        )
        diag = first
        for _ in range(_SALVAGE_ATTEMPTS):
            text = _salvage(text, diag, line_off)
            kept = len(_state.diagnostics)
            try:
                body.extend(_parse_with_shift(text, "start", shift))
                break
            except UnexpectedInput as err:
                del _state.diagnostics[kept:]
                diag = _error_diagnostic(err, shift)
    return body, broken


def _salvage(text: str, diag: Diagnostic, line_off: int) -> str:
    """The chunk with one more repair: close unclosed braces at the end of input, else blank the
    line of the error (offsets and positions of the other lines are unchanged)."""
    missing = text.count("{") - text.count("}")
    if "end of input" in diag.message and missing > 0:
        return text + "}" * missing
    span = diag.span
    if span is None:
        raise AssertionError(f"a syntax error without a span: {diag}")
    lines = text.split("\n")
    i = span.line - line_off - 1
    if 0 < i < len(lines) and span.col == len(lines[i]) - len(lines[i].lstrip()) + 1:
        # the error is at a line's first token: the previous line is the unfinished one
        i = (
            max(j for j in range(i) if lines[j].strip())
            if any(line.strip() for line in lines[:i])
            else i
        )
    if 0 <= i < len(lines):
        lines[i] = " " * len(lines[i])
    return "\n".join(lines)


def parse_expression(text: str) -> ast.Expr:
    """Parse a registry expression (a default or a constraint). Raises ValueError if it is not
    valid Aner: registry text is written by Aner's own engineers, so this is a bug, not user input."""
    outer = _state.diagnostics
    _state.diagnostics = []
    try:
        expr = _parse_with_shift(text, "expr", (0, 0, 0))
    except UnexpectedInput as err:
        raise ValueError(f"invalid registry expression {text!r}: {err}") from None
    finally:
        errors, _state.diagnostics = _state.diagnostics, outer
    if errors:
        raise ValueError(f"invalid registry expression {text!r}: {errors[0].message}")
    return expr
