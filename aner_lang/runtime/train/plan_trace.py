"""The values a `train(...)` call is given, followed through a checked script without running it.

Rules (what `aner plan` can know before a run):

* A name bound by `let` stands for its value, unless the script assigns to it again (then its
  value depends on the path the run takes, and it is not followed).
* A call of a user function stands for its `return` expression when the function has exactly one
  `return` with a value; its parameters stand for the call's arguments (read where the call is)
  or their defaults. A function with several returns depends on its branches: not followed.
* A `train` call inside a user function is planned once per call of that function (through any
  depth of calls), each with that call's arguments.
* A dataset carries its context through the builtins that take a dataset and give one (`split`
  and its `.train` / `.held_out`, `shuffle`, `take`, `pack`): the context is the source's
  (`texts`, `load_data`, `load_jsonl`), and `pack` marks its rows as full.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field

from aner_lang.builtins import registry
from aner_lang.check import Analysis
from aner_lang.check.analysis import CallInfo
from aner_lang.check.consteval import STATIC_FAILURES, evaluate
from aner_lang.check.environment import written_arguments
from aner_lang.grammar import ast

DEPTH = 64
"""Links followed at most from one expression (a longer chain is taken as not known)."""
_DATASETS = frozenset(("Dataset", "Pairs", "Feedback"))


def argument(info: CallInfo, name: str) -> ast.Expr | None:
    """The expression bound to parameter `name` of the call (its argument or its default)."""
    return next((e for n, e in info.bound if n == name), None)


class NotKnown(Exception):
    """The value depends on the run (or on more of the script than the plan follows)."""


@dataclass(frozen=True)
class Frame:
    """One call of a user function: each parameter's argument expression, read in `caller`'s
    frame (None: the script's top level)."""

    args: dict[str, tuple[ast.Expr, Frame | None]] = field(default_factory=dict)
    line: int = 0
    """The line of the call."""


@dataclass(frozen=True)
class DataFacts:
    """What the plan knows of a dataset: its context, whether its rows are packed, its number of
    examples, and the builtins it went through from its source."""

    context: int | None
    packed: bool
    examples: int | None
    path: tuple[str, ...]


class Tracer:
    """Follows expressions of one checked script (`Analysis`)."""

    def __init__(self, analysis: Analysis) -> None:
        self.analysis = analysis
        self._refs = {(r.span.start, r.span.end): r.definition for r in analysis.references}
        self._fns = [d.node for d in analysis.definitions if isinstance(d.node, ast.FnDecl)]
        statements = [*analysis.module.body, *(fn.body for fn in self._fns)]
        self._reassigned = {
            n.name for s in statements for n in _walk(s) if isinstance(n, ast.Assign)
        }
        self._members = frozenset(m.name for e in registry().enums.values() for m in e.members)

    # ---- the train calls, one per way the script reaches them ---------------------------------

    def instances(self, info: CallInfo) -> Iterator[Frame | None]:
        """The frames `info`'s call runs in: None at the top level, one per call of its
        function otherwise (none when the function is never called)."""
        yield from self._frames_at(info.call.span, 0)

    def _frames_at(self, span: ast.Span, depth: int) -> Iterator[Frame | None]:
        fn = self._enclosing(span)
        if fn is None:
            yield None
            return
        if depth > DEPTH:
            return
        for call in self.analysis.calls.values():
            if call.kind != "fn" or call.definition is None or call.definition.node is not fn:
                continue
            for outer in self._frames_at(call.call.span, depth + 1):
                yield self._frame(call, outer)

    def _enclosing(self, span: ast.Span) -> ast.FnDecl | None:
        inside = [f for f in self._fns if f.span.start <= span.start and span.end <= f.span.end]
        return min(inside, key=lambda f: f.span.end - f.span.start, default=None)

    def _frame(self, call: CallInfo, caller: Frame | None) -> Frame:
        written = written_arguments(call)
        args = {
            name: (e, caller if id(e) in written else None)
            for name, e in call.bound
            if e is not None
        }
        return Frame(args, call.call.span.line)

    # ---- expressions ----------------------------------------------------------------------------

    def follow(self, expr: ast.Expr | None, frame: Frame | None) -> tuple[ast.Expr, Frame | None]:
        """The expression `expr` stands for: through lets, parameters, user functions and a
        split's parts; raises NotKnown where the script's run decides."""
        for _ in range(DEPTH):
            if expr is None:
                raise NotKnown
            if isinstance(expr, ast.Name):
                followed = self._name(expr, frame)
                if followed[0] is expr:
                    return followed
                expr, frame = followed
            elif isinstance(expr, ast.Call):
                info = self.analysis.calls.get(id(expr))
                if info is None or info.kind != "fn" or info.definition is None:
                    return expr, frame
                fn = info.definition.node
                assert isinstance(fn, ast.FnDecl)
                returns = [n for n in _walk(fn.body) if isinstance(n, ast.Return)]
                if len(returns) != 1 or returns[0].value is None:
                    raise NotKnown
                frame = self._frame(info, frame)
                expr = returns[0].value
            elif isinstance(expr, ast.Member):
                split, split_frame = self.follow(expr.obj, frame)
                info = self.analysis.calls.get(id(split))
                if info is None or info.name != "split":
                    return expr, frame
                return split, split_frame
            else:
                return expr, frame
        raise NotKnown

    def _name(self, expr: ast.Name, frame: Frame | None) -> tuple[ast.Expr, Frame | None]:
        d = self._refs.get((expr.span.start, expr.span.end))
        if d is None and expr.name in self._members:
            return expr, None  # an enum member: a constant
        if d is None:
            raise NotKnown
        if d.kind == "let" and isinstance(d.node, ast.Let) and d.name not in self._reassigned:
            return d.node.value, frame if self._enclosing(d.node.span) is not None else None
        if d.kind == "param" and frame is not None and d.name in frame.args:
            return frame.args[d.name]
        raise NotKnown

    def builtin(self, expr: ast.Expr | None, frame: Frame | None) -> tuple[CallInfo, Frame | None]:
        """The builtin call `expr` stands for, and the frame its arguments are read in."""
        target, frame = self.follow(expr, frame)
        info = self.analysis.calls.get(id(target))
        if info is None or info.kind != "builtin" or info.builtin is None:
            raise NotKnown
        return info, frame

    def value(self, expr: ast.Expr | None, frame: Frame | None) -> object:
        """The constant `expr` stands for (enum members as their names)."""
        target, frame = self.follow(expr, frame)
        env: dict[str, object] = {}
        for name in _names(target):
            if name is target:
                continue
            try:
                env[name.name] = self.value(name, frame)
            except NotKnown:
                continue
        try:
            return evaluate(target, env, self._members)
        except STATIC_FAILURES:
            raise NotKnown from None

    def arguments(self, info: CallInfo, frame: Frame | None) -> tuple[dict[str, object], list[str]]:
        """The call's known arguments by parameter name (defaults included), and the parameters
        written with an argument whose value is not known."""
        written = written_arguments(info)
        known: dict[str, object] = {}
        unknown: list[str] = []
        for name, e in info.bound:
            if e is None:
                continue
            try:
                known[name] = self.value(e, frame if id(e) in written else None)
            except NotKnown:
                if id(e) in written:
                    unknown.append(name)
        return known, unknown

    def dataset(self, expr: ast.Expr | None, frame: Frame | None) -> DataFacts:
        """The context, packing and size of the dataset `expr` stands for."""
        packed, path = False, list[str]()
        examples_cap: int | None = None
        for _ in range(DEPTH):
            try:
                info, frame = self.builtin(expr, frame)
            except NotKnown:
                return DataFacts(None, packed, None, tuple(path))
            args, _ = self.arguments(info, frame)
            if "context" in args:
                context = args["context"]
                examples = self._examples(info, frame)
                if examples is not None and examples_cap is not None:
                    examples = min(examples, examples_cap)
                return DataFacts(
                    context if isinstance(context, int) else None,
                    packed,
                    None if packed else examples,
                    tuple(path),
                )
            first = info.bound[0] if info.bound else None
            if first is None or str(info.builtin.params[0].type) not in _DATASETS:  # type: ignore[union-attr]
                return DataFacts(None, packed, None, tuple(path))
            path.append(info.name)
            packed |= info.name == "pack"
            if info.name == "split":
                examples_cap = 0  # a part's size depends on the split's rounding: not counted
            elif info.name == "take" and isinstance(args.get("n"), int):
                n = int(str(args["n"]))
                examples_cap = n if examples_cap is None else min(n, examples_cap)
            expr = first[1]
        return DataFacts(None, packed, None, tuple(path))

    def _examples(self, info: CallInfo, frame: Frame | None) -> int | None:
        """The number of examples of a `texts([...])` list (other sources: not known)."""
        if info.name != "texts" or not info.bound:
            return None
        try:
            items = self.value(info.bound[0][1], frame)
        except NotKnown:
            return None
        return len(items) if isinstance(items, list) else None


def _names(expr: ast.Expr) -> Iterator[ast.Name]:
    """The names a constant expression reads (lists, unary and binary operations)."""
    if isinstance(expr, ast.Name):
        yield expr
    elif isinstance(expr, ast.ListLit):
        for item in expr.items:
            yield from _names(item)
    elif isinstance(expr, ast.Unary):
        yield from _names(expr.operand)
    elif isinstance(expr, ast.Binary):
        yield from _names(expr.left)
        yield from _names(expr.right)


def _walk(node: object) -> Iterator[object]:
    """Every statement under `node`, not entering nested function declarations."""
    if isinstance(node, ast.Block):
        for s in node.body:
            yield from _walk(s)
    elif isinstance(node, ast.If):
        yield node
        yield from _walk(node.then)
        if node.orelse is not None:
            yield from _walk(node.orelse)
    elif isinstance(node, ast.For):
        yield node
        yield from _walk(node.body)
    elif not isinstance(node, ast.FnDecl):
        yield node
