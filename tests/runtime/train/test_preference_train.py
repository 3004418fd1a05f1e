"""Training with the preference objectives: resume across a checkpoint is bit-identical for each,
the event log and TensorBoard carry their metrics, validation reports held-out accuracy, and the
data rules (which data an objective takes, KTO's micro-batch) are enforced."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from aner_lang.datafiles.preference_records import FeedbackFormat, PairFormat
from aner_lang.datafiles.records import Row
from aner_lang.problems.errors import AnerRuntimeError
from aner_lang.runtime import adapters
from aner_lang.runtime.tasks.data import Dataset, from_texts
from aner_lang.runtime.tasks.dataset_ops import inspect
from aner_lang.runtime.train import checkpoint
from aner_lang.runtime.train import objectives as obj
from aner_lang.runtime.train.profile import profile
from aner_lang.runtime.train.trainer import train

PAIRS = [
    ("Q: 2 + 2?", " 4", " 5"),
    ("Q: the sky?", " blue", " green"),
    ("Q: a cat says?", " meow", " moo"),
    ("Q: ice is?", " cold", " hot"),
    ("Q: 10 / 2?", " 5", " 3"),
    ("Q: fire is?", " hot", " wet"),
]
OBJECTIVES = {
    "dpo-sigmoid-smoothed": obj.DPO(0.2, "sigmoid", 0.1),
    "dpo-ipo": obj.DPO(0.5, "ipo"),
    "dpo-hinge": obj.DPO(0.2, "hinge"),
    "orpo": obj.ORPO(0.2),
    "kto": obj.KTO(0.2, 1.2, 0.9),
}


def _pairs(rows=PAIRS) -> Dataset:
    fmt = PairFormat()
    records = tuple(
        fmt.record(Row(f"pairs:{i}", {"prompt": p, "chosen": c, "rejected": r}))
        for i, (p, c, r) in enumerate(rows, start=1)
    )
    return Dataset(records, 32, "pairs")


def _run(model, objective, out: Path, adapter=None, **options):
    adapter = adapter or adapters.lora(model, rank=2, alpha=4.0, dropout=0.1, seed=3)
    return train(
        adapter,
        _pairs(),
        profile(),
        steps=2,
        learning_rate=5e-2,
        micro_batch=2,
        accumulation=2,
        seed=4,
        warmup=1,
        schedule="cosine",
        validation=_pairs(PAIRS[:2]),
        checkpoints=str(out),
        checkpoint_every=1,
        objective=objective,
        **options,
    )


@pytest.mark.parametrize("name", sorted(OBJECTIVES))
def test_resume_across_a_checkpoint_is_bit_identical(tiny_model, tmp_path, name):
    objective = OBJECTIVES[name]
    _run(tiny_model, objective, tmp_path / "whole")
    first = next((tmp_path / "whole").glob("update-000001-*"))
    _run(tiny_model, objective, tmp_path / "resumed", checkpoint.resume(first, model=tiny_model))
    whole, resumed = checkpoint.load(tmp_path / "whole"), checkpoint.load(tmp_path / "resumed")
    assert whole.updates == resumed.updates == 2
    assert whole.meta == resumed.meta
    assert whole.meta["options"]["objective"]["name"] == objective.name
    assert set(whole.tensors) == set(resumed.tensors)
    for key, t in whole.tensors.items():
        assert torch.equal(resumed.tensors[key], t), key
    moved = [k for k in whole.tensors if k.endswith("lora_B")]
    assert moved and all(whole.tensors[k].abs().max() > 0 for k in moved)


def test_events_and_tensorboard_carry_the_preference_metrics(tiny_model, tmp_path):
    pytest.importorskip("tensorboard")
    run = _run(
        tiny_model,
        OBJECTIVES["dpo-sigmoid-smoothed"],
        tmp_path / "ck",
        log_dir=str(tmp_path / "tb"),
    )
    events = [
        json.loads(line) for line in (tmp_path / "ck" / "events.jsonl").read_text().splitlines()
    ]
    updates = [e for e in events if e["event"] == "update"]
    assert len(updates) == 2
    for key in (
        "rewards_chosen",
        "rewards_rejected",
        "margin",
        "accuracy",
        "logps_chosen",
        "logps_rejected",
    ):
        assert all(isinstance(e[key], float) for e in updates), key
    assert [e["pairs"] for e in updates] == [4, 2]  # 2 x 2 pairs, then the rest of the 6
    validated = [e for e in updates if "validation_loss" in e]
    assert [e["update"] for e in validated] == [1, 2]
    assert all(0.0 <= e["validation_accuracy"] <= 1.0 for e in validated)
    assert run.validation_accuracy == validated[-1]["validation_accuracy"]
    assert run.first_validation_accuracy == validated[0]["validation_accuracy"]
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    board = EventAccumulator(str(tmp_path / "tb"))
    board.Reload()
    assert {"train/rewards/margin", "validation/accuracy"} <= set(board.Tags()["scalars"])


def test_epochs_count_pairs_and_kto_counts_both_responses(tiny_model, tmp_path):
    pairs = _pairs()
    a = adapters.lora(tiny_model, rank=2, seed=1)
    run = train(a, pairs, profile(), steps=None, epochs=1.0, micro_batch=2, objective=obj.DPO())
    assert run.updates == 3 and run.epochs == 1.0  # 6 pairs, 2 a micro-batch
    b = adapters.lora(tiny_model, rank=2, seed=1)
    run = train(b, pairs, profile(), steps=None, epochs=1.0, micro_batch=2, objective=obj.KTO())
    assert run.updates == 6  # each pair gives a desirable and an undesirable completion


def test_objectives_refuse_data_they_cannot_train_on(tiny_model):
    a = adapters.lora(tiny_model, rank=2)
    texts = from_texts(["plain text"], 16)
    with pytest.raises(AnerRuntimeError, match="objective dpo trains on pairs") as e:
        train(a, texts, profile(), steps=1, objective=obj.DPO())
    assert e.value.code == "E-OBJECTIVE-DATA"
    rated = Dataset(
        (FeedbackFormat().record(Row("f:1", {"prompt": "a", "completion": "b", "label": True})),),
        16,
    )
    with pytest.raises(AnerRuntimeError, match="objective orpo trains on pairs"):
        train(a, rated, profile(), steps=1, objective=obj.ORPO())
    with pytest.raises(AnerRuntimeError, match="micro_batch >= 2") as e:
        train(a, rated, profile(), steps=1, objective=obj.KTO())
    assert e.value.code == "E-OBJECTIVE-OPTIONS"


def test_objective_options_are_checked():
    with pytest.raises(AnerRuntimeError, match="label_smoothing applies to the sigmoid loss"):
        obj.dpo(0.1, "ipo", 0.1)
    with pytest.raises(AnerRuntimeError, match="lambda must be positive"):
        obj.orpo(**{"lambda": 0.0})
    assert obj.to_json(obj.kto(0.1, 1.0, 2.0)) == {
        "name": "kto",
        "beta": 0.1,
        "desirable_weight": 1.0,
        "undesirable_weight": 2.0,
    }


def _scored_text(model, example) -> str:
    return model.tokenizer.decode([t for t, s in zip(example.ids, example.scored) if s])


def test_chat_pairs_score_only_the_compared_turns_and_inspect_shows_them(tiny_model):
    history = "\n\nHuman: Hello\n\nAssistant: Hi there.\n\nHuman: Bye"
    row = {
        "chosen": history + "\n\nAssistant: Goodbye!",
        "rejected": history + "\n\nAssistant: No.",
    }
    data = Dataset((PairFormat().record(Row("hh:1", row)),), 128, "hh.jsonl")
    [pair] = data.examples(tiny_model.tokenizer)
    assert _scored_text(tiny_model, pair).startswith("Goodbye!")
    assert _scored_text(tiny_model, pair.rejected).startswith("No.")
    assert "Hi there" not in _scored_text(tiny_model, pair)  # an earlier turn is context
    assert pair.ids[: pair.prompt_length] == pair.rejected.ids[: pair.rejected.prompt_length]
    view = inspect(data, tiny_model, 1)
    assert "--- pair 1 of 1 ---" in view and "⟦Goodbye!" in view and "⟦No." in view
    assert "[chosen: " in view and "[rejected: " in view
    rated = Dataset(
        (FeedbackFormat().record(Row("f:1", {"prompt": "a", "completion": " b", "label": False})),),
        16,
    )
    assert "scored, undesirable ---" in inspect(rated, tiny_model, 1)


def test_a_pair_too_long_for_the_context_is_dropped_whole(tiny_model, capsys):
    long = " word" * 40
    data = Dataset(
        (
            PairFormat().record(Row("p:1", {"prompt": "Q", "chosen": " yes", "rejected": long})),
            PairFormat().record(Row("p:2", {"prompt": "Q", "chosen": " a", "rejected": " b"})),
        ),
        16,
        "p.jsonl",
        too_long="drop",
    )
    assert len(data.examples(tiny_model.tokenizer)) == 1
    assert "1 of 2 examples did not fit" in capsys.readouterr().err
