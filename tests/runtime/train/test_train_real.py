"""The trainer on the real SmolLM2 (fp32, CPU): counts, learning, determinism, resume, PEFT.

These tests share the session's `real_model`; adapters never modify it, and one test checks that.
"""

from __future__ import annotations

import json

import pytest
import torch

from aner_lang.runtime import adapters as A
from aner_lang.runtime.model.loss import logits_loss_sum
from aner_lang.runtime.tasks.batches import collate
from aner_lang.runtime.tasks.data import from_texts
from aner_lang.runtime.train.profile import profile
from aner_lang.runtime.train.state import TrainState
from aner_lang.runtime.train.trainer import train

TEXTS = [
    "Aner makes model adaptation explicit and reproducible.",
    "The quiet mountain lake reflects the clear morning sky.",
    "Seven engineers share one worktree and commit their own files.",
    "A typed script is checked before it ever loads a model.",
]
HELD_OUT = ["A clear morning sky over the quiet lake."]


@pytest.fixture(scope="module")
def data():
    return from_texts(TEXTS, context=32)


def test_trainable_counts_match_the_reference(real_model):
    got = {
        name: (a.trainable_parameters, a.target_tensors)
        for name, a in (
            ("lora", A.lora(real_model, rank=2, alpha=4.0)),
            ("lora_fa", A.lora_fa(real_model, rank=2, alpha=4.0)),
            ("dora", A.dora(real_model, rank=2, alpha=4.0)),
            ("tinylora", A.tinylora(real_model, parameters=13, rank=2)),
            ("full", A.full(real_model)),
        )
    }
    assert got == {
        "lora": (115_200, 60),
        "lora_fa": (46_080, 60),
        "dora": (115_200 + 30 * (576 + 192), 60),
        "tinylora": (13, 60),
        "full": (134_515_008, 272),
    }


def test_tinylora_stores_svd_bases_of_the_weights(real_model):
    t = A.tinylora(real_model, parameters=13, rank=2, seed=3)
    name, module = t.targets[5]
    w = module.dense_weight()
    u, s, vh = (t.frozen[f"{name}.tinylora_{k}"] for k in ("U", "S", "Vh"))
    assert torch.allclose(s, torch.linalg.svdvals(w)[:2], rtol=1e-4)
    # the rank-2 reconstruction is the best rank-2 approximation: residual = tail singular values
    resid = torch.linalg.norm(w - u @ torch.diag(s) @ vh)
    assert torch.isclose(resid, torch.linalg.svdvals(w)[2:].norm(), rtol=1e-3)
    assert t.frozen[f"{name}.tinylora_P"].shape == (13, 2, 2)


def test_lora_learns_in_30_updates_and_leaves_the_base_alone(real_model, data, tmp_path):
    ids = torch.tensor([real_model.tokenizer.encode(TEXTS[0])])
    before = real_model.forward(ids)
    other = A.lora(real_model, rank=2, alpha=4.0, seed=5)
    a = A.lora(real_model, rank=2, alpha=4.0, seed=71)
    run = train(
        a,
        data,
        profile(),
        steps=30,
        learning_rate=2e-3,
        micro_batch=4,
        validation=from_texts(HELD_OUT, context=32),
        log=str(tmp_path / "ev.jsonl"),
    )
    assert run.updates == 30 and run.skipped_updates == 0 and len(run.loss_history) == 30
    assert run.loss_history[-1] < 0.5 * run.loss_history[0]
    assert [u for u, _ in run.validation_history] == [1, 30]  # after the first and the last
    start, *events, end = [json.loads(x) for x in (tmp_path / "ev.jsonl").read_text().splitlines()]
    assert start["event"] == "start" and start["kernel_identity"] == run.kernel_identity
    assert start["kernel_identity"].startswith("aner.dense/1;compute=float32;torch=")
    assert [e["update"] for e in events if e["event"] == "update"] == list(range(1, 31))
    assert events[0]["grad_norm"] > 0 and "validation_loss" in events[-1]
    assert end["event"] == "end" and end["stopped"] == "done"
    assert run.scored_tokens == 30 * data.scored_tokens(real_model.tokenizer)
    with torch.no_grad():
        assert torch.equal(real_model.forward(ids), before)  # base untouched
        assert torch.equal(other.forward(ids), before)  # an untrained sibling is still the base
        assert not torch.equal(a.forward(ids), before)


def test_same_seed_bit_identical_and_resume_continues_exactly(real_model, data):
    def fresh():
        return A.lora(real_model, rank=2, alpha=4.0, dropout=0.1, seed=9)

    opts = {
        "learning_rate": 1e-3,
        "micro_batch": 2,
        "accumulation": 2,
        "seed": 4,
        "warmup": 1,
        "schedule": "cosine",
        "weight_decay": 0.01,
    }
    a, b = fresh(), fresh()
    train(a, data, profile(), steps=2, **opts)
    train(b, data, profile(), steps=2, **opts)
    c = fresh()
    train(c, data, profile(), steps=1, **opts)
    state = TrainState.from_parts(c.state.to_tensors(), json.loads(json.dumps(c.state.to_json())))
    resumed = A.adapter_from_state(real_model, state)
    run = train(resumed, data, profile(), steps=2, **opts)
    assert run.updates == 2 and a.state.meta["counters"] == resumed.state.meta["counters"]
    for name, t in a.params.items():
        assert torch.equal(t, b.params[name]) and torch.equal(t, resumed.params[name])
    sa, sr = a.state.to_tensors(), resumed.state.to_tensors()
    assert sa.keys() == sr.keys() and all(torch.equal(sa[k], sr[k]) for k in sa)


def test_lora_matches_peft_over_5_updates(real_model, smollm2_path, data):
    transformers = pytest.importorskip("transformers")
    peft = pytest.importorskip("peft")
    hf = transformers.LlamaForCausalLM.from_pretrained(
        str(smollm2_path.parent), gguf_file=smollm2_path.name, dtype=torch.float32
    )
    model = peft.get_peft_model(
        hf,
        peft.LoraConfig(r=2, lora_alpha=4, lora_dropout=0.0, target_modules=["q_proj", "v_proj"]),
    )
    ours = A.lora(real_model, rank=2, alpha=4.0, seed=71)
    with torch.no_grad():
        for name, module in model.named_modules():
            if isinstance(module, peft.tuners.lora.Linear):
                key = name[name.index("layers.") :]
                module.lora_A["default"].weight.copy_(ours.params[f"{key}.lora_A"])
                module.lora_B["default"].weight.copy_(ours.params[f"{key}.lora_B"])
    trainable = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(trainable, lr=1e-3, weight_decay=0.0, foreach=False)
    examples = data.examples(real_model.tokenizer)
    run = train(ours, data, profile(), steps=5, learning_rate=1e-3, micro_batch=4, seed=0)
    from aner_lang.runtime.train.order import epoch_order

    order = epoch_order(len(examples), 0, 0)
    batch = collate([examples[i] for i in order], real_model.tokenizer.pad_id or 0)
    theirs = []
    for _ in range(5):
        logits = model(input_ids=batch.input_ids).logits
        loss = logits_loss_sum(logits, batch.targets) / batch.scored_tokens
        loss.backward()
        torch.nn.utils.clip_grad_norm_(trainable, 1.0, foreach=False)
        opt.step()
        opt.zero_grad()
        theirs.append(float(loss))
    assert max(abs(x - y) for x, y in zip(run.loss_history, theirs)) < 1e-5
    assert run.loss_history[-1] < run.loss_history[0] - 0.05
