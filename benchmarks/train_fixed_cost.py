"""The fixed cost of a `train()` call: what a call costs beyond its updates, with warm caches.

Each repeat times whole `train()` calls on a fresh LoRA of one loaded model, one of 1 update and
one of N; every example has the same length, so every update is the same work, and

    fixed cost = T(1) - (T(N) - T(1)) / (N - 1)

(T(1) is one update plus the fixed cost, and each further update costs the same). On a machine
whose other load makes an update's time vary by more than the fixed cost, that difference is
noise; the report therefore also gives, per call, the seconds `train` spends outside its updates
(each `update()` timed on its own) and the first update's excess over the call's later ones (a
per-call warm-up inside the first update). A first, untimed call warms the caches (imports,
kernels, the dataset's tokenization). Every call writes an event log; the second variant also
gives a checkpoint folder (so the call writes its final checkpoint). The report also gives the
1-update call's time by phase: the time `train` spends in each function it calls directly, from
cProfile (whose own overhead inflates the total a little), and what a garbage collection costs
in the process (one runs before each CUDA graph recording, `train.graphs`). `--continued`
makes every call continue one LoRA (its optimizer state carried), as `train_scale.py` times a
call's overhead; `--top N` adds the N functions of largest cumulative and own time.

    python benchmarks/train_fixed_cost.py --out benchmarks/results/cpu_train_fixed_cost.json
    python benchmarks/train_fixed_cost.py --device cuda --storage nf4_double_quant \\
        --precision bfloat16 --out benchmarks/results/h200_train_fixed_cost.json
    python benchmarks/train_fixed_cost.py --device cuda --model /tmp/train_scale/llama3-8b/model \
        --storage nf4_double_quant --precision bfloat16 --context 2048 --rank 16 \
        --targets q_proj,k_proj,v_proj,o_proj,gate_proj,up_proj,down_proj --continued --top 40
"""

from __future__ import annotations

import argparse
import cProfile
import gc
import json
import platform
import pstats
import statistics
import subprocess
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from aner_lang.runtime import adapters as A
from aner_lang.runtime.load.loader import load_model
from aner_lang.runtime.tasks.data import from_texts
from aner_lang.runtime.train import graphs, trainer
from aner_lang.runtime.train.profile import profile
from aner_lang.testing.fixture import smollm2_gguf_path

ROOT = Path(__file__).resolve().parents[1]
TEXT = "The quiet mountain lake reflects the clear morning sky above the old stone bridge."


def commit() -> str:
    """The checkout's commit: what the figures were measured on."""
    head = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "HEAD"], capture_output=True)
    return head.stdout.decode().strip()


def _synchronize(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def phases(call: Callable[[], object], top: int = 0) -> dict[str, Any]:
    """Seconds `trainer.train` spends in each function it calls directly (cProfile), largest
    first, and the rest (`train` itself); with `top`, also the `top` functions of largest
    cumulative time anywhere in the call (`"top"`), where the direct phases hide what an update
    spends."""
    prof = cProfile.Profile()
    prof.enable()
    call()
    prof.disable()
    stats: dict[Any, Any] = pstats.Stats(prof).stats  # type: ignore[attr-defined]
    out: dict[str, Any] = {}
    keys = [k for k in stats if k[2] == "train" and Path(k[0]).name == "trainer.py"]
    if keys:  # cProfile loses it where a CUDA graph recording runs inside (seen on an H100)
        total = stats[keys[0]][3]
        for (file, line, name), (*_, callers) in stats.items():
            if keys[0] in callers:
                out[_where(file, line, name)] = callers[keys[0]][3]
        spent = sum(out.values())
        out = {k: round(v, 4) for k, v in sorted(out.items(), key=lambda kv: -kv[1])[:15]}
        out["train itself"] = round(max(total - spent, 0.0), 4)
        out["total"] = round(total, 4)
    if top:
        for name, column in (("top", 3), ("top_own", 2)):  # cumulative, then own time
            largest = sorted(stats.items(), key=lambda kv: -kv[1][column])[:top]
            out[name] = {_where(*key): round(v[column], 4) for key, v in largest}
    return out


def _where(file: str, line: int, name: str) -> str:
    return f"{Path(file).name}:{line}({name})"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default=None, help="a GGUF file or HF folder (default: SmolLM2)")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--storage", default="float32")
    ap.add_argument("--precision", default="float32")
    ap.add_argument("--updates", type=int, default=3, help="N, the longer call's updates")
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--context", type=int, default=32)
    ap.add_argument("--rank", type=int, default=8)
    ap.add_argument("--targets", default="q_proj,v_proj", help="LoRA targets, comma separated")
    ap.add_argument("--continued", action="store_true",
                    help="every call continues one LoRA (its optimizer state carried, as a script "
                    "that calls train() again on its adapter does) instead of a fresh one")  # fmt: skip
    ap.add_argument("--top", type=int, default=0,
                    help="also give the N functions of largest cumulative time in a 1-update "
                    "call (cProfile), beside the direct phases")  # fmt: skip
    ap.add_argument("--out", default="")
    args = ap.parse_args()
    path = Path(args.model) if args.model else smollm2_gguf_path()
    if path is None:
        ap.error("the SmolLM2 package is not installed: give --model")
    model = load_model(path, storage=args.storage, device=args.device)
    # each text fills the context (truncated to it): an update is the work of a full row
    data = from_texts([" ".join([TEXT] * max(1, args.context // 16))] * 16, args.context)
    folder = Path(tempfile.mkdtemp(prefix="aner-fixed-cost-"))
    calls = done = 0

    def new_lora() -> Any:
        targets = args.targets.split(",")
        return A.lora(model, rank=args.rank, alpha=2.0 * args.rank, targets=targets, seed=1)

    lora = new_lora()

    update_seconds: list[float] = []
    update = trainer._Loop.update

    def timed_update(loop: Any, ahead: bool = False) -> dict[str, Any]:
        _synchronize(args.device)
        began = time.perf_counter()
        event = update(loop, ahead)
        _synchronize(args.device)
        update_seconds.append(time.perf_counter() - began)
        return event

    trainer._Loop.update = timed_update  # type: ignore[method-assign,assignment]

    def call(updates: int, checkpoints: bool) -> tuple[float, list[float]]:
        """The call's seconds, and each of its updates' seconds."""
        nonlocal calls, done
        calls += 1
        update_seconds.clear()
        adapter = lora if args.continued else new_lora()
        done = done + updates if args.continued else updates
        _synchronize(args.device)
        began = time.perf_counter()
        trainer.train(
            adapter,
            data,
            profile(precision=args.precision),
            steps=done,
            learning_rate=1e-3,
            seed=1,
            log=str(folder / f"events{calls}.jsonl"),
            checkpoints=str(folder / f"ck{calls}") if checkpoints else None,
        )
        _synchronize(args.device)
        return time.perf_counter() - began, list(update_seconds)

    call(1, True)  # warm-up
    rows = []
    for checkpoints in (False, True):
        one: list[float] = []
        many: list[float] = []
        outside: list[float] = []
        warmup: list[float] = []
        for _ in range(args.repeats):
            for n, times in ((1, one), (args.updates, many)):
                total, updates = call(n, checkpoints)
                times.append(total)
                outside.append(total - sum(updates))
                if n > 1:
                    warmup.append(updates[0] - statistics.median(updates[1:]))
        per_update = [(m - o) / (args.updates - 1) for o, m in zip(one, many)]
        fixed = [o - u for o, u in zip(one, per_update)]
        rows.append(
            {
                "variant": "log and checkpoints" if checkpoints else "log",
                "one_update_seconds": [round(t, 4) for t in one],
                f"{args.updates}_updates_seconds": [round(t, 4) for t in many],
                "per_update_seconds": round(statistics.median(per_update), 4),
                "fixed_seconds": [round(t, 4) for t in fixed],
                "fixed_seconds_median": round(statistics.median(fixed), 4),
                "outside_updates_seconds": [round(t, 4) for t in outside],
                "outside_updates_seconds_median": round(statistics.median(outside), 4),
                "first_update_excess_seconds": [round(t, 4) for t in warmup],
                "one_update_phases": phases(lambda c=checkpoints: call(1, c), args.top),  # type: ignore[misc]
            }
        )
        print(json.dumps(rows[-1]), flush=True)
    machine = f"{platform.machine()} {args.device}, torch {torch.__version__}"
    collections = {}
    for generation in (2, graphs.COLLECT_BEFORE_RECORDING):
        began = time.perf_counter()
        gc.collect(generation)
        collections[f"generation {generation}"] = round(time.perf_counter() - began, 4)
    report = {
        "commit": commit(),
        "machine": f"{machine}, {torch.get_num_threads()} threads",
        "model": path.name,
        **{k: getattr(args, k) for k in ("storage", "precision", "context")},
        "rows": rows,
        "gc_collect_seconds": collections,
    }
    if not args.out:
        print(json.dumps(report, indent=1))
        return 0
    out = Path(args.out)  # a list of reports, each run's appended: figures before and after
    reports = json.loads(out.read_text()) if out.exists() else []
    out.write_text(json.dumps([*reports, report], indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
