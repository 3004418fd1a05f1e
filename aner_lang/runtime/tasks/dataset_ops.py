"""Dataset operations of the language: `shuffle`, `take`, `split`, `pack`, and `inspect`, the view
of what a model will actually be trained on.

Operations work on records and return new datasets (a dataset is never changed in place), so they
compose in any order; tokenization happens when a model first uses a dataset. `pack` marks a
dataset to be packed when tokenized (`data.pack_examples`). Orders come from seeded torch
permutations, the same on every machine.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from aner_lang.interp.values import record_text
from aner_lang.problems.errors import AnerRuntimeError
from aner_lang.runtime.tasks.data import Dataset, Example

SCORED_OPEN, SCORED_CLOSE = "⟦", "⟧"
"""How `inspect` marks the text the loss is computed on."""


def _permutation(n: int, seed: int) -> list[int]:
    return torch.randperm(n, generator=torch.Generator().manual_seed(seed)).tolist()


def shuffle(data: Dataset, seed: int) -> Dataset:
    """The records in a seeded random order."""
    return data.derive(records=tuple(data.records[i] for i in _permutation(len(data), seed)))


def take(data: Dataset, n: int) -> Dataset:
    """The first `n` records (all of them when there are fewer)."""
    return data.derive(records=data.records[:n])


@dataclass(frozen=True)
class Split:
    """The Aner `Split`: two disjoint parts of a dataset."""

    train: Dataset
    held_out: Dataset

    def __str__(self) -> str:
        return record_text(self)


def split(data: Dataset, fraction: float, seed: int) -> Split:
    """A seeded random `fraction` of the records (at least one) held out, the rest for training;
    each part keeps the records' order."""
    n = len(data)
    if n < 2:
        raise AnerRuntimeError(
            f"split: {data.source} has {n} example(s); splitting needs at least 2",
            code="E-DATA-EMPTY",
        )
    k = min(n - 1, max(1, round(n * fraction)))
    held = set(_permutation(n, seed)[:k])
    return Split(
        data.derive(records=tuple(r for i, r in enumerate(data.records) if i not in held)),
        data.derive(records=tuple(r for i, r in enumerate(data.records) if i in held)),
    )


def pack(data: Dataset) -> Dataset:
    """The dataset with its examples packed into rows of `context` tokens when tokenized."""
    return data.derive(packed=True)


def inspect(data: Dataset, model: Any, n: int) -> str:
    """The first `n` rows as the model will see them: text with the scored part between ⟦ ⟧,
    each packed example on its own, and the token ids with unscored ones in parentheses."""
    tokenizer = model.tokenizer
    t = data.tokenized(tokenizer)
    packed = f", packed into {len(t.examples)} rows" if data.packed else ""
    lines = [
        f"{data.source}: {t.records} records{packed}; context {data.context}; "
        f"{t.truncated} truncated, {t.dropped} dropped; loss on {data.loss_on}"
    ]
    for index, example in enumerate(t.examples[:n], start=1):
        if example.rejected is not None:
            lines += _pair_lines(tokenizer, example, example.rejected, index, len(t.examples))
            continue
        label = (
            "" if example.desirable is None else [", undesirable", ", desirable"][example.desirable]
        )
        lines.append(
            f"--- row {index} of {len(t.examples)}: {len(example.ids)} tokens, "
            f"{example.scored_tokens} scored{label} ---"
        )
        start = 0
        for k, length in enumerate(example.segments or (len(example.ids),), start=1):
            if example.segments is not None:
                lines.append(f"[example {k} of {len(example.segments)}: {length} tokens]")
            part = Example(
                example.ids[start : start + length], example.scored[start : start + length]
            )
            lines.append(_marked_text(tokenizer, part))
            lines.append("tokens: " + _marked_ids(part))
            start += length
    return "\n".join(lines)


def _pair_lines(
    tokenizer: Any, chosen: Example, rejected: Example, index: int, count: int
) -> list[str]:
    """A preference pair: each response with its prompt, the compared part between ⟦ ⟧."""
    lines = [f"--- pair {index} of {count} ---"]
    for name, e in (("chosen", chosen), ("rejected", rejected)):
        lines.append(f"[{name}: {len(e.ids)} tokens, {e.scored_tokens} scored]")
        lines += [_marked_text(tokenizer, e), "tokens: " + _marked_ids(e)]
    return lines


def _runs(example: Example) -> list[tuple[bool, list[int]]]:
    """Maximal runs of tokens that are (or are not) targets. Token 0 is never a target."""
    runs: list[tuple[bool, list[int]]] = []
    for i, token in enumerate(example.ids):
        target = i > 0 and example.scored[i]
        if runs and runs[-1][0] == target:
            runs[-1][1].append(token)
        else:
            runs.append((target, [token]))
    return runs


def _marked_text(tokenizer: Any, example: Example) -> str:
    return "".join(
        f"{SCORED_OPEN}{tokenizer.decode(ids)}{SCORED_CLOSE}" if target else tokenizer.decode(ids)
        for target, ids in _runs(example)
    )


def _marked_ids(example: Example) -> str:
    return " ".join(
        " ".join(str(i) if target else f"({i})" for i in ids) for target, ids in _runs(example)
    )
