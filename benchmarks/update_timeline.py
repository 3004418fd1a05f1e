"""Where the GPU waits between the updates of a `train()` call: one call on a loaded model, its
later updates traced by torch's profiler (CUDA graphs on as a run has them, or `--eager`), and
per update the wall time from one step replay to the next, the device's busy time in it, and
its idle gaps, each with the host functions that were running meanwhile (the trainer's own
functions wrapped in profiler ranges for this benchmark only). The untraced updates before them
(the first left out: it records the step's graph) give the tokens per second by the trainer's
clock and the MFU against this GPU's dense bf16 GEMM rate (train_e2e's FLOPs of a token and its
measured peak).

    python benchmarks/update_timeline.py --model /tmp/train_scale/llama3-8b/model \
        --context 2048 --updates 30 --out /tmp/update_timeline.json
"""

from __future__ import annotations

import argparse
import functools
import itertools
import json
import tempfile
import time
from pathlib import Path
from typing import Any

import torch
from torch.profiler import ProfilerActivity, profile, record_function
from train_e2e import dense_peak_flops, flops_per_token  # this directory is on sys.path

from aner_lang.runtime import adapters as A
from aner_lang.runtime.load.loader import load_model
from aner_lang.runtime.tasks.data import from_texts
from aner_lang.runtime.train import trainer, watch
from aner_lang.runtime.train.distributed import parallel
from aner_lang.runtime.train.graphs import GraphSteps
from aner_lang.runtime.train.optim import adamw
from aner_lang.runtime.train.profile import profile as train_profile

TEXT = "The quiet mountain lake reflects the clear morning sky above the old stone bridge."
TARGETS = "q_proj,k_proj,v_proj,o_proj,gate_proj,up_proj,down_proj"
WATCHED = [
    (trainer._Loop, "update"), (trainer._Loop, "_window"), (trainer._Loop, "_zero_grads"),
    (GraphSteps, "__call__"), (adamw.PreparedStep, "apply"), (adamw.AdamW, "prepare"),
    (parallel.Parallel, "clip_grad_norm"), (parallel.Parallel, "grad_norm"),
    (watch.EventLog, "add"), (watch.Progress, "update"),
]  # fmt: skip
"""(owner, attribute): the host functions a range names."""


def _ranged(owner: Any, name: str) -> None:
    inner = getattr(owner, name)

    @functools.wraps(inner)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        with record_function(f"host::{owner.__name__}.{name}"):
            return inner(*args, **kwargs)

    setattr(owner, name, wrapper)


def _merged(spans: list[tuple[float, float]]) -> list[tuple[float, float]]:
    out: list[tuple[float, float]] = []
    for s, e in sorted(spans):
        if out and s <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], e))
        else:
            out.append((s, e))
    return out


def analyse(trace: dict[str, Any], gap_us: float) -> list[dict[str, Any]]:
    """Per interval between consecutive step-graph launches: wall, busy and idle device time
    (microseconds), and the idle gaps of at least `gap_us` with the host ranges overlapping
    each (innermost names last)."""
    events = [e for e in trace["traceEvents"] if e.get("ph") == "X"]
    device = [
        (e["ts"], e["ts"] + e["dur"])
        for e in events
        if e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset")
    ]
    busy = _merged(device)
    launches = sorted(
        e["ts"] for e in events if e.get("cat") == "cuda_runtime" and "GraphLaunch" in e["name"]
    )
    ranges = [e for e in events if e.get("cat") in ("user_annotation", "cuda_runtime")]
    rows = []
    for a, b in itertools.pairwise(launches):
        # from the first device work after one launch to the first after the next
        start = next((s for s, _ in busy if s >= a), a)
        end = next((s for s, _ in busy if s >= b), b)
        inside = [(max(s, start), min(e, end)) for s, e in busy if e > start and s < end]
        busy_us = sum(e - s for s, e in inside)
        spans = [*inside, (end, end)]  # the wait before the next update's first kernel too
        gaps = [(e0, s1) for (_, e0), (s1, _) in itertools.pairwise(spans) if s1 - e0 >= gap_us]
        described = []
        for g0, g1 in sorted(gaps, key=lambda g: g[0] - g[1])[:6]:
            host: dict[str, float] = {}
            for r in ranges:
                o = min(g1, r["ts"] + r["dur"]) - max(g0, r["ts"])
                if o > 0:
                    host[r["name"]] = host.get(r["name"], 0.0) + o
            top = dict(sorted(host.items(), key=lambda kv: -kv[1])[:8])
            described.append({"at_us": round(g0 - start), "idle_us": round(g1 - g0), "host": top})
        rows.append(
            {
                "wall_us": round(end - start),
                "busy_us": round(busy_us),
                "idle_us": round(end - start - busy_us),
                "gaps": described,
            }
        )
    return rows


def run_inputs(model: Any, context: int, rows: int) -> tuple[Any, Any]:
    """The benchmark's `train()` inputs on a loaded model: ``rows`` rows of repeated text at
    ``context`` tokens, and a LoRA of rank 16 (alpha 32) on the seven linear targets."""
    data = from_texts([" ".join([TEXT] * (context // 16))] * rows, context)
    return data, A.lora(model, rank=16, alpha=32.0, targets=TARGETS.split(","), seed=1)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", required=True, help="an HF folder or GGUF file")
    ap.add_argument("--storage", default="nf4_double_quant")
    ap.add_argument("--context", type=int, default=2048)
    ap.add_argument("--updates", type=int, default=12, help="updates of the call")
    ap.add_argument(
        "--traced", type=int, default=5, help="last updates traced (0: none, timed only)"
    )
    ap.add_argument("--gap-us", type=float, default=30.0, help="smallest idle gap described")
    ap.add_argument("--eager", action="store_true", help="CUDA graphs off (profile graphs: false)")
    ap.add_argument("--activations", default="keep", help="the profile's activations: policy")
    ap.add_argument(
        "--shape",
        default="llama3-8b",
        help="train_scale's shape of the model, for the FLOPs of a token (MFU)",
    )
    ap.add_argument("--out", default="/tmp/update_timeline.json")
    args = ap.parse_args()
    model = load_model(Path(args.model), storage=args.storage, device="cuda")
    data, lora = run_inputs(model, args.context, rows=16)
    folder = Path(tempfile.mkdtemp(prefix="aner-timeline-"))
    for owner, name in WATCHED:
        _ranged(owner, name)
    prof = profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA])
    update = trainer._Loop.update
    seen = 0

    def traced_update(loop: Any, *given: Any, **named: Any) -> dict[str, Any]:
        nonlocal seen
        seen += 1
        if args.traced and seen == args.updates - args.traced:
            torch.cuda.synchronize()
            prof.start()
        return update(loop, *given, **named)

    trainer._Loop.update = traced_update  # type: ignore[method-assign,assignment]
    began = time.perf_counter()
    policy = train_profile(
        precision="bfloat16", graphs=not args.eager, activations=args.activations
    )
    run = trainer.train(
        lora, data, policy, steps=args.updates, learning_rate=2e-4, seed=1,
        log=str(folder / "events.jsonl"),
    )  # fmt: skip
    torch.cuda.synchronize()
    seconds = time.perf_counter() - began
    rows = []
    if args.traced:
        prof.stop()
        trace_path = folder / "trace.json"
        prof.export_chrome_trace(str(trace_path))
        rows = analyse(json.loads(trace_path.read_text()), args.gap_us)
    updates = [  # (tokens, milliseconds) of each update, by the trainer's clock
        (e["tokens"], 1e3 * e["tokens"] / e["tokens_per_second"])
        for e in map(json.loads, (folder / "events.jsonl").read_text().splitlines())
        if e["event"] == "update"
    ]
    update_ms = [ms for _, ms in updates]
    # the updates after the first (its graph's recording) and before the traced ones; their
    # tokens as trained (the text's rows may fall short of the context)
    untraced = updates[1 : args.updates - args.traced]
    seconds_untraced = sum(ms for _, ms in untraced) / 1e3
    tokens_per_s = sum(t for t, _ in untraced) / seconds_untraced if untraced else 0.0
    per_token = flops_per_token(args.shape, args.context)
    peak = dense_peak_flops()
    result = {
        "device": torch.cuda.get_device_name(),
        "mfu": tokens_per_s * per_token / peak,
        "dense_bf16_peak_tflops": peak / 1e12,
        "model_gflop_per_token": per_token / 1e9,
        "context": args.context,
        "activations": args.activations,
        "cuda_graphs": run.cuda_graphs,
        "call_seconds": round(seconds, 3),
        "training_tokens_per_second": run.training_tokens_per_second,
        "untraced_tokens_per_second": tokens_per_s,
        "update_ms": [round(ms, 2) for ms in update_ms],
        "intervals": rows,
    }
    Path(args.out).write_text(json.dumps(result, indent=1))
    print(f"{len(untraced)} untraced updates after the first: {tokens_per_s:,.0f} tokens/s by the "
          f"trainer's clock, MFU {100 * result['mfu']:.1f}% of {peak / 1e12:.0f} TFLOP/s")  # fmt: skip
    for r in rows:
        print(f"wall {r['wall_us'] / 1e3:.2f} ms busy {r['busy_us'] / 1e3:.2f} idle "
              f"{r['idle_us'] / 1e3:.2f}")  # fmt: skip
        for g in r["gaps"]:
            print(f"   gap {g['idle_us']} us at {g['at_us']}: {g['host']}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
