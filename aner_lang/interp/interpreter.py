"""The tree-walking evaluator. It runs a checked `Analysis` (the checker's side tables say which
builtin or function each call resolved to and which names are enum members), so it does no name
resolution of its own.

Statements and expressions dispatch on the exact node class (`type(node) is ast.X`, the most
frequent first): in CPython a chain of identity tests is the cheapest dispatch there is, and mypy
narrows the node in each branch. A call runs from its call site's plan (`binding.py`), made the
first time the call runs.

Every failure leaves as `AnerError` (`failures.py`), at an Aner span with the Aner call stack.
"""

from __future__ import annotations

from aner_lang.builtins.spec import WRITES, Builtin
from aner_lang.check import Analysis
from aner_lang.check.checker import registry_expr
from aner_lang.check.consteval import apply_binary, evaluate, negate, size_error
from aner_lang.grammar import ast
from aner_lang.grammar.ast import Span
from aner_lang.grammar.limits import MAX_CHARS, ensure_recursion_limit
from aner_lang.host import files, prechecks
from aner_lang.interp.binding import BuiltinPlan, CallPlan, RecordPlan, plan_call
from aner_lang.interp.boundary import from_native, load_impl, to_native
from aner_lang.interp.context import ExecContext
from aner_lang.interp.defaults import BuiltinCall, Constant
from aner_lang.interp.env import Env, Module
from aner_lang.interp.failures import AnerError, Frame, failure
from aner_lang.interp.values import EnumValue, RecordValue, Value, show
from aner_lang.problems import diagnostics as msg
from aner_lang.problems.errors import AnerRuntimeError


class _Return(Exception):
    """`return` unwinding to the call of the function it returns from."""

    def __init__(self, value: Value) -> None:
        self.value = value


class Interpreter:
    def __init__(self, ctx: ExecContext) -> None:
        self.ctx = ctx
        self.stack: list[Frame] = []
        self.modules: dict[int, Module] = {}
        """id(Analysis) -> the module run from it (each file runs once)."""
        self.declared: dict[int, Module] = {}
        """id(FnDecl or RecordDecl) -> the module that declares it."""
        self.plans: dict[int, CallPlan] = {}
        """id(Call) -> its plan."""
        self.last_span: Span | None = None
        self.outputs: dict[int, tuple[tuple[str, bool], ...]] = {}
        """id(Builtin) -> (parameter, is a folder) of each path it writes (`Param.path`)."""

    def fail(self, a: Analysis, span: Span | None, exc: BaseException) -> AnerError:
        return failure(a.path, span, exc, self.stack)

    # ---- modules --------------------------------------------------------------------------------
    def run_module(self, a: Analysis) -> Module:
        module = self.modules.get(id(a))
        if module is not None:
            return module
        module = Module(a, Env(None))
        self.modules[id(a)] = module
        env = module.env
        for s in a.module.body:
            if isinstance(s, (ast.FnDecl, ast.RecordDecl)):
                self.declared[id(s)] = module
            elif isinstance(s, ast.Import):
                sub = a.imports.get(id(s))
                if sub is not None:
                    sub_vars = self.run_module(sub).env.vars
                    for name in sub.scopes[0].names:
                        if name in sub_vars:
                            env.vars[name] = sub_vars[name]
        for s in a.module.body:
            if not isinstance(s, (ast.FnDecl, ast.Import, ast.RecordDecl, ast.EnumDecl)):
                self.stmt(a, s, env)
        return module

    # ---- statements -----------------------------------------------------------------------------
    def block(self, a: Analysis, body: tuple[ast.Stmt, ...], env: Env) -> None:
        for s in body:
            self.stmt(a, s, env)

    def stmt(self, a: Analysis, s: ast.Stmt, env: Env) -> None:
        self.last_span = s.span
        if type(s) is ast.ExprStmt:
            self.expr(a, s.expr, env)
        elif type(s) is ast.Let:
            env.vars[s.name] = self.expr(a, s.value, env)
        elif type(s) is ast.Assign:
            env.set_existing(s.name, self.expr(a, s.value, env))
        elif type(s) is ast.If:
            branch = s
            while True:
                if self.expr(a, branch.cond, env):
                    self.block(a, branch.then.body, Env(env))
                    break
                if isinstance(branch.orelse, ast.If):
                    branch = branch.orelse
                    continue
                if branch.orelse is not None:
                    self.block(a, branch.orelse.body, Env(env))
                break
        elif type(s) is ast.For:
            items = self.expr(a, s.iterable, env)
            if not isinstance(items, list):
                raise TypeError(f"`for` over {show(items, True)}, not a list")
            for item in items:
                self.block(a, s.body.body, Env(env, {s.var: item}))
        elif type(s) is ast.Return:
            raise _Return(None if s.value is None else self.expr(a, s.value, env))
        elif type(s) is ast.Assert:
            if not self.expr(a, s.cond, env):
                text = None if s.message is None else show(self.expr(a, s.message, env))
                d = msg.assertion_failed(s.span, text)
                raise self.fail(a, s.span, AnerRuntimeError(d.message, code=d.code))

    # ---- expressions ----------------------------------------------------------------------------
    def expr(self, a: Analysis, e: ast.Expr, env: Env) -> Value:
        if type(e) is ast.Name:
            enum = a.enum_values.get(id(e))
            if enum is not None:
                return EnumValue(*enum)
            return env.get(e.name)
        if type(e) is ast.IntLit:
            return e.value
        if type(e) is ast.Binary:
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
                return self.mixed_operands(a, e, left, right)
        if type(e) is ast.Call:
            return self.call(a, e, env)
        if type(e) is ast.Member:
            enum = a.enum_values.get(id(e))
            if enum is not None:
                return EnumValue(*enum)
            return self.field(a, e, self.expr(a, e.obj, env))
        if type(e) is ast.StringLit:
            parts = [p if isinstance(p, str) else show(self.expr(a, p, env)) for p in e.parts]
            size = sum(map(len, parts))
            if size > MAX_CHARS:
                raise self.fail(a, e.span, size_error(size, MAX_CHARS, "characters", "`${}`"))
            return "".join(parts)
        if type(e) is ast.FloatLit or type(e) is ast.BoolLit or type(e) is ast.BytesLit:
            return e.value
        if type(e) is ast.NoneLit:
            return None
        if type(e) is ast.ListLit:
            return [self.expr(a, i, env) for i in e.items]
        if type(e) is ast.Index:
            return self.index(a, e, self.expr(a, e.obj, env), self.expr(a, e.index, env))
        if type(e) is ast.Unary:
            value = self.expr(a, e.operand, env)
            if e.op == "not":
                return not value
            if isinstance(value, (int, float)):
                try:
                    return negate(value)
                except AnerRuntimeError as exc:
                    raise self.fail(a, e.span, exc) from None
            raise TypeError(f"`-` of {show(value, True)}")
        raise AssertionError(f"unhandled expression {type(e).__name__}")

    def mixed_operands(self, a: Analysis, e: ast.Binary, left: Value, right: Value) -> Value:
        """`left op right` where Python has no such operator: values of different kinds are never
        equal; any other operator is an error."""
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

    def index(self, a: Analysis, e: ast.Index, obj: Value, idx: Value) -> Value:
        if not isinstance(obj, (list, str)) or not isinstance(idx, int):
            raise TypeError(f"{show(obj, True)}[{show(idx, True)}]")
        if not -len(obj) <= idx < len(obj):
            raise self.fail(
                a,
                e.index.span,
                AnerRuntimeError(
                    f"index {idx} is out of range for a length of {len(obj)}", code="E-INDEX"
                ),
            )
        return obj[idx]

    def field(self, a: Analysis, e: ast.Member, obj: Value) -> Value:
        if obj is None:
            raise self.fail(
                a, e.span, AnerRuntimeError(f"cannot read `{e.name}` of none", code="E-NONE")
            )
        if isinstance(obj, RecordValue):
            return obj.get(e.name)
        value: object = obj[e.name] if isinstance(obj, dict) else getattr(obj, e.name)
        entry = a.expr_types.get(id(e))
        return from_native(value, entry[1]) if entry else value

    # ---- calls ----------------------------------------------------------------------------------
    def call(self, a: Analysis, e: ast.Call, env: Env) -> Value:
        plan = self.plans.get(id(e))
        if plan is None:
            plan = self.plans[id(e)] = plan_call(a, e, self.declared)
        values: dict[str, Value] = {}
        if isinstance(plan, BuiltinPlan):
            for name, arg, promote in plan.args:
                value = self.expr(a, arg, env)
                values[name] = float(value) if promote and type(value) is int else value
            for name, default in plan.defaults:
                values[name] = (
                    default.value
                    if isinstance(default, Constant)
                    else self.call_default(a, e.span, default)
                )
            result = self.call_builtin(a, e.span, plan.builtin, values)
            return result if plan.returns is None else from_native(result, plan.returns)
        for name, expr, where, promote in plan.args:
            value = (
                self.expr(a, expr, env)
                if where is None
                else self.expr(where.analysis, expr, where.env)
            )
            values[name] = float(value) if promote and type(value) is int else value
        if isinstance(plan, RecordPlan):
            return RecordValue(plan.name, tuple(values.items()))
        self.stack.append((plan.name, e.span, a.path))
        try:
            self.block(plan.module.analysis, plan.fn.body.body, Env(plan.module.env, values))
        except _Return as r:
            return r.value
        except RecursionError as exc:  # reported where it happened, with the Aner stack
            raise self.fail(a, e.span, exc) from None
        finally:
            self.stack.pop()
        return None

    def call_default(self, a: Analysis, span: Span, default: BuiltinCall) -> object:
        """A registry default that calls a builtin, called now for the call at `span`."""
        values = {
            name: arg.value if isinstance(arg, Constant) else self.call_default(a, span, arg)
            for name, arg in default.args
        }
        return self.call_builtin(a, span, default.builtin, values)

    def call_builtin(self, a: Analysis, span: Span, b: Builtin, values: dict[str, Value]) -> object:
        """Check `b`'s constraints on `values` and call its implementation (in native form)."""
        if b.constraints:
            self.check_constraints(a, span, b, values)
        self.check_outputs(a, span, b, values)
        self.stack.append((b.name, span, a.path))
        try:
            if "torch" in b.requires and b.lets_go:
                self.ctx.let_go(unless=b.name)
            fn = load_impl(b)
            args = {k: to_native(v) for k, v in values.items()}
            result = fn(self.ctx, **args) if b.needs_context else fn(**args)
        except AnerError:
            raise
        except Exception as exc:
            self.stack.pop()
            raise self.fail(a, span, exc) from None
        self.stack.pop()
        return result

    def check_outputs(self, a: Analysis, span: Span, b: Builtin, values: dict[str, Value]) -> None:
        """The paths `b` writes, checked before it runs by the rule the checks before a run use
        (`prechecks.output`): a train() whose checkpoint folder is a file fails before it trains,
        not when it saves."""
        outputs = self.outputs.get(id(b))
        if outputs is None:
            outputs = self.outputs[id(b)] = tuple(
                (p.name, p.path == "writes_folder") for p in b.params if p.path in WRITES
            )
        for name, folder in outputs:
            value = values.get(name)
            if isinstance(value, str):
                target = files.resolve(value, self.ctx.script_dir)
                e = prechecks.output(target, folder=folder, overwrite=values.get("overwrite"))
                if e is not None:
                    raise self.fail(a, span, e)

    def check_constraints(
        self, a: Analysis, span: Span, b: Builtin, values: dict[str, Value]
    ) -> None:
        """A constraint that cannot be evaluated on these values (a field of an opaque value, say)
        is left to the implementation."""
        env = {k: to_native(v) for k, v in values.items()}
        for c in b.constraints:
            try:
                ok = evaluate(registry_expr(c.expr), env)
            except Exception:
                ok = True
            if not ok:
                raise self.fail(
                    a,
                    span,
                    AnerRuntimeError(
                        f"`{b.name}`: {c.message}",
                        code="E-CONSTRAINT",
                        notes=(f"constraint: {c.expr}",),
                    ),
                )


def run(a: Analysis, ctx: ExecContext) -> None:
    """Run a checked analysis (raise AnerError on a run-time failure)."""
    ensure_recursion_limit()
    interp = Interpreter(ctx)
    try:
        interp.run_module(a)
    except AnerError:
        raise
    except Exception as exc:  # a bug in Aner: still reported as a diagnostic, never a traceback
        raise interp.fail(a, interp.last_span, exc) from None
    finally:
        ctx.let_go()
