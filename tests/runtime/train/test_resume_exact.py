"""1 update + checkpoint + reload in a fresh process + 1 update == 2 uninterrupted updates.

For every method (lora, lora_fa, dora, tinylora, full, and lora on an NF4 base) and every CPU
precision (float32, float16 with a dynamic loss scale, bfloat16), bit for bit: every tensor of the
checkpointed state (parameters, AdamW moments and steps, RNG) and every counter and loss-scale
field. The GPU variant (paged AdamW, fused kernels) runs the same worker on CUDA.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from aner_lang.runtime.train import checkpoint

WORKER = Path(__file__).with_name("resume_worker.py")
sys.path.insert(0, str(WORKER.parent))
from resume_worker import combos  # noqa: E402


def _run(phase: str, gguf: Path, out: Path, device: str) -> None:
    env = {**os.environ, "ANER_CACHE_DIR": str(out / "cache")}
    proc = subprocess.run(
        [sys.executable, str(WORKER), phase, str(gguf), str(out), device],
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]


def _assert_resume_exact(gguf: Path, out: Path, device: str) -> None:
    for phase in ("whole", "resumed"):
        _run(phase, gguf, out, device)
    for name, *_ in combos(device):
        resumed = checkpoint.load(out / "resumed" / name)
        whole = checkpoint.load(out / "whole" / name)
        assert resumed.updates == whole.updates == 2, name
        assert resumed.meta == whole.meta, name
        assert set(resumed.tensors) == set(whole.tensors), name
        for key, t in whole.tensors.items():
            assert torch.equal(resumed.tensors[key], t), f"{name}: {key} differs"
        counters = whole.meta["counters"]
        assert counters["updates"] == 2 and counters["scored_tokens"] > 0, name
        assert any(k.startswith("optim/exp_avg_sq/") for k in whole.tensors), name
        if "float16" in name:  # the loss scale is state too, and it moved
            assert whole.meta["loss_scale"]["scale"] != 256.0, name


@pytest.mark.slow
def test_resume_in_a_fresh_process_is_bit_identical_cpu(tiny_gguf, tmp_path):
    _assert_resume_exact(tiny_gguf, tmp_path, "cpu")


@pytest.mark.slow
@pytest.mark.cuda
def test_resume_in_a_fresh_process_is_bit_identical_cuda(tiny_gguf, tmp_path):
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    _assert_resume_exact(tiny_gguf, tmp_path, "cuda")
