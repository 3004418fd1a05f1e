"""Training with a long checkpointed micro-batch, whose MLPs run a tile of tokens at a time
(`model.activations.run_tiled`): the losses of the untiled run up to float rounding, and a resume
as exact as any other."""

from __future__ import annotations

import pytest
import torch

from aner_lang.runtime import adapters as A
from aner_lang.runtime.model import chunking, transformer
from aner_lang.runtime.tasks.data import from_texts
from aner_lang.runtime.train.profile import profile
from aner_lang.runtime.train.trainer import train

TEXTS = ["a tiny model learns these words and then some more of them", "and these other words too"]
OPTIONS = {"learning_rate": 1e-2, "micro_batch": 2, "accumulation": 1, "seed": 2}


def _lora(model):  # type: ignore[no-untyped-def]
    return A.lora(model, rank=2, alpha=4.0, dropout=0.1, seed=1)


@pytest.mark.parametrize("activations", ["checkpoint", "offload"])
def test_tiled_training_follows_the_untiled_run_and_resumes_exactly(
    tiny_model, activations, monkeypatch
):
    data = from_texts(TEXTS, context=24)
    prof = profile(activations=activations)
    mlp_runs: list[int] = []  # the tokens of each MLP run
    forward = transformer.LlamaMLP._forward

    def counted(mlp, x):  # type: ignore[no-untyped-def]
        mlp_runs.append(x.shape[:-1].numel())
        return forward(mlp, x)

    monkeypatch.setattr(transformer.LlamaMLP, "_forward", counted)
    whole = train(_lora(tiny_model), data, prof, steps=3, **OPTIONS)
    assert max(mlp_runs) > 5
    width = tiny_model.module.layers[0].mlp.intermediate
    monkeypatch.setattr(chunking, "MLP_TILE_BYTES", 5 * width * 4)  # tiles of 5 fp32 tokens
    mlp_runs.clear()
    straight = _lora(tiny_model)
    tiled = train(straight, data, prof, steps=3, **OPTIONS)
    assert max(mlp_runs) == 5
    assert tiled.loss_history == pytest.approx(whole.loss_history, rel=1e-5)
    half = _lora(tiny_model)
    train(half, data, prof, steps=1, **OPTIONS)
    resumed = A.adapter_from_state(tiny_model, half.state)
    train(resumed, data, prof, steps=3, **OPTIONS)
    a, b = straight.state.to_tensors(), resumed.state.to_tensors()
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
