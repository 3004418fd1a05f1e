"""The Aner syntax tree: frozen dataclasses, each carrying the `Span` of source it came from.

The parser builds these directly inside the LALR parse; the checker, the interpreter and the LSP
never see a Lark tree. Nodes are immutable so one parse can be shared by every consumer, and the
checker's side tables are keyed by node identity (`id(node)`).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Span:
    """A source range: 1-based line/column of the first character, end column exclusive, plus the
    0-based character offsets `start`/`end` (end exclusive) that the LSP converts to positions."""

    line: int
    col: int
    end_line: int
    end_col: int
    start: int
    end: int

    def contains(self, offset: int) -> bool:
        return self.start <= offset <= self.end

    def cover(self, other: Span) -> Span:
        """The smallest span that covers `self` and `other`."""
        return Span(self.line, self.col, other.end_line, other.end_col, self.start, other.end)


# ---- types written in source -------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class TypeName:
    span: Span
    name: str
    args: tuple[TypeExpr, ...] = ()


@dataclass(frozen=True, slots=True)
class OptionalType:
    span: Span
    inner: TypeExpr


TypeExpr = TypeName | OptionalType


# ---- expressions --------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class IntLit:
    span: Span
    value: int


@dataclass(frozen=True, slots=True)
class FloatLit:
    span: Span
    value: float


@dataclass(frozen=True, slots=True)
class BytesLit:
    """`512 KiB`: `value` is the byte count; `text` is the literal as written (for messages)."""

    span: Span
    value: int
    text: str


@dataclass(frozen=True, slots=True)
class BoolLit:
    span: Span
    value: bool


@dataclass(frozen=True, slots=True)
class NoneLit:
    span: Span


@dataclass(frozen=True, slots=True)
class StringLit:
    """A string; `parts` alternates literal text (str) and interpolated expressions `${expr}`."""

    span: Span
    parts: tuple[str | Expr, ...]


@dataclass(frozen=True, slots=True)
class Name:
    span: Span
    name: str


@dataclass(frozen=True, slots=True)
class ListLit:
    span: Span
    items: tuple[Expr, ...]


@dataclass(frozen=True, slots=True)
class Unary:
    span: Span
    op: str  # "-" or "not"
    operand: Expr


@dataclass(frozen=True, slots=True)
class Binary:
    span: Span
    op: str  # + - * / % == != < <= > >= and or
    left: Expr
    right: Expr
    op_span: Span


@dataclass(frozen=True, slots=True)
class Arg:
    """One call argument; `name` is set for a named argument `name: value`."""

    span: Span
    name: str | None
    name_span: Span | None
    value: Expr


@dataclass(frozen=True, slots=True)
class Call:
    """`callee(args)`; `open_span` is the `(` through `)` range (used for signature help)."""

    span: Span
    callee: Expr
    args: tuple[Arg, ...]
    open_span: Span


@dataclass(frozen=True, slots=True)
class Member:
    span: Span
    obj: Expr
    name: str
    name_span: Span


@dataclass(frozen=True, slots=True)
class Index:
    span: Span
    obj: Expr
    index: Expr


Expr = (
    IntLit
    | FloatLit
    | BytesLit
    | BoolLit
    | NoneLit
    | StringLit
    | Name
    | ListLit
    | Unary
    | Binary
    | Call
    | Member
    | Index
)


# ---- statements ---------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Let:
    span: Span
    name: str
    name_span: Span
    annotation: TypeExpr | None
    value: Expr


@dataclass(frozen=True, slots=True)
class Assign:
    span: Span
    name: str
    name_span: Span
    value: Expr


@dataclass(frozen=True, slots=True)
class ParamDecl:
    span: Span
    name: str
    name_span: Span
    type: TypeExpr
    default: Expr | None


@dataclass(frozen=True, slots=True)
class Block:
    span: Span
    body: tuple[Stmt, ...]


@dataclass(frozen=True, slots=True)
class FnDecl:
    span: Span
    name: str
    name_span: Span
    params: tuple[ParamDecl, ...]
    returns: TypeExpr | None
    body: Block


@dataclass(frozen=True, slots=True)
class FieldDecl:
    span: Span
    name: str
    name_span: Span
    type: TypeExpr
    default: Expr | None


@dataclass(frozen=True, slots=True)
class RecordDecl:
    span: Span
    name: str
    name_span: Span
    fields: tuple[FieldDecl, ...]


@dataclass(frozen=True, slots=True)
class EnumMemberDecl:
    span: Span
    name: str


@dataclass(frozen=True, slots=True)
class EnumDecl:
    span: Span
    name: str
    name_span: Span
    members: tuple[EnumMemberDecl, ...]


@dataclass(frozen=True, slots=True)
class If:
    span: Span
    cond: Expr
    then: Block
    orelse: Block | If | None


@dataclass(frozen=True, slots=True)
class For:
    span: Span
    var: str
    var_span: Span
    iterable: Expr
    body: Block


@dataclass(frozen=True, slots=True)
class Return:
    span: Span
    value: Expr | None


@dataclass(frozen=True, slots=True)
class Assert:
    span: Span
    cond: Expr
    message: Expr | None


@dataclass(frozen=True, slots=True)
class Import:
    span: Span
    path: str
    path_span: Span


@dataclass(frozen=True, slots=True)
class ExprStmt:
    span: Span
    expr: Expr


Stmt = (
    Let | Assign | FnDecl | RecordDecl | EnumDecl | If | For | Return | Assert | Import | ExprStmt
)


@dataclass(frozen=True, slots=True)
class Module:
    """A parsed file. `body` holds every statement that parsed, even when others did not."""

    path: str | None
    body: tuple[Stmt, ...]
    broken: tuple[Span, ...] = ()
    """Spans of top-level chunks with a syntax error; what was salvaged from them is in `body`,
    but the checker reports no other diagnostics inside them (they would be cascades)."""
