"""The NF4 kernel travels with the run, not with the shared base; states record its identity.

On the CPU the two "kernels" are host_tiled with 4 KiB and with 8 MiB tiles: their input
gradients differ in the last bits (the tiles split the backward's sum), so a run that picked up
the other run's kernel would not reproduce its numbers.
"""

from __future__ import annotations

import pytest
import torch

from aner_lang.problems.errors import AnerRuntimeError
from aner_lang.runtime import adapters as A
from aner_lang.runtime.load.loader import load_model
from aner_lang.runtime.nf4.host_tiled import DEFAULT_TILE_BYTES
from aner_lang.runtime.tasks.data import from_texts
from aner_lang.runtime.train.checkpoint import resume
from aner_lang.runtime.train.profile import Profile
from aner_lang.runtime.train.trainer import train

TEXTS = [
    "Aner makes model adaptation explicit and reproducible.",
    "The quiet mountain lake reflects the clear morning sky.",
]
SMALL, LARGE = Profile(dequant_tile_bytes=4096), Profile()


def _base(path):
    return load_model(path, storage="nf4_double_quant", device="cpu")


def _lora(base, seed):
    return A.lora(base, rank=2, alpha=4.0, targets=["q_proj", "v_proj", "down_proj"], seed=seed)


def _train(adapter, prof, steps, **kw):
    return train(adapter, from_texts(TEXTS, 16), prof, steps=steps, learning_rate=1e-2, **kw)


def test_the_two_tile_sizes_really_compute_differently(tiny_bytes_gguf):
    a, b = _lora(_base(tiny_bytes_gguf), 1), _lora(_base(tiny_bytes_gguf), 1)
    _train(a, SMALL, 2)
    _train(b, LARGE, 2)
    assert any(not torch.equal(a.params[n], b.params[n]) for n in a.params)


def test_adapters_of_one_base_trained_in_turn_match_each_trained_alone(tiny_bytes_gguf):
    a_alone, b_alone = _lora(_base(tiny_bytes_gguf), 1), _lora(_base(tiny_bytes_gguf), 2)
    _train(a_alone, SMALL, 3)
    _train(b_alone, LARGE, 3)
    shared = _base(tiny_bytes_gguf)
    a, b = _lora(shared, 1), _lora(shared, 2)
    _train(a, SMALL, 1)
    _train(b, LARGE, 2)
    _train(a, SMALL, 3)  # a continues after b ran on the same base with the other kernel
    _train(b, LARGE, 3)
    for ours, alone in ((a, a_alone), (b, b_alone)):
        assert all(torch.equal(ours.params[n], alone.params[n]) for n in alone.params)
    assert not any(
        hasattr(m, "kernel") or hasattr(m, "tile_bytes") for m in shared.module.modules()
    )


def test_states_record_the_kernel_identity_and_resume_refuses_another(tiny_bytes_gguf, tmp_path):
    adapter = _lora(_base(tiny_bytes_gguf), 3)
    run = _train(adapter, SMALL, 1, checkpoints=str(tmp_path / "ck"))
    ident = run.kernel_identity
    assert ident.startswith("aner.nf4.host_tiled/1;tile_bytes=4096;compute=float32;torch=")
    assert adapter.state.meta["kernel_identity"] == ident
    resumed = resume(tmp_path / "ck")
    assert resumed.state.meta["kernel_identity"] == ident
    with pytest.raises(AnerRuntimeError, match="produced by a different kernel") as err:
        _train(resumed, LARGE, 2)
    assert err.value.code == "E-CKPT-KERNEL"
    assert any(f"tile_bytes={DEFAULT_TILE_BYTES}" in n for n in err.value.notes)
    assert _train(resumed, SMALL, 2).updates == 2  # the same kernel continues
