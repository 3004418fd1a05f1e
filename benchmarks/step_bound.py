"""The least time a QLoRA update of a dense shape can take on this GPU with bf16 math, measured.

A QLoRA update with a frozen base multiplies every token by every base weight twice: forward, and
backward to the input (the base's own gradient is never formed). This benchmark times exactly
those products with cuBLAS (torch's matmul) at the shape's sizes: per decoder layer q/k/v as one
GEMM, o, gate/up as one GEMM and down, forward and input gradient, then the `lm_head`'s two
(16-bit, as every QLoRA peer keeps it); and attention (torch's SDPA, causal, forward and
backward, the fastest of its flash/cuDNN/efficient backends). Their sum is a floor under any
implementation that runs these products as bf16 GEMMs: everything else an update does
(dequantizing NF4, the LoRA's products, norms, activations, RoPE, the loss, the optimizer) only
adds to it, unless it is fused into these GEMMs. `dequant_ms` adds what the "dequantize, then
cuBLAS" design (Aner's and Unsloth's past 1,024 tokens) costs beside: Aner's NF4 dequantization
kernel over every base weight of every layer, twice (forward and backward).

With `--against train_scale.json` (a run of the same shape and context in the same device call)
it prints, for each of its Unsloth rows, the step time 1.5x that rate needs and how much of it is
left beside the floor. Products rotate between two copies of their weights, so no timed product
finds its operands in the L2 cache; each is timed as a CUDA graph of back-to-back calls (events
around the replays, median), attention as a loop.

    python benchmarks/step_bound.py --shape llama3-8b --context 2048 --out /tmp/step_bound.json \\
        --against /tmp/train_scale/train_scale.json
    python benchmarks/step_bound.py --dry-run    # the plumbing on the CPU, tiny shape, no timing
"""

from __future__ import annotations

import argparse
import json
import platform
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
import train_scale as bench  # this directory is on sys.path when run as a script
from nf4_kernels import ceilings, measure, time_loop
from torch.nn.attention import SDPBackend, sdpa_kernel

COPIES = 2
"""Weight copies each product rotates through (one layer's weights exceed the L2 cache)."""
BACKENDS = (SDPBackend.CUDNN_ATTENTION, SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION)


def dims(shape: str) -> dict[str, int]:
    """The sizes the products depend on, from train_scale's shape table."""
    s = bench.SHAPES[shape]
    heads, kv = s["num_attention_heads"], s["num_key_value_heads"]
    head_dim = s.get("head_dim", s["hidden_size"] // heads)
    return {"hidden": s["hidden_size"], "inter": s["intermediate_size"], "heads": heads,
            "kv_heads": kv, "head_dim": head_dim, "layers": s["num_hidden_layers"],
            "vocab": s["vocab_size"]}  # fmt: skip


def products(d: dict[str, int]) -> dict[str, tuple[int, int]]:
    """Each base product of a layer (and the lm_head) as (out_features, in_features)."""
    q, kv = d["heads"] * d["head_dim"], d["kv_heads"] * d["head_dim"]
    return {"qkv": (q + 2 * kv, d["hidden"]), "o": (d["hidden"], q),
            "gate_up": (2 * d["inter"], d["hidden"]), "down": (d["hidden"], d["inter"]),
            "lm_head": (d["vocab"], d["hidden"])}  # fmt: skip


def time_products(d: dict[str, int], tokens: int, device: str) -> dict[str, dict[str, float]]:
    """Microseconds of each product's forward (x W^T) and input gradient (g W), with TFLOP/s."""
    out: dict[str, dict[str, float]] = {}
    for name, (n, k) in products(d).items():
        ws = [torch.randn(n, k, device=device, dtype=torch.bfloat16) for _ in range(COPIES)]
        x = torch.randn(tokens, k, device=device, dtype=torch.bfloat16)
        g = torch.randn(tokens, n, device=device, dtype=torch.bfloat16)
        flops = 2 * tokens * n * k
        forward = [_product(x, w.T) for w in ws] * 2
        grad_input = [_product(g, w) for w in ws] * 2
        row: dict[str, float] = {}
        for step, calls in (("forward", forward), ("grad_input", grad_input)):
            us = _time(calls, device)
            row[f"{step}_us"] = us
            row[f"{step}_TFLOPs"] = flops / us / 1e6 if us else 0.0
        out[name] = row
        del ws, x, g, forward, grad_input
    return out


def _product(a: torch.Tensor, b: torch.Tensor) -> Callable[[], torch.Tensor]:
    return lambda: a @ b


def time_attention(d: dict[str, int], tokens: int, device: str) -> dict[str, Any]:
    """Causal attention's forward and backward, microseconds, by the fastest SDPA backend that
    takes grouped-query heads (`enable_gqa`) at this shape; one that refuses them is passed over."""
    shape = (1, d["heads"], tokens, d["head_dim"])
    q = torch.randn(shape, device=device, dtype=torch.bfloat16, requires_grad=True)
    kv_shape = (1, d["kv_heads"], tokens, d["head_dim"])
    k = torch.randn(kv_shape, device=device, dtype=torch.bfloat16, requires_grad=True)
    v = torch.randn(kv_shape, device=device, dtype=torch.bfloat16, requires_grad=True)
    grad = torch.randn(shape, device=device, dtype=torch.bfloat16)
    best: dict[str, Any] = {"us": 0.0, "backend": "none"}
    for backend in BACKENDS if device == "cuda" else (SDPBackend.MATH,):
        try:
            us = _time([_attention(q, k, v, grad, backend)], device, graph=False)
        except RuntimeError:  # this backend does not take these inputs here
            continue
        if best["backend"] == "none" or us < best["us"]:
            best = {"us": us, "backend": backend.name}
    return best


def _attention(q, k, v, grad, backend: SDPBackend) -> Callable[[], None]:
    def step() -> None:
        with sdpa_kernel(backend):
            out = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
        out.backward(grad)

    return step


def time_dequant(d: dict[str, int], device: str) -> float | None:
    """Microseconds to dequantize one layer's NF4 base weights to bf16 with Aner's kernel (None
    off CUDA: the kernel is CUDA's)."""
    if device != "cuda":
        return None
    from aner_lang.runtime.nf4.fused import ops
    from aner_lang.runtime.nf4.fused.backend import nf4_tensors
    from aner_lang.runtime.nf4.quant import quantize_nf4

    q, kv = d["heads"] * d["head_dim"], d["kv_heads"] * d["head_dim"]
    sizes = [(q, d["hidden"]), (kv, d["hidden"]), (kv, d["hidden"]), (d["hidden"], q),
             (d["inter"], d["hidden"]), (d["inter"], d["hidden"]), (d["hidden"], d["inter"])]  # fmt: skip
    weights = [
        nf4_tensors(quantize_nf4(torch.randn(n, k, device=device) * 0.02))
        for _ in range(COPIES)
        for n, k in sizes
    ]
    calls = [_dequantize(ops.dequantize, w) for w in weights]
    return len(sizes) * _time(calls, device)  # the per-call median times the layer's weights


def _dequantize(dequantize: Callable[..., torch.Tensor], w: Any) -> Callable[[], torch.Tensor]:
    return lambda: dequantize(w, torch.bfloat16)


def _time(calls: Sequence[Callable[[], object]], device: str, graph: bool = True) -> float:
    """Median microseconds per call (CUDA: graph or event-timed loop; CPU: not timed, one run)."""
    if device != "cuda":
        for c in calls:
            c()
        return 0.0
    return measure(list(calls))[0] if graph else time_loop(list(calls), reps=10)


def floors(d: dict[str, int], tokens: int, prods: dict, attention: dict, dequant: float | None):
    """The update's floor in milliseconds: the layers' products and attention, the lm_head's, and
    with the dequantization beside."""
    layer_us = sum(r["forward_us"] + r["grad_input_us"] for n, r in prods.items() if n != "lm_head")
    head_us = prods["lm_head"]["forward_us"] + prods["lm_head"]["grad_input_us"]
    gemm_ms = (d["layers"] * layer_us + head_us) / 1000
    attention_ms = d["layers"] * attention["us"] / 1000
    dequant_ms = 2 * d["layers"] * dequant / 1000 if dequant is not None else None
    floor_ms = gemm_ms + attention_ms
    row = {"gemm_ms": gemm_ms, "attention_ms": attention_ms, "floor_ms": floor_ms,
           "floor_tokens_per_s": tokens / floor_ms * 1000 if floor_ms else None,
           "dequant_ms": dequant_ms}  # fmt: skip
    if dequant_ms is not None and floor_ms:
        row["floor_with_dequant_ms"] = floor_ms + dequant_ms
        row["floor_with_dequant_tokens_per_s"] = tokens / (floor_ms + dequant_ms) * 1000
    return row


def against(path: Path, tokens: int, floor: dict[str, Any]) -> list[dict[str, Any]]:
    """For each row of a train_scale run (its last shape's report): its rate, the step time 1.5x
    an Unsloth row's rate needs, and what that leaves beside the floors."""
    report = json.loads(path.read_text())
    report = report[-1] if isinstance(report, list) else report
    rows = []
    for row in report.get("rows", []):
        rate = row.get("tokens_per_s")
        entry = {"side": row.get("side"), "tokens_per_s": rate}
        if rate and str(row.get("side", "")).startswith("unsloth"):
            needed = tokens / (1.5 * rate) * 1000
            entry["needed_ms_for_1_5x"] = needed
            entry["left_beside_floor_ms"] = needed - floor["floor_ms"]
            if "floor_with_dequant_ms" in floor:
                entry["left_beside_dequant_floor_ms"] = needed - floor["floor_with_dequant_ms"]
        rows.append(entry)
    return rows


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--shape", default="llama3-8b", choices=sorted(bench.SHAPES))
    ap.add_argument("--context", type=int, default=2048, help="tokens of one update (batch 1)")
    ap.add_argument(
        "--against", default="", help="a train_scale.json of the same shape and context"
    )
    ap.add_argument("--out", default="")
    ap.add_argument("--dry-run", action="store_true", help="the tiny shape on the CPU, untimed")
    args = ap.parse_args()
    device = "cpu" if args.dry_run else "cuda"
    shape, tokens = ("tiny", 32) if args.dry_run else (args.shape, args.context)
    d = dims(shape)
    began = time.perf_counter()
    prods = time_products(d, tokens, device)
    attention = time_attention(d, tokens, device)
    dequant = time_dequant(d, device)
    floor = floors(d, tokens, prods, attention, dequant)
    report: dict[str, Any] = {
        "shape": shape, "context": tokens, "dims": d, "device": device,
        "gpu": torch.cuda.get_device_name() if device == "cuda" else platform.processor(),
        "torch": torch.__version__, "ceilings": ceilings() if device == "cuda" else {},
        "products": prods, "attention": attention, "dequant_layer_us": dequant, "floor": floor,
        "seconds": time.perf_counter() - began,
    }  # fmt: skip
    if args.against:
        report["against"] = against(Path(args.against), tokens, floor)
    text = json.dumps(report, indent=1)
    if args.out:
        Path(args.out).write_text(text + "\n")
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
