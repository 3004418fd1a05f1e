"""Paged AdamW: AdamW whose large moments live in CUDA managed memory.

Semantics follow bitsandbytes' PagedAdamW32bit (research/training.md section 2): only tensors of
at least `PAGE_MIN_ELEMENTS` elements are paged, moments are zero-initialised, and they are
prefetched to the GPU before the update. Unlike bnb we prefetch in `page_bytes` chunks on the
current stream, move the pages back to the host after the step (so the device copy is only
resident while it is used), never ask for more managed memory than `MANAGED_FRACTION` of the free
device memory (tensors past the cap get ordinary device moments, and the report says so), and
save/restore the moments as plain tensors copied into fresh managed buffers (bnb #1344/#1381).
On CPU there is no managed memory: it is plain AdamW and `report()` says so.

Managed buffers come from CuPy (`cupy.cuda.malloc_managed`) and are viewed as torch tensors
through `__cuda_array_interface__`, so the arithmetic is the same torch code as `AdamW`.
"""

from __future__ import annotations

from typing import Any

import torch

from aner_lang.problems.errors import AnerRuntimeError
from aner_lang.runtime.train.footprint import PAGE_MIN_ELEMENTS
from aner_lang.runtime.train.optim.adamw import AdamW, AdamWState, StepGroup

MANAGED_FRACTION = 0.5
_CPU_DEVICE_ID = -1  # cudaCpuDeviceId


class PagedAdamW(AdamW):
    """AdamW with managed-memory moments on CUDA; identical arithmetic to `AdamW`."""

    kind = "paged_adamw"

    def __init__(
        self, params: dict[str, torch.Tensor], page_bytes: int = 2 << 20, **kwargs: Any
    ) -> None:
        super().__init__(params, **kwargs)
        self.page_bytes = page_bytes
        self.on_cuda = any(p.is_cuda for p in params.values())
        self._buffers: dict[int, object] = {}  # data_ptr -> cupy managed memory, kept alive
        self._managed = 0
        self._cap = 0
        self._fallback = 0
        self._cp: Any = None  # the cupy module, imported only on CUDA
        self._can_prefetch = False
        self._no_prefetch = ""
        if self.on_cuda:
            self._init_cuda()

    def _init_cuda(self) -> None:
        try:
            import cupy
        except ImportError:
            raise AnerRuntimeError(
                "optimizer: paged_adamw on CUDA needs the Python package 'cupy' (managed memory)",
                code="E-PAGED-UNAVAILABLE",
                notes=("install cupy-cuda12x/13x, or use optimizer: adamw",),
            ) from None
        self._cp = cupy
        free, _total = torch.cuda.mem_get_info()
        self._cap = int(free * MANAGED_FRACTION)
        rt = cupy.cuda.runtime
        dev = torch.cuda.current_device()
        self._device = dev
        self._can_prefetch = bool(rt.deviceGetAttribute(rt.cudaDevAttrConcurrentManagedAccess, dev))
        if not self._can_prefetch:
            self._no_prefetch = "; device lacks concurrent managed access, no prefetch"

    def _zeros(self, p: torch.Tensor) -> torch.Tensor:
        nbytes = p.numel() * 4
        if not self.on_cuda or p.numel() < PAGE_MIN_ELEMENTS or self._managed + nbytes > self._cap:
            if self.on_cuda and p.numel() >= PAGE_MIN_ELEMENTS:
                self._fallback += nbytes
            return torch.zeros_like(p)
        cp = self._cp
        with cp.cuda.Device(self._device):
            mem = cp.cuda.malloc_managed(nbytes)
            arr = cp.ndarray(tuple(p.shape), dtype=cp.float32, memptr=mem)
            arr.fill(0)
        # __cuda_array_interface__ gives a zero-copy CUDA tensor whatever the pointer's kind
        # (DLPack would tag managed memory kDLCUDAManaged, which torch may refuse)
        t = torch.as_tensor(arr, device=torch.device("cuda", self._device))
        if t.data_ptr() != mem.ptr:
            raise AnerRuntimeError(
                "paged_adamw: torch copied the managed buffer instead of viewing it",
                code="E-PAGED-UNAVAILABLE",
            )
        self._buffers[t.data_ptr()] = (mem, arr)
        self._managed += nbytes
        return t

    def _is_managed(self, t: torch.Tensor) -> bool:
        return t.data_ptr() in self._buffers

    def _prefetch(self, t: torch.Tensor, device: int) -> None:
        """Move `t`'s pages to `device` (-1: host) in `page_bytes` chunks on the current stream."""
        if not (self._can_prefetch and self._is_managed(t)):
            return
        rt = self._cp.cuda.runtime
        stream = torch.cuda.current_stream().cuda_stream
        base, total = t.data_ptr(), t.nbytes
        try:
            for off in range(0, total, self.page_bytes):
                rt.memPrefetchAsync(base + off, min(self.page_bytes, total - off), device, stream)
        except (AttributeError, TypeError, rt.CUDARuntimeError) as exc:
            # CUDA 13 changed cudaMemPrefetchAsync's signature; without prefetch the driver
            # still migrates pages on demand, so training goes on and the report says why
            self._can_prefetch = False
            self._no_prefetch = f"; prefetch unavailable ({type(exc).__name__}: {exc})"

    def _update_group(
        self,
        group: StepGroup,
        states: list[AdamWState],
        lr: float,
        step_size: list[float],
        bias_correction2_sqrt: list[float],
    ) -> None:
        """AdamW's update with the moments' pages brought to the device first and sent back to
        the host after, both asynchronously on the current stream."""
        moments = [st.exp_avg for st in states] + [st.exp_avg_sq for st in states]
        for t in moments:
            self._prefetch(t, self._device if self.on_cuda else _CPU_DEVICE_ID)
        super()._update_group(group, states, lr, step_size, bias_correction2_sqrt)
        for t in moments:
            self._prefetch(t, _CPU_DEVICE_ID)

    def managed_bytes(self) -> int:
        return self._managed

    def report(self) -> str:
        """One line for the profile report: where the moments live and why."""
        if not self.on_cuda:
            return "paged_adamw on CPU: no CUDA managed memory, plain AdamW"
        note = self._no_prefetch
        spill = (
            f"; {self._fallback} bytes past the cap kept as device memory" if self._fallback else ""
        )
        return (
            f"paged_adamw: {self._managed} bytes of moments in CUDA managed memory "
            f"(cap {self._cap} bytes = {MANAGED_FRACTION:.0%} of free device memory), "
            f"prefetch in {self.page_bytes}-byte pages{note}{spill}"
        )


def make_optimizer(
    kind: str, params: dict[str, torch.Tensor], page_bytes: int, **kwargs: Any
) -> AdamW:
    """The optimizer a profile names, over the adapter's fp32 masters."""
    if kind == "adamw":
        return AdamW(params, **kwargs)
    if kind == "paged_adamw":
        return PagedAdamW(params, page_bytes=page_bytes, **kwargs)
    raise AnerRuntimeError(
        f"unknown optimizer {kind!r}; expected adamw or paged_adamw", code="E-OPTIMIZER"
    )
