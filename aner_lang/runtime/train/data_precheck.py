"""Training data that leaves no token to score, found before a run rather than after the model
has loaded.

`train` refuses data without a scored token (E-TRAIN-DATA). Whether a dataset has one depends on
the model's tokenizer, which `analyze` cannot read; but a script often says enough. This check
takes each `train` call that certainly runs (`check.reach`: the script's unconditional top-level
code) whose adapter's model is `load_model` of a path known before the run, and whose `data` (and
`validation`) comes, through `split` and its parts, `shuffle`, `take` and `pack`, from a source
dataset with every argument known (`texts`, `load_jsonl`, `load_data`). The source is built as the
run builds it and tokenized with the model's tokenizer alone (no weights), only until one example
leaves a scored token. Selecting, shuffling and packing examples never add a scored token, so a
source without one certainly fails the call. Anything not known is left to the call, and so is a
path the script may write before it (`check.environment.Write.may_come_before`); a model or data
file that cannot be read is the other checks' and the run's to report.

`aner run` runs this after `check_before_run`: it reads the model's header (a fraction of a
second; the tokenizer is kept for the run's `load_model` of the same file). `aner check` and the
editor do not: they never import the runtime.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

from aner_lang.check.analysis import Analysis, CallInfo
from aner_lang.check.environment import Write, program_writes, written_arguments
from aner_lang.check.reach import reach
from aner_lang.grammar import ast
from aner_lang.host.chat_template import syntax_error
from aner_lang.host.files import resolve
from aner_lang.interp.boundary import load_impl
from aner_lang.interp.context import ExecContext
from aner_lang.problems.diagnostics import Diagnostic
from aner_lang.problems.errors import AnerRuntimeError
from aner_lang.runtime.train.plan_trace import DEPTH, Frame, NotKnown, Tracer, argument

if TYPE_CHECKING:
    from aner_lang.runtime.model.tokenizer import Tokenizer
    from aner_lang.runtime.tasks.data import Dataset

SOURCES = ("texts", "load_jsonl", "load_data")
"""The builtins a dataset is read from, built here from their known arguments."""
SELECTIONS = ("split", "shuffle", "take", "pack")
"""The builtins that select, order or pack a dataset's examples (never adding a scored token)."""
CHECKED = {"data": "training", "validation": "validation"}
"""`train`'s dataset parameters and what its error calls each."""


def scoreless_data(analysis: Analysis) -> list[Diagnostic]:
    """An E-TRAIN-DATA error at each dataset argument of a certain `train` call that leaves no
    token to score under its model's tokenizer (see the module docstring)."""
    certain = reach(analysis.module).unconditional
    calls = [
        info
        for info in analysis.calls.values()
        if info.kind == "builtin" and info.name == "train" and id(info.call) in certain
    ]
    if not calls:
        return []
    tracer = Tracer(analysis)
    base = Path(analysis.path).resolve().parent if analysis.path else Path.cwd()
    writes = program_writes(analysis)
    found: list[Diagnostic] = []
    for info in calls:
        model = _model(tracer, info, base, writes)
        if model is None:
            continue
        path, tokenizer = model
        written = written_arguments(info)
        for name, expr in info.bound:
            what = CHECKED.get(name)
            if what is None or expr is None or id(expr) not in written:
                continue
            data = _source(tracer, expr, base, writes)
            if data is not None and not data.scores_any(tokenizer):
                found.append(_failure(expr, what, data, path).at(analysis.path))
    return found


def _failure(expr: ast.Expr, what: str, data: Dataset, model: str) -> Diagnostic:
    from aner_lang.runtime.tasks.data import no_scored_tokens

    e = no_scored_tokens(what)
    span = expr.span
    source = "texts(...)" if data.source == "texts" else data.source
    notes = (
        f"none of the {len(data)} examples of {source} leaves a token to score within its "
        f"context of {data.context} tokens under the tokenizer of {model}",
        *e.notes,
    )
    return Diagnostic(e.code, span, e.message, notes=notes)


def _model(
    tracer: Tracer, info: CallInfo, base: Path, writes: list[Write]
) -> tuple[str, Tokenizer] | None:
    """The model path the call's adapter is made from (as the script names it) and its
    tokenizer, when known: with the `chat_template` the script gives `load_model` (a template
    computed at run time leaves the tokenizer, and so the call, unknown)."""
    from aner_lang.runtime.load.model_header import model_location, model_tokenizer

    try:
        adapter, frame = tracer.builtin(argument(info, "adapter"), None)
        model, frame = tracer.builtin(argument(adapter, "model"), frame)
    except NotKnown:
        return None
    if model.name != "load_model":
        return None
    args, unknown = tracer.arguments(model, frame)
    path, template = args.get("path"), args.get("chat_template")
    if not isinstance(path, str) or "chat_template" in unknown:
        return None
    try:
        file = model_location(path, base)
        if _written_first(writes, tracer.analysis, file, model.call):
            return None
        tokenizer = model_tokenizer(file)
        if isinstance(template, str):
            if syntax_error(template) is not None:  # `load_model`'s own failure
                return None
            tokenizer = tokenizer.with_chat_template(template)
        return path, tokenizer
    except AnerRuntimeError:  # the model's own failure: `load_model` reports it where it runs
        return None


def _source(tracer: Tracer, expr: ast.Expr, base: Path, writes: list[Write]) -> Dataset | None:
    """The source dataset `expr` is selected from, built as the run builds it; None when any of
    it is not known before the run."""
    from aner_lang.runtime.tasks.data import Dataset

    for info, frame in _chain(tracer, expr):
        if info.name in SELECTIONS:
            continue
        if info.name not in SOURCES or info.builtin is None:
            return None
        args, unknown = tracer.arguments(info, frame)
        path = args.get("path")
        if unknown or (
            isinstance(path, str)
            and _written_first(writes, tracer.analysis, resolve(path, base), info.call)
        ):
            return None
        fn = load_impl(info.builtin)
        try:
            built = fn(ExecContext(base), **args) if info.builtin.needs_context else fn(**args)
        except AnerRuntimeError:
            return None  # the data file's own failure: the other checks and the call say it
        return built if isinstance(built, Dataset) and built.kind == "text" else None
    return None


def _written_first(writes: list[Write], analysis: Analysis, path: Path, call: ast.Call) -> bool:
    """Whether the script may write `path` before `call` (of `analysis`'s file) runs."""
    return any(w.may_come_before(path, analysis.path, call.span.start) for w in writes)


def _chain(tracer: Tracer, expr: ast.Expr | None) -> Iterator[tuple[CallInfo, Frame | None]]:
    """The builtin calls from `expr` back to its source: each call, then its first argument's."""
    frame: Frame | None = None
    for _ in range(DEPTH):
        try:
            info, frame = tracer.builtin(expr, frame)
        except NotKnown:
            return
        yield info, frame
        if not info.bound:
            return
        expr = info.bound[0][1]
