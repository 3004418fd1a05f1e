"""Generate the builtins reference (`docs/builtins.md`) from the registry: `aner builtins`."""

from __future__ import annotations

from collections.abc import Iterable

from aner_lang.builtins import Registry
from aner_lang.builtins.spec import Builtin


def param_text(name: str, type_: str, default: str | None) -> str:
    """`name: Type = default` (or `name: Type`): one parameter as signatures write it."""
    return f"{name}: {type_}" + (f" = {default}" if default is not None else "")


def signature_text(name: str, params: Iterable[tuple[str, str, str | None]], returns: str) -> str:
    """`name(param: Type = default, ...) -> Returns` from (name, type, default or None) per
    parameter: how a signature is written in messages, the reference, hovers and signature help
    (which locates each parameter in it by `param_text`)."""
    parts = ", ".join(param_text(n, t, d) for n, t, d in params)
    return f"{name}({parts}) -> {returns}"


def signature(b: Builtin) -> str:
    """A builtin's signature, with its defaults as the registry writes them."""
    return signature_text(b.name, ((p.name, p.type, p.default) for p in b.params), b.returns)


def _entry(title: str, doc: str, items: list[tuple[str, str]]) -> list[str]:
    """One enum or type: heading, doc, then a bullet per member or field."""
    return (
        [f"### {title}", "", doc, ""]
        + [f"- `{name}`" + (f": {d}" if d else "") for name, d in items]
        + [""]
    )


def render_reference(reg: Registry) -> str:
    """The whole reference as Markdown, grouped by category, stable ordering."""
    out = [
        "# Aner builtins reference",
        "",
        "Generated from the registry by `aner builtins -o docs/builtins.md`; do not edit by hand.",
        "",
    ]
    categories = sorted(
        {b.category for bs in reg.functions.values() for b in bs}
        | {e.category for e in reg.enums.values()}
        | {t.category for t in reg.types.values()}
    )
    for cat in categories:
        out += [f"## {cat}", ""]
        for name in sorted(reg.functions):
            for b in reg.functions[name]:
                if b.category != cat:
                    continue
                out += [f"### `{signature(b)}`", "", b.doc, ""]
                for p in b.params:
                    if p.doc:
                        out.append(f"- `{p.name}`: {p.doc}")
                for c in b.constraints:
                    out.append(f"- requires `{c.expr}`: {c.message}")
                if b.native:
                    out.append(
                        f"- needs the native backend ({', '.join(b.requires) or 'aner[native]'})"
                    )
                if b.examples:
                    out += ["", "```aner skip"] + list(b.examples) + ["```"]
                out.append("")
        for e in sorted(reg.enums.values(), key=lambda d: d.name):
            if e.category == cat:
                out += _entry(f"enum `{e.name}`", e.doc, [(m.name, m.doc) for m in e.members])
        for t in sorted(reg.types.values(), key=lambda d: d.name):
            if t.category == cat:
                out += _entry(
                    f"type `{t.name}`", t.doc, [(f"{f.name}: {f.type}", f.doc) for f in t.fields]
                )
    return "\n".join(line.rstrip() for line in out).rstrip() + "\n"
