"""The static checker: names, types, calls, overloads, constraints, returns, imports.

One pass over the AST in source order, with top-level `fn`/`record`/`enum` declarations hoisted
first (so functions may call each other). Expressions are checked bidirectionally: an expected
type flows into an expression, which is how a bare enum member (`storage: nf4_double_quant`,
`targets: [q_proj, v_proj]`) is resolved. Every problem becomes a Diagnostic; checking goes on
after an error (an erroneous expression has type `Any`, which fits everywhere, so one mistake
reports once).

Calls bind positional then named arguments to the parameters; an overloaded builtin tries each
candidate speculatively (diagnostics discarded) and keeps the cheapest exact fit, or reports
every candidate. Registry constraints are evaluated when all the names they mention are bound to
literals.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import cache

from aner_lang import diagnostics as msg
from aner_lang.builtins import Registry
from aner_lang.builtins.reference import signature
from aner_lang.builtins.spec import Builtin
from aner_lang.check import types as T
from aner_lang.check.analysis import Analysis, CallInfo, Definition, Reference, ScopeInfo
from aner_lang.check.consteval import evaluate
from aner_lang.diagnostics import Diagnostic
from aner_lang.grammar import ast, parse, parse_expression
from aner_lang.grammar.ast import Span

Resolver = Callable[[str, "str | None"], "tuple[str, str]"]
"""resolver(import path as written, importing file) -> (resolved path, source); raises OSError."""


@cache
def registry_expr(text: str) -> ast.Expr:
    """A default or constraint of the registry, parsed once per process."""
    return parse_expression(text)


@dataclass
class _Param:
    """A parameter as the binder sees it (from a builtin, a user fn or a record field)."""

    name: str
    ty: T.Type
    default: ast.Expr | None
    required: bool
    keyword_only: bool = False


class _Scope:
    def __init__(
        self, parent: _Scope | None, span: Span | None, fn: tuple[ast.FnDecl, T.Type] | None
    ) -> None:
        self.parent = parent
        self.names: dict[str, Definition] = {}
        self.narrowed: dict[str, T.Type] = {}
        """Optional names known not to be none here (inside `if x != none { ... }`)."""
        self.span = span
        self.fn = fn if fn is not None else (parent.fn if parent else None)
        self.info = ScopeInfo(span, self.names, parent.info if parent else None)

    def lookup(self, name: str) -> Definition | None:
        scope: _Scope | None = self
        while scope is not None:
            d = scope.names.get(name)
            if d is not None:
                return d
            scope = scope.parent
        return None

    def narrowed_type(self, name: str) -> T.Type | None:
        scope: _Scope | None = self
        while scope is not None:
            if name in scope.narrowed:
                return scope.narrowed[name]
            if name in scope.names:
                return None
            scope = scope.parent
        return None

    def visible(self) -> list[str]:
        out, scope = [], self
        while scope is not None:
            out += scope.names
            scope = scope.parent
        return out


class Checker:
    def __init__(
        self,
        registry: Registry,
        analysis: Analysis,
        resolver: Resolver,
        import_stack: tuple[str, ...],
        cache: dict[str, Analysis],
        warn_unused_top: bool,
    ) -> None:
        self.reg = registry
        self.a = analysis
        self.path = analysis.path
        self.resolver = resolver
        self.import_stack = import_stack
        self.cache = cache
        self.warn_unused_top = warn_unused_top
        self.diags = analysis.diagnostics
        self.enum_types: dict[str, T.EnumT] = {
            e.name: T.EnumT(e.name, tuple(m.name for m in e.members))
            for e in registry.enums.values()
        }
        self.fields: dict[str, dict[str, T.Type]] = {}
        self.record_params: dict[str, list[_Param]] = {}
        self.fn_params: dict[int, list[_Param]] = {}
        self.fn_returns: dict[int, T.Type] = {}
        self._builtin_params: dict[int, list[_Param]] = {}
        self._builtin_returns: dict[int, T.Type] = {}
        self.muted = 0
        for td in registry.types.values():
            self.fields[td.name] = {}
        for td in registry.types.values():
            self.fields[td.name] = {f.name: self.spec_type(f.type) for f in td.fields}

    # ---- diagnostics ------------------------------------------------------------------------
    def report(self, d: Diagnostic) -> None:
        if not self.muted:
            self.diags.append(d.at(self.path))

    # ---- types --------------------------------------------------------------------------------
    def spec_type(self, text: str) -> T.Type:
        return self._from_parsed(T.parse_type_string(text), text)

    def _from_parsed(self, parsed: tuple, text: str) -> T.Type:
        name, args, opt = parsed
        if name == "List" and len(args) == 1:
            ty: T.Type = T.ListT(self._from_parsed(args[0], text))
        elif args:
            raise ValueError(f"registry type {text!r}: only List takes type arguments")
        elif name in T.PRIMITIVES:
            ty = T.PRIMITIVES[name]
        elif name in self.enum_types:
            ty = self.enum_types[name]
        elif name in self.fields:
            ty = T.NamedT(name)
        else:
            raise ValueError(f"registry type {text!r}: unknown type {name!r}")
        for _ in range(opt):
            ty = T.optional(ty)
        return ty

    def resolve_type(self, t: ast.TypeExpr, scope: _Scope) -> T.Type:
        if isinstance(t, ast.OptionalType):
            return T.optional(self.resolve_type(t.inner, scope))
        if t.name == "List":
            if len(t.args) != 1:
                self.report(msg.bad_type_args(t.span, "List", 1, len(t.args)))
                return T.ANY
            return T.ListT(self.resolve_type(t.args[0], scope))
        if t.args:
            self.report(msg.bad_type_args(t.span, t.name, 0, len(t.args)))
        if t.name in T.PRIMITIVES:
            return T.PRIMITIVES[t.name]
        d = scope.lookup(t.name)
        if d is not None and d.kind in ("record", "enum"):
            self.use(d, t.span)
            return d.ty
        if t.name in self.enum_types:
            return self.enum_types[t.name]
        if t.name in self.reg.types:
            return T.NamedT(t.name)
        names = (
            list(T.PRIMITIVES)
            + ["List"]
            + list(self.enum_types)
            + list(self.reg.types)
            + [
                n
                for n in scope.visible()
                if (scope.lookup(n) or Definition("", "", T.ANY, None, None)).kind
                in ("record", "enum")
            ]
        )
        self.report(msg.unknown_type(t.span, t.name, names))
        return T.ANY

    def builtin_sig(self, b: Builtin) -> tuple[list[_Param], T.Type]:
        key = id(b)
        if key not in self._builtin_params:
            self._builtin_params[key] = [
                _Param(
                    p.name,
                    self.spec_type(p.type),
                    None if p.default is None else registry_expr(p.default),
                    p.required,
                    p.keyword_only,
                )
                for p in b.params
            ]
            self._builtin_returns[key] = self.spec_type(b.returns)
        return self._builtin_params[key], self._builtin_returns[key]

    # ---- definitions --------------------------------------------------------------------------
    def define(
        self, scope: _Scope, name: str, kind: str, ty: T.Type, span: Span, node: object
    ) -> Definition:
        d = Definition(name, kind, ty, span, self.path, node)
        prev = scope.names.get(name)
        if prev is not None:
            self.report(
                msg.duplicate_definition(span, name, prev.span if prev.path == self.path else None)
            )
        scope.names[name] = d
        if not self.muted:
            self.a.definitions.append(d)
        return d

    def use(self, d: Definition, span: Span) -> None:
        d.used = True
        if not self.muted:
            self.a.references.append(Reference(span, d))

    def new_scope(self, parent: _Scope, span: Span, fn=None) -> _Scope:
        scope = _Scope(parent, span, fn)
        self.a.scopes.append(scope.info)
        return scope

    def close_scope(self, scope: _Scope) -> None:
        if scope.parent is None and not self.warn_unused_top:
            return
        for d in scope.names.values():
            if (
                d.kind in ("let", "param", "for")
                and not d.used
                and not d.name.startswith("_")
                and d.path == self.path
            ):
                self.report(msg.unused_binding(d.span, d.name))

    # ---- module ---------------------------------------------------------------------------------
    def check_module(self, module: ast.Module) -> None:
        top = _Scope(None, None, None)
        self.a.scopes.append(top.info)
        decls = [
            s for s in module.body if isinstance(s, (ast.FnDecl, ast.RecordDecl, ast.EnumDecl))
        ]
        for s in module.body:
            if isinstance(s, ast.Import):
                self.check_import(s, top)
        for s in decls:  # hoist: names first, then their types
            if isinstance(s, ast.EnumDecl):
                ty = T.EnumT(s.name, tuple(m.name for m in s.members))
                self.define(top, s.name, "enum", ty, s.name_span, s)
                seen: set[str] = set()
                for m in s.members:
                    if m.name in seen:
                        self.report(msg.duplicate_definition(m.span, m.name, None))
                    seen.add(m.name)
            elif isinstance(s, ast.RecordDecl):
                self.fields[s.name] = {}
                self.define(top, s.name, "record", T.NamedT(s.name), s.name_span, s)
                self.a.record_fields[s.name] = s.fields
            else:
                self.define(top, s.name, "fn", T.ANY, s.name_span, s)
        for s in decls:
            if isinstance(s, ast.RecordDecl):
                params = []
                for f in s.fields:
                    fty = self.resolve_type(f.type, top)
                    if f.name in self.fields[s.name]:
                        self.report(msg.duplicate_definition(f.name_span, f.name, None))
                    self.fields[s.name][f.name] = fty
                    params.append(_Param(f.name, fty, f.default, f.default is None))
                self.record_params[s.name] = params
                self.a.signatures[id(s)] = (params, T.NamedT(s.name))
                self.a.field_types[s.name] = self.fields[s.name]
            elif isinstance(s, ast.FnDecl):
                self.fn_params[id(s)] = [
                    _Param(p.name, self.resolve_type(p.type, top), p.default, p.default is None)
                    for p in s.params
                ]
                ret = self.resolve_type(s.returns, top) if s.returns is not None else T.NONE
                self.fn_returns[id(s)] = ret
                self.a.signatures[id(s)] = (self.fn_params[id(s)], ret)
                top.names[s.name].ty = ret
        for s in decls:
            if isinstance(s, ast.RecordDecl):
                for f, p in zip(s.fields, self.record_params[s.name]):
                    if f.default is not None:
                        self.expect(f.default, p.ty, top, f"default of field `{f.name}`")
        for s in module.body:
            self.stmt(s, top)
        self.close_scope(top)

    def check_import(self, s: ast.Import, scope: _Scope) -> None:
        try:
            resolved, source = self.resolver(s.path, self.path)
        except OSError as e:
            self.report(msg.import_not_found(s.path_span, s.path, e.strerror or str(e)))
            return
        if resolved in self.import_stack:
            chain = list(self.import_stack[self.import_stack.index(resolved) :]) + [resolved]
            self.report(msg.import_cycle(s.path_span, chain))
            return
        sub = self.cache.get(resolved)
        if sub is None:
            sub = analyze_module(
                source,
                resolved,
                self.reg,
                self.resolver,
                self.import_stack + (resolved,),
                self.cache,
                warn_unused_top=False,
            )
            self.cache[resolved] = sub
        self.a.imports[id(s)] = sub
        cycle = next((d for d in sub.errors if d.code == "E-IMPORT-CYCLE"), None)
        if cycle is not None:
            self.report(msg.Diagnostic(cycle.code, s.path_span, cycle.message))
        elif sub.errors:
            first = sub.errors[0]
            self.report(
                msg.import_not_found(
                    s.path_span,
                    s.path,
                    f"it has {len(sub.errors)} error(s), the first: {first.message}",
                )
            )
        self.fields.update(sub.field_types)
        self.a.field_types.update(sub.field_types)
        self.a.record_fields.update(sub.record_fields)
        self.a.signatures.update(sub.signatures)
        for name, d in sub.scopes[0].names.items():
            if name in scope.names:
                self.report(msg.duplicate_definition(s.span, name, None))
            scope.names[name] = d
            d.used = True

    # ---- statements --------------------------------------------------------------------------------
    def block(
        self,
        b: ast.Block,
        parent: _Scope,
        fn=None,
        params: list | None = None,
        narrowed: dict[str, T.Type] | None = None,
    ) -> _Scope:
        scope = self.new_scope(parent, b.span, fn)
        scope.narrowed.update(narrowed or {})
        for p in params or ():
            self.define(scope, *p)
        for s in b.body:
            self.stmt(s, scope)
        self.close_scope(scope)
        return scope

    def stmt(self, s: ast.Stmt, scope: _Scope) -> None:
        if isinstance(s, ast.Let):
            expected = self.resolve_type(s.annotation, scope) if s.annotation is not None else None
            ty = self.expr(s.value, scope, expected)
            if expected is not None:
                self.fits(s.value, ty, expected, f"`{s.name}`")
                ty = expected
            elif ty == T.NONE or (isinstance(ty, T.ListT) and ty.elem == T.NEVER):
                self.report(msg.need_annotation(s.name_span, s.name))
                ty = T.ANY
            self.define(scope, s.name, "let", ty, s.name_span, s)
        elif isinstance(s, ast.Assign):
            d = scope.lookup(s.name)
            ty = self.expr(s.value, scope, d.ty if d else None)
            if d is None:
                self.report(msg.unknown_name(s.name_span, s.name, scope.visible()))
            elif d.kind != "let":
                self.report(msg.assign_to_non_variable(s.name_span, s.name, d.kind))
            else:
                self.a.references.append(Reference(s.name_span, d)) if not self.muted else None
                self.fits(s.value, ty, d.ty, f"`{s.name}`")
        elif isinstance(s, ast.FnDecl):
            if scope.parent is not None:
                self.report(msg.declaration_not_top_level(s.span, "function"))
                return
            ret = self.fn_returns[id(s)]
            params = [
                (p.name, "param", sig.ty, p.name_span, p)
                for p, sig in zip(s.params, self.fn_params[id(s)])
            ]
            for p, sig in zip(s.params, self.fn_params[id(s)]):
                if p.default is not None:
                    self.expect(p.default, sig.ty, scope, f"default of `{p.name}`")
            self.block(s.body, scope, (s, ret), params)
            if ret != T.NONE and not _always_returns(s.body):
                self.report(msg.missing_return(s.name_span, s.name, str(ret)))
        elif isinstance(s, (ast.RecordDecl, ast.EnumDecl)):
            if scope.parent is not None:
                self.report(
                    msg.declaration_not_top_level(
                        s.span, "record" if isinstance(s, ast.RecordDecl) else "enum"
                    )
                )
        elif isinstance(s, ast.If):
            self.expect(s.cond, T.BOOL, scope, "the condition")
            then_narrow, else_narrow = self._narrowing(s.cond, scope)
            self.block(s.then, scope, narrowed=then_narrow)
            if isinstance(s.orelse, ast.Block):
                self.block(s.orelse, scope, narrowed=else_narrow)
            elif s.orelse is not None:
                self.stmt(s.orelse, scope)
        elif isinstance(s, ast.For):
            ity = self.expr(s.iterable, scope, None)
            if isinstance(ity, T.ListT):
                elem = ity.elem
            elif ity == T.ANY:
                elem = T.ANY
            else:
                self.report(
                    msg.type_mismatch(s.iterable.span, "List[...]", str(ity), "the loop's iterable")
                )
                elem = T.ANY
            self.block(s.body, scope, None, [(s.var, "for", elem, s.var_span, s)])
        elif isinstance(s, ast.Return):
            if scope.fn is None:
                self.report(msg.return_outside_fn(s.span))
                if s.value is not None:
                    self.expr(s.value, scope, None)
                return
            _fn, ret = scope.fn
            if s.value is None:
                if ret != T.NONE:
                    self.report(msg.type_mismatch(s.span, str(ret), "None", "the returned value"))
            else:
                self.expect(s.value, ret, scope, "the returned value")
        elif isinstance(s, ast.Assert):
            self.expect(s.cond, T.BOOL, scope, "the assertion")
            if s.message is not None:
                self.expect(s.message, T.STRING, scope, "the assertion message")
        elif isinstance(s, ast.Import):
            if scope.parent is not None:
                self.report(msg.declaration_not_top_level(s.span, "import"))
        elif isinstance(s, ast.ExprStmt):
            self.expr(s.expr, scope, None)

    def _narrowing(self, cond: ast.Expr, scope: _Scope) -> tuple[dict, dict]:
        """`x != none` narrows an optional `x` in the then-branch, `x == none` in the else-branch."""
        if (
            isinstance(cond, ast.Binary)
            and cond.op in ("==", "!=")
            and isinstance(cond.right, ast.NoneLit)
            and isinstance(cond.left, ast.Name)
        ):
            d = scope.lookup(cond.left.name)
            if d is not None and isinstance(d.ty, T.OptionalT):
                narrowed = {cond.left.name: d.ty.inner}
                return (narrowed, {}) if cond.op == "!=" else ({}, narrowed)
        return {}, {}

    # ---- expressions ---------------------------------------------------------------------------------
    def expect(self, e: ast.Expr, expected: T.Type, scope: _Scope, what: str) -> T.Type:
        ty = self.expr(e, scope, expected)
        self.fits(e, ty, expected, what)
        return ty

    def fits(self, e: ast.Expr, ty: T.Type, expected: T.Type, what: str) -> bool:
        if T.assign_cost(ty, expected) is None:
            self.report(msg.type_mismatch(e.span, str(expected), str(ty), what))
            return False
        return True

    def expr(self, e: ast.Expr, scope: _Scope, expected: T.Type | None) -> T.Type:
        ty = self._expr(e, scope, expected)
        if not self.muted:
            self.a.expr_types[id(e)] = (e, ty)
        return ty

    def _expr(self, e, scope: _Scope, expected: T.Type | None) -> T.Type:
        if isinstance(e, ast.IntLit):
            return T.INT
        if isinstance(e, ast.FloatLit):
            return T.FLOAT
        if isinstance(e, ast.BoolLit):
            return T.BOOL
        if isinstance(e, ast.BytesLit):
            return T.BYTES
        if isinstance(e, ast.NoneLit):
            return T.NONE
        if isinstance(e, ast.StringLit):
            for p in e.parts:
                if not isinstance(p, str):
                    self.expr(p, scope, None)
            return T.STRING
        if isinstance(e, ast.Name):
            return self.name(e, scope, expected)
        if isinstance(e, ast.ListLit):
            want = expected.inner if isinstance(expected, T.OptionalT) else expected
            elem_expected = want.elem if isinstance(want, T.ListT) else None
            elem: T.Type = T.NEVER
            for item in e.items:
                ity = self.expr(item, scope, elem_expected)
                joined = T.join(ity, elem)
                if joined is None:
                    self.report(msg.type_mismatch(item.span, str(elem), str(ity), "list item"))
                else:
                    elem = joined
            if elem_expected is not None and T.assign_cost(elem, elem_expected) is not None:
                return T.ListT(elem_expected)
            return T.ListT(elem)
        if isinstance(e, ast.Unary):
            ty = self.expr(e.operand, scope, T.BOOL if e.op == "not" else None)
            if e.op == "not":
                if ty not in (T.BOOL, T.ANY):
                    self.report(msg.bad_operands(e.span, "not", str(ty)))
                return T.BOOL
            if ty in (T.INT, T.FLOAT, T.BYTES, T.ANY):
                return ty
            self.report(msg.bad_operands(e.span, "-", str(ty)))
            return T.ANY
        if isinstance(e, ast.Binary):
            return self.binary(e, scope)
        if isinstance(e, ast.Call):
            return self.call(e, scope, expected)
        if isinstance(e, ast.Member):
            return self.member(e, scope)
        if isinstance(e, ast.Index):
            oty = self.expr(e.obj, scope, None)
            self.expect(e.index, T.INT, scope, "the index")
            if isinstance(oty, T.ListT):
                return oty.elem
            if oty in (T.STRING, T.ANY):
                return oty
            self.report(msg.not_indexable(e.obj.span, str(oty)))
            return T.ANY
        raise AssertionError(f"unhandled expression {type(e).__name__}")

    def name(self, e: ast.Name, scope: _Scope, expected: T.Type | None) -> T.Type:
        d = scope.lookup(e.name)
        want = expected.inner if isinstance(expected, T.OptionalT) else expected
        if d is not None and d.kind in ("let", "param", "for"):
            self.use(d, e.span)
            return scope.narrowed_type(e.name) or d.ty
        if isinstance(want, T.EnumT) and e.name in want.members:
            if not self.muted:
                self.a.enum_values[id(e)] = (want.name, e.name)
            return want
        if d is not None:
            self.use(d, e.span)
            if d.kind == "enum":
                return d.ty
            self.report(msg.Diagnostic("E-TYPE", e.span, f"`{e.name}` is a {d.kind}, not a value"))
            return T.ANY
        if isinstance(want, T.EnumT):
            self.report(msg.unknown_member(e.span, want.name, e.name, want.members))
            return want
        if e.name in self.reg.functions:
            self.report(
                msg.Diagnostic(
                    "E-TYPE", e.span, f"builtin function `{e.name}` is not a value; call it"
                )
            )
            return T.ANY
        self.report(msg.unknown_name(e.span, e.name, scope.visible() + list(self.reg.functions)))
        return T.ANY

    def member(self, e: ast.Member, scope: _Scope) -> T.Type:
        enum = self._enum_type_named(e.obj, scope)
        if enum is not None:
            if e.name not in enum.members:
                self.report(msg.unknown_member(e.name_span, enum.name, e.name, enum.members))
            elif not self.muted:
                self.a.enum_values[id(e)] = (enum.name, e.name)
            return enum
        oty = self.expr(e.obj, scope, None)
        base = oty.inner if isinstance(oty, T.OptionalT) else oty
        if base == T.ANY:
            return T.ANY
        if isinstance(base, T.NamedT) and base.name in self.fields:
            fields = self.fields[base.name]
            if e.name in fields:
                return fields[e.name]
            self.report(msg.unknown_field(e.name_span, base.name, e.name, fields))
            return T.ANY
        self.report(msg.unknown_field(e.name_span, str(oty), e.name, ()))
        return T.ANY

    def _enum_type_named(self, e: ast.Expr, scope: _Scope) -> T.EnumT | None:
        if not isinstance(e, ast.Name):
            return None
        d = scope.lookup(e.name)
        if d is not None:
            if d.kind == "enum":
                self.use(d, e.span)
                return d.ty
            return None
        return self.enum_types.get(e.name)

    def binary(self, e: ast.Binary, scope: _Scope) -> T.Type:
        op = e.op
        if op in ("and", "or"):
            self.expect(e.left, T.BOOL, scope, f"the left side of `{op}`")
            self.expect(e.right, T.BOOL, scope, f"the right side of `{op}`")
            return T.BOOL
        lt = self.expr(e.left, scope, None)
        rt = self.expr(e.right, scope, lt if isinstance(lt, T.EnumT) else None)
        result = _binary_type(op, lt, rt)
        if result is None:
            self.report(msg.bad_operands(e.op_span, op, str(lt), str(rt)))
            return T.BOOL if op in ("==", "!=", "<", "<=", ">", ">=") else T.ANY
        return result

    # ---- calls ------------------------------------------------------------------------------------------
    def call(self, e: ast.Call, scope: _Scope, expected: T.Type | None) -> T.Type:
        receiver: ast.Expr | None = None
        callee = e.callee
        if isinstance(callee, ast.Member):
            if self._enum_type_named(callee.obj, scope) is not None:
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
            self._record_call(
                e, self._info(e, name, "fn", params, receiver, candidates=(d,), definition=d)
            )
            return ret
        if d is not None and d.kind == "record" and receiver is None:
            self.use(d, name_span)
            params = self.a.signatures[id(d.node)][0]
            self.bind_and_check(e, name, params, None, scope)
            self._record_call(
                e, self._info(e, name, "record", params, None, candidates=(d,), definition=d)
            )
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
            candidates = [n for n in scope.visible() if (scope.lookup(n).kind == "fn")] + list(
                self.reg.functions
            )
            self.report(msg.unknown_name(name_span, name, candidates))
            return T.ANY
        chosen = self.pick_overload(e, name, overloads, receiver, scope)
        if chosen is None:
            return T.ANY
        params, ret = self.builtin_sig(chosen)
        self.bind_and_check(e, name, params, receiver, scope, builtin=chosen)
        self._record_call(
            e,
            self._info(e, name, "builtin", params, receiver, candidates=overloads, builtin=chosen),
        )
        return ret

    def _record_call(self, e: ast.Call, info: CallInfo) -> None:
        if not self.muted:
            self.a.calls[id(e)] = info

    def pick_overload(
        self, e: ast.Call, name: str, overloads: tuple[Builtin, ...], receiver, scope
    ) -> Builtin | None:
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

    def _problem_count(self, e: ast.Call, params: list[_Param], receiver, scope) -> int:
        """How many things are wrong with a call against one candidate signature."""
        bound, problems = self._bind(e, params, receiver)
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

    def _bind(
        self, e: ast.Call, params: list[_Param], receiver
    ) -> tuple[dict[str, ast.Expr], list[Diagnostic]]:
        bound: dict[str, ast.Expr] = {}
        problems: list[Diagnostic] = []
        positional = [p for p in params if not p.keyword_only]
        values = ([receiver] if receiver is not None else []) + [
            a for a in e.args if a.name is None
        ]
        named_seen = False
        for a in e.args:
            if a.name is not None:
                named_seen = True
            elif named_seen:
                problems.append(
                    msg.Diagnostic("E-ARGS", a.span, "positional argument after a named argument")
                )
        for i, v in enumerate(values):
            expr = v if isinstance(v, ast.Expr.__args__) else v.value
            if i >= len(positional):
                problems.append(msg.too_many_args(v.span, e_name(e), len(positional)))
                break
            bound[positional[i].name] = expr
        by_name = {p.name: p for p in params}
        for a in e.args:
            if a.name is None:
                continue
            if a.name not in by_name:
                problems.append(msg.unknown_argument(a.name_span, e_name(e), a.name, list(by_name)))
            elif a.name in bound:
                problems.append(msg.duplicate_argument(a.name_span, e_name(e), a.name))
            else:
                bound[a.name] = a.value
        missing = [p.name for p in params if p.required and p.name not in bound]
        if missing:
            problems.append(msg.missing_argument(e.span, e_name(e), missing))
        return bound, problems

    def bind_and_check(
        self,
        e: ast.Call,
        name: str,
        params: list[_Param],
        receiver,
        scope,
        builtin: Builtin | None = None,
    ) -> int | None:
        """Bind and type-check the arguments; the total promotion cost, or None on any error."""
        bound, problems = self._bind(e, params, receiver)
        for p in problems:
            self.report(p)
        ok = not problems
        cost = 0
        checked = set()
        for p in params:
            arg = bound.get(p.name)
            if arg is None:
                continue
            checked.add(id(arg))
            ty = self.expr(arg, scope, p.ty)
            c = T.assign_cost(ty, p.ty)
            if c is None:
                ok = False
                self.report(msg.argument_type(arg.span, name, p.name, str(p.ty), str(ty)))
            else:
                cost += c
        for a in e.args:  # arguments that bound to nothing are still checked for their own errors
            if id(a.value) not in checked:
                self.expr(a.value, scope, None)
        if receiver is not None and id(receiver) not in checked:
            self.expr(receiver, scope, None)
        if ok and builtin is not None and builtin.constraints:
            self.check_constraints(e, name, builtin, params, bound)
        return cost if ok else None

    def check_constraints(
        self, e: ast.Call, name: str, b: Builtin, params: list[_Param], bound: dict[str, ast.Expr]
    ) -> None:
        env: dict[str, object] = {}
        members = frozenset(m for et in self.enum_types.values() for m in et.members)
        for p in params:
            expr = bound.get(p.name, p.default)
            if expr is None:
                continue
            try:
                env[p.name] = evaluate(expr, {}, members)
            except (
                Exception
            ):  # not a literal (NotConstant), or it fails: then only the run checks it
                continue
        for c in b.constraints:
            try:
                ok = evaluate(registry_expr(c.expr), env, members)
            except Exception:  # NotConstant, or it cannot be evaluated statically
                continue
            if not ok:
                mentioned = [
                    p.name
                    for p in params
                    if p.name in bound and _mentions(registry_expr(c.expr), p.name)
                ]
                span = bound[mentioned[0]].span if mentioned else e.span
                self.report(msg.constraint_failed(span, name, c.message, c.expr))

    def _bound(
        self, e: ast.Call, params: list[_Param], receiver
    ) -> tuple[tuple[str, ast.Expr | None], ...]:
        bound, _ = self._bind(e, params, receiver)
        return tuple((p.name, bound.get(p.name, p.default)) for p in params)

    def _info(
        self, e: ast.Call, name: str, kind: str, params: list[_Param], receiver, **kw
    ) -> CallInfo:
        return CallInfo(
            e,
            name,
            kind,
            bound=self._bound(e, params, receiver),
            param_types=tuple(p.ty for p in params),
            receiver=receiver,
            **kw,
        )


def e_name(e: ast.Call) -> str:
    c = e.callee
    return c.name if isinstance(c, (ast.Name, ast.Member)) else "function"


def _mentions(expr: ast.Expr, name: str) -> bool:
    if isinstance(expr, ast.Name):
        return expr.name == name
    return any(
        _mentions(getattr(expr, f), name)
        for f in ("left", "right", "operand")
        if isinstance(getattr(expr, f, None), ast.Expr.__args__)
    )


_COMPARE = ("<", "<=", ">", ">=")


def _binary_type(op: str, lt: T.Type, rt: T.Type) -> T.Type | None:
    if T.ANY in (lt, rt):
        return T.BOOL if op in _COMPARE or op in ("==", "!=") else T.ANY
    if op in ("==", "!="):
        if T.assign_cost(lt, rt) is not None or T.assign_cost(rt, lt) is not None:
            return T.BOOL
        return None
    num = lt in T.NUMERIC and rt in T.NUMERIC
    if op in _COMPARE:
        if num or (lt == rt and lt in (T.BYTES, T.STRING)):
            return T.BOOL
        return None
    if op == "/":
        return T.FLOAT if num or (lt == rt == T.BYTES) else None
    if num:
        return T.INT if lt == rt == T.INT else T.FLOAT
    if op == "+" and lt == rt and (lt in (T.STRING, T.BYTES) or isinstance(lt, T.ListT)):
        return lt
    if op == "-" and lt == rt == T.BYTES:
        return T.BYTES
    if op == "*" and {lt, rt} == {T.BYTES, T.INT}:
        return T.BYTES
    return None


def _always_returns(b: ast.Block) -> bool:
    if not b.body:
        return False
    last = b.body[-1]
    if isinstance(last, ast.Return):
        return True
    if isinstance(last, ast.If) and last.orelse is not None:
        other = (
            last.orelse
            if isinstance(last.orelse, ast.Block)
            else ast.Block(last.orelse.span, (last.orelse,))
        )
        return _always_returns(last.then) and _always_returns(other)
    if isinstance(last, ast.Assert) and isinstance(last.cond, ast.BoolLit) and not last.cond.value:
        return True
    return False


def analyze_module(
    source: str,
    path: str | None,
    registry: Registry,
    resolver: Resolver,
    import_stack: tuple[str, ...],
    cache: dict[str, Analysis],
    warn_unused_top: bool = True,
) -> Analysis:
    module, diags = parse(source, path)
    analysis = Analysis(path, source, module, diagnostics=list(diags))
    checker = Checker(registry, analysis, resolver, import_stack, cache, warn_unused_top)
    checker.check_module(module)
    if module.broken:
        syntax = len(diags)
        # inside a broken chunk other errors are cascades; unused warnings are noise until it parses
        analysis.diagnostics[syntax:] = [
            d
            for d in analysis.diagnostics[syntax:]
            if d.code != "W-UNUSED"
            and (d.span is None or not any(b.start <= d.span.start < b.end for b in module.broken))
        ]
    return analysis
