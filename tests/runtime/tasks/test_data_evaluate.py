"""Datasets (texts, JSONL, prompt masking) and evaluate(), checked against HF transformers' loss."""

from __future__ import annotations

import json
import math

import pytest
import torch

from aner_lang.problems.errors import AnerRuntimeError
from aner_lang.runtime.model.loss import IGNORE
from aner_lang.runtime.tasks.batches import collate
from aner_lang.runtime.tasks.data import from_jsonl, from_texts
from aner_lang.runtime.tasks.evaluate import evaluate

TEXTS = [
    "The quiet mountain lake reflects the clear morning sky.",
    "Aner makes model adaptation explicit and reproducible.",
]


def test_texts_score_every_token_and_end_with_eos(tiny_model):
    tok = tiny_model.tokenizer
    ds = from_texts(TEXTS, context=64)
    ex = ds.examples(tok)
    assert list(ex[0].ids) == tok.encode(TEXTS[0]) + [tok.eos_id]
    assert all(ex[0].scored) and ex[0].scored_tokens == len(ex[0].ids) - 1
    assert ds.examples(tok) is ex  # tokenized once per tokenizer


def test_context_truncates(tiny_model):
    ex = from_texts(TEXTS, context=5).examples(tiny_model.tokenizer)
    assert all(len(e.ids) == 5 for e in ex)


def test_jsonl_prompt_tokens_are_unscored(tmp_path, tiny_model):
    tok = tiny_model.tokenizer
    path = tmp_path / "qa.jsonl"
    path.write_text(
        "\n".join(
            json.dumps(r)
            for r in [
                {"question": "Capital of France?", "answer": " Paris"},
                {"question": "2 + 2 =", "answer": " 4"},
            ]
        )
        + "\n"
    )
    ds = from_jsonl(path, context=32, prompt_field="question", completion_field="answer")
    e = ds.examples(tok)[0]
    n_prompt = len(tok.encode("Capital of France?"))
    assert e.scored == (False,) * n_prompt + (True,) * (len(e.ids) - n_prompt)
    batch = collate(ds.examples(tok), tok.pad_id)
    # targets are the next token where it is scored, IGNORE elsewhere (prompt and padding)
    assert batch.targets[0, n_prompt - 1].item() == e.ids[n_prompt]
    assert (batch.targets[0, : n_prompt - 1] == IGNORE).all()
    assert (
        batch.scored_tokens
        == ds.scored_tokens(tok)
        == sum(x.scored_tokens for x in ds.examples(tok))
    )


def test_jsonl_errors(tmp_path):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"text": "ok"}\n{not json}\n')
    with pytest.raises(AnerRuntimeError, match=r"bad.jsonl:2: not valid JSON"):
        from_jsonl(bad, context=16)
    bad.write_text('{"txt": "typo"}\n')
    with pytest.raises(AnerRuntimeError, match=r"bad.jsonl:1: no field 'text' .*\(fields: txt\)"):
        from_jsonl(bad, context=16)
    with pytest.raises(AnerRuntimeError, match="no such file"):
        from_jsonl(tmp_path / "missing.jsonl", context=16)
    with pytest.raises(AnerRuntimeError, match="both prompt_field and completion_field"):
        from_jsonl(bad, context=16, prompt_field="txt")


def test_evaluate_matches_hf_loss(tiny_bytes_gguf):
    transformers = pytest.importorskip("transformers")
    from aner_lang.runtime.load.loader import load_model

    tiny_model = load_model(tiny_bytes_gguf, device="cpu")
    hf = transformers.LlamaForCausalLM.from_pretrained(
        str(tiny_bytes_gguf.parent), gguf_file=tiny_bytes_gguf.name, dtype=torch.float32
    ).eval()
    ds = from_texts(TEXTS, context=64)
    ours = evaluate(tiny_model, ds, batch_size=2)  # one right-padded batch of two
    total = count = 0.0
    with torch.no_grad():
        for e in ds.examples(tiny_model.tokenizer):
            ids = torch.tensor([e.ids])
            n = len(e.ids) - 1
            total += hf(ids, labels=ids).loss.item() * n
            count += n
    assert ours.scored_tokens == count
    assert abs(ours.loss - total / count) < 1e-4
    assert math.isclose(ours.perplexity, math.exp(ours.loss))
    # a different batch size gives the same numbers
    assert abs(evaluate(tiny_model, ds, batch_size=1).loss - ours.loss) < 1e-5


def test_real_model_perplexity_is_sane(real_model):
    ev = evaluate(
        real_model,
        from_texts(
            ["The capital of France is Paris. The capital of Germany is Berlin."], context=32
        ),
    )
    assert ev.scored_tokens > 10 and 1.0 < ev.perplexity < 60.0
