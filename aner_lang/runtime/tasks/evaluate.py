"""Held-out loss of anything that produces logits (a `LoadedModel` or an adapter).

Written against the forward protocol of docs/internals.md only (`forward`, `tokenizer`, `device`),
so evaluating an adapter needs no adapter-specific code.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch

from aner_lang.errors import AnerRuntimeError
from aner_lang.runtime.tasks.data import collate, token_loss_sum
from aner_lang.runtime.tasks.records import Dataset


@dataclass(frozen=True)
class Evaluation:
    """Mean next-token cross-entropy over scored tokens, its exp, and the count it averages."""

    loss: float
    perplexity: float
    scored_tokens: int


def evaluate(model: Any, dataset: Dataset, batch_size: int = 8) -> Evaluation:
    """Loss over every scored target token of `dataset`, in batches of `batch_size` examples."""
    tokenizer = model.tokenizer
    examples = dataset.examples(tokenizer)
    pad = tokenizer.pad_id if tokenizer.pad_id is not None else 0
    total = torch.zeros((), dtype=torch.float64)
    count = 0
    with torch.no_grad():
        for start in range(0, len(examples), batch_size):
            batch = collate(examples[start : start + batch_size], pad, model.device)
            total += token_loss_sum(model.forward(batch.input_ids), batch).double().cpu()
            count += batch.scored_tokens
    if count == 0:
        raise AnerRuntimeError(
            "evaluate: the dataset has no scored tokens (every example is "
            "a prompt only, or one token long)",
            code="E-DATA-EMPTY",
        )
    loss = float(total) / count
    return Evaluation(loss=loss, perplexity=math.exp(min(loss, 700.0)), scored_tokens=count)
