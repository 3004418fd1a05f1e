"""Held-out loss of anything that produces logits (a `LoadedModel` or an adapter).

Written against the forward protocol of docs/internals.md only (`forward`, `tokenizer`, `device`),
so evaluating an adapter needs no adapter-specific code.
"""

from __future__ import annotations

from typing import Any

import torch

from aner_lang.runtime.tasks.batches import collate, length_groups
from aner_lang.runtime.tasks.data import Dataset
from aner_lang.runtime.tasks.scores import Evaluation, evaluation


def evaluate(model: Any, dataset: Dataset, batch_size: int = 8, tokens: int = 0) -> Evaluation:
    """Loss over every scored target token of `dataset`, in batches of `batch_size` examples of
    similar length, or more while a batch's rows times its longest row stay within `tokens`
    (`length_groups`: little padding, and the same sums whatever the order of the examples).
    The sum stays on the model's device until the end: one wait for the device, not one a
    batch."""
    tokenizer = model.tokenizer
    examples = dataset.examples(tokenizer)
    pad = tokenizer.pad_id if tokenizer.pad_id is not None else 0
    total = torch.zeros((), dtype=torch.float64, device=model.device)
    count = 0
    with torch.no_grad():
        for group in length_groups(examples, batch_size, tokens):
            batch = collate(group, pad, model.device)
            total += model.loss(batch.input_ids, batch.targets, batch.positions).double()
            count += batch.scored_tokens
    return evaluation(float(total), count)
