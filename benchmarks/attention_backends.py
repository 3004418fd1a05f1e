"""Causal attention through each of torch's SDPA backends at a Llama-3-8B layer's shape, one run.

The trainer's attention is `scaled_dot_product_attention(q, k, v, is_causal=True)` on bf16
`[1, 32, T, 128]` queries and `[1, 8, T, 128]` keys/values (grouped-query). This prints, per
context T and backend, the device time of forward and of forward + backward, whether two backward
passes on the same inputs give the same bits (exact resume needs that), and the largest error of
the output and the gradients against an fp32 computation of the same inputs, beside flash's.
Backends that cannot take grouped heads get keys and values repeated per query head (the copy is
timed with them). Needs CUDA.

    python benchmarks/attention_backends.py [--contexts 2048,8192] [--out results.json]
"""

from __future__ import annotations

import argparse
import json
from functools import partial

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

HEADS, KV_HEADS, HEAD_DIM = 32, 8, 128
BACKENDS = {
    "flash": SDPBackend.FLASH_ATTENTION,
    "cudnn": SDPBackend.CUDNN_ATTENTION,
    "efficient": SDPBackend.EFFICIENT_ATTENTION,
}


def _attend(backend: SDPBackend, q, k, v, gqa: bool) -> torch.Tensor:
    if not gqa:
        k = k.repeat_interleave(HEADS // KV_HEADS, dim=1)
        v = v.repeat_interleave(HEADS // KV_HEADS, dim=1)
    with sdpa_kernel([backend]):
        return F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=gqa)


def _time(fn, reps: int = 10) -> float:
    """Median device milliseconds of `fn()`."""
    fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return sorted(times)[len(times) // 2]


def _grads(backend, q, k, v, g, gqa):
    q, k, v = (t.detach().requires_grad_(True) for t in (q, k, v))
    out = _attend(backend, q, k, v, gqa)
    out.backward(g)
    return out.detach(), q.grad, k.grad, v.grad


def _error(got: torch.Tensor, ref: torch.Tensor) -> float:
    return float((got.float() - ref).abs().max() / ref.abs().max())


def bench(t: int) -> list[dict]:
    gen = torch.Generator(device="cuda").manual_seed(0)
    shape = lambda h: (1, h, t, HEAD_DIM)  # noqa: E731
    q, k, v = (
        torch.randn(shape(h), device="cuda", generator=gen, dtype=torch.bfloat16)
        for h in (HEADS, KV_HEADS, KV_HEADS)
    )
    g = torch.randn(shape(HEADS), device="cuda", generator=gen, dtype=torch.bfloat16)
    ref = _grads(SDPBackend.MATH, q.float(), k.float(), v.float(), g.float(), False)
    rows = []
    for name, backend in BACKENDS.items():
        for gqa in (True, False):
            row: dict = {"context": t, "backend": name, "gqa": gqa}
            try:
                first = _grads(backend, q, k, v, g, gqa)
            except RuntimeError as exc:
                row["error"] = str(exc).splitlines()[0][:160]
                rows.append(row)
                print(json.dumps(row), flush=True)
                continue
            second = _grads(backend, q, k, v, g, gqa)
            row["deterministic"] = all(torch.equal(a, b) for a, b in zip(first, second))
            row["max_rel_error"] = {
                n: _error(a, r) for n, a, r in zip(("out", "dq", "dk", "dv"), first, ref)
            }

            row["forward_ms"] = _time(torch.no_grad()(partial(_attend, backend, q, k, v, gqa)))
            row["forward_backward_ms"] = _time(partial(_grads, backend, q, k, v, g, gqa))
            rows.append(row)
            print(json.dumps(row), flush=True)
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--contexts", default="2048,8192")
    parser.add_argument("--out")
    args = parser.parse_args()
    rows = [r for t in args.contexts.split(",") for r in bench(int(t))]
    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}, cudnn "
          f"{torch.backends.cudnn.version()}")  # fmt: skip
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"device": torch.cuda.get_device_name(), "torch": torch.__version__,
                       "cudnn": torch.backends.cudnn.version(), "rows": rows}, f, indent=1)  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
