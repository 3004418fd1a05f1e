"""A run's validation loss: rows grouped by length into forwards of a bounded size, the same mean
as one row at a time."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from aner_lang.runtime import adapters as A
from aner_lang.runtime.model.precision import autocast
from aner_lang.runtime.tasks import evaluate as evaluate_module
from aner_lang.runtime.tasks.batches import collate, length_groups
from aner_lang.runtime.tasks.data import Example, from_texts
from aner_lang.runtime.train import validation
from aner_lang.runtime.train.profile import Profile, profile


def _rows(lengths: list[int]) -> list[Example]:
    """Rows of these lengths, each of its own tokens (rows of one length differ)."""
    return [Example((i,) * n, (True,) * n) for i, n in enumerate(lengths)]


@given(
    st.lists(st.integers(1, 300), min_size=1, max_size=40),
    st.integers(1, 4),
    st.sampled_from([0, 64, 512, 2048]),
)
def test_groups_hold_every_row_once_by_length_within_the_token_bound(lengths, rows, tokens):
    groups = length_groups(_rows(lengths), rows, tokens)
    flat = [len(e.ids) for g in groups for e in g]
    assert flat == sorted(lengths)
    for g in groups[:-1]:
        assert len(g) >= rows
    for g in groups:
        # beyond the micro-batch a group grows only while rows x its longest row fit the bound
        assert len(g) <= rows or len(g) * max(len(e.ids) for e in g) <= tokens
    assert len(groups[-1]) >= 1
    # the groups come from the rows, not the order they come in
    again = length_groups(_rows(lengths)[::-1], rows, tokens)
    assert [[e.ids for e in g] for g in again] == [[e.ids for e in g] for g in groups]


def _one_row_at_a_time(adapter, data, precision: str) -> float:
    total, count = 0.0, 0
    with torch.no_grad():
        for e in data.examples(adapter.tokenizer):
            batch = collate([e], adapter.tokenizer.pad_id or 0, adapter.device)
            with autocast(precision, adapter.device):
                total += float(adapter.loss(batch.input_ids, batch.targets, batch.positions))
            count += batch.scored_tokens
    return total / count


TEXTS = [f"held-out line {i} " + "with more words " * (i % 5) for i in range(11)]


@pytest.mark.parametrize("activations", ["keep", "checkpoint"])
def test_the_grouped_loss_is_the_mean_of_one_row_at_a_time(tiny_model, activations, monkeypatch):
    """The same mean up to the order of float sums; `keep` groups rows beyond the micro-batch,
    `checkpoint` keeps to it."""
    adapter = A.lora(tiny_model, rank=2, alpha=4.0, targets=["q_proj", "v_proj"], seed=1)
    data = from_texts(TEXTS, context=96)
    seen: list[int] = []
    collated = evaluate_module.collate

    def counting(rows, *args, **kw):
        seen.append(len(rows))
        return collated(rows, *args, **kw)

    monkeypatch.setattr(evaluate_module, "collate", counting)
    prof = profile(activations=activations)
    got = validation.mean_loss(adapter, data, 2, 2 * 96, prof)
    assert got == pytest.approx(_one_row_at_a_time(adapter, data, prof.precision), rel=1e-6)
    assert sum(seen) == len(TEXTS)
    if activations == "keep":
        assert max(seen) > 2  # 4 x 192 tokens allow more than two of these short rows
    else:
        assert seen == [2] * 5 + [1]


def test_the_grouping_does_not_depend_on_the_rows_order(tiny_model):
    """A resumed run validates the same bits: the groups come from the rows, not their order."""
    adapter = A.lora(tiny_model, rank=2, alpha=4.0, targets=["q_proj"], seed=1)
    forward, backward = from_texts(TEXTS, context=96), from_texts(TEXTS[::-1], context=96)
    assert validation.mean_loss(adapter, forward, 1, 96, Profile()) == validation.mean_loss(
        adapter, backward, 1, 96, Profile()
    )
