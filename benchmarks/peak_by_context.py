"""Measured peak CUDA memory of one QLoRA update against `aner plan`'s, per activation policy and
context, on a random-weight model of a train_scale shape (default: Llama-3-8B at 8 of 32 layers).

    python benchmarks/peak_by_context.py [--shape llama3-8b-8] [--contexts 4096,8192] [--sites 25]

`--sites N` records the allocator's history of each update (torch.cuda.memory's recorder, C++
and Python stacks) and prints the N places that hold the most memory at its peak: each live
block's allocating op, the autograd node whose backward ran it (if any) and the first Aner frame,
with the bytes they hold.

The shapes' configs allow 8,192 positions: a longer context is refused (E-CONTEXT).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch
import train_scale as bench  # this directory is on sys.path when run as a script

from aner_lang.runtime import adapters as A
from aner_lang.runtime.load.loader import load_model
from aner_lang.runtime.train.plan import plan
from aner_lang.runtime.train.profile import profile
from aner_lang.runtime.train.trainer import train


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shape", default="llama3-8b-8")
    ap.add_argument("--contexts", default="4096,8192")
    ap.add_argument("--policies", default="offload,checkpoint")
    ap.add_argument("--sites", type=int, default=0, help="print the top sites at the peak")
    ap.add_argument("--out")
    args = ap.parse_args()
    folder = Path("/tmp/peak_by_context") / args.shape
    if not (folder / "config.json").exists():
        bench.make_model(args.shape, folder, "cuda")
    torch.cuda.empty_cache()
    model = load_model(str(folder), storage="nf4_double_quant", device="cuda")
    rows = []
    for policy in args.policies.split(","):
        for context in (int(c) for c in args.contexts.split(",")):
            adapter = A.lora(model, rank=bench.RANK, alpha=bench.ALPHA, targets=bench.TARGETS)
            ids = torch.randint(3, model.config.vocab_size, (2, context))
            prof = profile(precision="bfloat16", activations=policy)
            torch.cuda.empty_cache()
            torch.cuda.reset_peak_memory_stats()
            row = {"policy": policy, "context": context}
            if args.sites:
                torch.cuda.memory._record_memory_history(max_entries=1_000_000, stacks="all")
            try:
                train(adapter, bench._token_dataset(ids), prof, steps=1, learning_rate=bench.LR,
                      clip_norm=None, seed=0)  # fmt: skip
                row["peak_bytes"] = torch.cuda.max_memory_allocated()
            except torch.OutOfMemoryError as e:
                row["error"] = str(e)[:200]
            if args.sites:
                row["sites"] = peak_sites(torch.cuda.memory._snapshot(), args.sites)
                torch.cuda.memory._record_memory_history(enabled=None)
                for site in row["sites"]:
                    print(f"  {site['mb']:9.1f} MB {site['blocks']:4d}x  {site['site']}")
            planned = plan(model.config, storage="nf4_double_quant", method="lora",
                           rank=bench.RANK, targets=list(bench.TARGETS),
                           profile=prof.to_json(), context=context, micro_batch=1,
                           accumulation=1, updates=1)  # fmt: skip
            row["planned_bytes"] = planned.peak
            row["planned"] = planned.categories
            rows.append(row)
            print(json.dumps({k: v for k, v in row.items() if k not in ("planned", "sites")}),
                  flush=True)  # fmt: skip
            del adapter
    if args.out:
        Path(args.out).write_text(json.dumps(rows, indent=1))
    return 0


def _site(frames: list[dict]) -> str:
    """Where a block was allocated: its op (the first ATen frame), the autograd node whose
    backward ran it, and the innermost Aner frame (file:line function)."""
    op = next((f["name"] for f in frames if "at::native::" in f["name"]
               or "at::_ops::" in f["name"]), "?")  # fmt: skip
    node = next((f["name"] for f in frames if "autograd::generated::" in f["name"]
                 or "PyNode::apply" in f["name"]), "")  # fmt: skip
    ours = next((f"{Path(f['filename']).name}:{f['line']} {f['name']}" for f in frames
                 if "aner_lang" in f.get("filename", "")), "")  # fmt: skip
    short = lambda name: name.split("(")[0][-70:]  # noqa: E731
    return " | ".join(x for x in (short(op), short(node), ours) if x)


def peak_sites(snapshot: dict, top: int) -> list[dict]:
    """The `top` sites holding the most bytes at the peak of the allocator's recorded history,
    replayed from its trace of device 0; blocks live before the recording are not seen."""
    trace = snapshot["device_traces"][0]
    live: dict[int, dict] = {}
    total = peak = peak_at = 0
    for i, event in enumerate(trace):
        if event["action"] == "alloc":
            live[event["addr"]] = event
            total += event["size"]
            if total > peak:
                peak, peak_at = total, i
        elif event["action"] == "free_completed" and event["addr"] in live:
            total -= live.pop(event["addr"])["size"]
    live.clear()
    for event in trace[: peak_at + 1]:
        if event["action"] == "alloc":
            live[event["addr"]] = event
        elif event["action"] == "free_completed":
            live.pop(event["addr"], None)
    sites: dict[str, list[int]] = {}
    for event in live.values():
        sites.setdefault(_site(event.get("frames", [])), []).append(event["size"])
    ranked = sorted(sites.items(), key=lambda kv: -sum(kv[1]))[:top]
    return [{"mb": sum(sizes) / 2**20, "blocks": len(sizes), "site": site,
             "sizes_mb": sorted((round(s / 2**20, 1) for s in sizes), reverse=True)[:8]}
            for site, sizes in ranked] + [{"mb": peak / 2**20, "blocks": len(live),
                                          "site": f"recorded peak, event {peak_at} of {len(trace)}"}]  # fmt: skip


if __name__ == "__main__":
    raise SystemExit(main())
