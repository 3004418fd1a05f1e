"""resume(): what it verifies and what it gives back, on a tiny fixture and on the real model."""

from __future__ import annotations

import pytest
import torch

from aner_lang.problems.errors import AnerRuntimeError
from aner_lang.runtime import adapters as A
from aner_lang.runtime.load.loader import load_model
from aner_lang.runtime.tasks.data import from_texts
from aner_lang.runtime.train.checkpoint import latest, resume
from aner_lang.runtime.train.profile import profile
from aner_lang.runtime.train.trainer import train
from aner_lang.testing.fixture import write_fixture

TEXTS = [
    "Aner makes model adaptation explicit and reproducible.",
    "The quiet mountain lake reflects the clear morning sky.",
]


def test_resume_refuses_another_base_or_profile(tiny_model, tmp_path):
    d = tmp_path / "runs"
    train(
        A.lora(tiny_model, rank=2, alpha=4.0),
        from_texts(TEXTS, 16),
        profile(),
        steps=1,
        checkpoints=str(d),
    )
    other = load_model(write_fixture(tmp_path / "other.gguf", "tiny", seed=4), "float32", "cpu")
    with pytest.raises(AnerRuntimeError, match="the base model") as e:
        resume(d, model=other)
    assert e.value.code == "E-CKPT-BASE"
    with pytest.raises(AnerRuntimeError, match="the training profile") as e:
        resume(d, model=tiny_model, profile=profile(precision="bfloat16"))
    assert e.value.code == "E-CKPT-PROFILE"
    again = resume(d)  # no model given: the recorded base is loaded
    assert again.base.path == tiny_model.path and again.state.updates == 1
    assert resume(d, model=tiny_model, profile=profile()).method == "lora"


def test_otherwise_starts_a_run_where_there_is_no_checkpoint(tiny_model, tmp_path):
    fresh = A.lora(tiny_model, rank=1, alpha=1.0)
    assert latest(tmp_path) is None
    assert resume(tmp_path / "none", model=tiny_model, otherwise=fresh) is fresh
    with pytest.raises(AnerRuntimeError, match="no such directory"):
        resume(tmp_path / "none", model=tiny_model)


@pytest.mark.slow
def test_real_model_interrupted_after_one_update_continues_exactly(real_model, tmp_path):
    data = from_texts(TEXTS, context=24)
    opts = {"learning_rate": 2e-3, "micro_batch": 2, "seed": 1, "schedule": "linear"}
    whole = A.lora(real_model, rank=2, alpha=4.0, seed=71)
    train(
        whole, data, profile(), steps=2, checkpoints=str(tmp_path / "w"), checkpoint_every=1, **opts
    )
    first = next((tmp_path / "w").glob("update-000001-*"))
    cont = resume(first, model=real_model)
    assert cont.state.updates == 1
    train(cont, data, profile(), steps=2, checkpoints=str(tmp_path / "r"), **opts)
    a, b = latest(tmp_path / "w"), latest(tmp_path / "r")
    assert a.meta["counters"] == b.meta["counters"] and set(a.tensors) == set(b.tensors)
    for key, t in a.tensors.items():
        assert torch.equal(b.tensors[key], t), key
    assert a.base_sha256 is not None and len(a.base_sha256) == 64
