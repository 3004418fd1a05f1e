"""Packing (each example computed as if alone), over-long examples (counted and reported), the
dataset operations (seeded, deterministic) and `inspect`."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from aner_lang.datafiles.records import Format
from aner_lang.runtime.model.loss import IGNORE
from aner_lang.runtime.tasks.batches import collate
from aner_lang.runtime.tasks.data import Dataset, from_file, from_texts, pack_examples
from aner_lang.runtime.tasks.dataset_ops import inspect, pack, shuffle, split, take

EXAMPLE_CHATS = Path(__file__).parents[3] / "examples" / "data" / "chats.jsonl"
TEXTS = [
    "The quiet mountain lake reflects the clear morning sky.",
    "Aner makes model adaptation explicit and reproducible.",
    "Seven engineers share one worktree.",
    "A typed script is checked before it ever loads a model, so mistakes cost nothing.",
    "Short one.",
    "Packing puts several examples into one window.",
]


def test_pack_examples_fills_rows_and_keeps_every_example(tiny_model):
    tok = tiny_model.tokenizer
    plain = from_texts(TEXTS, context=40).examples(tok)
    rows = pack_examples(plain, 40)
    assert len(rows) < len(plain)
    assert all(len(r.ids) <= 40 and sum(r.segments) == len(r.ids) for r in rows)
    pieces = []
    for r in rows:
        start = 0
        for n in r.segments:
            pieces.append(r.ids[start : start + n])
            assert r.scored[start] is False  # no target crosses into an example
            start += n
    assert sorted(pieces) == sorted(e.ids for e in plain)
    assert sum(r.scored_tokens for r in rows) == sum(e.scored_tokens for e in plain)
    assert pack_examples(plain, 40) == rows  # deterministic


def _packed_losses_match_alone(model, data):
    """Each example's loss inside a packed batch (targets of the others ignored) equals its loss
    computed alone, and the batch's total is their sum, within fp32 tolerance."""
    tok = model.tokenizer
    plain = data.examples(tok)
    rows = pack(data).examples(tok)
    assert len(rows) < len(plain)
    batch = collate(rows, tok.pad_id or 0)
    assert batch.positions is not None
    with torch.no_grad():
        alone = {}
        for e in plain:
            b = collate([e], tok.pad_id or 0)
            alone[e.ids] = float(model.loss(b.input_ids, b.targets))
        for r, row in enumerate(rows):
            start = 0
            for n in row.segments:
                targets = torch.full_like(batch.targets, IGNORE)
                targets[r, start : start + n - 1] = batch.targets[r, start : start + n - 1]
                got = float(model.loss(batch.input_ids, targets, batch.positions))
                assert got == pytest.approx(alone[row.ids[start : start + n]], rel=1e-5)
                start += n
        total = float(model.loss(batch.input_ids, batch.targets, batch.positions))
    assert total == pytest.approx(sum(alone.values()), rel=1e-5)


def test_packed_rows_give_each_example_its_own_loss(tiny_model):
    _packed_losses_match_alone(tiny_model, from_texts(TEXTS, context=48))


@pytest.mark.slow
def test_packed_conversations_on_smollm2_keep_their_own_loss(real_model):
    chats = from_file(EXAMPLE_CHATS, 256, Format("chat"), "responses", "truncate")
    _packed_losses_match_alone(real_model, take(chats, 8))


def test_collate_positions_restart_per_example():
    from aner_lang.runtime.tasks.data import Example

    row = Example((5, 6, 7, 8, 9), (True, True, True, False, True), segments=(3, 2))
    batch = collate([row, Example((1, 2), (True, True), segments=(2,))], pad_id=0)
    assert batch.positions.tolist() == [[0, 1, 2, 0, 1], [0, 1, 0, 0, 0]]
    assert batch.targets.tolist()[0] == [6, 7, IGNORE, 9, IGNORE]


def _chats(path, n):
    rows = [{"prompt": "word " * (3 + 9 * (i % 2)), "completion": f" answer {i}"} for i in range(n)]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_too_long_examples_are_counted_and_reported(tmp_path, tiny_model, capsys):
    tok = tiny_model.tokenizer
    path = _chats(tmp_path / "qa.jsonl", 6)
    lengths = [len(e.ids) for e in from_file(path, 64, Format()).examples(tok)]
    short, long = min(lengths), max(lengths)
    capsys.readouterr()
    context = (short + long) // 2  # the long prompts fill it: nothing scored is left
    t = from_file(path, context, Format()).tokenized(tok)
    assert (t.records, t.truncated, t.dropped, len(t.examples)) == (6, 0, 3, 3)
    err = capsys.readouterr().err
    assert f"warning[W-DATA-TOO-LONG]: {path}: 3 of 6 examples did not fit" in err
    assert "3 dropped (nothing scored was left in them)" in err
    t = from_file(path, long - 1, Format(), loss_on="all").tokenized(tok)
    assert (t.truncated, t.dropped) == (3, 0) and max(len(e.ids) for e in t.examples) == long - 1
    t = from_file(path, long - 1, Format(), too_long="drop").tokenized(tok)
    assert (t.truncated, t.dropped, len(t.examples)) == (0, 3, 3)
    assert "3 dropped (too_long: drop)" in capsys.readouterr().err
    from_file(path, 64, Format()).tokenized(tok)
    assert "warning" not in capsys.readouterr().err  # nothing to report, nothing said


def test_operations_are_seeded_and_compose():
    data = from_texts([f"text {i}" for i in range(20)], context=16)
    order = [r.completion for r in shuffle(data, 3).records]
    assert order == [r.completion for r in shuffle(data, 3).records]
    assert order != [r.completion for r in shuffle(data, 4).records]
    assert sorted(order) == sorted(r.completion for r in data.records)
    parts = split(data, 0.25, 1)
    held = [r.completion for r in parts.held_out.records]
    kept = [r.completion for r in parts.train.records]
    assert len(held) == 5 and len(kept) == 15 and not set(held) & set(kept)
    assert kept == [r.completion for r in data.records if r.completion not in held]  # file order
    assert held == [r.completion for r in split(data, 0.25, 1).held_out.records]
    assert len(take(data, 3)) == 3 and len(take(data, 99)) == 20
    assert pack(take(shuffle(data, 1), 4)).packed and not data.packed
    assert len(split(from_texts(["a", "b"], 8), 0.01, 0).held_out) == 1


def test_inspect_marks_what_the_loss_is_on(tmp_path, tiny_model):
    path = tmp_path / "qa.jsonl"
    path.write_text(json.dumps({"prompt": "Capital of France?", "completion": " Paris"}) + "\n")
    view = inspect(from_file(path, 32, Format()), tiny_model, 1)
    assert "1 records; context 32; 0 truncated, 0 dropped; loss on responses" in view
    assert "Capital of France?⟦ Paris" in view
    tokens = next(line for line in view.splitlines() if line.startswith("tokens: "))
    prompt_ids = tiny_model.tokenizer.encode("Capital of France?")
    assert tokens.startswith("tokens: " + " ".join(f"({i})" for i in prompt_ids) + " ")
    packed = inspect(pack(from_texts(TEXTS[:3], 64)), tiny_model, 1)
    assert "[example 1 of" in packed and "[example 2 of" in packed


def test_token_rows_are_used_as_they_are(tiny_model):
    data = Dataset.of_tokens([[1, 2, 3], [4, 5]], context=8, source="rows")
    assert [e.ids for e in data.examples(tiny_model.tokenizer)] == [(1, 2, 3), (4, 5)]
