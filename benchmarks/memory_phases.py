"""Where a CUDA run's device memory goes: torch's allocated and reserved bytes around each phase of
one `aner run` (loading, the first updates, the CUDA graph recording, validations, snapshots), and
at the end the reserved segments by pool (the default pool or a CUDA graph's) and stream.

A diagnostic, not a comparison: it runs train_e2e's Aner script in this process with the trainer's
phases wrapped, so the figures are those of the same run a user makes, phase by phase.

    python benchmarks/memory_phases.py --model /tmp/train_e2e/llama3-8b/model \\
        --train /tmp/train_e2e/llama3-8b/train.jsonl --val /tmp/train_e2e/llama3-8b/val.jsonl
"""

from __future__ import annotations

import argparse
import functools
import json
import sys
import tempfile
from collections import defaultdict
from pathlib import Path
from typing import Any

import torch
import train_e2e  # this directory is on sys.path when run as a script

from aner_lang import cli
from aner_lang.runtime.load import loader
from aner_lang.runtime.train import graphs, trainer

GB = 1e9


def _memory(phase: str) -> dict[str, Any]:
    torch.cuda.synchronize()
    stats = torch.cuda.memory_stats()
    return {
        "phase": phase,
        "allocated_gb": stats["allocated_bytes.all.current"] / GB,
        "reserved_gb": stats["reserved_bytes.all.current"] / GB,
        "peak_allocated_gb": stats["allocated_bytes.all.peak"] / GB,
        "peak_reserved_gb": stats["reserved_bytes.all.peak"] / GB,
        "inactive_split_gb": stats["inactive_split_bytes.all.current"] / GB,
    }


def _segments(phase: str) -> dict[str, Any]:
    """Reserved and allocated bytes per (pool, stream) of torch's segments now."""
    by: dict[str, list[float]] = defaultdict(lambda: [0.0, 0.0, 0])
    for seg in torch.cuda.memory_snapshot():
        pool = "default" if tuple(seg.get("segment_pool_id", (0, 0))) == (0, 0) else "graph"
        key = f"{pool} stream {seg['stream']}"
        by[key][0] += seg["total_size"] / GB
        by[key][1] += seg["allocated_size"] / GB
        by[key][2] += 1
    return {"phase": phase, "segments": {k: {"reserved_gb": round(r, 3), "allocated_gb":
            round(a, 3), "count": n} for k, (r, a, n) in by.items()}}  # fmt: skip


def _watch(owner: Any, name: str, times: int, segments: bool = False) -> None:
    """Log memory before and after the first `times` calls of `owner.name`."""
    original = getattr(owner, name)
    calls = [0]

    @functools.wraps(original)
    def watched(*args: Any, **kwargs: Any) -> Any:
        calls[0] += 1
        n = calls[0]
        if n <= times:
            print(json.dumps(_memory(f"before {name} {n}")), flush=True)
        out = original(*args, **kwargs)
        if n <= times:
            print(json.dumps(_memory(f"after {name} {n}")), flush=True)
            if segments:
                print(json.dumps(_segments(f"after {name} {n}")), flush=True)
        return out

    setattr(owner, name, watched)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", required=True)
    ap.add_argument("--train", required=True)
    ap.add_argument("--val", required=True)
    ap.add_argument("--context", type=int, default=2048)
    ap.add_argument("--updates", type=int, default=4)
    ap.add_argument("--every", type=int, default=2)
    ap.add_argument("--checkpointing", action="store_true")
    args = ap.parse_args(argv)
    work = Path(tempfile.mkdtemp(prefix="aner-memory-"))
    job = {"model": args.model, "train": args.train, "val": args.val, "dir": str(work),
           "device": "cuda", "context": args.context, "updates": args.updates,
           "every": args.every, "checkpointing": args.checkpointing}  # fmt: skip
    script = work / "run.aner"
    script.write_text(train_e2e.aner_script(job))
    _watch(loader, "read_weights", 1, segments=True)  # the load: its peak and what it leaves
    _watch(trainer._Loop, "update", 3, segments=True)
    _watch(trainer._Loop, "validate", 2, segments=True)
    _watch(trainer._Loop, "snapshot", 2)
    _watch(graphs.GraphSteps, "_record", 2, segments=True)
    code = cli.main(["run", str(script)])
    print(json.dumps(_memory("end")), flush=True)
    print(json.dumps(_segments("end")), flush=True)
    return code


if __name__ == "__main__":
    sys.exit(main())
