"""A training run imports only what it uses: a plain `aner run` of a LoRA training on the CPU,
with validation and checkpoints, then resumed, under each activation policy, ends without any of
the heavy libraries and torch subsystems it has no use for in the process (each costs from a
fraction of a second to several seconds of start-up: dynamo and inductor 2.5 s, peft with
transformers and bitsandbytes 7 s)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

UNUSED = (
    "torch._dynamo",
    "torch._inductor",
    "sympy",
    "torch.distributed.fsdp",
    "torch.distributed.tensor",
    "torch.utils.tensorboard",
    "tensorboard",
    "transformers",
    "peft",
    "trl",
    "bitsandbytes",
    "liger_kernel",
    "triton",
    "cupy",
    "matplotlib",
    "pyarrow",
    "jinja2",
)
"""Modules a CPU training run on texts must not load."""

SCRIPT = """\
let base = load_model("{gguf}", storage: float32, device: cpu)
let data = texts(["Aner makes model adaptation explicit and reproducible.",
                  "The quiet mountain lake reflects the clear morning sky.",
                  "Seven engineers share one worktree and commit their own files."], context: 24)
let a = resume("runs", model: base, otherwise: lora(base, rank: 2, alpha: 4.0, dropout: 0.1,
                                                     targets: [q_proj, v_proj], seed: 5))
let run = train(a, data, profile(precision: {precision}, activations: {activations}),
                steps: {steps}, learning_rate: 0.01, micro_batch: 2, seed: 3, checkpoints: "runs",
                checkpoint_every: 2, validation: data, eval_every: 2)
print("updates ${{run.updates}}")
"""

_CHILD = """\
import json, runpy, sys
sys.argv = ["aner", "run", "train.aner"]
try:
    runpy.run_module("aner_lang.cli", run_name="__main__")
except SystemExit as stop:
    assert not stop.code, stop.code
print(json.dumps(sorted(m for m in {unused!r} if m in sys.modules)))
"""


def _run(workdir: Path) -> tuple[str, list[str]]:
    proc = subprocess.run(
        [sys.executable, "-c", _CHILD.format(unused=UNUSED)],
        cwd=workdir,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    *printed, loaded = proc.stdout.strip().splitlines()
    return "\n".join(printed), json.loads(loaded)


@pytest.mark.slow
@pytest.mark.parametrize(
    ("precision", "activations"),
    [("float32", "keep"), ("bfloat16", "checkpoint"), ("float32", "offload")],
)
def test_a_training_run_imports_nothing_it_does_not_use(
    tiny_gguf, tmp_path, precision, activations
):
    """Activation checkpointing and offloading included: torch.utils.checkpoint's first call
    imports dynamo and inductor, the run's own recomputation nothing."""
    script = tmp_path / "train.aner"
    for steps in (4, 6):  # the second run resumes from the first one's checkpoint
        script.write_text(
            SCRIPT.format(gguf=tiny_gguf, precision=precision, activations=activations, steps=steps)
        )
        printed, loaded = _run(tmp_path)
        assert f"updates {steps}" in printed
        assert loaded == [], f"a {precision} {activations} run of {steps} updates imported {loaded}"


_KERNELS_CHILD = """\
import json, sys, torch
from aner_lang.runtime.model import triton_ops
assert triton_ops.kernels() is not None
x = torch.randn(2, 3, 32).bfloat16().requires_grad_(True)
triton_ops.RMSNorm.apply(x, torch.ones(32), 1e-5).sum().backward()
gate, up = torch.randn(2, 64).bfloat16(), torch.randn(2, 64).bfloat16()
triton_ops.SwiGLU.apply(gate, up)
print(json.dumps(sorted(m for m in {unused!r} if m in sys.modules)))
"""


def test_the_half_precision_kernels_load_none_of_the_heavy_libraries():
    """The GPU's half-precision kernels (run here by Triton's interpreter) load Triton and nothing
    that Liger's kernels pulled in: peft, transformers, bitsandbytes."""
    pytest.importorskip("triton")
    heavy = ("transformers", "peft", "bitsandbytes", "liger_kernel", "torch._dynamo")
    proc = subprocess.run(
        [sys.executable, "-c", _KERNELS_CHILD.format(unused=heavy)],
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, "TRITON_INTERPRET": "1"},
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert json.loads(proc.stdout.strip().splitlines()[-1]) == []
