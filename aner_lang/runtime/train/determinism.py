"""Deterministic kernels while a run trains: one seed gives one result, bit for bit on the CPU
and on CUDA up to attention's backward (below).

Rules (`deterministic`):

* TF32 and reduced-precision reductions are off and cuDNN does not benchmark its algorithms.
* torch's deterministic algorithms are on, warning only (`warn_only`): every op that has a
  deterministic kernel takes it, and one that has none warns and runs. On CUDA that one is the
  backward of `scaled_dot_product_attention`: cuDNN's and the memory-efficient kernel's sum in
  an order that varies from call to call, so gradients differ in their last bits between two
  runs, and a resumed run continues to the last bits, not bit for bit. Strictly (warn_only off)
  torch takes flash's deterministic backward, which made the attention of a Llama-3-8B layer
  2.9x slower at context 8192 (`benchmarks/results/h100_session11.md`): a quarter of the step
  at that length, which no run is made to pay.
* Uninitialised memory is not filled. Under deterministic algorithms torch fills every
  `torch.empty` (NaN), so that a kernel reading memory it never wrote gives the same wrong result
  each time: one more pass over every such buffer, the offload's pinned host copies included,
  which the host thread would fill before it queues the next layer. A run's kernels read only
  what they write; the bit-identity tests (resume, CUDA graphs, offload) would show otherwise.
* Outside the run the process's own settings come back: a script's other work after `train()`
  runs as it would without it.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace

import torch

WHILE_TRAINING = "on while a run trains, warning only (attention's CUDA backward is not)"
"""What a run's report says of torch's deterministic algorithms (`deterministic`)."""

_CUBLAS = "CUBLAS_WORKSPACE_CONFIG"
"""cuBLAS's fixed workspace, without which its results may vary from call to call (torch's
deterministic algorithms warn at each cuBLAS call without it)."""


@dataclass(frozen=True)
class _Settings:
    """The process-wide switches a run sets, read and written together."""

    tf32_matmul: bool
    tf32_cudnn: bool
    cudnn_benchmark: bool
    fp16_reduction: bool
    bf16_reduction: bool
    algorithms: bool
    warn_only: bool
    fill_uninitialized: bool

    @classmethod
    def current(cls) -> _Settings:
        matmul, cudnn = torch.backends.cuda.matmul, torch.backends.cudnn
        return cls(
            matmul.allow_tf32,
            cudnn.allow_tf32,
            cudnn.benchmark,
            matmul.allow_fp16_reduced_precision_reduction,
            matmul.allow_bf16_reduced_precision_reduction,
            torch._C._get_deterministic_algorithms(),
            torch._C._get_deterministic_algorithms_warn_only(),
            torch._C._get_deterministic_fill_uninitialized_memory(),
        )

    def apply(self) -> None:
        matmul, cudnn = torch.backends.cuda.matmul, torch.backends.cudnn
        matmul.allow_tf32, cudnn.allow_tf32 = self.tf32_matmul, self.tf32_cudnn
        cudnn.benchmark = self.cudnn_benchmark
        matmul.allow_fp16_reduced_precision_reduction = self.fp16_reduction
        matmul.allow_bf16_reduced_precision_reduction = self.bf16_reduction
        _algorithms(self.algorithms, warn_only=self.warn_only)
        torch._C._set_deterministic_fill_uninitialized_memory(self.fill_uninitialized)


@contextmanager
def deterministic(device: torch.device) -> Iterator[None]:
    """Run the enclosed training under the module docstring's settings, then restore them (all
    but the cuBLAS workspace variable, which cuBLAS reads when it makes a handle: it stays set)."""
    before = _Settings.current()
    cuda = device.type == "cuda"
    os.environ.setdefault(_CUBLAS, ":4096:8")
    replace(
        before,
        tf32_matmul=False,
        tf32_cudnn=False,
        cudnn_benchmark=False,
        fp16_reduction=before.fp16_reduction and not cuda,
        bf16_reduction=before.bf16_reduction and not cuda,
        algorithms=True,
        warn_only=True,
        fill_uninitialized=False,
    ).apply()
    try:
        yield
    finally:
        before.apply()


def _algorithms(on: bool, warn_only: bool) -> None:
    """`torch.use_deterministic_algorithms(on, warn_only=...)` without its import of
    `torch._inductor.config`, which loads dynamo, sympy and FSDP (about 2.5 s) for a flag only
    inductor-compiled code reads. Aner compiles nothing with inductor; where something else has
    loaded the config already, its flag is set as torch would."""
    torch._C._set_deterministic_algorithms(on, warn_only=warn_only)
    inductor = sys.modules.get("torch._inductor.config")
    if inductor is not None:
        setattr(inductor, "deterministic", on)  # noqa: B010 (a module attribute torch sets)
