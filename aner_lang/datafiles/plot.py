"""Loss curves of a training run, drawn from its JSON-lines event log (`aner plot`, `plot()`).

The log is the one `train` writes (`docs/finetuning.md` lists its events): each ``update`` event
has the update number, its training ``loss`` and, when it validated, a ``validation_loss``. A
log may hold several `train` calls on the same adapter (a run resumed after Ctrl-C appends to
it); when an update number appears again (a run resumed from an older checkpoint redoes
updates), the later event wins, so the picture is the run the adapter actually had.

The picture is PNG or SVG by the output's suffix, drawn with matplotlib's object API (no pyplot
and its global state; imported only when drawing, so the front end never loads it). SVG output
carries no date and fixed element ids, so the same log gives the same file.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from aner_lang.datafiles.records import rows
from aner_lang.host import files
from aner_lang.problems.errors import AnerRuntimeError

FORMATS = (".png", ".svg")
"""Picture formats, by the output file's suffix."""


@dataclass
class Curves:
    """Loss by update number: training, and validation where the run validated."""

    train: dict[int, float] = field(default_factory=dict)
    validation: dict[int, float] = field(default_factory=dict)


def _number(value: object) -> float | None:
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else None


def read_curves(log: Path) -> Curves:
    """The loss curves in an event log; E-PLOT when it has no update to draw."""
    curves = Curves()
    for row in rows(log):
        if row.values.get("event") != "update" or not isinstance(row.values.get("update"), int):
            continue
        update = row.values["update"]
        loss = _number(row.values.get("loss"))
        if loss is not None:
            curves.train[update] = loss
        validation = _number(row.values.get("validation_loss"))
        if validation is not None:
            curves.validation[update] = validation
    if not curves.train:
        raise AnerRuntimeError(
            f"{log}: no update events to plot",
            code="E-PLOT",
            notes=("plot reads the JSON-lines log train() writes with `log:` or `checkpoints:`",),
        )
    return curves


def _figure(curves: Curves, title: str) -> Any:
    from matplotlib.figure import Figure

    fig = Figure(figsize=(8, 4.5), dpi=100, layout="constrained")
    ax = fig.add_subplot()
    steps = sorted(curves.train)
    ax.plot(steps, [curves.train[s] for s in steps], label="train", linewidth=1.2)
    if curves.validation:
        steps = sorted(curves.validation)
        ax.plot(
            steps, [curves.validation[s] for s in steps], "o-", label="validation", linewidth=1.5
        )
    ax.set_xlabel("update")
    ax.set_ylabel("loss")
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend()
    return fig


def plot(log: Path, out: Path, *, overwrite: bool = False) -> Curves:
    """Draw the loss curves of `log` into `out` (.png or .svg) and return them. An existing `out`
    is replaced only with `overwrite` (E-FILE-EXISTS otherwise); the file appears whole or not at
    all (`files.replacing`)."""
    if out.suffix.lower() not in FORMATS:
        raise AnerRuntimeError(
            f"{out}: a plot is written as {' or '.join(FORMATS)} (by the file's suffix)",
            code="E-PLOT",
        )
    curves = read_curves(log)
    try:
        import matplotlib
    except ImportError:
        raise AnerRuntimeError(
            "plot: drawing needs the matplotlib package",
            code="E-NATIVE-UNAVAILABLE",
            notes=("install it with: pip install 'aner[native]' (or pip install matplotlib)",),
        ) from None
    kind = out.suffix.lower()[1:]
    metadata = {"Date": None} if kind == "svg" else {}
    with (
        files.replacing(out, overwrite=overwrite) as tmp,
        matplotlib.rc_context({"svg.hashsalt": "aner"}),  # SVG element ids from a fixed salt
    ):
        figure = _figure(curves, f"{log.parent.name}/{log.name}")
        figure.savefig(tmp, format=kind, metadata=metadata)
    return curves


def plot_builtin(ctx: Any, log: str, to: str, overwrite: bool = False) -> str:
    """Builtin `plot(log, to, overwrite:)`: script-relative paths; returns the path written."""
    out = ctx.resolve_path(to)
    plot(ctx.resolve_path(log), out, overwrite=overwrite)
    return str(out)
