"""The tree-walking evaluator. It runs a checked `Analysis` (the checker's side tables say which
builtin or function each call resolved to and which names are enum members), so it does no name
resolution of its own.

Every failure leaves as `AnerError`, carrying a Diagnostic with the Aner span and the Aner call
stack: an `AnerRuntimeError` from a builtin keeps its code and notes; a missing native package is
`NativeBackendUnavailable`; any other Python exception is reported as an internal error, still at
the Aner span. No Python traceback reaches a user.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any

from aner_lang import diagnostics as msg
from aner_lang.builtins.spec import Builtin
from aner_lang.check import Analysis
from aner_lang.check.checker import registry_expr
from aner_lang.check.consteval import apply_binary, evaluate
from aner_lang.check.types import FLOAT, EnumT, ListT, NamedT, OptionalT, Type
from aner_lang.diagnostics import Diagnostic
from aner_lang.errors import AnerRuntimeError, NativeBackendUnavailable
from aner_lang.grammar import ast
from aner_lang.grammar.ast import Span
from aner_lang.interp.context import ExecContext
from aner_lang.interp.values import EnumValue, RecordValue, show


class AnerError(Exception):
    """A run-time failure as a diagnostic (raised out of `run`)."""

    def __init__(self, diagnostic: Diagnostic) -> None:
        super().__init__(diagnostic.message)
        self.diagnostic = diagnostic


class _Return(Exception):
    def __init__(self, value: Any) -> None:
        self.value = value


class _Env:
    __slots__ = ("parent", "vars")

    def __init__(self, parent: _Env | None) -> None:
        self.vars: dict[str, Any] = {}
        self.parent = parent

    def get(self, name: str) -> Any:
        env = self
        while env is not None:
            if name in env.vars:
                return env.vars[name]
            env = env.parent
        raise KeyError(name)

    def set_existing(self, name: str, value: Any) -> None:
        env = self
        while env is not None:
            if name in env.vars:
                env.vars[name] = value
                return
            env = env.parent
        raise KeyError(name)


_impl_cache: dict[str, Callable] = {}
_SHOWN_FRAMES = 12


def load_impl(b: Builtin) -> Callable:
    """Import a builtin's implementation on first use; a missing package means the native backend
    is unavailable (named in the error), not a crash."""
    fn = _impl_cache.get(b.impl)
    if fn is not None:
        return fn
    module_name, _, attr = b.impl.partition(":")
    try:
        module = importlib.import_module(module_name)
    except ImportError as e:
        missing = (e.name or module_name).split(".")[0]
        wanted = next((p for p in b.requires if p.split(".")[0] == missing), None)
        raise NativeBackendUnavailable(b.name, wanted or e.name or module_name) from None
    fn = getattr(module, attr, None)
    if fn is None:
        raise NativeBackendUnavailable(b.name, module_name)
    _impl_cache[b.impl] = fn
    return fn


class Interpreter:
    def __init__(self, ctx: ExecContext) -> None:
        self.ctx = ctx
        self.stack: list[tuple[str, Span, str | None]] = []  # (function, call span, path)
        self.modules: dict[int, _Env] = {}
        self.last_span: Span | None = None

    # ---- errors -------------------------------------------------------------------------------
    def fail(self, a: Analysis, span: Span | None, exc: BaseException) -> AnerError:
        if isinstance(exc, AnerRuntimeError):
            d = msg.runtime_error(span, exc.message, exc.code, exc.notes)
        elif isinstance(exc, RecursionError):
            d = msg.runtime_error(span, "too deep recursion", "E-RECURSION", ())
        else:
            d = msg.internal_error(span, exc)
        frames = [
            f"called from `{fn}` at {path or '<input>'}:{s.line}:{s.col}"
            for fn, s, path in reversed(self.stack)
        ]
        if len(frames) > _SHOWN_FRAMES:  # deep recursion: the innermost and the outermost calls
            hidden = len(frames) - _SHOWN_FRAMES + 1
            frames = frames[: _SHOWN_FRAMES - 3] + [f"... {hidden} more calls ..."] + frames[-2:]
        frames = tuple(frames)
        return AnerError(Diagnostic(d.code, d.span, d.message, notes=d.notes + frames, path=a.path))

    # ---- modules --------------------------------------------------------------------------------
    def run_module(self, a: Analysis) -> _Env:
        env = self.modules.get(id(a))
        if env is not None:
            return env
        env = _Env(None)
        self.modules[id(a)] = env
        for s in a.module.body:
            if isinstance(s, ast.FnDecl):
                env.vars[s.name] = (a, s, env)
            elif isinstance(s, ast.Import):
                sub = a.imports.get(id(s))
                if sub is not None:
                    sub_env = self.run_module(sub)
                    for name, _d in sub.scopes[0].names.items():
                        if name in sub_env.vars:
                            env.vars[name] = sub_env.vars[name]
        for s in a.module.body:
            if not isinstance(s, (ast.FnDecl, ast.Import, ast.RecordDecl, ast.EnumDecl)):
                self.stmt(a, s, env)
        return env

    # ---- statements -----------------------------------------------------------------------------
    def block(self, a: Analysis, body: tuple, env: _Env) -> None:
        for s in body:
            self.stmt(a, s, env)

    def stmt(self, a: Analysis, s: ast.Stmt, env: _Env) -> None:
        self.last_span = s.span
        if isinstance(s, ast.Let):
            env.vars[s.name] = self.expr(a, s.value, env)
        elif isinstance(s, ast.Assign):
            env.set_existing(s.name, self.expr(a, s.value, env))
        elif isinstance(s, ast.ExprStmt):
            self.expr(a, s.expr, env)
        elif isinstance(s, ast.If):
            branch = s
            while True:
                if self.expr(a, branch.cond, env):
                    self.block(a, branch.then.body, _Env(env))
                    break
                if isinstance(branch.orelse, ast.If):
                    branch = branch.orelse
                    continue
                if branch.orelse is not None:
                    self.block(a, branch.orelse.body, _Env(env))
                break
        elif isinstance(s, ast.For):
            for item in self.expr(a, s.iterable, env):
                inner = _Env(env)
                inner.vars[s.var] = item
                self.block(a, s.body.body, inner)
        elif isinstance(s, ast.Return):
            raise _Return(None if s.value is None else self.expr(a, s.value, env))
        elif isinstance(s, ast.Assert):
            if not self.expr(a, s.cond, env):
                text = None if s.message is None else show(self.expr(a, s.message, env))
                d = msg.assertion_failed(s.span, text)
                raise self.fail(a, s.span, AnerRuntimeError(d.message, code=d.code))

    # ---- expressions -------------------------------------------------------------------------------
    def expr(self, a: Analysis, e: ast.Expr, env: _Env) -> Any:
        t = type(e)
        if t in (ast.IntLit, ast.FloatLit, ast.BoolLit, ast.BytesLit):
            return e.value
        if t is ast.Name:
            enum = a.enum_values.get(id(e))
            if enum is not None:
                return EnumValue(*enum)
            return env.get(e.name)
        if t is ast.StringLit:
            return "".join(p if isinstance(p, str) else show(self.expr(a, p, env)) for p in e.parts)
        if t is ast.NoneLit:
            return None
        if t is ast.ListLit:
            return [self.expr(a, i, env) for i in e.items]
        if t is ast.Binary:
            left = self.expr(a, e.left, env)
            if e.op == "and":
                return left and self.expr(a, e.right, env)
            if e.op == "or":
                return left or self.expr(a, e.right, env)
            right = self.expr(a, e.right, env)
            try:
                return apply_binary(e.op, left, right)
            except AnerRuntimeError as exc:
                raise self.fail(a, e.op_span, exc) from None
            except TypeError:
                if e.op in ("==", "!="):
                    return (left == right) == (e.op == "==")
                raise self.fail(
                    a,
                    e.op_span,
                    AnerRuntimeError(
                        f"operator `{e.op}` cannot be applied to {show(left, True)} and {show(right, True)}",
                        code="E-OPERATOR",
                    ),
                ) from None
        if t is ast.Unary:
            value = self.expr(a, e.operand, env)
            return (not value) if e.op == "not" else -value
        if t is ast.Call:
            return self.call(a, e, env)
        if t is ast.Member:
            enum = a.enum_values.get(id(e))
            if enum is not None:
                return EnumValue(*enum)
            return self.field(a, e, self.expr(a, e.obj, env))
        if t is ast.Index:
            obj = self.expr(a, e.obj, env)
            idx = self.expr(a, e.index, env)
            if not -len(obj) <= idx < len(obj):
                raise self.fail(
                    a,
                    e.index.span,
                    AnerRuntimeError(
                        f"index {idx} is out of range for a length of {len(obj)}", code="E-INDEX"
                    ),
                )
            return obj[idx]
        raise AssertionError(f"unhandled expression {t.__name__}")

    def field(self, a: Analysis, e: ast.Member, obj: Any) -> Any:
        if obj is None:
            raise self.fail(
                a, e.span, AnerRuntimeError(f"cannot read `{e.name}` of none", code="E-NONE")
            )
        if isinstance(obj, RecordValue):
            return obj.get(e.name)
        value = obj[e.name] if isinstance(obj, dict) else getattr(obj, e.name)
        entry = a.expr_types.get(id(e))
        return from_native(value, entry[1]) if entry else value

    def call(self, a: Analysis, e: ast.Call, env: _Env) -> Any:
        info = a.calls[id(e)]
        kwargs = {}
        for (name, expr), ty in zip(info.bound, info.param_types):
            if expr is None:
                value = None
            elif id(expr) in a.expr_types or info.kind != "builtin":
                value = self.expr(a, expr, env)
            else:  # a registry default: a constant, enum members as their names
                value = from_native(evaluate(expr, {}, _ENUM_MEMBERS(ty)), ty)
            kwargs[name] = float(value) if ty == FLOAT and type(value) is int else value
        if info.kind == "record":
            return RecordValue(info.name, tuple(kwargs.items()))
        if info.kind == "fn":
            fa, fn, fenv = (
                env.get(info.name) if info.definition.path == a.path else self._imported_fn(info)
            )
            inner = _Env(fenv)
            inner.vars.update(kwargs)
            self.stack.append((info.name, e.span, a.path))
            try:
                self.block(fa, fn.body.body, inner)
            except _Return as r:
                return r.value
            except RecursionError as exc:  # reported where it happened, with the Aner stack
                raise self.fail(a, e.span, exc) from None
            finally:
                self.stack.pop()
            return None
        return self.call_builtin(a, e, info.builtin, kwargs)

    def _imported_fn(self, info) -> tuple:
        for env in self.modules.values():
            value = env.vars.get(info.name)
            if isinstance(value, tuple) and value[1] is info.definition.node:
                return value
        raise AssertionError(f"function {info.name} not loaded")

    def call_builtin(self, a: Analysis, e: ast.Call, b: Builtin, kwargs: dict[str, Any]) -> Any:
        if b.constraints:
            env = {k: to_native(v) for k, v in kwargs.items()}
            for c in b.constraints:
                try:
                    ok = evaluate(registry_expr(c.expr), env)
                except Exception:
                    ok = True
                if not ok:
                    raise self.fail(
                        a,
                        e.span,
                        AnerRuntimeError(
                            f"`{b.name}`: {c.message}",
                            code="E-CONSTRAINT",
                            notes=(f"constraint: {c.expr}",),
                        ),
                    )
        self.stack.append((b.name, e.span, a.path))
        try:
            fn = load_impl(b)
            args = {k: to_native(v) for k, v in kwargs.items()}
            result = fn(self.ctx, **args) if b.needs_context else fn(**args)
        except AnerError:
            raise
        except Exception as exc:
            self.stack.pop()
            raise self.fail(a, e.span, exc) from None
        self.stack.pop()
        entry = a.expr_types.get(id(e))
        return from_native(result, entry[1]) if entry else result


def _ENUM_MEMBERS(ty: Type) -> frozenset[str]:
    inner = ty.inner if isinstance(ty, OptionalT) else ty
    inner = inner.elem if isinstance(inner, ListT) else inner
    return frozenset(inner.members) if isinstance(inner, EnumT) else frozenset()


def to_native(value: Any) -> Any:
    """An Aner value as a builtin implementation receives it (enum members as names)."""
    if isinstance(value, EnumValue):
        return value.member
    if isinstance(value, list):
        return [to_native(v) for v in value]
    return value


def from_native(value: Any, ty: Type) -> Any:
    """A value returned by a builtin, typed by its declaration (names become enum members)."""
    if isinstance(ty, OptionalT):
        return None if value is None else from_native(value, ty.inner)
    if isinstance(ty, EnumT) and isinstance(value, str):
        return EnumValue(ty.name, value)
    if isinstance(ty, ListT) and isinstance(value, (list, tuple)):
        return [from_native(v, ty.elem) for v in value]
    if isinstance(ty, NamedT):
        return value
    return value


def run(a: Analysis, ctx: ExecContext) -> None:
    """Run a checked analysis (raise AnerError on a run-time failure)."""
    interp = Interpreter(ctx)
    try:
        interp.run_module(a)
    except AnerError:
        raise
    except Exception as exc:  # a bug in Aner: still reported as a diagnostic, never a traceback
        raise interp.fail(a, interp.last_span, exc) from None
