"""The ctypes mirrors of the driver's launch structures (programmatic.py) have cuda.h's layout: a
wrong offset would hand cuLaunchKernelEx a garbage stream or attribute list, not raise."""

from __future__ import annotations

import ctypes

from aner_lang.runtime.nf4.fused import programmatic


def test_launch_attribute_layout() -> None:
    # CUlaunchAttribute: CUlaunchAttributeID id; char pad[8 - sizeof(id)]; CUlaunchAttributeValue value (64 bytes)
    assert ctypes.sizeof(programmatic._Attribute) == 72
    assert programmatic._Attribute.value.offset == 8


def test_launch_config_layout() -> None:
    # CUlaunchConfig: 3 + 3 grid/block dims, sharedMemBytes, CUstream hStream, CUlaunchAttribute *attrs, numAttrs
    cfg = programmatic._Config
    assert (cfg.shared_bytes.offset, cfg.stream.offset, cfg.attrs.offset, cfg.num_attrs.offset) == (
        24,
        32,
        40,
        48,
    )
    assert ctypes.sizeof(cfg) == 56
