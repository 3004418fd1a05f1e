"""Checking calls: what a call resolves to, binding its arguments, overloads and constraints.

Rules:

* A callee name resolves to a user `fn`, a record constructor, else a builtin; a user name
  shadows a builtin. `x.f(a)` means `f(x, a)`: the receiver binds to the first parameter.
* Binding: positional arguments (the receiver first) fill the parameters that are not
  keyword-only, in order; then named arguments fill parameters by name. A positional argument
  after a named one, too many positional arguments, an unknown or duplicate name and a missing
  required parameter are errors. Every argument is checked against its parameter's type, with the
  parameter's type as the expected type. One that bound to nothing is checked on its own (its
  names are uses), but its own errors are not reported: without a parameter there is no expected
  type (an enum member reads as an unknown name), so they would only follow from the binding
  error.
* Overloads: each candidate of a builtin overload set is tried speculatively (muted). Of those
  that fit, the one with the lowest total promotion cost (`types.assign_cost`) wins; a tie is
  ambiguous. When none fits, a candidate with strictly fewer problems than every other is taken
  as the one meant and its own errors are reported; otherwise every candidate is listed.
* Registry constraints of the chosen builtin are checked on literal arguments (`constraints.py`).
* Each resolved call is recorded as a `CallInfo` (`Analysis.calls`), which the interpreter runs.
"""

from __future__ import annotations

from aner_lang.builtins.reference import signature
from aner_lang.builtins.spec import Builtin
from aner_lang.check import types as T
from aner_lang.check.analysis import CallInfo, Definition
from aner_lang.check.constraints import constraint_failures
from aner_lang.check.core import Param, registry_expr
from aner_lang.check.expressions import ExpressionChecker
from aner_lang.check.scopes import Scope
from aner_lang.grammar import ast
from aner_lang.problems import diagnostics as msg
from aner_lang.problems.diagnostics import Diagnostic

Bound = dict[str, ast.Expr]
"""The argument expression bound to each parameter, by parameter name."""


class CallChecker(ExpressionChecker):
    def call(self, e: ast.Call, scope: Scope, expected: T.Type | None) -> T.Type:
        receiver: ast.Expr | None = None
        callee = e.callee
        if isinstance(callee, ast.Member):
            if self.enum_type_named(callee.obj, scope) is not None:
                self.report(msg.not_callable(callee.span, f"enum member `{callee.name}`"))
                return T.ANY
            receiver, name, name_span = callee.obj, callee.name, callee.name_span
        elif isinstance(callee, ast.Name):
            name, name_span = callee.name, callee.span
        else:
            self.expr(callee, scope, None)
            self.report(msg.not_callable(callee.span, "this expression"))
            return T.ANY
        d = scope.lookup(name)
        if d is not None and d.kind == "fn":
            self.use(d, name_span)
            params, ret = self.a.signatures[id(d.node)]
            self.bind_and_check(e, name, params, receiver, scope)
            self._record(e, name, "fn", params, receiver, candidates=(d,), definition=d)
            return ret
        if d is not None and d.kind == "record" and receiver is None:
            self.use(d, name_span)
            params = self.a.signatures[id(d.node)][0]
            self.bind_and_check(e, name, params, None, scope)
            self._record(e, name, "record", params, None, candidates=(d,), definition=d)
            return d.ty
        if d is not None and d.kind in ("let", "param", "for", "enum", "record"):
            self.use(d, name_span)
            self.report(msg.not_callable(name_span, f"`{name}` ({d.kind})"))
            return T.ANY
        overloads = self.reg.functions.get(name)
        if not overloads:
            if receiver is not None:
                self.expr(receiver, scope, None)
            for a in e.args:
                self.expr(a.value, scope, None)
            candidates = scope.visible_of_kind("fn") + list(self.reg.functions)
            self.report(msg.unknown_name(name_span, name, candidates))
            return T.ANY
        chosen = self.pick_overload(e, name, overloads, receiver, scope)
        if chosen is None:
            return T.ANY
        params, ret = self.builtin_sig(chosen)
        self.bind_and_check(e, name, params, receiver, scope, builtin=chosen)
        self._record(e, name, "builtin", params, receiver, candidates=overloads, builtin=chosen)
        return ret

    def builtin_sig(self, b: Builtin) -> tuple[list[Param], T.Type]:
        """A builtin's parameters and return type as the checker's types (once per builtin)."""
        key = id(b)
        sig = self.builtin_sigs.get(key)
        if sig is None:
            params = [
                Param(
                    p.name,
                    self.spec_type(p.type),
                    None if p.default is None else registry_expr(p.default),
                    p.required,
                    p.keyword_only,
                )
                for p in b.params
            ]
            sig = self.builtin_sigs[key] = (params, self.spec_type(b.returns))
        return sig

    def _record(
        self,
        e: ast.Call,
        name: str,
        kind: str,
        params: list[Param],
        receiver: ast.Expr | None,
        candidates: tuple[Builtin, ...] | tuple[Definition, ...],
        builtin: Builtin | None = None,
        definition: Definition | None = None,
    ) -> None:
        """Record how `e` resolved, for the interpreter and the LSP."""
        if self.muted:
            return
        bound, _ = self.bind(e, params, receiver)
        self.a.calls[id(e)] = CallInfo(
            e,
            name,
            kind,
            candidates=candidates,
            builtin=builtin,
            definition=definition,
            bound=tuple((p.name, bound.get(p.name, p.default)) for p in params),
            param_types=tuple(p.ty for p in params),
            receiver=receiver,
        )

    def pick_overload(
        self,
        e: ast.Call,
        name: str,
        overloads: tuple[Builtin, ...],
        receiver: ast.Expr | None,
        scope: Scope,
    ) -> Builtin | None:
        """The candidate a call means, or None after reporting that none fits or several do."""
        if len(overloads) == 1:
            return overloads[0]
        scored: list[tuple[int, Builtin]] = []
        failures: list[tuple[int, Builtin]] = []
        for b in overloads:
            params, _ = self.builtin_sig(b)
            self.muted += 1
            n_before = len(self.diags)
            try:
                cost = self.bind_and_check(e, name, params, receiver, scope)
            finally:
                self.muted -= 1
            del self.diags[n_before:]
            if cost is not None:
                scored.append((cost, b))
            else:
                failures.append((self._problem_count(e, params, receiver, scope), b))
        if not scored:
            failures.sort(key=lambda x: x[0])
            if len(failures) == 1 or failures[0][0] < failures[1][0]:
                return failures[0][1]  # one candidate is clearly meant: report its own errors
            found = []
            self.muted += 1
            try:
                if receiver is not None:
                    found.append(str(self.expr(receiver, scope, None)))
                for a in e.args:
                    t = str(self.expr(a.value, scope, None))
                    found.append(f"{a.name}: {t}" if a.name else t)
            finally:
                self.muted -= 1
            self.report(
                msg.no_matching_overload(e.span, name, found, [signature(b) for b in overloads])
            )
            return None
        scored.sort(key=lambda x: x[0])
        best = [b for c, b in scored if c == scored[0][0]]
        if len(best) > 1:
            self.report(msg.ambiguous_overload(e.span, name, [signature(b) for b in best]))
            return None
        return best[0]

    def _problem_count(
        self, e: ast.Call, params: list[Param], receiver: ast.Expr | None, scope: Scope
    ) -> int:
        """How many things are wrong with a call against one candidate signature."""
        bound, problems = self.bind(e, params, receiver)
        self.muted += 1
        try:
            bad = sum(
                1
                for p in params
                if p.name in bound
                and T.assign_cost(self.expr(bound[p.name], scope, p.ty), p.ty) is None
            )
        finally:
            self.muted -= 1
        return len(problems) + bad

    def bind(
        self, e: ast.Call, params: list[Param], receiver: ast.Expr | None
    ) -> tuple[Bound, list[Diagnostic]]:
        """Bind the arguments (and receiver) of `e` to `params`; the binding problems found."""
        bound: Bound = {}
        problems: list[Diagnostic] = []
        callee = _callee_name(e)
        positional = [p for p in params if not p.keyword_only]
        values = ([receiver] if receiver is not None else []) + [
            a.value for a in e.args if a.name is None
        ]
        named_seen = False
        for a in e.args:
            if a.name is not None:
                named_seen = True
            elif named_seen:
                problems.append(
                    Diagnostic("E-ARGS", a.span, "positional argument after a named argument")
                )
        for i, v in enumerate(values):
            if i >= len(positional):
                problems.append(msg.too_many_args(v.span, callee, len(positional)))
                break
            bound[positional[i].name] = v
        by_name = {p.name: p for p in params}
        for a in e.args:
            if a.name is None:
                continue
            name_span = a.name_span if a.name_span is not None else a.span
            if a.name not in by_name:
                problems.append(msg.unknown_argument(name_span, callee, a.name, list(by_name)))
            elif a.name in bound:
                problems.append(msg.duplicate_argument(name_span, callee, a.name))
            else:
                bound[a.name] = a.value
        missing = [p.name for p in params if p.required and p.name not in bound]
        if missing:
            problems.append(msg.missing_argument(e.span, callee, missing))
        return bound, problems

    def bind_and_check(
        self,
        e: ast.Call,
        name: str,
        params: list[Param],
        receiver: ast.Expr | None,
        scope: Scope,
        builtin: Builtin | None = None,
    ) -> int | None:
        """Bind and type-check the arguments; the total promotion cost, or None on any error."""
        bound, problems = self.bind(e, params, receiver)
        for problem in problems:
            self.report(problem)
        ok = not problems
        cost = 0
        checked: set[int] = set()
        flawed: set[str] = set()
        for p in params:
            arg = bound.get(p.name)
            if arg is None:
                continue
            checked.add(id(arg))
            errors = self.errors
            ty = self.expr(arg, scope, p.ty)
            if self.errors != errors:
                flawed.add(p.name)
            c = T.assign_cost(ty, p.ty)
            if c is None:
                ok = False
                self.report(msg.argument_type(arg.span, name, p.name, str(p.ty), str(ty)))
            else:
                cost += c
        for a in e.args:  # bound to nothing: checked for their uses, their errors not reported
            if id(a.value) not in checked:
                before = len(self.diags)
                self.expr(a.value, scope, None)
                del self.diags[before:]
        if receiver is not None and id(receiver) not in checked:
            self.expr(receiver, scope, None)
        if ok and builtin is not None and builtin.constraints:
            for d in constraint_failures(
                e, name, builtin, params, bound, flawed, self.enum_members
            ):
                self.report(d)
        return cost if ok else None


def _callee_name(e: ast.Call) -> str:
    c = e.callee
    return c.name if isinstance(c, (ast.Name, ast.Member)) else "function"
