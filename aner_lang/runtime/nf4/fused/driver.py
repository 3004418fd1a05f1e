"""Entry points of the CUDA driver library that neither CuPy nor torch exposes (tensor maps,
launches with attributes), reached through ctypes in the libcuda the CUDA runtime already loaded."""

from __future__ import annotations

import ctypes
from typing import Any

from aner_lang.problems.errors import AnerRuntimeError


def function(name: str, argtypes: list[type]) -> Any:
    """The driver function ``name`` returning a CUresult (int), with ``argtypes`` set; a clear
    error where the driver lacks it."""
    try:
        fn = getattr(ctypes.CDLL("libcuda.so.1"), name)
    except (OSError, AttributeError) as exc:
        raise AnerRuntimeError(
            f"the CUDA driver has no {name}: {exc}",
            code="E-KERNEL-UNAVAILABLE",
            notes=("TMA kernels need a CUDA 12+ driver",),
        ) from None
    fn.restype = ctypes.c_int
    fn.argtypes = argtypes
    return fn
