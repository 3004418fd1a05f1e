"""Compile the project's CUDA kernels without a GPU and report what the compiler says about them.

NVRTC needs no GPU: with the `nvidia-cuda-nvrtc` wheel (a dev dependency) this compiles the
package's CUDA source exactly as the GPU machine does (same options; sm_90a for Hopper), and
reports per kernel the registers, spills and ptxas's wgmma serialization warnings (C75xx), which
cost device time to discover otherwise.

    python tools/nvrtc_check.py [--arch sm_90a] [--ggml Q4_K]   # NF4, or one GGUF block type
    python tools/nvrtc_check.py --time-parts   # NF4 compiled whole and in parts, timed

CuPy's NVRTC binding would need CuPy, which installs only on CUDA machines; this calls the
library through ctypes instead.
"""

from __future__ import annotations

import argparse
import ctypes
import os
import re
import struct
import sys
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path

from aner_lang.runtime.nf4.fused import compiler


@dataclass
class Report:
    ok: bool
    log: str
    registers: dict[str, int] = field(default_factory=dict)
    spills: dict[str, int] = field(default_factory=dict)  # kernel -> spill store bytes
    serialized: list[str] = field(default_factory=list)  # kernels whose wgmmas ptxas serialized


def library() -> ctypes.CDLL | None:
    """libnvrtc from the installed nvidia-cuda-nvrtc wheel (None where it is not installed). Its
    builtins library is loaded first, by path, so NVRTC finds it without LD_LIBRARY_PATH."""
    try:
        files = metadata.distribution("nvidia-cuda-nvrtc").files or []
    except metadata.PackageNotFoundError:
        return None
    libs = {
        Path(str(f)).name: Path(str(metadata.distribution("nvidia-cuda-nvrtc").locate_file(f)))
        for f in files
        if ".so" in str(f)
    }
    main = next((p for n, p in libs.items() if re.fullmatch(r"libnvrtc\.so\.\d+", n)), None)
    builtins = next(
        (p for n, p in libs.items() if re.fullmatch(r"libnvrtc-builtins\.so\.[\d.]+", n)), None
    )
    if main is None or builtins is None:
        return None
    ctypes.CDLL(str(builtins), mode=ctypes.RTLD_GLOBAL)
    return ctypes.CDLL(str(main))


@contextmanager
def _compiled(
    lib: ctypes.CDLL, arch: str, source: compiler.KernelSource, *extra: str
) -> Iterator[tuple[ctypes.c_void_p, int]]:
    """An NVRTC program of ``source`` compiled for ``arch`` with the package's options and
    ``extra``, and NVRTC's result code; the program is destroyed on leaving."""
    prog = ctypes.c_void_p()
    src = source.text().encode()
    if lib.nvrtcCreateProgram(ctypes.byref(prog), src, source.name.encode(), 0, None, None):
        raise RuntimeError("nvrtcCreateProgram failed")
    try:
        opts = [o.encode() for o in (*source.options(), f"--gpu-architecture={arch}", *extra)]
        yield prog, lib.nvrtcCompileProgram(prog, len(opts), (ctypes.c_char_p * len(opts))(*opts))
    finally:
        lib.nvrtcDestroyProgram(ctypes.byref(prog))


def _output(lib: ctypes.CDLL, prog: ctypes.c_void_p, what: str) -> bytes:
    """A compiled program's `what` (``ProgramLog``, ``CUBIN``): NVRTC gives its size, then it."""
    size = ctypes.c_size_t()
    getattr(lib, f"nvrtcGet{what}Size")(prog, ctypes.byref(size))
    buf = ctypes.create_string_buffer(size.value)
    getattr(lib, f"nvrtcGet{what}")(prog, buf)
    return buf.raw


def compile_report(
    lib: ctypes.CDLL, arch: str = "sm_90a", source: compiler.KernelSource = compiler.NF4
) -> Report:
    """Compile ``source`` for ``arch`` with the package's options plus ptxas -v."""
    with _compiled(lib, arch, source, "--ptxas-options=-v") as (prog, rc):
        log = _output(lib, prog, "ProgramLog").split(b"\0", 1)[0].decode(errors="replace")
    report = Report(ok=rc == 0, log=log)
    kernel = None
    for line in log.splitlines():
        if m := re.search(r"Compiling entry function '(\w+)'", line):
            kernel = m.group(1)
        elif (m := re.search(r"(\d+) bytes spill stores", line)) and kernel:
            report.spills[kernel] = int(m.group(1))
        elif (m := re.search(r"Used (\d+) registers", line)) and kernel:
            report.registers[kernel] = int(m.group(1))
        if m := re.search(r"\(C75\d\d\).*serialized.*function '(\w+)'", line):
            report.serialized.append(m.group(1))
    return report


def compile_cubin(
    lib: ctypes.CDLL, arch: str = "sm_90a", source: compiler.KernelSource = compiler.NF4
) -> bytes:
    """The cubin of one program ``source`` for ``arch``, compiled as the GPU machine does."""
    with _compiled(lib, arch, source) as (prog, rc):
        if rc:
            raise RuntimeError(f"{source.name} {source.defines} does not compile for {arch}")
        return _output(lib, prog, "CUBIN")


def kernel_code(cubin: bytes) -> dict[str, bytes]:
    """Each kernel's machine code in a cubin (an ELF64 file): its `.text.<kernel>` section's
    bytes, by kernel name. The section table is read directly (a few fixed-layout records)
    rather than through an ELF library the project would otherwise not need."""
    (table,) = struct.unpack_from("<Q", cubin, 0x28)
    entry, count, names = struct.unpack_from("<HHH", cubin, 0x3A)
    # Elf64_Shdr: name, type, flags, addr, offset, size, link, info, addralign, entsize
    headers = [struct.unpack_from("<IIQQQQIIQQ", cubin, table + i * entry) for i in range(count)]
    strings = headers[names][4]

    def name(offset: int) -> str:
        end = cubin.index(b"\0", strings + offset)
        return cubin[strings + offset : end].decode()

    code = {}
    for h in headers:
        section = name(h[0])
        if section.startswith(".text."):
            code[section.removeprefix(".text.")] = cubin[h[4] : h[4] + h[5]]
    return code


def time_parts(lib: ctypes.CDLL, arch: str, repeats: int = 2) -> None:
    """Print the wall seconds of the NF4 source compiled as one program and as its parts, one
    thread each (as `compiler.cubin_paths` compiles them), `repeats` times."""
    parts = compiler.NF4.part_sources()
    for repeat in range(1, repeats + 1):
        began = time.perf_counter()
        compile_cubin(lib, arch, compiler.NF4)
        whole = time.perf_counter() - began
        began = time.perf_counter()
        with ThreadPoolExecutor(max_workers=len(parts)) as pool:
            list(pool.map(lambda part: compile_cubin(lib, arch, part), parts))
        split = time.perf_counter() - began
        print(f"repeat {repeat}: whole {whole:.1f} s, {len(parts)} parts at once {split:.1f} s "
              f"({os.cpu_count()} cores)", flush=True)  # fmt: skip


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--arch", default="sm_90a")
    ap.add_argument("--ggml", metavar="QTYPE", help="the GGUF block kernels of one type (Q4_K...)")
    ap.add_argument("--time-parts", action="store_true",
                    help="wall seconds of the NF4 source compiled whole and in its parts at once, "
                         "twice (what a machine without a kernel cache waits for)")  # fmt: skip
    args = ap.parse_args()
    lib = library()
    if lib is None:
        print("nvidia-cuda-nvrtc is not installed (pip install -e '.[dev]')", file=sys.stderr)
        return 2
    if args.time_parts:
        time_parts(lib, args.arch)
        return 0
    if args.ggml:
        from aner_lang.runtime.ggml.fused import source

        r = compile_report(lib, args.arch, source(args.ggml))
    else:
        r = compile_report(lib, args.arch)
    if not r.ok:
        print(r.log, file=sys.stderr)
        return 1
    for name in sorted(r.registers):
        print(
            f"{name:40s} {r.registers[name]:4d} registers  {r.spills.get(name, 0):4d} spill bytes"
            + ("  WGMMA SERIALIZED" if name in r.serialized else "")
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
