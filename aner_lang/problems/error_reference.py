"""Render the error-code registry (`aner_lang.problems.error_codes`): one entry for `aner explain CODE`, the
list for `aner explain`, and `docs/errors.md` for `aner explain --markdown`.

An entry reads the same in a terminal and in the docs (Markdown, as `rustc --explain` prints it).
Its example is fenced so that `aner check-docs` proves it: ```` ```aner error ```` for an error the
checker reports, ```` ```aner ```` for a warning's example and for scripts that check cleanly and
fail only when run; a situation is prose.
"""

from __future__ import annotations

from aner_lang.problems.error_codes import ERROR_CODES, Area, ErrorCode, ExampleKind

_INTRO = {
    ExampleKind.CHECK: "`aner check` reports `{code}` for this script:",
    ExampleKind.RUN: "this script checks cleanly, and running it fails with `{code}`:",
    ExampleKind.SCRIPT: "this script checks cleanly, and fails with `{code}` run where its comments say:",
}


def _fence(entry: ErrorCode) -> str:
    return "aner error" if entry.kind is ExampleKind.CHECK and not entry.is_warning else "aner"


def _body(entry: ErrorCode) -> list[str]:
    """Explanation and example, as Markdown lines (no heading)."""
    if entry.kind is ExampleKind.SITUATION:
        example = [f"Example: {entry.example}"]
    else:
        intro = _INTRO[entry.kind].format(code=entry.code)
        example = [f"Example: {intro}", "", f"```{_fence(entry)}", entry.example, "```"]
    return [entry.explanation, "", *example]


def explain(entry: ErrorCode) -> str:
    """The text `aner explain CODE` prints."""
    return "\n".join([f"{entry.code}: {entry.title}", "", *_body(entry)]) + "\n"


def _by_area() -> dict[Area, list[ErrorCode]]:
    groups: dict[Area, list[ErrorCode]] = {}
    for entry in ERROR_CODES.values():
        groups.setdefault(entry.area, []).append(entry)
    return groups


def listing() -> str:
    """The text `aner explain` prints: every code with its title, by area."""
    width = max(map(len, ERROR_CODES))
    lines = []
    for area, entries in _by_area().items():
        lines += [area.value] + [f"  {e.code:<{width}}  {e.title}" for e in entries] + [""]
    return "\n".join(lines + ["`aner explain CODE` explains one of them.", ""])


def render_markdown() -> str:
    """`docs/errors.md`: an index, then every entry under its area."""
    out = [
        "# Aner error codes",
        "",
        "Generated from the registry in `aner_lang/problems/error_codes.py` by",
        "`aner explain --markdown -o docs/errors.md`; do not edit by hand. `aner explain CODE`",
        "prints one entry in a terminal. Codes starting with `W-` are warnings; all others are",
        "errors.",
        "",
    ]
    groups = _by_area()
    for area, entries in groups.items():
        out += [f"- {area.value}: " + ", ".join(f"[{e.code}](#{e.code.lower()})" for e in entries)]
    for area, entries in groups.items():
        out += ["", f"## {area.value}"]
        for e in entries:
            out += ["", f"### {e.code}", "", f"**{e.title}**", "", *_body(e)]
    return "\n".join(out) + "\n"
