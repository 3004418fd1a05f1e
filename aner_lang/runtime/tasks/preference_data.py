"""The preference data builtins: `load_pairs` (chosen/rejected pairs for DPO and ORPO) and
`load_feedback` (labeled completions for KTO). The row shapes are `aner_lang.datafiles.preference_records`;
the datasets are ordinary `Dataset`s of pair or feedback records, so shuffle, take, split and
inspect work on them, and their examples carry the rejected response or the label
(`data.Example`)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from aner_lang.datafiles.preference_records import FeedbackFormat, PairFormat
from aner_lang.runtime.tasks.data import Dataset, from_file

if TYPE_CHECKING:
    from aner_lang.interp.context import ExecContext


def load_pairs_builtin(ctx: ExecContext, path: str, context: int, too_long: str) -> Dataset:
    """Builtin `load_pairs(path, context:, too_long:)`."""
    return from_file(ctx.resolve_path(path), context, PairFormat(), too_long=too_long)


def load_feedback_builtin(ctx: ExecContext, path: str, context: int, too_long: str) -> Dataset:
    """Builtin `load_feedback(path, context:, too_long:)`."""
    return from_file(ctx.resolve_path(path), context, FeedbackFormat(), too_long=too_long)
