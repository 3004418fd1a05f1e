"""Run-time compilation of the project's CUDA kernels with NVRTC (through CuPy), and their caches.

Two sources are compiled here (`KernelSource`): the fused NF4 kernels (`NF4`) and the GGML block
kernels of `storage: gguf` (`runtime.ggml.fused`, one module per block type, so a run compiles
only the types its file holds). NVRTC compiles one program on one core, and the NF4 source takes
it ~25 s: on a machine without a kernel cache that was most of a run's start. So a source may
come in `parts`, each the same text with `-DANER_PART=k` keeping only some entry points; the parts
compile as concurrent NVRTC programs (threads: NVRTC releases the GIL) and load as one module per
part. Each kernel's machine code is the same as in the whole program: the parts share every
helper, and ptxas compiles each entry point on its own (tests/runtime/nf4/fused compares the
kernels' code sections byte for byte). A compiled module is identified by its *kernel identity
string*: the sha256 of the CUDA source, the NVRTC options, the target architecture and the
precision profile. Profiles and checkpoints
record it, so a result can be traced to the exact machine code that produced it. Modules are
cached twice: per process (a dict, so a second layer costs nothing) and on disk (a cubin named by
the sha256 of the module's identity, so a second process skips NVRTC; that identity also names
the NVRTC version, since another compiler makes other machine code from the same source). Writes
to the disk cache are atomic (temporary file + rename), so concurrent processes never read half
a cubin.
"""

from __future__ import annotations

import hashlib
import os
import tempfile
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from importlib import resources
from pathlib import Path
from typing import Any

from aner_lang.host.process_clock import timed
from aner_lang.problems.errors import AnerRuntimeError
from aner_lang.runtime.io.fingerprint import cache_dir as aner_cache_dir

# No --use_fast_math: the dequantized weights must be the exact fp32 products host_tiled computes.
OPTIONS: tuple[str, ...] = ("--std=c++17", "-default-device")
PRECISIONS = ("float32", "float16", "bfloat16")


@dataclass(frozen=True)
class KernelSource:
    """A CUDA source shipped as package data (`kernels/<name>` in `package`), compiled with
    `OPTIONS` plus its own `defines` (``-D`` options: one module per set) and named `label` in
    its module identity; with `parts` above 1, compiled as that many programs (`part_sources`)."""

    package: str
    name: str
    label: str
    defines: tuple[str, ...] = field(default=())
    parts: int = 1

    def part_sources(self) -> list[KernelSource]:
        """The programs that make up this source's module: itself, or one per part, each with
        ``-DANER_PART=k`` (the source keeps only part k's entry points then)."""
        if self.parts == 1:
            return [self]
        return [
            replace(self, defines=(*self.defines, f"-DANER_PART={k}"), parts=1)
            for k in range(self.parts)
        ]

    def text(self) -> str:
        return resources.files(self.package).joinpath("kernels", self.name).read_text("utf-8")

    def sha256(self) -> str:
        return hashlib.sha256(self.text().encode("utf-8")).hexdigest()

    def options(self) -> tuple[str, ...]:
        return (*OPTIONS, *self.defines)


NF4 = KernelSource(__package__ or "aner_lang.runtime.nf4.fused", "nf4.cu", "nf4-fused", parts=8)
"""The fused NF4 kernels (kernels/nf4.cu, in the eight parts its `PART` guards name)."""


def nvrtc_version() -> str:
    """The version of the NVRTC that compiles here (``13.0``)."""
    from cupy_backends.cuda.libs import nvrtc

    major, minor = nvrtc.getVersion()
    return f"{major}.{minor}"


def module_identity(arch: str, nvrtc: str, source: KernelSource = NF4) -> str:
    """What the compiled module depends on: source, options, architecture (``sm_90``) and the
    NVRTC version."""
    return (
        f"{source.label} src=sha256:{source.sha256()} opts={' '.join(source.options())} "
        f"arch={arch} nvrtc={nvrtc}"
    )


def kernel_identity(arch: str, precision: str) -> str:
    """The identity string runs and checkpoints record for inputs of one precision: the source's
    sha256, the compile options, the architecture and the arithmetic (compute dtype, fp32
    accumulation), in the form of the reference system's `aner.nf4.cuda.fused/1;...`."""
    if precision not in PRECISIONS:
        raise AnerRuntimeError(
            f"fused kernels have no precision profile '{precision}'",
            code="E-KERNEL-PRECISION",
            notes=(f"expected one of {', '.join(PRECISIONS)}",),
        )
    return (
        f"aner.nf4.cuda.fused/1;source_sha256={NF4.sha256()};options={' '.join(OPTIONS)};"
        f"arch={arch};compute={precision};accumulate=float32"
    )


def cache_dir() -> Path:
    """Where cubins are kept across processes: ``kernels`` in Aner's cache folder
    (``ANER_KERNEL_CACHE`` overrides)."""
    env = os.environ.get("ANER_KERNEL_CACHE")
    return Path(env) if env else aner_cache_dir() / "kernels"


def compile_cubin(arch: str, source: KernelSource = NF4) -> bytes:
    """Compile ``source`` for ``arch`` with NVRTC; a compile error becomes a clear AnerRuntimeError."""
    from cupy_backends.cuda.libs import nvrtc

    prog = nvrtc.createProgram(source.text(), source.name, [], [])
    try:
        try:
            nvrtc.compileProgram(prog, [*source.options(), f"--gpu-architecture={arch}"])
        except nvrtc.NVRTCError as exc:
            log = nvrtc.getProgramLog(prog)
            raise AnerRuntimeError(
                f"NVRTC could not compile {source.name} for {arch}: {exc}",
                code="E-KERNEL-COMPILE",
                notes=tuple(log.splitlines()[-20:]),
            ) from None
        return nvrtc.getCUBIN(prog)
    finally:
        nvrtc.destroyProgram(prog)


def target_arch(capability: str) -> str:
    """The NVRTC target for a compute capability such as "90": Hopper gets the arch-specific
    ``sm_90a``, which the wgmma kernels need; elsewhere those kernels compile empty and the
    Python side never launches them (``CompiledModule.has_wgmma``)."""
    return f"sm_{capability}a" if capability == "90" else f"sm_{capability}"


def cubin_paths(arch: str, source: KernelSource = NF4) -> list[Path]:
    """The on-disk cubins of ``source``'s parts for ``arch``, those not there compiled now,
    concurrently."""
    parts = source.part_sources()
    if len(parts) == 1:
        return [cubin_path(arch, parts[0])]
    with ThreadPoolExecutor(max_workers=min(len(parts), os.cpu_count() or 1)) as pool:
        return list(pool.map(lambda part: cubin_path(arch, part), parts))


def cubin_path(arch: str, source: KernelSource) -> Path:
    """The on-disk cubin of one program ``source`` for ``arch``, compiled and written now if it is
    not there."""
    ident = module_identity(arch, nvrtc_version(), source)
    path = cache_dir() / f"{hashlib.sha256(ident.encode()).hexdigest()}.cubin"
    if not path.exists():
        cubin = compile_cubin(arch, source)
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, suffix=".tmp")
        with os.fdopen(fd, "wb") as fh:
            fh.write(cubin)
        os.replace(tmp, path)
    return path


@dataclass
class CompiledModule:
    """One loaded source: its identity, where its parts' cubins live, the loaded module of each
    part, and its kernels by name."""

    arch: str
    identity: str
    paths: list[Path]
    modules: list[Any]
    _functions: dict[str, Any]

    @property
    def has_wgmma(self) -> bool:
        """Whether the warpgroup-MMA kernels were compiled with bodies (Hopper's sm_90a)."""
        return self.arch == "sm_90a"

    def function(self, name: str, shared_bytes: int = 0) -> Any:
        """A kernel by name; ``shared_bytes`` of dynamic shared memory above the default 48 KB
        limit are allowed once, when the kernel is first looked up."""
        fn = self._functions.get(name)
        if fn is None:
            fn = self._functions[name] = _find(self.modules, name)
            if shared_bytes > 48 * 1024:
                fn.max_dynamic_shared_size_bytes = shared_bytes
        return fn


_MODULES: dict[tuple[int, KernelSource], CompiledModule] = {}


def load(device_index: int, source: KernelSource = NF4) -> CompiledModule:
    """The compiled module of ``source`` for a CUDA device, from the process cache (a dict lookup:
    this runs on every launch), the disk cache or NVRTC."""
    mod = _MODULES.get((device_index, source))
    if mod is None:
        import cupy

        with cupy.cuda.Device(device_index):
            arch = target_arch(cupy.cuda.Device(device_index).compute_capability)  # e.g. "sm_90a"
            with timed("kernel_build"):  # NVRTC where the disk cache has no cubin
                paths = cubin_paths(arch, source)
                mod = _MODULES[(device_index, source)] = CompiledModule(
                    arch,
                    module_identity(arch, nvrtc_version(), source),
                    paths,
                    [cupy.RawModule(path=str(path)) for path in paths],
                    {},
                )
    return mod


def _find(modules: list[Any], name: str) -> Any:
    """The kernel `name` from the one of `modules` (CuPy RawModules) that holds it."""
    import cupy

    for module in modules[:-1]:
        try:
            return module.get_function(name)
        except cupy.cuda.driver.CUDADriverError:  # not in this part
            continue
    return modules[-1].get_function(name)
