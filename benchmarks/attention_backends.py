"""Causal attention through each of torch's SDPA backends at a Llama-3-8B layer's shape, one run.

The trainer's attention is `scaled_dot_product_attention(q, k, v, is_causal=True)` on bf16
`[1, 32, T, 128]` queries and `[1, 8, T, 128]` keys/values (grouped-query). This prints, per
context T and backend, the device time of forward and of forward + backward, whether two backward
passes on the same inputs give the same bits (exact resume needs that), and the largest error of
the output and the gradients against an fp32 computation of the same inputs, beside flash's.
Backends that cannot take grouped heads get keys and values repeated per query head (the copy is
timed with them). `auto` is torch's own pick among them, as the trainer calls it. Each row runs
under torch's deterministic algorithms strictly (`strict: true`, warn_only off, which the
trainer does not set: cuDNN's backward then has no deterministic kernel and is refused, flash and
the memory-efficient kernel take their deterministic backward) and, with `--modes strict,free`,
without them too. Needs CUDA.

`--packed N` measures packed rows instead: each row holds N documents of equal length, and
attention must not cross them. Per context, the ways to compute it side by side, each with its
device time, peak memory over its inputs and error against an fp32 masked computation:
`mask-gqa` (what the trainer runs: SDPA with the `[1, 1, T, T]` segment mask and grouped heads,
torch picking the backend), `mask-repeat` (the same with keys and values repeated per head, which
the memory-efficient kernel takes), `segments` (one causal flash call per document) and `varlen`
(`torch.nn.attention.varlen.varlen_attn`, causal, where this torch has it).

    python benchmarks/attention_backends.py [--contexts 2048,8192] [--out results.json]
    python benchmarks/attention_backends.py --packed 8 --contexts 8192,16384,32768
"""

from __future__ import annotations

import argparse
import json
import os
from functools import partial

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")  # cuBLAS under deterministic algorithms
HEADS, KV_HEADS, HEAD_DIM = 32, 8, 128
BACKENDS = {
    "auto": None,
    "flash": SDPBackend.FLASH_ATTENTION,
    "cudnn": SDPBackend.CUDNN_ATTENTION,
    "efficient": SDPBackend.EFFICIENT_ATTENTION,
}


def _attend(backend: SDPBackend | None, q, k, v, gqa: bool) -> torch.Tensor:
    if not gqa:
        k = k.repeat_interleave(HEADS // KV_HEADS, dim=1)
        v = v.repeat_interleave(HEADS // KV_HEADS, dim=1)
    with sdpa_kernel([backend] if backend else [b for b in BACKENDS.values() if b]):
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


def _inputs(t: int) -> tuple[torch.Tensor, ...]:
    """Seeded bf16 queries, keys, values and output gradient of one `t`-token layer."""
    gen = torch.Generator(device="cuda").manual_seed(0)
    shape = lambda h: (1, h, t, HEAD_DIM)  # noqa: E731
    return tuple(
        torch.randn(shape(h), device="cuda", generator=gen, dtype=torch.bfloat16)
        for h in (HEADS, KV_HEADS, KV_HEADS, HEADS)
    )


def bench(t: int, strict: bool) -> list[dict]:
    """Every backend at context `t`, under torch's deterministic algorithms when `strict`."""
    torch.use_deterministic_algorithms(strict)
    q, k, v, g = _inputs(t)
    ref = _grads(SDPBackend.MATH, q.float(), k.float(), v.float(), g.float(), False)
    rows = []
    for name, backend in BACKENDS.items():
        for gqa in (True, False):
            row: dict = {"context": t, "backend": name, "gqa": gqa, "strict": strict}
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


# ---- packed rows ---------------------------------------------------------------------------


def segment_mask(t: int, documents: int) -> torch.Tensor:
    """`[1, 1, t, t]`: query i sees key j when j <= i within the same of `documents` equal
    documents (the trainer's `transformer.segment_mask` of such a row)."""
    doc = torch.arange(t, device="cuda") // (t // documents)
    causal = torch.ones(t, t, dtype=torch.bool, device="cuda").tril()
    return ((doc[:, None] == doc[None, :]) & causal)[None, None]


def _masked(q, k, v, mask, repeat: bool) -> torch.Tensor:
    if repeat:
        k = k.repeat_interleave(HEADS // KV_HEADS, dim=1)
        v = v.repeat_interleave(HEADS // KV_HEADS, dim=1)
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=not repeat)


def _segments(q, k, v, documents: int) -> torch.Tensor:
    size = q.shape[2] // documents
    parts = [
        F.scaled_dot_product_attention(
            q[:, :, s : s + size], k[:, :, s : s + size], v[:, :, s : s + size],
            is_causal=True, enable_gqa=True,
        )
        for s in range(0, q.shape[2], size)
    ]  # fmt: skip
    return torch.cat(parts, dim=2)


def _varlen(q, k, v, documents: int) -> torch.Tensor:
    from torch.nn.attention import varlen

    t = q.shape[2]
    size = t // documents
    cu = torch.arange(0, t + 1, size, device="cuda", dtype=torch.int32)
    flat = [x[0].transpose(0, 1) for x in (q, k, v)]  # [T, heads, D]
    try:  # the causal argument has been `is_causal` and `window_size` in torch's releases
        out = varlen.varlen_attn(*flat, cu, cu, size, size, window_size=(-1, 0), enable_gqa=True)
    except TypeError:
        out = varlen.varlen_attn(*flat, cu, cu, size, size, is_causal=True)
    return out.transpose(0, 1)[None]


def _peak_over(fn) -> int:
    """Peak CUDA bytes `fn()` allocates over what was allocated before it."""
    torch.cuda.synchronize()
    before = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    fn()
    torch.cuda.synchronize()
    return torch.cuda.max_memory_allocated() - before


def bench_packed(t: int, documents: int) -> list[dict]:
    q, k, v, g = _inputs(t)
    mask = segment_mask(t, documents)
    ways = {
        "mask-gqa": lambda q, k, v: _masked(q, k, v, mask, repeat=False),
        "mask-repeat": lambda q, k, v: _masked(q, k, v, mask, repeat=True),
        "segments": lambda q, k, v: _segments(q, k, v, documents),
        "varlen": lambda q, k, v: _varlen(q, k, v, documents),
    }

    def grads(way, q, k, v, g):  # type: ignore[no-untyped-def]
        q, k, v = (x.detach().requires_grad_(True) for x in (q, k, v))
        out = ways[way](q, k, v)
        out.backward(g)
        return out.detach(), q.grad, k.grad, v.grad

    ref = None
    if t <= 8192:  # the fp32 reference materializes [heads, T, T] scores
        ref = grads("segments", q.float(), k.float(), v.float(), g.float())
    rows = []
    for way in ways:
        row: dict = {"context": t, "documents": documents, "way": way}
        try:
            row["peak_bytes"] = _peak_over(partial(grads, way, q, k, v, g))
            first = grads(way, q, k, v, g)
        except (RuntimeError, ImportError, AttributeError, TypeError) as exc:
            row["error"] = str(exc).splitlines()[0][:160]
            torch.cuda.empty_cache()
            rows.append(row)
            print(json.dumps(row), flush=True)
            continue
        if ref is not None:
            names = ("out", "dq", "dk", "dv")
            row["max_rel_error"] = {n: _error(a, r) for n, a, r in zip(names, first, ref)}
        row["forward_backward_ms"] = _time(partial(grads, way, q, k, v, g))
        rows.append(row)
        print(json.dumps(row), flush=True)
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--contexts", default="2048,8192")
    parser.add_argument("--packed", type=int, default=0, help="documents per packed row")
    parser.add_argument("--modes", default="strict", help="strict and/or free, comma separated")
    parser.add_argument("--out")
    args = parser.parse_args()
    contexts = [int(t) for t in args.contexts.split(",")]
    if args.packed:
        rows = [r for t in contexts for r in bench_packed(t, args.packed)]
    else:
        modes = args.modes.split(",")
        rows = [r for t in contexts for m in modes for r in bench(t, m == "strict")]
    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}, cudnn "
          f"{torch.backends.cudnn.version()}")  # fmt: skip
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"device": torch.cuda.get_device_name(), "torch": torch.__version__,
                       "cudnn": torch.backends.cudnn.version(), "rows": rows}, f, indent=1)  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
