"""The bounds of the language: on a script's syntax, on its numbers and on the size of its values.

Each bound is policy (docs/security.md lists them with Aner's other resource bounds); exceeding
one is an error where it happens, naming the bound, never a Python exception or a machine brought
to its knees.

* `MAX_NESTING`: how deeply syntax may nest (parser, `E-NESTING`). The checker, the interpreter
  and the language server walk the tree recursively, a few Python frames per level; the bound
  keeps every walk far inside the recursion limit below, so a deep program is a located error
  before any walk starts, never a `RecursionError` in the middle of one. Real programs nest a
  dozen levels; a chain `a + b + c + ...` nests one level per operator, so the bound also caps
  such a chain.
* `RECURSION_LIMIT`: the recursion limit the front end runs with (Python's default is 1,000). The
  walkers take up to about ten frames per level of nesting, so `MAX_NESTING` levels need more
  than the default; 5,000 frames stay within an 8 MiB C stack even if every one of them re-enters
  the evaluator through C (measured: CPython 3.11 overflows past about 10,000 such frames). A
  user's recursive function gets the rest, and recursing deeper is `E-RECURSION`.
* `MAX_NUMBER_CHARS`: the length of a number literal (parser, `E-LITERAL`): Python's int and float
  conversions are superlinear in the digits, and no meaningful literal needs more.
* `INT_MIN`, `INT_MAX`: an `Int` (and a `Bytes` count) is a signed 64-bit integer. A literal
  outside is `E-LITERAL`; arithmetic or a conversion that leaves the range is `E-OVERFLOW`, as is
  Float arithmetic that turns finite operands into an infinity (`aner_lang.check.consteval`).
* `MAX_ITEMS`, `MAX_CHARS`: the largest list and string a script may build (`range`, `+`, `join`,
  interpolation: `E-LIMIT`). A script that doubles a string in a loop stops at the bound with an
  error, not when the machine runs out of memory; should memory run out first anyway, that is
  `E-MEMORY`, never a crash.
"""

from __future__ import annotations

import sys
from collections.abc import Iterable

from aner_lang.grammar import ast
from aner_lang.host.files import TEXT_LIMIT

MAX_NESTING = 200
"""Levels of nested expressions, blocks and types (each operator, call, index, list, block)."""
RECURSION_LIMIT = 5000
MAX_NUMBER_CHARS = 1000
INT_MAX = 2**63 - 1
INT_MIN = -(2**63)
MAX_ITEMS = 10_000_000
"""Items of one list (about 80 MB of references alone)."""
MAX_CHARS = TEXT_LIMIT
"""Characters of one string: as many as the largest text file `read_text` reads has bytes."""

Node = ast.Stmt | ast.Expr | ast.TypeExpr | ast.Arg | ast.ParamDecl | ast.FieldDecl | ast.Block
"""A node of the tree that may have children."""

# The fields of each node that hold child nodes (a node, a tuple of nodes, or a string's parts).
_CHILDREN: dict[type, tuple[str, ...]] = {
    ast.TypeName: ("args",),
    ast.OptionalType: ("inner",),
    ast.StringLit: ("parts",),
    ast.ListLit: ("items",),
    ast.Unary: ("operand",),
    ast.Binary: ("left", "right"),
    ast.Arg: ("value",),
    ast.Call: ("callee", "args"),
    ast.Member: ("obj",),
    ast.Index: ("obj", "index"),
    ast.Let: ("annotation", "value"),
    ast.Assign: ("value",),
    ast.ParamDecl: ("type", "default"),
    ast.Block: ("body",),
    ast.FnDecl: ("params", "returns", "body"),
    ast.FieldDecl: ("type", "default"),
    ast.RecordDecl: ("fields",),
    ast.If: ("cond", "then", "orelse"),
    ast.For: ("iterable", "body"),
    ast.Return: ("value",),
    ast.Assert: ("cond", "message"),
    ast.ExprStmt: ("expr",),
}
# Wrappers that add no level: they span exactly their one child.
_WRAPPERS = (ast.Arg, ast.ExprStmt)


def too_deep(statements: Iterable[ast.Stmt]) -> list[tuple[ast.Stmt, Node]]:
    """(top-level statement, the first node nested deeper than `MAX_NESTING` in it) for each
    statement that has one.

    The walk is iterative, and it skips every subtree that cannot reach the bound: each level
    of nesting adds at least one character of its own (an operator, a bracket, a keyword), so a
    node of n characters at depth d has nothing deeper than d + n. Only statements longer than
    the bound are entered, and of them only the long subtrees."""
    found: list[tuple[ast.Stmt, Node]] = []
    for top in statements:
        stack: list[tuple[Node, int]] = [(top, 1)]
        while stack:
            node, depth = stack.pop()
            if depth > MAX_NESTING:
                found.append((top, node))
                break
            if depth + node.span.end - node.span.start <= MAX_NESTING:
                continue
            below = depth if isinstance(node, _WRAPPERS) else depth + 1
            for name in _CHILDREN.get(type(node), ()):
                child = getattr(node, name)
                if isinstance(child, tuple):
                    stack.extend((c, below) for c in child if not isinstance(c, str))
                elif child is not None:
                    stack.append((child, below))
    return found


def ensure_recursion_limit() -> None:
    """Raise Python's recursion limit to `RECURSION_LIMIT` (never lower it): called where the
    front end starts walking a tree (`analyze`, `run`)."""
    if sys.getrecursionlimit() < RECURSION_LIMIT:
        sys.setrecursionlimit(RECURSION_LIMIT)
