"""The fused kernels' source, identity and caches, checked where no GPU is needed.

NVRTC compiles for a named architecture without a GPU, so a broken kernel source fails here, on
any machine with CuPy's NVRTC, before device time is spent. On a machine without CUDA,
``kernel: fused`` must fail with one clear error.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

from aner_lang.problems.errors import AnerRuntimeError
from aner_lang.runtime.nf4.fused import compiler

torch = pytest.importorskip("torch")


def test_identity_names_source_options_arch_and_precision() -> None:
    ident = compiler.kernel_identity("sm_90", "bfloat16")
    assert ident.startswith("aner.nf4.cuda.fused/1;")
    assert f";source_sha256={compiler.NF4.sha256()};" in ident
    assert ";arch=sm_90;" in ident and ";compute=bfloat16;" in ident and "--std=c++17" in ident
    assert compiler.kernel_identity("sm_90", "float32") != ident
    with pytest.raises(AnerRuntimeError, match="no precision profile 'tf32'"):
        compiler.kernel_identity("sm_90", "tf32")


def test_disk_cache_keys_name_the_nvrtc_version_and_live_in_aners_cache(
    tmp_path, monkeypatch
) -> None:
    """A cubin is found again only for the same source, architecture and NVRTC version: another
    NVRTC (a CUDA upgrade) or another architecture compiles anew into another file. The cache
    lives in `kernels` under Aner's cache folder unless ANER_KERNEL_CACHE names one."""
    monkeypatch.delenv("ANER_KERNEL_CACHE", raising=False)
    monkeypatch.setenv("ANER_CACHE_DIR", str(tmp_path))
    compiled: list[tuple[str, str]] = []
    version = ["13.0"]
    monkeypatch.setattr(compiler, "nvrtc_version", lambda: version[0])

    def fake_compile(arch: str, source: compiler.KernelSource) -> bytes:
        assert source in compiler.NF4.part_sources()
        compiled.append((arch, version[0]))
        return f"cubin {arch} {version[0]} {source.defines}".encode()

    monkeypatch.setattr(compiler, "compile_cubin", fake_compile)
    first = compiler.cubin_paths("sm_90a")
    assert len(set(first)) == compiler.NF4.parts == 8 and len(compiled) == 8
    assert {p.parent for p in first} == {tmp_path / "kernels"}
    assert compiler.cubin_paths("sm_90a") == first and len(compiled) == 8  # from the disk
    version[0] = "13.1"
    upgraded = compiler.cubin_paths("sm_90a")
    other_arch = compiler.cubin_paths("sm_80")
    assert len({*first, *upgraded, *other_arch}) == 24
    assert sorted(compiled) == sorted(
        [("sm_90a", "13.0")] * 8 + [("sm_90a", "13.1")] * 8 + [("sm_80", "13.1")] * 8
    )
    assert upgraded[0].read_bytes() == b"cubin sm_90a 13.1 ('-DANER_PART=0',)"
    assert first[7].read_bytes() == b"cubin sm_90a 13.0 ('-DANER_PART=7',)"
    monkeypatch.setenv("ANER_KERNEL_CACHE", str(tmp_path / "mine"))
    assert compiler.cubin_paths("sm_80")[0].parent == tmp_path / "mine"


@pytest.mark.skipif(importlib.util.find_spec("cupy_backends") is None, reason="needs CuPy's NVRTC")
def test_source_compiles_for_hopper_and_is_cached_on_disk(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("ANER_KERNEL_CACHE", str(tmp_path))
    try:
        paths = compiler.cubin_paths("sm_90")
    except OSError as exc:  # CuPy present but no NVRTC library on this machine
        pytest.skip(f"NVRTC not loadable: {exc}")
    cubin = b"".join(path.read_bytes() for path in paths)
    assert all(p.read_bytes()[:4] == b"\x7fELF" and p.parent == tmp_path for p in paths)
    for name in (
        "nf4_dequant_bf16",
        "nf4_gemv_f32_m16",
        "nf4_mma_fwd_bf16_m16",
        "nf4_mma_bwd_f16_m8",
        "nf4_wgmma_fwd_bf16_m128",
    ):
        assert name.encode() in cubin
    monkeypatch.setattr(
        compiler, "compile_cubin", lambda *_: pytest.fail("recompiled despite the disk cache")
    )
    assert compiler.cubin_paths("sm_90") == paths


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the behaviour without CUDA")
def test_fused_without_cuda_is_a_clear_error() -> None:
    from aner_lang.runtime.nf4.fused.availability import require_fused, unavailable_reason

    assert "no CUDA GPU" in unavailable_reason()
    with pytest.raises(AnerRuntimeError, match="kernel: fused needs a CUDA GPU") as err:
        require_fused()
    assert err.value.code == "E-KERNEL-UNAVAILABLE"


def _nvrtc_check():
    """tools/nvrtc_check.py (a script, not a package module), loaded by path."""
    path = Path(__file__).resolve().parents[4] / "tools" / "nvrtc_check.py"
    spec = importlib.util.spec_from_file_location("nvrtc_check", path)
    module = sys.modules.setdefault("nvrtc_check", importlib.util.module_from_spec(spec))
    spec.loader.exec_module(module)  # registered first: its dataclasses look their module up
    return module


@pytest.mark.slow  # NVRTC compiles every kernel on the CPU: ~30 s
def test_kernels_build_for_hopper_without_spills_or_serialized_wgmma() -> None:
    """Compiled as on the GPU machine (sm_90a, ptxas -v) with the pip NVRTC: every kernel builds,
    none spills registers, and ptxas keeps the wgmma pipeline asynchronous (an earlier version
    whose second unrolled step ran under an `if` had all its wgmmas serialized, which shows only
    as a C75xx note). Other architectures build too, with the wgmma kernels empty."""
    check = _nvrtc_check()
    lib = check.library()
    if lib is None:
        pytest.skip("nvidia-cuda-nvrtc is not installed")
    report = check.compile_report(lib, "sm_90a")
    assert report.ok, report.log[-3000:]
    assert {
        "nf4_dequant_bf16",
        "nf4_mma_fwd_bf16_m16",
        "nf4_mma_bwd_f16_m8",
        "nf4_wgmma_fwd_bf16_m128",
        "nf4_wgmma_fwd_f16_m256",
        "nf4_ws_fwd_bf16_m128",
        "nf4_ws_fwd_f16_m64",
        "nf4_tma_fwd_bf16_m256_r64",
        "nf4_tma_fwd_f16_m128_r128",
        "nf4_tma_fwd_bf16_m256_r128_k2",
    } <= set(report.registers)
    assert report.serialized == []
    assert {k: v for k, v in report.spills.items() if v} == {}
    assert check.compile_report(lib, "sm_80").ok


@pytest.mark.slow  # NVRTC compiles every kernel twice on the CPU: ~60 s
def test_the_parts_hold_every_kernel_once_with_the_whole_programs_machine_code() -> None:
    """The NF4 source compiled in parts (concurrently, on a machine without a kernel cache) gives
    each kernel the machine code the whole program gives it, byte for byte, and every kernel is
    in exactly one part: the parts change how long a cold start compiles, never what runs."""
    check = _nvrtc_check()
    lib = check.library()
    if lib is None:
        pytest.skip("nvidia-cuda-nvrtc is not installed")
    whole = check.kernel_code(check.compile_cubin(lib, "sm_90a", compiler.NF4))
    parts = [check.kernel_code(check.compile_cubin(lib, "sm_90a", part))
             for part in compiler.NF4.part_sources()]  # fmt: skip
    assert all(parts) and sum(len(p) for p in parts) == len(whole) > 40
    assert {k: v for part in parts for k, v in part.items()} == whole


@pytest.mark.slow  # NVRTC compiles every kernel on the CPU: ~30 s
def test_ggml_kernels_build_for_every_block_type_without_spills() -> None:
    """The GGUF block kernels (`runtime/ggml/kernels/ggml.cu`), one module per block type, build
    for Hopper as the GPU machine builds them, every entry point there, no register spilled; a
    source without a block type's define is a compile error, not an empty module."""
    from aner_lang.runtime.ggml import fused
    from aner_lang.runtime.io.ggml_blocks import DEQUANTIZERS

    check = _nvrtc_check()
    lib = check.library()
    if lib is None:
        pytest.skip("nvidia-cuda-nvrtc is not installed")
    names = {f"ggml_dequant_{d}" for d in ("f32", "f16", "bf16")} | {
        f"ggml_{op}_{d}_m{m}"
        for op in ("gemv", "bwd")
        for d in ("f32", "f16", "bf16")
        for m in (1, 2, 4, 8, 16)
    }
    for qtype in sorted(DEQUANTIZERS):
        report = check.compile_report(lib, "sm_90a", fused.source(qtype))
        assert report.ok, (qtype, report.log[-3000:])
        assert set(report.registers) == names, qtype
        assert {k: v for k, v in report.spills.items() if v} == {}, qtype
    assert not check.compile_report(lib, "sm_90a", fused.SOURCE).ok
