"""Aner's DPO, ORPO and KTO against TRL's own trainers: the same tiny model and LoRA weights
(ours exported to PEFT and loaded onto the transformers model), the same token rows, and the
loss computed by TRL's `compute_loss` (reference = the PEFT model with its adapter disabled, as
ours is the base with the adapter off; TRL's copy of a pretrained adapter as the reference is
removed). Losses agree within fp32 tolerance, and so do the
gradients of every LoRA tensor.

Conservative DPO (sigmoid with label smoothing) is TRL's ``aot`` loss on one pair (its sort over
the batch is then the identity); TRL 1.x's ``sigmoid`` ignores label smoothing. ORPO is TRL's
ORPOTrainer with ``beta`` = lambda, on pairs with multi-token prompts tokenized as TRL's own
`tokenize_row` does (checked): its next-token term covers the chosen row's prompt and response,
its odds ratio the responses only.
"""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
import torch

trl = pytest.importorskip("trl")
peft = pytest.importorskip("peft")
transformers = pytest.importorskip("transformers")
datasets = pytest.importorskip("datasets")

from aner_lang.datafiles.preference_records import FeedbackFormat, PairFormat  # noqa: E402
from aner_lang.datafiles.records import Row  # noqa: E402
from aner_lang.runtime import adapters  # noqa: E402
from aner_lang.runtime.adapters.files import save_adapter  # noqa: E402
from aner_lang.runtime.load.loader import load_model  # noqa: E402
from aner_lang.runtime.tasks.batches import collate  # noqa: E402
from aner_lang.runtime.tasks.data import Dataset, from_texts  # noqa: E402
from aner_lang.runtime.train import objectives as obj  # noqa: E402
from aner_lang.runtime.train.preference import (  # noqa: E402
    PreferenceSteps,
    _every_target,
    _mismatched,
    nll_targets,
)
from aner_lang.runtime.train.profile import profile  # noqa: E402
from aner_lang.runtime.train.trainer import train  # noqa: E402
from aner_lang.testing.hf_fixture import write_hf_model  # noqa: E402

PAIRS = [
    ("The capital of France is", " Paris.", " a large cheese."),
    ("2 + 2 =", " 4", " twenty-two, or so they say"),
    ("Name a colour:", " blue", " the number seven"),
]
FEEDBACK = [
    ("The sky is", " blue.", True),
    ("Water boils at", " 3 degrees.", False),
    ("A cat says", " meow.", True),
    ("Fire is", " cold and wet.", False),
]
TOL = {"rtol": 1e-5, "atol": 1e-5}


def _peft(adapter, folder: Path, out: Path):
    """The transformers model of `folder` with `adapter` exported to PEFT and loaded onto it."""
    saved = save_adapter(adapter, out, format="peft")
    hf = transformers.AutoModelForCausalLM.from_pretrained(str(folder), dtype=torch.float32)
    return peft.PeftModel.from_pretrained(hf, str(saved), is_trainable=True)


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    """(our model, our LoRA with random weights, the PEFT model with the same weights, the HF
    tokenizer, the model folder)."""
    root = tmp_path_factory.mktemp("trl")
    folder = write_hf_model(root / "hf", "llama3", seed=7)
    ours = load_model(folder, storage="float32", device="cpu")
    adapter = adapters.lora(ours, rank=2, alpha=4.0, targets=["q_proj", "v_proj"], seed=5)
    g = torch.Generator().manual_seed(3)
    with torch.no_grad():
        for p in adapter.params.values():
            p.add_(torch.randn(p.shape, generator=g) * 0.3)
    tokenizer = transformers.AutoTokenizer.from_pretrained(str(folder))
    logging.getLogger("trl").setLevel(logging.ERROR)
    return ours, adapter, _peft(adapter, folder, root / "peft"), tokenizer, folder


def _examples(model, fmt, rows) -> list:
    records = tuple(fmt.record(Row(f"test:{i}", r)) for i, r in enumerate(rows, start=1))
    return list(Dataset(records, 64).examples(model.tokenizer))


def _pad(rows, value: int = 0) -> torch.Tensor:
    width = max(len(r) for r in rows)
    return torch.tensor([list(r) + [value] * (width - len(r)) for r in rows])


def _batch(rows, prefix: str = "") -> dict[str, torch.Tensor]:
    """TRL's collated batch of right-padded token rows; the completion mask is our scored mask."""
    return {
        f"{prefix}input_ids": _pad([e.ids for e in rows]),
        f"{prefix}attention_mask": _pad([(1,) * len(e.ids) for e in rows]),
        f"{prefix}completion_mask": _pad([tuple(map(int, e.scored)) for e in rows]),
    }


def _args(config_class, tmp_path: Path, **options):
    return config_class(output_dir=str(tmp_path / "out"), report_to=[], use_cpu=True, **options)


def _ours(adapter, objective, examples) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Our loss of one micro-batch, and the gradient of every LoRA tensor."""
    for p in adapter.params.values():
        p.grad = None
    steps = PreferenceSteps(adapter, objective, "float32")
    loss = steps._micro_batch(examples, len(examples), nll_targets(examples), None, backward=True)
    grads = {name: p.grad.clone() for name, p in adapter.params.items()}
    return loss, grads


def _theirs(trainer, model, inputs) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """TRL's loss and LoRA gradients. TRL keeps a copy of a pretrained adapter as its reference
    ("ref"); without it the reference is the model with its adapter disabled, as Aner's is."""
    if "ref" in model.peft_config:
        model.delete_adapter("ref")
        model.set_adapter("default")
    model.zero_grad(set_to_none=True)
    loss = trainer.compute_loss(model, inputs)
    loss.backward()
    grads = {}
    for name, p in model.named_parameters():
        if (
            p.grad is not None
        ):  # base_model.model.model.layers.0.self_attn.q_proj.lora_A.default.weight
            short = name.removeprefix("base_model.model.model.").replace(".default.weight", "")
            grads[short] = p.grad.clone()
    return loss.detach(), grads


def _assert_same(ours, theirs) -> None:
    (our_loss, our_grads), (their_loss, their_grads) = ours, theirs
    torch.testing.assert_close(our_loss.float(), their_loss.float(), **TOL)
    assert set(our_grads) == set(their_grads)
    for name, g in our_grads.items():
        assert g.abs().max() > 0, name
        scale = float(g.abs().max())  # fp32 sums in another order: relative to the tensor
        torch.testing.assert_close(g, their_grads[name], rtol=1e-3, atol=1e-4 * scale)


def _pair_rows(model, prompts: bool = True):
    rows = [{"prompt": p if prompts else "", "chosen": c, "rejected": r} for p, c, r in PAIRS]
    return _examples(model, PairFormat(), rows)


def _dpo_inputs(examples) -> dict[str, torch.Tensor]:
    return _batch(list(examples) + [e.rejected for e in examples])


def _dpo_trainer(theirs, tokenizer, tmp_path, **options):
    train = datasets.Dataset.from_list([{"prompt": "a", "chosen": " b", "rejected": " c"}] * 2)
    args = _args(trl.DPOConfig, tmp_path, **options)
    return trl.DPOTrainer(model=theirs, args=args, train_dataset=train, processing_class=tokenizer)


@pytest.mark.parametrize("loss", ["sigmoid", "ipo", "hinge"])
def test_dpo_losses_equal_trl(models, tmp_path, loss):
    ours, adapter, theirs, tokenizer, _ = models
    examples = _pair_rows(ours)
    trainer = _dpo_trainer(theirs, tokenizer, tmp_path, beta=0.7, loss_type=[loss])
    _assert_same(
        _ours(adapter, obj.dpo(0.7, loss, 0.0), examples),
        _theirs(trainer, theirs, _dpo_inputs(examples)),
    )


def test_conservative_dpo_equals_trl_aot_on_one_pair(models, tmp_path):
    ours, adapter, theirs, tokenizer, _ = models
    trainer = _dpo_trainer(
        theirs, tokenizer, tmp_path, beta=0.7, loss_type=["aot"], label_smoothing=0.2
    )
    for pair in _pair_rows(ours):
        _assert_same(
            _ours(adapter, obj.dpo(0.7, "sigmoid", 0.2), [pair]),
            _theirs(trainer, theirs, _dpo_inputs([pair])),
        )


def _orpo_inputs(examples) -> dict[str, torch.Tensor]:
    inputs = {}
    for name, rows in (("chosen", examples), ("rejected", [e.rejected for e in examples])):
        batch = _batch(rows, f"{name}_")
        labels = batch[f"{name}_input_ids"].masked_fill(
            batch.pop(f"{name}_completion_mask") == 0, -100
        )
        inputs |= batch | {f"{name}_labels": labels}
    return inputs


def _orpo_trainer(theirs, tokenizer, tmp_path, lam: float):
    from trl.experimental.orpo import ORPOConfig, ORPOTrainer

    train = datasets.Dataset.from_list([{"prompt": "a", "chosen": " b", "rejected": " c"}] * 2)
    args = _args(ORPOConfig, tmp_path, beta=lam, max_length=64)
    return ORPOTrainer(model=theirs, args=args, train_dataset=train, processing_class=tokenizer)


def test_our_pair_rows_are_trl_orpo_rows(models, tmp_path):
    """The token rows the ORPO comparisons feed TRL are the ones TRL's `tokenize_row` makes of
    the same pair: ids, and which targets are the responses'."""
    ours, _, theirs, tokenizer, _ = models
    trainer = _orpo_trainer(theirs, tokenizer, tmp_path, 0.3)
    for (prompt, chosen, rejected), pair in zip(PAIRS, _pair_rows(ours), strict=True):
        assert pair.prompt_length > 2  # real prompts: several tokens, all of them targets of NLL
        row = trainer.tokenize_row({"prompt": prompt, "chosen": chosen, "rejected": rejected})
        for name, e in (("chosen", pair), ("rejected", pair.rejected)):
            assert tuple(row[f"{name}_input_ids"]) == e.ids, name
            assert tuple(t != -100 for t in row[f"{name}_labels"]) == e.scored, name


@pytest.mark.parametrize("lam", [0.3, 2.0])
def test_orpo_loss_equals_trl(models, tmp_path, lam):
    ours, adapter, theirs, tokenizer, _ = models
    examples = _pair_rows(ours)
    trainer = _orpo_trainer(theirs, tokenizer, tmp_path, lam)
    _assert_same(
        _ours(adapter, obj.orpo(**{"lambda": lam}), examples),
        _theirs(trainer, theirs, _orpo_inputs(examples)),
    )


def test_orpo_nll_covers_the_prompt_and_the_odds_do_not(models, tmp_path):
    """The class of ORPO's two spans: TRL's next-token term over the whole chosen row, its odds
    ratio from the responses' mean log-probabilities (`get_batch_logps`, `odds_ratio_loss`)."""
    ours, adapter, theirs, tokenizer, _ = models
    examples = _pair_rows(ours)
    trainer = _orpo_trainer(theirs, tokenizer, tmp_path, 0.3)
    rows = list(examples) + [e.rejected for e in examples]
    batch = _batch(rows)
    labels = batch["input_ids"].masked_fill(batch["completion_mask"] == 0, -100)
    with torch.no_grad():
        logits = theirs(batch["input_ids"], attention_mask=batch["attention_mask"]).logits
        logps = trainer.get_batch_logps(logits, labels, average_log_prob=True)
        their_terms = trainer.odds_ratio_loss(*logps.chunk(2))[0]
        whole = batch["input_ids"].masked_fill(batch["attention_mask"] == 0, -100)
        their_nll = torch.nn.functional.cross_entropy(
            logits[: len(examples), :-1].reshape(-1, logits.shape[-1]),
            whole[: len(examples), 1:].reshape(-1),
        )
        steps = PreferenceSteps(adapter, obj.orpo(**{"lambda": 0.3}), "float32")
        every = _every_target(examples, 0, adapter.device)
        with adapter.active():
            policy = steps._logps(adapter, collate(rows, 0), every)
        our_terms, our_nll, _ = obj.orpo_losses(obj.ORPO(0.3), policy)
    torch.testing.assert_close(our_terms, -their_terms, **TOL)
    torch.testing.assert_close(our_nll.sum() / nll_targets(examples), their_nll, **TOL)
    assert nll_targets(examples) > sum(e.scored_tokens for e in examples)


def test_kto_loss_equals_trl(models, tmp_path):
    """The adapter is first fine-tuned on the completions, so that it likes them in other
    prompts too: the KL estimate is then positive, not clamped to 0."""
    ours, _, _, tokenizer, folder = models
    adapter = adapters.lora(ours, rank=2, alpha=4.0, targets=["q_proj", "v_proj"], seed=5)
    completions = from_texts([c for _, c, _ in FEEDBACK] * 2, 16)
    train(adapter, completions, profile(), steps=4, learning_rate=0.05, micro_batch=4)
    theirs = _peft(adapter, folder, tmp_path / "peft")
    rows = [{"prompt": p, "completion": c, "label": d} for p, c, d in FEEDBACK]
    examples = _examples(ours, FeedbackFormat(), rows)
    args = _args(
        trl.KTOConfig,
        tmp_path,
        beta=0.4,
        desirable_weight=1.3,
        undesirable_weight=0.8,
        per_device_train_batch_size=len(rows),
    )
    trainer = trl.KTOTrainer(
        model=theirs,
        args=args,
        train_dataset=datasets.Dataset.from_list(rows),
        processing_class=tokenizer,
    )
    inputs = _batch(examples) | _batch(_mismatched(examples), "KL_")
    inputs["label"] = torch.tensor([d for *_, d in FEEDBACK])
    ours_result = _ours(adapter, obj.kto(0.4, 1.3, 0.8), examples)
    theirs_result = _theirs(trainer, theirs, inputs)
    assert trainer._metrics["train"]["kl"][-1] > 0.1  # the KL term is on, not clamped away
    _assert_same(ours_result, theirs_result)
