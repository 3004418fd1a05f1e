"""Kernel launches that may overlap the end of the kernel before them on the stream
(programmatic dependent launch), through the driver's ``cuLaunchKernelEx``.

Between two back-to-back kernels a Hopper GPU idles for about 1.5 us: the next grid is launched
only once the last block of the previous one has finished. Launched with the
programmatic-stream-serialization attribute, a kernel's blocks are scheduled as soon as every
block of the previous kernel has signalled (``griddepcontrol.launch_dependents``) or exited, and
the kernel itself holds them (``griddepcontrol.wait``, the first thing the TMA GEMM does) until
that kernel has completed and its writes are visible. So the result is the same as an ordinary
launch; only the launch latency is hidden. CUDA graphs capture the relation as a programmatic
edge. CuPy's launch takes no attribute list, hence the driver's own call (driver.py).
"""

from __future__ import annotations

import ctypes
from functools import lru_cache

import numpy as np

from aner_lang.problems.errors import AnerRuntimeError
from aner_lang.runtime.nf4.fused import driver

_PROGRAMMATIC_STREAM_SERIALIZATION = 6  # CUlaunchAttributeID


class _Attribute(ctypes.Structure):  # CUlaunchAttribute: id, padding to 8 bytes, a 64-byte union
    _fields_ = [("id", ctypes.c_int), ("pad", ctypes.c_char * 4), ("value", ctypes.c_int * 16)]


class _Config(ctypes.Structure):  # CUlaunchConfig
    _fields_ = [
        ("grid", ctypes.c_uint * 3),
        ("block", ctypes.c_uint * 3),
        ("shared_bytes", ctypes.c_uint),
        ("stream", ctypes.c_void_p),
        ("attrs", ctypes.POINTER(_Attribute)),
        ("num_attrs", ctypes.c_uint),
    ]


@lru_cache(maxsize=1)
def _launch_kernel_ex():
    return driver.function(
        "cuLaunchKernelEx",
        [
            ctypes.POINTER(_Config),
            ctypes.c_void_p,
            ctypes.POINTER(ctypes.c_void_p),
            ctypes.c_void_p,
        ],
    )


def launch(
    function: int, grid: tuple[int, ...], block: int, shared_bytes: int, stream: int, args: list
) -> None:
    """Launch the CUfunction ``function`` on ``stream`` (raw handles) with programmatic stream
    serialization. ``args`` are the kernel's parameters as CuPy takes them: NumPy scalars and
    structured arrays (a tensor map), each passed by value."""
    values = [np.ascontiguousarray(a) for a in args]  # kept alive until the call returns
    params = (ctypes.c_void_p * len(values))(*(v.ctypes.data for v in values))
    attr = _Attribute(id=_PROGRAMMATIC_STREAM_SERIALIZATION)
    attr.value[0] = 1
    dims = (*grid, 1, 1)[:3]
    config = _Config(
        (ctypes.c_uint * 3)(*dims),
        (ctypes.c_uint * 3)(block, 1, 1),
        shared_bytes,
        stream,
        ctypes.pointer(attr),
        1,
    )
    rc = _launch_kernel_ex()(ctypes.byref(config), function, params, None)
    if rc != 0:
        raise AnerRuntimeError(
            f"cuLaunchKernelEx failed with CUDA error {rc} (grid {dims}, block {block}, "
            f"{shared_bytes} bytes of shared memory)",
            code="E-KERNEL-LAUNCH",
        )
