"""Launching the project's NVRTC kernels (`compiler`) on torch's current CUDA stream.

Kernels read and write torch tensors by pointer (`ptr`) and run in torch's stream order, so a
launch never synchronises the host and can be captured in a CUDA graph.
"""

from __future__ import annotations

from contextlib import nullcontext
from functools import cache

import numpy as np
import torch

from aner_lang.runtime.nf4.fused import compiler, programmatic


def ptr(t: torch.Tensor) -> np.uint64:
    """A tensor's device pointer as a kernel argument."""
    return np.uint64(t.data_ptr())


def device_index(device: torch.device) -> int:
    return device.index if device.index is not None else torch.cuda.current_device()


@cache
def sm_count(index: int) -> int:
    """Multiprocessors of CUDA device `index` (the kernels size their grids by it)."""
    return torch.cuda.get_device_properties(index).multi_processor_count


DT_NAME = {torch.float16: "f16", torch.bfloat16: "bf16", torch.float32: "f32"}
"""The dtype part of a kernel's name."""


def token_bucket(m: int) -> int:
    """The few-token kernels' compiled row count that holds `m` (<= 16) rows."""
    return next(b for b in (1, 2, 4, 8, 16) if m <= b)


def aligned_rows(t: torch.Tensor, width: int) -> torch.Tensor:
    """``t`` as a contiguous [rows, width] matrix whose start is 16-byte aligned (the kernels read
    it with 16-byte loads; a view into a larger tensor may start anywhere)."""
    t = t.reshape(-1, width).contiguous()
    return t if t.data_ptr() % 16 == 0 else t.clone()


_STREAMS: dict[int, object] = {}


class _StreamHandle:
    """A raw CUDA stream in the CUDA stream protocol, which CuPy's ``Stream.from_external`` takes."""

    def __init__(self, handle: int) -> None:
        self.handle = handle

    def __cuda_stream__(self) -> tuple[int, int]:
        return (0, self.handle)


def _stream(index: int):
    """CuPy's handle on torch's current stream of device ``index`` (one per raw stream). The raw
    handle comes from torch's C accessor: ``torch.cuda.current_stream`` builds a Python Stream
    object per call, a measurable share of a launch."""
    import cupy

    handle = torch._C._cuda_getCurrentRawStream(index)
    stream = _STREAMS.get(handle)
    if stream is None:
        stream = _STREAMS[handle] = cupy.cuda.Stream.from_external(_StreamHandle(handle))
    return stream


def launch(
    device: torch.device,
    name: str,
    grid: tuple[int, ...],
    block: int,
    args: list,
    shared_bytes: int = 0,
    overlapping: bool = False,
    source: compiler.KernelSource = compiler.NF4,
) -> None:
    """Launch kernel ``name`` of ``source`` on torch's current stream; ``overlapping`` (a kernel
    that starts with griddepcontrol.wait) lets its blocks be scheduled while the previous kernel
    finishes (programmatic.launch)."""
    import cupy

    index = device_index(device)
    stream = _stream(index)
    # A kernel's first lookup loads the module on CuPy's current device: make it ``index`` where it
    # is not already (entering the context costs host time on every launch).
    with nullcontext() if cupy.cuda.runtime.getDevice() == index else cupy.cuda.Device(index):
        fn = compiler.load(index, source).function(name, shared_bytes)
        if overlapping:
            programmatic.launch(fn.kernel.ptr, grid, block, shared_bytes, stream.ptr, args)
        else:
            fn(grid, (block,), tuple(args), stream=stream, shared_mem=shared_bytes)
