"""The CUDA GPUs of this machine, found without torch: through the driver library itself.

`aner check` (a `device: cuda` on a machine without one) and `aner plan` (will a run fit?) ask
before anything heavy loads, so they call the CUDA driver API (`libcuda.so.1`, `nvcuda.dll`) with
ctypes: `cuInit`, `cuDeviceGetCount`, `cuDeviceGetName`, `cuDeviceTotalMem_v2`. No driver, a
failing `cuInit` (no GPU, `CUDA_VISIBLE_DEVICES=""`) or a missing entry point all mean no GPU.
The answer is computed once per process.
"""

from __future__ import annotations

import ctypes
from dataclasses import dataclass
from functools import cache

_LIBRARIES = ("libcuda.so.1", "libcuda.so", "nvcuda.dll")


@dataclass(frozen=True)
class Gpu:
    name: str
    total_bytes: int


@cache
def detect() -> tuple[Gpu, ...]:
    """Every CUDA GPU the driver reports, in its order (empty when there is none)."""
    for name in _LIBRARIES:
        try:
            lib = ctypes.CDLL(name)
        except OSError:
            continue
        try:
            return _devices(lib)
        except AttributeError:  # a driver without these entry points
            return ()
    return ()


def _devices(lib: ctypes.CDLL) -> tuple[Gpu, ...]:
    if lib.cuInit(0) != 0:
        return ()
    count = ctypes.c_int(0)
    if lib.cuDeviceGetCount(ctypes.byref(count)) != 0:
        return ()
    found = []
    for ordinal in range(count.value):
        device = ctypes.c_int(0)
        if lib.cuDeviceGet(ctypes.byref(device), ordinal) != 0:
            continue
        name = ctypes.create_string_buffer(256)
        total = ctypes.c_size_t(0)
        lib.cuDeviceGetName(name, len(name), device)
        lib.cuDeviceTotalMem_v2(ctypes.byref(total), device)
        found.append(Gpu(name.value.decode(errors="replace"), total.value))
    return tuple(found)
