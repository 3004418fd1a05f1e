"""CUDA tensor maps (TMA descriptors) for the fused kernels that copy tiles with the Tensor Memory
Accelerator, encoded by the driver's ``cuTensorMapEncodeTiled``.

Neither CuPy nor torch exposes that call (driver.py reaches it). A map is 128 opaque bytes, passed
to the kernel by value (a ``__grid_constant__`` parameter; CuPy passes a NumPy structured array as a
struct). It depends only on its arguments, so maps are cached by them: a weight's map is encoded
once, an activation's once per buffer the caching allocator hands out.
"""

from __future__ import annotations

import ctypes
from functools import lru_cache

import numpy as np

from aner_lang.problems.errors import AnerRuntimeError
from aner_lang.runtime.nf4.fused import driver

# cuda.h enumerators
_DATA_TYPE = {1: 0, 2: 1}  # element bytes -> CU_TENSOR_MAP_DATA_TYPE_UINT8 / _UINT16
_SWIZZLE_NONE, _SWIZZLE_128B = 0, 3
_INTERLEAVE_NONE, _L2_PROMOTION_256B, _OOB_FILL_ZERO = 0, 3, 0

TENSOR_MAP = np.dtype({"names": ["bits"], "formats": [(np.uint64, (16,))], "itemsize": 128})


@lru_cache(maxsize=1)
def _encode():
    u64p, u32p = ctypes.POINTER(ctypes.c_uint64), ctypes.POINTER(ctypes.c_uint32)
    return driver.function(
        "cuTensorMapEncodeTiled",
        [
            ctypes.c_void_p,
            ctypes.c_int,
            ctypes.c_uint32,
            ctypes.c_void_p,
            u64p,
            u64p,
            u32p,
            u32p,
            ctypes.c_int,
            ctypes.c_int,
            ctypes.c_int,
            ctypes.c_int,
        ],
    )


@lru_cache(maxsize=1024)
def tiled_2d(
    address: int,
    elem_bytes: int,
    cols: int,
    rows: int,
    box_cols: int,
    box_rows: int,
    swizzle_128b: bool,
) -> np.ndarray:
    """The map of a row-major [rows, cols] matrix at ``address`` (rows packed, no padding), copied
    in boxes of [box_rows, box_cols]; reads past the matrix give zeros. ``swizzle_128b`` stores each
    box row's 16-byte chunks in the 128-byte swizzle a wgmma descriptor reads."""
    out = np.zeros(1, TENSOR_MAP)
    rc = _encode()(
        out.ctypes.data,
        _DATA_TYPE[elem_bytes],
        2,
        address,
        (ctypes.c_uint64 * 2)(cols, rows),
        (ctypes.c_uint64 * 1)(cols * elem_bytes),
        (ctypes.c_uint32 * 2)(box_cols, box_rows),
        (ctypes.c_uint32 * 2)(1, 1),
        _INTERLEAVE_NONE,
        _SWIZZLE_128B if swizzle_128b else _SWIZZLE_NONE,
        _L2_PROMOTION_256B,
        _OOB_FILL_ZERO,
    )
    if rc != 0:
        raise AnerRuntimeError(
            f"cuTensorMapEncodeTiled failed with CUDA error {rc} for a {rows}x{cols} matrix "
            f"of {elem_bytes}-byte elements in {box_rows}x{box_cols} boxes",
            code="E-KERNEL-LAUNCH",
        )
    out.flags.writeable = False
    return out
