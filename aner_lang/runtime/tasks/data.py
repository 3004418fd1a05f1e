"""Datasets of token ids with a per-token scoring mask, and the batches evaluation and training
draw from them.

An example is a sequence of at most `context` token ids; `scored[t]` says whether token t is a
target the loss predicts (from position t-1). Prompt tokens are unscored, so a prompt/completion
example trains only on the completion. The loss is mean next-token cross-entropy over scored
targets: a model's `loss(input_ids, targets)` returns the sum and `Batch.scored_tokens` the
count, so a caller can normalise over a whole accumulation window.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from dataclasses import field as dc_field
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from aner_lang import files
from aner_lang.errors import AnerRuntimeError
from aner_lang.runtime.model.loss import IGNORE
from aner_lang.runtime.model.tokenizer import Tokenizer

if TYPE_CHECKING:
    from aner_lang.interp.context import ExecContext


@dataclass(frozen=True)
class Example:
    """One training/evaluation sequence."""

    ids: tuple[int, ...]
    scored: tuple[bool, ...]

    @property
    def scored_tokens(self) -> int:
        """Scored targets: position 0 has no predecessor, so it never counts."""
        return sum(self.scored[1:])


@dataclass(frozen=True)
class Record:
    """One dataset entry as text: an unscored `prompt` (may be empty) and a scored `completion`."""

    prompt: str
    completion: str


@dataclass(frozen=True, eq=False)
class Dataset:
    """Text records and a context length; tokenized per tokenizer on first use.

    `texts([...], context: 32)` needs no model, so a Dataset keeps its records as text and
    `examples(tokenizer)` yields the token-id `Example`s (length <= context) a model trains on.
    """

    records: tuple[Record, ...]
    context: int
    source: str = "texts"
    _cache: dict[int, tuple[Tokenizer, tuple[Example, ...]]] = dc_field(
        default_factory=dict, repr=False
    )

    def __len__(self) -> int:
        return len(self.records)

    def examples(self, tokenizer: Tokenizer) -> tuple[Example, ...]:
        cached = self._cache.get(id(tokenizer))
        if cached is None or cached[0] is not tokenizer:
            examples = tuple(
                _example(tokenizer, r.prompt, r.completion, self.context) for r in self.records
            )
            cached = self._cache[id(tokenizer)] = (tokenizer, examples)
        return cached[1]

    def scored_tokens(self, tokenizer: Tokenizer) -> int:
        return sum(e.scored_tokens for e in self.examples(tokenizer))

    def __repr__(self) -> str:
        return f"Dataset({len(self)} examples from {self.source}, context {self.context})"


@dataclass(frozen=True)
class Batch:
    """Right-padded `input_ids [B, T]` and next-token `targets [B, T]` (IGNORE where unscored)."""

    input_ids: torch.Tensor
    targets: torch.Tensor

    @property
    def scored_tokens(self) -> int:
        return int((self.targets != IGNORE).sum())


def collate(examples: Sequence[Example], pad_id: int, device: torch.device | str = "cpu") -> Batch:
    """Pad examples on the right into one batch; causal attention keeps pads out of the loss."""
    width = max(len(e.ids) for e in examples)
    ids = torch.full((len(examples), width), pad_id, dtype=torch.long)
    targets = torch.full((len(examples), width), IGNORE, dtype=torch.long)
    for row, e in enumerate(examples):
        n = len(e.ids)
        ids[row, :n] = torch.tensor(e.ids, dtype=torch.long)
        tgt = torch.tensor(e.ids[1:], dtype=torch.long)
        keep = torch.tensor(e.scored[1:], dtype=torch.bool)
        targets[row, : n - 1] = torch.where(keep, tgt, torch.full_like(tgt, IGNORE))
    return Batch(ids.to(device), targets.to(device))


def _check_context(context: int) -> None:
    if context < 2:
        raise AnerRuntimeError(
            f"context must be at least 2 tokens, got {context}", code="E-DATA-CONTEXT"
        )


def _example(tokenizer: Tokenizer, prompt: str, completion: str, context: int) -> Example:
    """Tokenize prompt + completion, prompt unscored, truncated to `context` tokens.

    The completion is tokenized on its own so the prompt/completion boundary is exact; an EOS
    closes every example so the model learns where a completion ends.
    """
    prompt_ids = (
        tokenizer.encode(prompt, add_special=True)
        if prompt
        else ([tokenizer.bos_id] if tokenizer.add_bos and tokenizer.bos_id is not None else [])
    )
    completion_ids = tokenizer.encode(completion, add_special=False)
    if tokenizer.eos_id is not None:
        completion_ids.append(tokenizer.eos_id)
    ids = (prompt_ids + completion_ids)[:context]
    scored = ([False] * len(prompt_ids) + [True] * len(completion_ids))[:context]
    return Example(tuple(ids), tuple(scored))


def from_texts(items: Sequence[str], context: int) -> Dataset:
    """Every token of every text is scored (the first has nothing before it)."""
    _check_context(context)
    if not items:
        raise AnerRuntimeError("texts() needs at least one text", code="E-DATA-EMPTY")
    return Dataset(tuple(Record("", t) for t in items), context)


def _jsonl_rows(path: Path) -> list[tuple[int, dict]]:
    """(line number, object) of every non-blank line, read through `aner_lang.files.lines`: one
    bounded line at a time, split at `\n` only (a U+2028 inside a string stays in its line),
    invalid UTF-8 reported at its line."""
    rows = []
    try:
        for n, line in files.lines(path):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except (json.JSONDecodeError, RecursionError) as exc:
                reason = exc.msg if isinstance(exc, json.JSONDecodeError) else "nested too deeply"
                raise AnerRuntimeError(
                    f"{path}:{n}: not valid JSON ({reason})", code="E-DATA-JSON"
                ) from None
            if not isinstance(row, dict):
                raise AnerRuntimeError(
                    f"{path}:{n}: each line must be a JSON object", code="E-DATA-JSON"
                )
            rows.append((n, row))
    except AnerRuntimeError as exc:
        if exc.code == "E-FILE-MISSING":
            raise AnerRuntimeError(f"{path}: no such JSONL file", code="E-DATA-FILE") from None
        raise
    if not rows:
        raise AnerRuntimeError(f"{path}: the file has no examples", code="E-DATA-EMPTY")
    return rows


def _text_field(path: Path, n: int, row: dict, name: str) -> str:
    value = row.get(name)
    if not isinstance(value, str):
        found = ", ".join(sorted(row)) or "none"
        raise AnerRuntimeError(
            f"{path}:{n}: the example has no string field {name!r} (fields: {found})",
            code="E-DATA-FIELD",
        )
    return value


def from_jsonl(
    path: Path,
    context: int,
    field: str | None = "text",
    prompt_field: str | None = None,
    completion_field: str | None = None,
) -> Dataset:
    """Read `field` texts, or `prompt_field`/`completion_field` pairs (prompt unscored)."""
    _check_context(context)
    rows = _jsonl_rows(path)
    if (prompt_field is None) != (completion_field is None):
        raise AnerRuntimeError(
            "load_jsonl: give both prompt_field and completion_field, or neither",
            code="E-DATA-FIELD",
        )
    records = []
    for n, row in rows:
        if prompt_field is not None and completion_field is not None:
            records.append(
                Record(
                    _text_field(path, n, row, prompt_field),
                    _text_field(path, n, row, completion_field),
                )
            )
        else:
            records.append(Record("", _text_field(path, n, row, field or "text")))
    return Dataset(tuple(records), context, source=str(path))


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
