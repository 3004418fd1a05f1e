"""Measured peak CUDA memory of one QLoRA update against `aner plan`'s, per activation policy and
context, on a random-weight model of a train_scale shape (default: Llama-3-8B at 8 of 32 layers).

    python benchmarks/peak_by_context.py [--shape llama3-8b-8] [--contexts 4096,8192]

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
            try:
                train(adapter, bench._token_dataset(ids), prof, steps=1, learning_rate=bench.LR,
                      clip_norm=None, seed=0)  # fmt: skip
                row["peak_bytes"] = torch.cuda.max_memory_allocated()
            except torch.OutOfMemoryError as e:
                row["error"] = str(e)[:200]
            planned = plan(model.config, storage="nf4_double_quant", method="lora",
                           rank=bench.RANK, targets=list(bench.TARGETS),
                           profile=prof.to_json(), context=context, micro_batch=1,
                           accumulation=1, updates=1)  # fmt: skip
            row["planned_bytes"] = planned.peak
            row["planned"] = planned.categories
            rows.append(row)
            print(json.dumps({k: v for k, v in row.items() if k != "planned"}), flush=True)
            del adapter
    if args.out:
        Path(args.out).write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
