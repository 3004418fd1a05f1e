"""Training on several GPUs: data-parallel QLoRA scaling, and an FSDP full fine-tune.

Three experiments, each rank count one torchrun launch of this script's worker (Aner's `train`, as
`aner run --nproc N` runs it), on random weights of a real model's shape (`train_scale.SHAPES`,
written once as an f16 fixture GGUF) and random token rows:

* `qlora` (default): the LoRA of `train_scale` (rank 16, alpha 32, all seven linear targets) on
  the NF4 double-quantized base, `--micro-batch` rows per GPU, one window per update. Reported per
  rank count: tokens/s of all ranks over `--steps` updates after `--warmup`, and the scaling
  efficiency per GPU, tokens/s / (N x the one-GPU tokens/s) (the target is >= 0.9).
* `qlora-sharded` (`--shard-base`): the same QLoRA with the NF4 base sharded by rank
  (`ANER_SHARD_BASE=1`): per-rank peak memory falls by about (N-1)/N of the base, at the cost of
  one all-gather of each layer's bytes per forward and backward (compare with `qlora`).
* `full` (`--full`): `full` fine-tuning of a float16 base sharded with FSDP2 over the ranks. For
  `llama3-8b` one GPU cannot hold it (16 GB of f16 weights plus 16 bytes of fp32 master, gradient
  and AdamW moments per parameter: 144 GB), two can. Reported: tokens/s, peak CUDA bytes of the
  busiest rank, and the bytes one GPU would need. `--offload` keeps the shards and the optimizer
  state in host memory (`ANER_FSDP_OFFLOAD=1`).

    python benchmarks/train_distributed.py --shape llama3-8b --gpus 1,2,4 --out /tmp/dist
    python benchmarks/train_distributed.py --shard-base --shape llama3-8b --gpus 2,4 --out /tmp/dist
    python benchmarks/train_distributed.py --full --shape llama3-8b --gpus 2 --out /tmp/dist
    python benchmarks/train_distributed.py --dry-run     # CPU, gloo, tiny shape: the plumbing

Results: `<out>/train_distributed.json` and a Markdown table on stdout. Each launch's result is
also kept as `<out>/<shape>/<experiment>-<N>.json`, so rank counts can be measured in separate
calls (`--gpus 1`, then `--gpus 2,4`) and still be compared with the one-GPU figure.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).parent))
from train_scale import ALPHA, LR, RANK, SHAPES, TARGETS, _peak_rss, _token_dataset, make_gguf


def launch(job: dict[str, Any], nproc: int) -> dict[str, Any]:
    """One torchrun launch of the worker on `nproc` ranks; rank 0's result."""
    out = Path(job["dir"]) / f"{job['experiment']}-{nproc}.json"
    out.unlink(missing_ok=True)
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone",
           "--nproc-per-node", str(nproc), __file__, "--worker", json.dumps(job),
           "--json", str(out)]  # fmt: skip
    from aner_lang.runtime.train.distributed.base_shards import SHARD_ENV
    from aner_lang.runtime.train.distributed.fsdp import OFFLOAD_ENV

    sharded = job["experiment"] == "qlora-sharded"
    env = {**os.environ, OFFLOAD_ENV: "1" if job["offload"] else "0", SHARD_ENV: str(int(sharded))}
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=job["timeout"], env=env)
    if proc.returncode != 0 or not out.exists():
        return {"gpus": nproc, "error": f"exit {proc.returncode}: {proc.stderr[-1500:]}"}
    return dict(json.loads(out.read_text()))


def worker(job: dict[str, Any]) -> dict[str, Any] | None:
    """Train as a script would on this rank; rank 0 returns the measurements."""
    import torch
    import torch.distributed as dist

    from aner_lang.runtime import adapters as A
    from aner_lang.runtime.io.world import process_group
    from aner_lang.runtime.load.loader import load_model
    from aner_lang.runtime.train.memory import memory_report
    from aner_lang.runtime.train.profile import profile
    from aner_lang.runtime.train.trainer import train

    world = process_group()
    cuda = job["device"] == "cuda"
    full = job["experiment"] == "full"
    storage = ("float16" if cuda else "float32") if full else "nf4_double_quant"
    start = time.perf_counter()
    model = load_model(job["model"], storage=storage, device=job["device"])
    load_s = time.perf_counter() - start
    prof = profile(precision=job["precision"] if cuda else "float32",
                   activations=job["activations"])  # fmt: skip
    adapter = A.full(model) if full else A.lora(model, rank=RANK, alpha=ALPHA, targets=TARGETS)
    report = memory_report(adapter, prof).as_dict()
    gen = torch.Generator().manual_seed(1)
    rows = job["micro_batch"] * world.size * (job["warmup"] + job["steps"])
    ids = torch.randint(3, SHAPES[job["shape"]]["vocab_size"], (rows, job["context"]),
                        generator=gen)  # fmt: skip
    data = _token_dataset(ids)
    lr = 1e-5 if full else LR
    options = {"learning_rate": lr, "micro_batch": job["micro_batch"], "clip_norm": None}
    train(adapter, data, prof, steps=job["warmup"], **options)
    if full:  # the timed run starts afresh: no host copy of the warm-up's state held meanwhile
        adapter.state = None
    if cuda:
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
    start = time.perf_counter()
    total = job["steps"] + (0 if full else job["warmup"])
    run = train(adapter, data, prof, steps=total, **options)
    if cuda:
        torch.cuda.synchronize()
    seconds = time.perf_counter() - start
    peak = torch.tensor(
        [torch.cuda.max_memory_allocated() if cuda else 0], dtype=torch.float64, device=model.device
    )
    if world.size > 1:
        dist.all_reduce(peak, op=dist.ReduceOp.MAX)
    if not world.main:
        return None
    tokens = job["steps"] * job["micro_batch"] * world.size * job["context"]
    return {
        "gpus": world.size,
        "tokens_per_s": tokens / seconds,
        "peak_cuda_bytes_max_rank": int(peak.item()),
        "host_rss_bytes": _peak_rss(),
        "memory_report_rank0": report,
        "final_loss": run.final_loss,
        "cuda_graphs": run.cuda_graphs,
        "load_seconds": load_s,
        "storage": storage,
    }


def one_gpu_bytes(job: dict[str, Any]) -> int:
    """What one process needs for a `full` fine-tune of the shape: f16 weights plus fp32 masters,
    gradients and two AdamW moments (16 bytes) per parameter."""
    s = SHAPES[job["shape"]]
    h, f, v, layers = (
        s["hidden_size"],
        s["intermediate_size"],
        s["vocab_size"],
        s["num_hidden_layers"],
    )
    kv = h * s["num_key_value_heads"] // s["num_attention_heads"]
    per_layer = 2 * h * h + 2 * h * kv + 3 * h * f + 2 * h
    params = layers * per_layer + v * h * (1 if s["tie_word_embeddings"] else 2) + h
    return params * (2 + 16)


def table(experiment: str, rows: list[dict[str, Any]], job: dict[str, Any]) -> str:
    one = next((r for r in rows if r.get("gpus") == 1 and "tokens_per_s" in r), None)
    earlier = Path(job["dir"]) / f"{experiment}-1.json"  # a one-GPU run of an earlier call
    if one is None and earlier.exists():
        one = json.loads(earlier.read_text())
    lines = [f"## {experiment}: {job['shape']}, context {job['context']}, micro_batch "
             f"{job['micro_batch']} per GPU", "",
             "| GPUs | tok/s | per GPU vs 1 GPU | peak CUDA GB (max rank) | loss |",
             "|---|---|---|---|---|"]  # fmt: skip
    for r in rows:
        if "tokens_per_s" not in r:
            lines.append(f"| {r['gpus']} | {r['error'][-200:]!r} ||||")
            continue
        eff = f"{r['tokens_per_s'] / (r['gpus'] * one['tokens_per_s']):.1%}" if one else "-"
        lines.append(f"| {r['gpus']} | {r['tokens_per_s']:,.0f} | {eff} | "
                     f"{r['peak_cuda_bytes_max_rank'] / 1e9:.1f} | {r['final_loss']:.4f} |")  # fmt: skip
    if experiment == "full":
        lines += ["", f"one GPU would need {one_gpu_bytes(job) / 1e9:.0f} GB before activations"]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shape", default="llama3-8b", choices=sorted(SHAPES))
    ap.add_argument("--gpus", default="1,2,4", help="rank counts, comma separated")
    ap.add_argument("--full", action="store_true", help="FSDP full fine-tuning instead of QLoRA")
    ap.add_argument("--offload", action="store_true", help="full: shards in host memory")
    ap.add_argument("--shard-base", action="store_true", help="QLoRA with the NF4 base sharded")
    ap.add_argument("--micro-batch", type=int, default=1, help="rows per GPU per update")
    ap.add_argument("--context", type=int, default=0, help="override the shape's context")
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--precision", default="bfloat16", choices=("bfloat16", "float16"))
    ap.add_argument("--activations", default="", choices=("", "keep", "checkpoint", "offload"),
                    help="default: keep for QLoRA, checkpoint for full")  # fmt: skip
    ap.add_argument("--out", default="/tmp/train_distributed")
    ap.add_argument("--timeout", type=int, default=1800)
    ap.add_argument("--dry-run", action="store_true", help="CPU, gloo, tiny shape, 1 and 2 ranks")
    ap.add_argument("--worker", help=argparse.SUPPRESS)
    ap.add_argument("--json", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.worker:
        result = worker(json.loads(args.worker))
        if result is not None:
            Path(args.json).write_text(json.dumps(result))
        return 0
    import torch

    device = "cuda" if torch.cuda.is_available() else "cpu"
    experiments = ["full"] if args.full else ["qlora-sharded"] if args.shard_base else ["qlora"]
    gpus = [int(n) for n in args.gpus.split(",")]
    if args.dry_run:
        args.shape, device, gpus, experiments = (
            "tiny",
            "cpu",
            [1, 2],
            ["qlora", "qlora-sharded", "full"],
        )
        args.steps, args.warmup = 2, 1
    work = Path(args.out) / args.shape
    work.mkdir(parents=True, exist_ok=True)
    model = work / "model.gguf"
    if not model.exists():
        make_gguf(args.shape, model)
    report = []
    for experiment in experiments:
        activations = args.activations or ("checkpoint" if experiment == "full" else "keep")
        job = {"experiment": experiment, "dir": str(work), "model": str(model),
               "shape": args.shape, "device": device, "micro_batch": args.micro_batch,
               "context": args.context or SHAPES[args.shape]["context"], "steps": args.steps,
               "warmup": args.warmup, "precision": args.precision, "activations": activations,
               "offload": args.offload,
               "timeout": args.timeout}  # fmt: skip
        rows = [launch(job, n) for n in gpus]
        text = table(experiment, rows, job)
        print(text + "\n", flush=True)
        report.append({"job": job, "rows": rows, "table": text})
    out = Path(args.out) / "train_distributed.json"
    out.write_text(json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
