"""Every builtin of the registry can be called with its required arguments only: the interpreter
fills every default, and the implementation receives each parameter as a value of its declared
type. The interpreter's own builtins run for real; the runtime's (native ones, and those that
start jobs or call services) run against a stubbed implementation loader, which records what
each implementation would receive (so no torch, process or server is needed), except for one real
`train` on the tiny fixture model."""

from __future__ import annotations

import io
from pathlib import Path

import pytest

from aner_lang.builtins import registry
from aner_lang.builtins.spec import Builtin
from aner_lang.check import Analysis, analyze
from aner_lang.check.types import parse_type_string
from aner_lang.grammar import ast
from aner_lang.interp import ExecContext, run
from aner_lang.interp import interpreter as interp_module
from aner_lang.interp.boundary import Impl, load_impl

REGISTRY = registry()
BUILTINS = [b for overloads in REGISTRY.functions.values() for b in overloads]
LITERALS = {
    "Int": "2",
    "Float": "2.0",
    "Bool": "true",
    "String": '"a.txt"',
    "Bytes": "2 KiB",
    "Any": "2",
}
"""A script literal of each primitive type (the String names a file the tests create)."""

Parsed = tuple[str, tuple["Parsed", ...], int]  # parse_type_string's (name, args, optional depth)


class Opaque:
    """What a stubbed native implementation returns: a value of the builtin's declared type."""

    def __init__(self, type_name: str) -> None:
        self.type_name = type_name


def _source(parsed: Parsed) -> str:
    """Script source for a value of the type (an opaque one from a builtin that returns it)."""
    name, args, _ = parsed
    if name == "List":
        return f"[{_source(args[0])}]"
    if name in LITERALS:
        return LITERALS[name]
    if name in REGISTRY.enums:
        return REGISTRY.enums[name].members[0].name
    maker = next(  # one that makes the type from others (not shuffle(Pairs) -> Pairs)
        b
        for b in BUILTINS
        if b.returns == name
        and not any(p.required and parse_type_string(p.type)[0] == name for p in b.params)
    )
    return _call(maker)


def _call(b: Builtin) -> str:
    """`b` called with its required arguments only, by name (which also picks the overload)."""
    args = ", ".join(
        f"{p.name}: {_source(parse_type_string(p.type))}" for p in b.params if p.required
    )
    return f"{b.name}({args})"


def _has_type(value: object, parsed: Parsed) -> bool:
    name, args, optional = parsed
    if optional and value is None:
        return True
    if name == "List":
        return isinstance(value, list) and all(_has_type(v, args[0]) for v in value)
    if name in ("Int", "Bytes"):
        return type(value) is int
    if name == "Any":
        return True
    if name in ("Float", "Bool", "String"):
        return type(value) is {"Float": float, "Bool": bool, "String": str}[name]
    if name in REGISTRY.enums:
        return value in {m.name for m in REGISTRY.enums[name].members}
    return isinstance(value, Opaque) and value.type_name == name


@pytest.fixture
def received(monkeypatch: pytest.MonkeyPatch) -> list[tuple[Builtin, dict[str, object]]]:
    """Every implementation call as (builtin, the keyword arguments it receives); the runtime's
    implementations are not called, the interpreter's are."""
    calls: list[tuple[Builtin, dict[str, object]]] = []

    def stub_loader(b: Builtin) -> Impl:
        real = load_impl(b) if b.impl.startswith("aner_lang.interp.") else None

        def impl(*ctx: object, **kwargs: object) -> object:
            calls.append((b, kwargs))
            if real is None:
                return Opaque(parse_type_string(b.returns)[0])
            return real(*ctx, **kwargs)

        return impl

    monkeypatch.setattr(interp_module, "load_impl", stub_loader)
    return calls


def _run(source: str, script_dir: Path, out: io.StringIO | None = None) -> Analysis:
    analysis = analyze(source, str(script_dir / "t.aner"))
    assert not analysis.errors, (source, analysis.errors)
    run(analysis, ExecContext(script_dir=script_dir, stdout=out or io.StringIO()))
    return analysis


@pytest.mark.parametrize(
    "b", BUILTINS, ids=lambda b: f"{b.name}({','.join(p.type for p in b.params)})"
)
def test_required_arguments_only(b: Builtin, received: list, tmp_path: Path) -> None:
    if "overwrite" not in {p.name for p in b.params}:  # a writer refuses an existing file
        (tmp_path / "a.txt").write_text("text")
    analysis = _run(_call(b) + "\n", tmp_path)
    statement = analysis.module.body[-1]
    assert isinstance(statement, ast.ExprStmt)
    assert analysis.calls[id(statement.expr)].builtin is b, "the call picks another overload"
    kwargs = [kw for called, kw in received if called is b][-1]
    assert set(kwargs) == {p.name for p in b.params}
    for p in b.params:
        assert _has_type(kwargs[p.name], parse_type_string(p.type)), (p, kwargs[p.name])


def test_a_default_that_calls_a_builtin_is_made_per_call(received: list, tmp_path: Path) -> None:
    adapter, data = _source(("Adapter", (), 0)), _source(("Dataset", (), 0))
    _run(
        f"let a = {adapter}\nlet d = {data}\ntrain(a, d)\ntrain(a, d)\n"
        "train(a, d, profile: profile(optimizer: paged_adamw))\n",
        tmp_path,
    )
    profiles = [kw["profile"] for b, kw in received if b.name == "train"]
    made = [kw for b, kw in received if b.name == "profile"]
    assert len(made) == 3 and made[-1]["optimizer"] == "paged_adamw"
    assert len({id(p) for p in profiles}) == 3
    assert all(isinstance(p, Opaque) and p.type_name == "Profile" for p in profiles)


def test_train_with_the_default_profile_on_the_tiny_model(tiny_gguf: Path, tmp_path: Path) -> None:
    pytest.importorskip("torch")
    out = io.StringIO()
    _run(
        f'let m = load_model("{tiny_gguf}", device: cpu)\n'
        'let r = train(lora(m, rank: 2), texts(["hello world", "once upon a time"], context: 16), '
        "steps: 1)\nprint(r.updates)\nprint(len(r.loss_history))\n",
        tmp_path,
        out,
    )
    assert out.getvalue().split() == ["1", "1"]
