"""Whether the fused kernels can run here, and the clear error when they cannot.

Kept apart from the kernels so that ``kernel: auto`` can ask without importing CuPy or touching a
GPU, and ``kernel: fused`` on a machine without CUDA fails with one readable message.
"""

from __future__ import annotations

import importlib.util
from functools import lru_cache

from aner_lang.problems.errors import AnerRuntimeError


@lru_cache(maxsize=1)
def unavailable_reason() -> str | None:
    """None when fused kernels can run; otherwise why not, in words a user can act on (asked once
    per process: NF4Linear resolves its backend on every forward)."""
    import torch

    if not torch.cuda.is_available():
        return "no CUDA GPU is visible to torch (torch.cuda.is_available() is False)"
    if importlib.util.find_spec("cupy") is None:
        return "CuPy is not installed (pip install 'aner[cuda]')"
    return None


def require_fused() -> None:
    """Raise the user-facing error for ``kernel: fused`` where the kernels cannot run."""
    reason = unavailable_reason()
    if reason is not None:
        raise AnerRuntimeError(
            f"kernel: fused needs a CUDA GPU with CuPy: {reason}",
            code="E-KERNEL-UNAVAILABLE",
            notes=("use kernel: host_tiled, or kernel: auto to pick host_tiled here",),
        )
