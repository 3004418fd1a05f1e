"""The fused NF4 kernels against the reference NF4 dequantization and float64 matmuls.

Weights come from `quantize_nf4` (byte-identical to bitsandbytes, checked in the NF4 tests), and
the reference is the CPU dequantization host_tiled uses, so the dequantize kernel must match it
bit for bit. Every input is fresh random data; outputs are checked finite and against float64, so
an unwritten element (torch.empty garbage) fails.
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

pytestmark = pytest.mark.cuda

if not torch.cuda.is_available():
    pytest.skip("needs a CUDA GPU", allow_module_level=True)
pytest.importorskip("cupy")

from aner_lang.runtime.model import chunking, dense_matmul  # noqa: E402
from aner_lang.runtime.nf4.fused import compiler, ops  # noqa: E402
from aner_lang.runtime.nf4.fused.backend import nf4_tensors  # noqa: E402
from aner_lang.runtime.nf4.quant import block_absmax, dequantize_nf4, nf4_code, quantize_nf4  # noqa: E402

DTYPES = [torch.float32, torch.float16, torch.bfloat16]
# Relative Frobenius error of the result vs a float64 matmul over the same dequantized weight:
# fp32 accumulates exactly enough to land far under 1e-4; half-precision operands ~1e-3.
BOUND = {torch.float32: 1e-5, torch.float16: 4e-3, torch.bfloat16: 1.5e-2}


def random_nf4(n: int, k: int, seed: int):
    gen = torch.Generator().manual_seed(seed)
    return quantize_nf4(torch.randn(n, k, generator=gen) * 0.05)


def quantized(n: int, k: int, seed: int) -> tuple[ops.NF4Tensors, torch.Tensor]:
    """A random weight quantized by our bitsandbytes-compatible quantizer, with its fp32
    dequantization by the reference (CPU) code that host_tiled uses."""
    q = random_nf4(n, k, seed)
    return nf4_tensors(q.to("cuda")), dequantize_nf4(q).cuda()


def code_rounded_weight(n: int, k: int, seed: int, dtype: torch.dtype) -> torch.Tensor:
    """The small-token kernels' operands in float64: each NF4 code rounded to ``dtype``, times its
    block's fp32 absmax (they scale per-block partial sums instead of each weight)."""
    q = random_nf4(n, k, seed)
    raw = q.packed.long()
    codes = nf4_code()[torch.stack((raw >> 4, raw & 15), -1).reshape(-1)].to(dtype).double()
    scales = block_absmax(q, 0, q.numel // q.blocksize).double()
    return (codes.view(-1, q.blocksize) * scales[:, None]).view(n, k).cuda()


def rel_err(out: torch.Tensor, ref: torch.Tensor) -> float:
    assert torch.isfinite(out).all(), "unwritten or non-finite output"
    return ((out.double() - ref).norm() / ref.norm()).item()


@pytest.mark.parametrize("dtype", DTYPES)
def test_dequantize_is_bit_identical_to_reference(dtype: torch.dtype) -> None:
    w, ref = quantized(1536, 576, seed=1)
    out = ops.dequantize(w, dtype)
    assert out.dtype == dtype and out.shape == (1536, 576)
    assert torch.equal(out, ref.to(dtype))


SHAPES = [(576, 576), (1536, 576), (4096, 1024), (250, 4160), (259, 576)]  # 259: an odd vocabulary


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("n,k", [(4096, 1024), (250, 4160)])
@pytest.mark.parametrize("sliced", [False, True], ids=["whole", "sliced"])
def test_many_token_dequant_path(
    dtype: torch.dtype, n: int, k: int, sliced: bool, monkeypatch
) -> None:
    """The dequantize + cuBLAS path (float32, GPUs without wgmma, every many-token backward), with
    float32 outputs from half-precision operands, and a partial-row dequantization. `sliced`: the
    weight is larger than the dequantization limit (here 96 rows), so it goes in row slices (the
    last one shorter) and the reused buffer never holds more than one slice."""
    monkeypatch.setattr(ops, "_uses_wgmma", lambda *_: False)
    monkeypatch.setattr(ops, "_uses_ws", lambda *_: False)
    monkeypatch.setattr(ops, "_uses_tma", lambda *_: False)
    monkeypatch.setattr(dense_matmul, "_BUFFERS", {})
    if sliced:
        monkeypatch.setattr(chunking, "DEQUANT_MAX_ELEMENTS", 96 * k)
    w, ref = quantized(n, k, seed=11)
    x = torch.randn(40, k, device="cuda", dtype=dtype)
    assert ops.path(40, dtype) == "dequant+cublas"
    assert rel_err(ops.linear(x, w), x.double() @ ref.double().T) < BOUND[dtype]
    gy = torch.randn(40, n, device="cuda", dtype=dtype)
    assert rel_err(ops.grad_input(gy, w), gy.double() @ ref.double()) < BOUND[dtype]
    if dtype != torch.float32:
        y32 = ops.linear(x, w, out_dtype=torch.float32)
        gx32 = ops.grad_input(gy, w, out_dtype=torch.float32)
        assert y32.dtype == gx32.dtype == torch.float32
        assert rel_err(y32, x.double() @ ref.to(dtype).double().T) < 1e-5
        assert rel_err(gx32, gy.double() @ ref.to(dtype).double()) < 1e-5
    if sliced:
        assert max(b.numel() for b in dense_matmul._BUFFERS.values()) == 96 * k
    part = ops.dequantize(w, dtype, rows=(64, 192))
    assert torch.equal(part, ref[64:192].to(dtype))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("n,k", SHAPES)
@pytest.mark.parametrize("m", [1, 3, 8, 13, 16, 40])
def test_linear_forward(dtype: torch.dtype, n: int, k: int, m: int) -> None:
    w, ref = quantized(n, k, seed=n + k + m)
    x = torch.randn(m, k, device="cuda", dtype=dtype)
    y = ops.linear(x, w)
    assert y.dtype == dtype and y.shape == (m, n)
    assert rel_err(y, x.double() @ ref.double().T) < BOUND[dtype], ops.path(m, dtype)
    if dtype != torch.float32:  # float32 outputs: the fp32 accumulators of the rounded operands
        y32 = ops.linear(x, w, out_dtype=torch.float32)
        assert y32.dtype == torch.float32
        small = m <= ops.SMALL_MAX_TOKENS
        operands = code_rounded_weight(n, k, n + k + m, dtype) if small else ref.to(dtype).double()
        assert rel_err(y32, x.double() @ operands.T) < 1e-5, ops.path(m, dtype, x.device, n, k)


def needs_wgmma() -> None:
    if not ops._module(torch.device("cuda")).has_wgmma:
        pytest.skip("the wgmma kernels need a Hopper GPU (sm_90a)")


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("tile", ops.WGMMA_TILES)
@pytest.mark.parametrize(
    "n,k,m", [(576, 576, 17), (1536, 576, 300), (250, 4160, 77), (4096, 1024, 512)]
)
def test_wgmma_forward(dtype: torch.dtype, tile: int, n: int, k: int, m: int, monkeypatch) -> None:
    """Every tile size, ragged rows (250), an odd number of k-steps (4160 = 65 x 64), partial token
    tiles. With float32 outputs the result is the fp32-accumulated product of the rounded operands:
    it must match torch's of the same operands to accumulation-order noise, so the dequantized
    weights and the fragment layouts are exact, not merely close."""
    needs_wgmma()
    monkeypatch.setattr(ops, "wgmma_tile", lambda *_: tile)
    monkeypatch.setattr(
        ops, "_uses_wgmma", lambda m_, *_: m_ > ops.SMALL_MAX_TOKENS
    )  # whatever the shape rule says
    monkeypatch.setattr(ops, "_uses_ws", lambda *_: False)
    monkeypatch.setattr(ops, "_uses_tma", lambda *_: False)
    check_fused_gemm("fused-wgmma", dtype, n, k, m, seed=n + k + m + tile)


def check_fused_gemm(path: str, dtype: torch.dtype, n: int, k: int, m: int, seed: int) -> None:
    """A forced fused GEMM against float64 (16-bit output) and, with float32 output, against
    torch's product of the same rounded operands to accumulation-order noise; the 16-bit output
    must be the float32 one rounded."""
    w, ref = quantized(n, k, seed=seed)
    x = torch.randn(m, k, device="cuda", dtype=dtype)
    assert ops.path(m, dtype, x.device, n, k) == path
    y = ops.linear(x, w)
    assert y.dtype == dtype and y.shape == (m, n)
    assert rel_err(y, x.double() @ ref.double().T) < BOUND[dtype]
    y32 = ops.linear(x, w, out_dtype=torch.float32)
    assert y32.dtype == torch.float32
    same_operands = x.double() @ ref.to(dtype).double().T
    assert rel_err(y32, same_operands) < 1e-5
    assert torch.equal(y, y32.to(dtype))


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("tile", ops.WS_TILES)
@pytest.mark.parametrize(
    "n,k,m",
    [
        (576, 576, 17),
        (1536, 576, 300),
        (250, 4160, 77),
        (4096, 1024, 512),
        (130, 64, 129),
        (259, 1536, 1000),
    ],
)
def test_ws_forward(dtype: torch.dtype, tile: int, n: int, k: int, m: int, monkeypatch) -> None:
    """The warp-specialized GEMM, checked as strictly as the register-operand one: both tiles,
    ragged rows (250, 130, 259), one k-step (64: fewer than the pipeline's stages), 65 (4160: every
    stage refilled many times, an odd count), partial token tiles, several token tiles.
    With float32 outputs it must equal torch's fp32-accumulated product of the same rounded
    operands to accumulation-order noise: any stale stage, swizzle or fragment error shows."""
    needs_wgmma()
    monkeypatch.setattr(ops, "ws_tile", lambda *_: tile)
    monkeypatch.setattr(
        ops, "_uses_ws", lambda m_, *_: m_ > ops.SMALL_MAX_TOKENS
    )  # whatever the shape rule says
    monkeypatch.setattr(ops, "_uses_tma", lambda *_: False)
    check_fused_gemm("fused-wgmma-ws", dtype, n, k, m, seed=n + k + m + tile)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("kernel", ops.TMA_KERNELS, ids=lambda c: "t{}r{}k{}".format(*c))
@pytest.mark.parametrize(
    "n,k,m",
    [
        (576, 576, 17),
        (1536, 576, 300),
        (250, 4160, 77),
        (4096, 1024, 512),
        (130, 64, 129),
        (259, 1536, 1000),
        (200, 192, 600),
    ],
)
def test_tma_forward(
    dtype: torch.dtype, kernel: tuple[int, int, int], n: int, k: int, m: int, monkeypatch
) -> None:
    """The TMA-fed GEMM in every block shape, checked as strictly as the others: ragged rows (250,
    130, 259, 200: partial row blocks), one k-step (64: the zero-filled padding steps do
    the rest; split in two, the second block of the cluster sees only padding), 65 (4160: an odd
    count, every stage refilled, uneven halves when split), partial and several token tiles."""
    needs_wgmma()
    monkeypatch.setattr(ops, "tma_kernel", lambda *_: kernel)
    monkeypatch.setattr(
        ops, "_uses_tma", lambda m_, *_: m_ > ops.SMALL_MAX_TOKENS
    )  # whatever the shape rule says
    check_fused_gemm("fused-tma", dtype, n, k, m, seed=n + k + m + sum(kernel))


@pytest.mark.parametrize(
    "n,k,m", [(4096, 4096, 512), (4096, 14336, 512), (14336, 4096, 128), (14336, 4096, 32)]
)
def test_tma_forward_as_routed(n: int, k: int, m: int) -> None:
    """The benchmark's shapes that take the TMA-fed GEMM get it by the shape rules themselves."""
    needs_wgmma()
    check_fused_gemm("fused-tma", torch.bfloat16, n, k, m, seed=n + k + m)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("n,k", SHAPES)
@pytest.mark.parametrize("m", [1, 5, 8, 16, 40])
def test_grad_input(dtype: torch.dtype, n: int, k: int, m: int) -> None:
    w, ref = quantized(n, k, seed=3 * n + k + m)
    gy = torch.randn(m, n, device="cuda", dtype=dtype)
    gx = ops.grad_input(gy, w)
    assert gx.dtype == dtype and gx.shape == (m, k)
    assert rel_err(gx, gy.double() @ ref.double()) < BOUND[dtype], ops.path(m, dtype)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("m", [5, 300, 2048])
def test_add_linear_adds_the_product_into_the_tensor(dtype: torch.dtype, m: int) -> None:
    """`add_linear` leaves `into + x @ W^T` in `into` itself, within the product's rounding;
    where it says it adds in place (many tokens through cuBLAS), the bits of one `addmm_` over
    the dequantized weight."""
    n, k = 1536, 576
    w, ref = quantized(n, k, seed=m + 1)
    x = torch.randn(m, k, device="cuda", dtype=dtype)
    start = torch.randn(m, n, device="cuda", dtype=dtype)
    into = start.clone()
    assert ops.add_linear(x, w, into) is into
    exact = start.double() + x.double() @ ref.double().t()
    assert rel_err(into, exact) < BOUND[dtype], ops.path(m, dtype)
    in_place = ops.linear_adds_in_place(m, dtype, x.device, n, k)
    assert in_place or m < 2048 or dtype == torch.float32  # 2048 half tokens take cuBLAS
    assert not (in_place and dtype == torch.float32)
    if in_place:
        dense = ops.dequantize(w, dtype)
        assert torch.equal(into, start.clone().addmm_(x, dense.t()))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("m", [5, 40, 300])
def test_add_grad_input_adds_the_product_into_the_tensor(dtype: torch.dtype, m: int) -> None:
    """`add_grad_input` leaves `into + gy @ W` in `into` itself, within the product's rounding;
    where many tokens take cuBLAS the GEMM adds into it (beta 1): the bits of one `addmm_` over
    the dequantized weight, no product tensor rounded apart."""
    n, k = 1536, 576
    w, ref = quantized(n, k, seed=m)
    gy = torch.randn(m, n, device="cuda", dtype=dtype)
    start = torch.randn(m, k, device="cuda", dtype=dtype)
    into = start.clone()
    assert ops.add_grad_input(gy, w, into) is into
    exact = start.double() + gy.double() @ ref.double()
    assert rel_err(into, exact) < BOUND[dtype], ops.path(m, dtype)
    assert ops.grad_adds_in_place(m, n, dtype) == (m > ops.SMALL_MAX_TOKENS)  # cuBLAS past 16
    if m > ops.SMALL_MAX_TOKENS:
        dense = ops.dequantize(w, dtype)
        assert torch.equal(into, start.clone().addmm_(gy, dense))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("m", [1, 9, 16])
def test_grad_input_is_the_same_bits_every_time(dtype: torch.dtype, m: int) -> None:
    """The small-token backward splits the reduction over N; its partial sums must add in a
    fixed order, or exact resume (1 + checkpoint + 1 == 2) fails on the GPU."""
    w, _ = quantized(1536, 576, seed=m)
    gy = torch.randn(m, 1536, device="cuda", dtype=dtype)
    first = ops.grad_input(gy, w, out_dtype=torch.float32)
    for _ in range(20):
        assert torch.equal(ops.grad_input(gy, w, out_dtype=torch.float32), first)


def test_kernels_follow_torch_stream_and_graph_capture() -> None:
    """Launches go to torch's current stream, so a CUDA graph captures and replays them."""
    w, ref = quantized(1024, 1024, seed=7)
    x = torch.randn(4, 1024, device="cuda", dtype=torch.bfloat16)
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        ops.linear(x, w)  # warm-up: compile and load outside the capture
    torch.cuda.current_stream().wait_stream(s)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        y = ops.linear(x, w)
    x.copy_(torch.randn_like(x))
    graph.replay()
    torch.cuda.synchronize()
    assert rel_err(y, x.double() @ ref.double().T) < BOUND[torch.bfloat16]


def test_overlapping_launches_wait_for_the_previous_kernel(monkeypatch) -> None:
    """TMA GEMMs launched to overlap the kernel before them (programmatic dependent launch), six in a
    chain where each reads the previous one's output, captured in one CUDA graph: bit for bit the
    ordinary launches' result, so no block read its input before the kernel writing it finished."""
    needs_wgmma()
    w, _ = quantized(4096, 4096, seed=11)
    x = (torch.randn(512, 4096, device="cuda") * 0.05).to(torch.bfloat16)
    assert ops.path(512, torch.bfloat16, x.device, 4096, 4096) == "fused-tma"

    def chain() -> torch.Tensor:
        y = x
        for _ in range(6):
            y = ops.linear(y, w) * 0.05
        return y

    overlapping = chain()
    original = ops.launch
    with monkeypatch.context() as m:
        m.setattr(ops, "launch", lambda *a, overlapping=False, **k: original(*a, **k))
        ordinary = chain()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = chain()
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(overlapping, ordinary) and torch.equal(captured, ordinary)


def test_disk_cache_reused(tmp_path, monkeypatch) -> None:
    """A second process (an empty process cache) loads the cubin from disk instead of compiling."""
    monkeypatch.setenv("ANER_KERNEL_CACHE", str(tmp_path))
    monkeypatch.setattr(compiler, "_MODULES", {})
    mod = compiler.load(torch.cuda.current_device())
    assert mod.paths and all(p.parent == tmp_path and p.exists() for p in mod.paths)
    assert mod.identity.startswith(f"nf4-fused src=sha256:{compiler.NF4.sha256()}")
    assert mod.arch == compiler.target_arch("".join(map(str, torch.cuda.get_device_capability())))
    monkeypatch.setattr(compiler, "_MODULES", {})
    monkeypatch.setattr(
        compiler, "compile_cubin", lambda *a: pytest.fail("recompiled despite the disk cache")
    )
    assert compiler.load(torch.cuda.current_device()).paths == mod.paths
