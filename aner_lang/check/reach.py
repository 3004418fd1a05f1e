"""Which calls of a file run whenever the file runs.

A check before a run may refuse a script only for what would fail on every path through it, so
it needs to know which calls certainly run. A call is *unconditional* when it sits in a
top-level statement's part that always runs: the value of a `let` or an assignment, an
expression statement, an `assert`'s condition, the first condition of an `if`, the list a `for`
walks, and there outside the right operand of `and`/`or` (which short-circuits). Everything else
may not run: the branches of an `if`, the body of a `for` (the list may be empty), the message
of an `assert`, and every call in a function or record declaration (its body and defaults run
only when, and if, it is called). A file runs once, whether it is the script or imported.

A call outside any function or record declaration is *top level*: it runs, if at all, in the
order of the file (imports first), which tells whether it can come before another call.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, fields, is_dataclass

from aner_lang.grammar import ast

SHORT_CIRCUIT = ("and", "or")


@dataclass(frozen=True)
class Reach:
    """The ids of one file's Call nodes by how surely they run (see the module docstring)."""

    unconditional: frozenset[int]
    top_level: frozenset[int]


def reach(module: ast.Module) -> Reach:
    """What of `module` certainly runs, and what runs outside declarations."""
    unconditional: set[int] = set()
    top_level: set[int] = set()
    for s in module.body:
        if isinstance(s, (ast.FnDecl, ast.RecordDecl)):
            continue
        _calls(s, top_level, certain=False)
        for part in _always_run(s):
            _calls(part, unconditional, certain=True)
    return Reach(frozenset(unconditional), frozenset(top_level))


def _always_run(s: ast.Stmt) -> tuple[object, ...]:
    """The parts of a top-level statement that run whenever it does."""
    if isinstance(s, (ast.Let, ast.Assign)):
        return (s.value,)
    if isinstance(s, ast.ExprStmt):
        return (s.expr,)
    if isinstance(s, (ast.Assert, ast.If)):
        return (s.cond,)
    if isinstance(s, ast.For):
        return (s.iterable,)
    return ()


def _calls(node: object, out: set[int], *, certain: bool) -> None:
    """Add the ids of the calls in `node` to `out`; with `certain`, only those that run whenever
    `node` is evaluated (the right operand of `and`/`or` may not be)."""
    if isinstance(node, ast.Call):
        out.add(id(node))
    if certain and isinstance(node, ast.Binary) and node.op in SHORT_CIRCUIT:
        _calls(node.left, out, certain=certain)
        return
    for child in _children(node):
        _calls(child, out, certain=certain)


def _children(node: object) -> Iterator[object]:
    """The AST nodes directly inside `node` (spans and plain values left out)."""
    if not is_dataclass(node) or isinstance(node, ast.Span):
        return
    for f in fields(node):
        value = getattr(node, f.name)
        for item in value if isinstance(value, tuple) else (value,):
            if is_dataclass(item) and not isinstance(item, ast.Span):
                yield item
