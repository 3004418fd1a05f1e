"""Datasets of token ids with a per-token scoring mask, and the batches evaluation and training
draw from them.

An example is a sequence of at most `context` token ids; `scored[t]` says whether token t is a
target the loss predicts (from position t-1). By default (`loss_on: responses`) only what the model
should learn to produce is scored: a completion, an instruction's output, the assistant's turns of
a conversation, every token of a plain text; `loss_on: all` scores every token. The loss is mean
next-token cross-entropy over scored targets: a model's `loss(input_ids, targets)` returns the sum
and `Batch.scored_tokens` the count, so a caller can normalise over a whole accumulation window.

A `Dataset` keeps records (text, conversations, or token rows) and tokenizes them per tokenizer
on first use (`texts(...)` needs no model). Rules of tokenization:

* An example longer than `context` is truncated to its first `context` tokens (`too_long:
  truncate`) or left out (`too_long: drop`); one left with no scored target is left out too.
  Either is counted and reported once, as a warning on stderr (never silent).
* A packed dataset (`pack`) puts several examples into one row of at most `context` tokens
  (best-fit decreasing, deterministic). `Example.segments` gives their lengths; the first token of
  each is never a target, and `collate` gives the row position ids that restart at 0 at each
  example, from which the model keeps attention inside each example. A packed row's loss is the
  sum of its examples' losses, each as if alone.
"""

from __future__ import annotations

import bisect
import sys
from collections.abc import Sequence
from dataclasses import dataclass, replace
from dataclasses import field as dc_field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from aner_lang.datafiles.preference_records import FeedbackRecord, PairRecord
from aner_lang.datafiles.records import (
    ChatRecord,
    Format,
    Record,
    RowFormat,
    TextRecord,
    jsonl_format,
    records,
)
from aner_lang.problems.errors import AnerRuntimeError
from aner_lang.runtime.tasks.chat import chat_tokens

if TYPE_CHECKING:
    from aner_lang.interp.context import ExecContext
    from aner_lang.runtime.model.tokenizer import Tokenizer


TOO_LONG = "W-DATA-TOO-LONG"


@dataclass(frozen=True)
class Example:
    """One training/evaluation row: one example, or several packed (`segments`: their lengths)."""

    ids: tuple[int, ...]
    scored: tuple[bool, ...]
    segments: tuple[int, ...] | None = None
    rejected: Example | None = None
    """A preference pair: this example is the chosen response, `rejected` the other one."""
    desirable: bool | None = None
    """Unpaired feedback: whether this completion is desirable."""

    @property
    def scored_tokens(self) -> int:
        """Scored targets: position 0 has no predecessor, so it never counts."""
        return sum(self.scored[1:])

    @property
    def prompt_length(self) -> int:
        """Tokens before the first scored target: the prompt of a preference example."""
        return next((i for i in range(1, len(self.ids)) if self.scored[i]), len(self.ids))


@dataclass(frozen=True)
class TokenRecord:
    """An example given as token ids and scoring flags, used as it is (truncation aside)."""

    ids: tuple[int, ...]
    scored: tuple[bool, ...]
    where: str = ""


AnyRecord = Record | TokenRecord | PairRecord | FeedbackRecord


@dataclass(frozen=True)
class Tokenized:
    """A dataset's examples for one tokenizer, and what tokenizing did to over-long ones."""

    examples: tuple[Example, ...]
    records: int
    truncated: int
    dropped: int


@dataclass(frozen=True, eq=False)
class Dataset:
    """Records and the rules to tokenize them (see the module docstring)."""

    records: tuple[AnyRecord, ...]
    context: int
    source: str = "texts"
    loss_on: str = "responses"
    too_long: str = "truncate"
    packed: bool = False
    _cache: dict[int, tuple[Tokenizer, Tokenized]] = dc_field(default_factory=dict, repr=False)

    def __len__(self) -> int:
        return len(self.records)

    @property
    def kind(self) -> str:
        """``pairs`` (chosen/rejected), ``feedback`` (labeled completions) or ``text``."""
        first = self.records[0] if self.records else None
        return (
            "pairs"
            if isinstance(first, PairRecord)
            else "feedback"
            if isinstance(first, FeedbackRecord)
            else "text"
        )

    @classmethod
    def of_tokens(cls, rows: Sequence[Sequence[int]], context: int, source: str) -> Dataset:
        """A dataset of token rows, every target scored (benchmarks, tests)."""
        return cls(tuple(TokenRecord(tuple(r), (True,) * len(r)) for r in rows), context, source)

    def derive(self, **changes: Any) -> Dataset:
        """This dataset with some fields changed (records, packing, ...), tokenized afresh."""
        return replace(self, _cache={}, **changes)

    def tokenized(self, tokenizer: Tokenizer) -> Tokenized:
        """The examples for `tokenizer` (once per tokenizer; the first time, a warning on stderr
        when examples were truncated or dropped)."""
        cached = self._cache.get(id(tokenizer))
        if cached is None or cached[0] is not tokenizer:
            result = _tokenize(self, tokenizer)
            cached = self._cache[id(tokenizer)] = (tokenizer, result)
            if result.truncated or result.dropped:
                message = _too_long_message(self, result)
                print(f"warning[{TOO_LONG}]: {message}", file=sys.stderr)
        return cached[1]

    def examples(self, tokenizer: Tokenizer) -> tuple[Example, ...]:
        return self.tokenized(tokenizer).examples

    def scored_tokens(self, tokenizer: Tokenizer) -> int:
        return sum(e.scored_tokens for e in self.examples(tokenizer))

    def scores_any(self, tokenizer: Tokenizer) -> bool:
        """Whether some example leaves a token to score, tokenizing records only until one does
        (and printing nothing). Selecting, shuffling and packing examples never adds a scored
        token, so a dataset derived from one where this is False has none either."""
        for record in self.records:
            fitted = _fitted(self, tokenizer, record)
            if fitted is not None and any(e.scored_tokens for e, _ in fitted):
                return True
        return False

    def __repr__(self) -> str:
        packed = ", packed" if self.packed else ""
        return f"Dataset({len(self)} examples from {self.source}, context {self.context}{packed})"


def _too_long_message(data: Dataset, t: Tokenized) -> str:
    why = "too_long: drop" if data.too_long == "drop" else "nothing scored was left in them"
    parts = [f"{t.truncated} truncated"] if t.truncated else []
    parts += [f"{t.dropped} dropped ({why})"] if t.dropped else []
    return (
        f"{data.source}: {t.truncated + t.dropped} of {t.records} examples did not fit the "
        f"context of {data.context} tokens: {', '.join(parts)}"
    )


def _tokenize(data: Dataset, tokenizer: Tokenizer) -> Tokenized:
    examples: list[Example] = []
    truncated = dropped = 0
    for record in data.records:
        fitted = _fitted(data, tokenizer, record)
        if fitted is None:
            dropped += 1
            continue
        truncated += any(cut for _, cut in fitted)
        examples.append(_whole(record, [e for e, _ in fitted]))
    if data.packed:
        examples = pack_examples(examples, data.context)
    return Tokenized(tuple(examples), len(data.records), truncated, dropped)


def _fitted(
    data: Dataset, tokenizer: Tokenizer, record: AnyRecord
) -> list[tuple[Example, bool]] | None:
    """Each token row of `record` within `data`'s context and whether it was cut; None when the
    record is dropped (`_fit`)."""
    fitted = [_fit(data, *_record_tokens(tokenizer, r, data)) for r in _parts(record)]
    return None if any(f is None for f in fitted) else fitted  # type: ignore[return-value]


def _parts(record: AnyRecord) -> tuple[Record | TokenRecord, ...]:
    """What of a record becomes token rows: both responses of a pair, else the record itself."""
    if isinstance(record, PairRecord):
        return (record.chosen, record.rejected)
    if isinstance(record, FeedbackRecord):
        return (record.example,)
    return (record,)


def _fit(data: Dataset, ids: list[int], scored: list[bool]) -> tuple[Example, bool] | None:
    """The example within the context and whether it was truncated; None when it is dropped
    (`too_long: drop`, or nothing scored is left)."""
    if len(ids) <= data.context:
        return Example(tuple(ids), tuple(scored)), False
    ids, scored = ids[: data.context], scored[: data.context]
    if data.too_long == "drop" or not any(scored[1:]):
        return None
    return Example(tuple(ids), tuple(scored)), True


def _whole(record: AnyRecord, parts: list[Example]) -> Example:
    """One example of a record: a pair's chosen response carries its rejected one."""
    if isinstance(record, PairRecord):
        return replace(parts[0], rejected=parts[1])
    if isinstance(record, FeedbackRecord):
        return replace(parts[0], desirable=record.desirable)
    return parts[0]


def _record_tokens(
    tokenizer: Tokenizer, record: Record | TokenRecord, data: Dataset
) -> tuple[list[int], list[bool]]:
    """A record's tokens, enough of them for `data`'s context: a text longer than the context is
    tokenized only as far as the example keeps it (`Tokenizer.encode`'s `limit`)."""
    if isinstance(record, TokenRecord):
        return list(record.ids), list(record.scored)
    if isinstance(record, ChatRecord):
        return chat_tokens(
            tokenizer,
            record.messages,
            data.loss_on,
            record.where,
            record.scored_from,
            limit=data.context,
        )
    return _text_tokens(tokenizer, record, data.loss_on, data.context)


def _text_tokens(
    tokenizer: Tokenizer, record: TextRecord, loss_on: str, limit: int
) -> tuple[list[int], list[bool]]:
    """Prompt (unscored unless `loss_on` is all) then completion and EOS, each part at most
    `limit` + 1 tokens (enough to know the example is cut at a context of `limit`).

    The completion is tokenized on its own so the prompt/completion boundary is exact; an EOS
    closes every example so the model learns where a completion ends."""
    prompt_ids = (
        tokenizer.encode(record.prompt, add_special=True, limit=limit)
        if record.prompt
        else ([tokenizer.bos_id] if tokenizer.add_bos and tokenizer.bos_id is not None else [])
    )
    completion_ids = tokenizer.encode(record.completion, add_special=False, limit=limit)
    if tokenizer.eos_id is not None:
        completion_ids.append(tokenizer.eos_id)
    prompt_scored = loss_on == "all"
    return prompt_ids + completion_ids, (
        [prompt_scored] * len(prompt_ids) + [True] * len(completion_ids)
    )


def pack_examples(examples: Sequence[Example], context: int) -> list[Example]:
    """Best-fit decreasing: longest first, each into the fullest row it fits, rows in the order
    they were opened. The first token of every packed example is unscored (it has no target in
    its own example), so no target crosses an example boundary."""
    order = sorted(range(len(examples)), key=lambda i: -len(examples[i].ids))
    rows: list[list[int]] = []
    free: list[tuple[int, int]] = []  # (free tokens, row), sorted
    for i in order:
        n = len(examples[i].ids)
        at = bisect.bisect_left(free, (n, -1))
        if at < len(free):
            room, row = free.pop(at)
        else:
            room, row = context, len(rows)
            rows.append([])
        rows[row].append(i)
        bisect.insort(free, (room - n, row))
    packed = []
    for members in rows:
        ids: list[int] = []
        scored: list[bool] = []
        for i in members:
            e = examples[i]
            ids += e.ids
            scored += (False,) + e.scored[1:]
        packed.append(
            Example(tuple(ids), tuple(scored), tuple(len(examples[i].ids) for i in members))
        )
    return packed


def no_scored_tokens(what: str) -> AnerRuntimeError:
    """`train`'s error for its `what` ("training" or "validation") set without a scored token."""
    return AnerRuntimeError(
        f"train: the {what} set has no scored tokens",
        code="E-TRAIN-DATA",
        notes=(
            "a scored token is a response (or text) token within the context: raise the "
            "context, or shorten the prompts that fill it",
        ),
    )


def _check_context(context: int) -> None:
    if context < 2:
        raise AnerRuntimeError(
            f"context must be at least 2 tokens, got {context}", code="E-DATA-CONTEXT"
        )


def from_texts(items: Sequence[str], context: int) -> Dataset:
    """Every token of every text is scored (the first has nothing before it)."""
    _check_context(context)
    if not items:
        raise AnerRuntimeError("texts() needs at least one text", code="E-DATA-EMPTY")
    return Dataset(tuple(TextRecord("", t) for t in items), context)


def from_file(
    path: Path,
    context: int,
    fmt: RowFormat[AnyRecord],
    loss_on: str = "responses",
    too_long: str = "truncate",
) -> Dataset:
    """The records of a data file (`aner_lang.datafiles.records`) as a dataset."""
    _check_context(context)
    return Dataset(tuple(records(path, fmt)), context, str(path), loss_on, too_long)


def from_jsonl(
    path: Path,
    context: int,
    field: str = "text",
    prompt_field: str | None = None,
    completion_field: str | None = None,
) -> Dataset:
    """Read `field` texts, or `prompt_field`/`completion_field` pairs (prompt unscored)."""
    return from_file(path, context, jsonl_format(field, prompt_field, completion_field))


def texts_builtin(items: list[str], context: int) -> Dataset:
    """Builtin `texts(items, context:)`."""
    return from_texts(items, context)


def load_jsonl_builtin(
    ctx: ExecContext,
    path: str,
    field: str,
    prompt_field: str | None,
    completion_field: str | None,
    context: int,
) -> Dataset:
    """Builtin `load_jsonl(path, field:, prompt_field:, completion_field:, context:)`."""
    return from_jsonl(ctx.resolve_path(path), context, field, prompt_field, completion_field)


def load_data_builtin(
    ctx: ExecContext,
    path: str,
    format: str,
    field: str | None,
    prompt_field: str | None,
    completion_field: str | None,
    template: str | None,
    context: int,
    loss_on: str,
    too_long: str,
) -> Dataset:
    """Builtin `load_data(path, format:, ...)`."""
    fmt = Format(format, field, prompt_field, completion_field, template)
    return from_file(ctx.resolve_path(path), context, fmt, loss_on, too_long)
