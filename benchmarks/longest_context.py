"""The longest context that trains a QLoRA update within a GPU memory cap, Aner beside Unsloth.

Every side trains the train_scale benchmark's LoRA (rank 16, all seven targets) on an NF4 base of
random weights of a model's shape (`--shape`, default the full Llama-3-8B) in bf16, one sequence
of random tokens per update, `--steps` updates. Per side and cap (`--caps`, GiB) the context is
doubled from `--start` until an attempt fails (or `--max` trains), then bisected between the last
success and the first failure until they are `--resolution` tokens apart. Every attempt is a
process of its own, so that an out-of-memory error leaves nothing behind for the next one.

The cap: before anything allocates, the attempt calls
`torch.cuda.set_per_process_memory_fraction(cap / card)`, so torch's caching allocator refuses
to hold more than the cap (a cap above the card is the card). It counts torch's allocations only:
the CUDA context, cuBLAS/cuDNN handles' own memory and anything allocated outside torch are not in
it, so a real card of the cap's size has some hundreds of MB less to give.

Sides: `aner` (Aner's trainer with `profile(memory_budget: cap)`: its own budget picker chooses
the activation policy; the policy picked and the planned peaks are read from the run's start
event), `aner-keep`, `aner-checkpoint`, `aner-offload` (the policy forced, no budget),
`unsloth` and `unsloth-gc` (Unsloth, without and with its offloading gradient checkpointing).
An attempt fails as `oom` (CUDA out of memory), `budget` (Aner's E-PROFILE-BUDGET: the plan
refused before training, no policy's planned peak fits), `timeout` (`--timeout` per attempt),
`killed` (SIGKILL from outside: the host's out-of-memory killer; every attempt records the least
host memory available while it ran), `error` (anything else; the tail of its output is kept) or
`deadline` (cut short by `--deadline`: not a result, the search stops there).

Beside the measured contexts the plan's: per activation policy the longest context (a multiple
of `--resolution`) whose `aner plan` peak (`runtime.train.plan.plan`, as the budget picker calls
it for this adapter) fits the cap, computed from the shape's config alone, without a GPU.

    python benchmarks/longest_context.py --caps 24,80 --sides aner,unsloth-gc --out /tmp/longest
    python benchmarks/longest_context.py --dry-run     # CPU, tiny shape, the cap as the budget

`--plan-only` prints the plan's table for a CUDA run and stops: no GPU needed.

Written: DIR/longest_context.json (every attempt, and per side and cap the longest context that
trained with its peak, tokens/s of its last update and policy), after every attempt; a Markdown
table at the end. `--dry-run` trains the tiny shape on the CPU, side `aner` only, caps of a few
MiB: no cap can be set on the CPU, so the budget picker's refusal (`budget`) is the boundary.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import train_scale as bench  # this directory is on sys.path when run as a script

from aner_lang.builtins import members
from aner_lang.host.memory import available_bytes

GIB = 1 << 30
POLICIES = tuple(members("Activations"))
"""Aner's activation policies, largest first."""
SIDES = ("aner", "aner-keep", "aner-checkpoint", "aner-offload", "unsloth", "unsloth-gc")
OUTSIDE_TORCH = 512 * 2**20
"""Bytes a run allocates outside torch's allocator before its profile checks the budget against
what is free (NVRTC modules, library workspaces): an uncapped attempt's budget leaves them out."""
RELEASED_SLACK = 256 * 2**20
"""What the GPU may hold beyond the search's starting level when an attempt begins."""
FAILURES = ("oom", "killed", "budget", "timeout", "error", "deadline")
SIGKILL = 9
DRY_CAPS = "0.012,0.02"
"""The dry run's caps (GiB): a few MiB, where the tiny shape's plan crosses them at a few hundred
tokens."""


# ---- the search ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Found:
    """A search's outcome: the longest context that trained (None: not even the start), the first
    context that failed above it (None: `--max` trained) and whether the search ran to the end."""

    longest: int | None
    failed: int | None
    complete: bool


def search(attempt: Callable[[int], bool | None], start: int, most: int, step: int) -> Found:
    """Double from `start` until `attempt(context)` fails or `most` trains, then bisect the gap
    between the last success and the first failure down to `step` tokens; every context probed is
    `start` plus a multiple of `step`. `attempt` returns None when it could not be run (out of
    time): the search stops with what it has, marked incomplete."""
    good: int | None = None
    context = start
    while True:
        ok = attempt(context)
        if ok is None:
            return Found(good, None, False)
        if not ok:
            bad = context
            break
        good = context
        if context >= most:
            return Found(good, None, True)
        context = min(2 * context, most)
    if good is None:
        return Found(None, bad, True)
    while bad - good > step:
        middle = good + max(step, (bad - good) // 2 // step * step)
        ok = attempt(middle)
        if ok is None:
            return Found(good, bad, False)
        good, bad = (middle, bad) if ok else (good, middle)
    return Found(good, bad, True)


def classify(text: str, timed_out: bool, signal: int | None = None) -> str:
    """The kind of a failed attempt from its error text and the signal that ended it, if any:
    `timeout`, `killed` (SIGKILL from outside the search: on these machines the kernel's
    out-of-memory killer, when the host's memory runs out), `budget` (Aner's E-PROFILE-BUDGET:
    refused by the plan before training), `oom` (torch's OutOfMemoryError or a CUDA "out of
    memory"), else `error`."""
    if timed_out:
        return "timeout"
    if signal == SIGKILL:
        return "killed"
    if "E-PROFILE-BUDGET" in text:
        return "budget"
    if "OutOfMemoryError" in text or "out of memory" in text.lower():
        return "oom"
    return "error"


# ---- the plan's longest context --------------------------------------------------------------


def plan_config(shape: str) -> Any:
    """Aner's ModelConfig of `shape`, as `aner plan` reads it from the folder's config.json."""
    from aner_lang.runtime.model.config import config_from_hf

    return config_from_hf(bench.hf_config(shape).to_dict(), Path(shape))


def planned_peak(config: Any, policy: str, context: int, cuda: bool) -> int:
    """`aner plan`'s peak for the benchmark's run at `context` under `policy`: the arguments
    `runtime.train.budget.pick` gives the planner for this adapter and profile."""
    from aner_lang.runtime.train.plan import plan
    from aner_lang.runtime.train.profile import Profile

    settings = {**Profile(precision="bfloat16", activations=policy).to_json()}
    return plan(config, storage="nf4_double_quant", method="lora", rank=bench.RANK,
                targets=list(bench.TARGETS), profile=settings, context=context, micro_batch=1,
                accumulation=1, updates=None, cuda=cuda).peak  # fmt: skip


def planned_longest(
    config: Any, caps: Iterable[int], most: int, step: int, cuda: bool = True
) -> dict[str, dict[int, int | None]]:
    """Per policy and cap (bytes), the longest context among `step`, 2 `step`... `most` whose
    planned peak fits the cap (None: not even `step`), as `aner plan` finds it
    (`plan.longest_context`)."""
    from aner_lang.runtime.train.plan import longest_context

    caps = sorted(caps)
    return {
        policy: {
            cap: longest_context(
                lambda c, p=policy, cap=cap: planned_peak(config, p, c, cuda) <= cap, most, step
            )
            for cap in caps
        }
        for policy in POLICIES
    }


# ---- one attempt: a process --------------------------------------------------------------------


def attempt_worker(side: str, job: dict[str, Any]) -> dict[str, Any]:
    """One attempt, in its own process: cap the allocator, write the batches, train."""
    import torch

    cuda = job["device"] == "cuda"
    result: dict[str, Any] = {"cap_bytes": job["cap_bytes"]}
    if cuda:  # before anything allocates: the allocator refuses beyond the cap
        total = torch.cuda.get_device_properties(0).total_memory
        result["card_bytes"] = total
        torch.cuda.set_per_process_memory_fraction(min(1.0, job["cap_bytes"] / total))
    bench.SHAPES[job["shape"]]["context"] = job["context"]
    bench.make_batches(job["shape"], job["steps"], Path(job["batches"]))
    train = unsloth_attempt if side.startswith("unsloth") else aner_attempt
    return {**result, **train(side, job)}


def aner_attempt(side: str, job: dict[str, Any]) -> dict[str, Any]:
    """Aner's trainer, `--steps` updates in one call, its log read for the budget's pick."""
    import torch

    from aner_lang.runtime.train.profile import profile
    from aner_lang.runtime.train.trainer import train

    _, adapter, load_s = bench.aner_adapter(job)
    data = bench._token_dataset(bench._batches(job))
    cuda = job["device"] == "cuda"
    budget = None
    if side == "aner":  # the cap, no more than the GPU can give (profile.validate's rule)
        budget = job["cap_bytes"]
        if cuda:  # less what the run allocates outside torch before it checks (kernel modules)
            free = torch.cuda.mem_get_info()[0] + torch.cuda.memory_reserved()
            budget = min(budget, free - OUTSIDE_TORCH)
    policy = side.removeprefix("aner-") if side != "aner" else "keep"
    prof = profile(precision="bfloat16", activations=policy, memory_budget=budget)
    log = Path(job["dir"]) / "train.jsonl"
    log.unlink(missing_ok=True)  # the log appends: its first event is then this run's start
    run = train(adapter, data, prof, steps=job["steps"], learning_rate=bench.LR, clip_norm=None,
                weight_decay=bench.WEIGHT_DECAY, seed=0, log=str(log))  # fmt: skip
    start = json.loads(log.read_text().splitlines()[0])
    return {
        # the last update's; with one update, the call's (its start-up included)
        "tokens_per_s": run.training_tokens_per_second or data.context / run.seconds,
        "peak_cuda_bytes": torch.cuda.max_memory_allocated() if cuda else 0,
        "policy": run.profile.activations,
        "budget_bytes": budget,
        "memory_budget": start.get("memory_budget"),
        "load_seconds": load_s,
        "losses": run.loss_history,
    }


def unsloth_attempt(side: str, job: dict[str, Any]) -> dict[str, Any]:
    """Unsloth (train_scale's model and update), the last of `--steps` updates timed."""
    model = bench.unsloth_model(job, checkpointing=side == "unsloth-gc")
    timed = {**job, "warmup": job["steps"] - 1, "steps": 1, "compare": 0}
    result = bench._measure(bench._hf_step(model, timed), bench._batches(job), timed)
    peak = max(result["peak_cuda_bytes"], result["warmup_peak_cuda_bytes"])
    policy = "unsloth checkpointing" if side == "unsloth-gc" else "keep"
    return {"tokens_per_s": result["tokens_per_s"], "peak_cuda_bytes": peak, "policy": policy}


def run_attempt(side: str, job: dict[str, Any], timeout: float) -> dict[str, Any]:
    """Run one attempt's process; its result, or the failure's kind and the tail of its output.
    Either way with the least host memory that was available while it ran (`HostLow`)."""
    out = Path(job["dir"]) / "result.json"
    out.unlink(missing_ok=True)
    cmd = [sys.executable, __file__, "--worker", side, "--job", json.dumps(job), "--json", str(out)]
    if job["device"] == "cuda":
        _wait_for_released(job["idle_bytes"])
    start = time.perf_counter()
    with HostLow() as host:
        try:
            proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
            # the error last, where the kept tail is: a peer's banner goes to stdout
            text, timed_out, code = proc.stdout + proc.stderr, False, proc.returncode
        except subprocess.TimeoutExpired as e:
            text, timed_out, code = _text(e.stdout) + _text(e.stderr), True, None
    seconds = time.perf_counter() - start
    low = {"host_available_low_bytes": host.lowest}
    if code == 0 and out.exists():
        return {**json.loads(out.read_text()), "ok": True, "seconds": seconds, **low}
    signal = -code if code is not None and code < 0 else None
    tail = text[-1500:] if signal is None else f"killed by signal {signal}\n{text[-1400:]}"
    kind = classify(text, timed_out, signal)
    return {"ok": False, "kind": kind, "seconds": seconds, "tail": tail, **low}


class HostLow:
    """The least host memory available (`host.memory.available_bytes`) while a `with` block runs,
    sampled every `every` seconds on a thread of its own (None where unknown). Beside a `killed`
    attempt it tells whether the host ran out of memory: the kernel's out-of-memory killer leaves
    no message in the process's output."""

    def __init__(self, every: float = 0.5) -> None:
        self.every = every
        self.lowest: int | None = None
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)

    def __enter__(self) -> HostLow:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._done.set()
        self._thread.join()

    def _sample(self) -> None:
        while True:
            now = available_bytes()
            if now is not None and (self.lowest is None or now < self.lowest):
                self.lowest = now
            if self._done.wait(self.every):
                return


def _wait_for_released(idle: int | None, most: float = 60.0) -> None:
    """Wait (at most `most` seconds) until the GPU holds no more than `idle` bytes (what was in use
    before the search), so that the memory of the attempt before, whose process may still be
    giving it back, is not counted against this one: an attempt under a budget checks what is
    free before it trains."""
    if idle is None:
        return
    deadline = time.monotonic() + most
    while time.monotonic() < deadline:
        used = bench.device_memory_used()
        if used is None or used <= idle + RELEASED_SLACK:
            return
        time.sleep(0.5)


def _text(data: bytes | str | None) -> str:
    return data.decode(errors="replace") if isinstance(data, bytes) else data or ""


# ---- the parent: model folder, the searches, the report ---------------------------------------


class Report:
    """Every attempt and every search's outcome, written to `path` whenever either changes."""

    def __init__(self, path: Path, settings: dict[str, Any]) -> None:
        self.path = path
        self.data: dict[str, Any] = {**settings, "attempts": [], "longest": [], "planned": {}}

    def add(self, key: str, row: dict[str, Any]) -> None:
        self.data[key].append(row)
        self.write()

    def write(self) -> None:
        self.path.write_text(json.dumps(self.data, indent=1))


def longest_row(side: str, cap: float, found: Found, attempts: list[dict[str, Any]]) -> dict:
    """A search's summary: its longest context with that attempt's figures, and what stopped it."""
    at = {a["context"]: a for a in attempts if a["side"] == side and a["cap_gib"] == cap}
    best = at.get(found.longest, {}) if found.longest else {}
    failed = at.get(found.failed) if found.failed else None
    return {"side": side, "cap_gib": cap, "longest": found.longest, "complete": found.complete,
            "peak_cuda_bytes": best.get("peak_cuda_bytes"), "tokens_per_s": best.get("tokens_per_s"),
            "policy": best.get("policy"), "failed_at": found.failed,
            "failure": failed["kind"] if failed else None}  # fmt: skip


def table(rows: list[dict[str, Any]]) -> str:
    """The Markdown table of the searches."""
    lines = ["| side | cap GiB | longest context | peak GB | tok/s at it | policy | stopped by |",
             "|---|---|---|---|---|---|---|"]  # fmt: skip
    for r in rows:
        longest = f"{r['longest']:,}" if r["longest"] else "none"
        peak = f"{r['peak_cuda_bytes'] / 1e9:.1f}" if r["peak_cuda_bytes"] else "-"
        tps = f"{r['tokens_per_s']:,.0f}" if r["tokens_per_s"] else "-"
        if r["failed_at"]:
            stop = f"{r['failure']} at {r['failed_at']:,}"
        else:
            stop = "--max" if r["complete"] else "deadline"
        if not r["complete"]:
            stop += " (incomplete)"
        lines.append(f"| {r['side']} | {r['cap_gib']:g} | {longest} | {peak} | {tps} | "
                     f"{r['policy'] or '-'} | {stop} |")  # fmt: skip
    return "\n".join(lines)


def planned_table(planned: dict[str, dict[int, int | None]], caps: list[float]) -> str:
    """The plan's longest context per policy (rows) and cap (columns)."""
    head = " | ".join(f"{c:g} GiB" for c in caps)
    lines = [f"| plan: policy | {head} |", "|---" * (len(caps) + 1) + "|"]
    for policy, by_cap in planned.items():
        cells = [by_cap[_bytes(c)] for c in caps]
        lines.append(f"| {policy} | " + " | ".join(f"{v:,}" if v else "none" for v in cells) + " |")
    return "\n".join(lines)


def _bytes(cap_gib: float) -> int:
    return int(cap_gib * GIB)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shape", default="llama3-8b", choices=sorted(bench.SHAPES))
    ap.add_argument("--caps", default="24,80", help="GPU memory caps in GiB, comma separated")
    ap.add_argument("--sides", default="aner,unsloth-gc", help=f"of {', '.join(SIDES)}")
    ap.add_argument("--start", type=int, default=8192)
    ap.add_argument("--max", type=int, default=524288)
    ap.add_argument("--resolution", type=int, default=1024, help="tokens the bisection ends at")
    ap.add_argument("--steps", type=int, default=2, help="updates per attempt (the last timed)")
    ap.add_argument("--timeout", type=float, default=300, help="seconds per attempt")
    ap.add_argument("--deadline", type=float, default=0, help="seconds for everything (0: none)")
    ap.add_argument("--out", default="/tmp/longest_context")
    ap.add_argument("--dry-run", action="store_true", help="CPU, tiny shape, side aner, MiB caps")
    ap.add_argument("--plan-only", action="store_true", help="the plan's table alone, no training")
    ap.add_argument("--worker", help=argparse.SUPPRESS)
    ap.add_argument("--job", help=argparse.SUPPRESS)
    ap.add_argument("--json", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.worker:
        from aner_lang.problems.errors import AnerRuntimeError

        try:
            result = attempt_worker(args.worker, json.loads(args.job))
        except AnerRuntimeError as e:  # its code (E-PROFILE-BUDGET) is what `classify` reads
            print(f"error[{e.code}]: {e}", file=sys.stderr)
            return 1
        Path(args.json).write_text(json.dumps(result))
        return 0
    import torch

    device = "cuda" if torch.cuda.is_available() or args.plan_only else "cpu"
    sides = args.sides.split(",")
    if args.dry_run:
        device, args.shape, sides = "cpu", "tiny", ["aner"]
        if args.caps == ap.get_default("caps"):
            args.caps = DRY_CAPS
        args.start, args.max, args.resolution = 64, 2048, 64
    if unknown := [s for s in sides if s not in SIDES]:
        ap.error(f"unknown sides {unknown}; expected some of {', '.join(SIDES)}")
    if args.start % args.resolution or args.steps < 1:
        ap.error("--start must be a multiple of --resolution, and --steps at least 1")
    caps = [float(c) for c in args.caps.split(",")]
    began = time.perf_counter()
    work = Path(args.out) / args.shape
    work.mkdir(parents=True, exist_ok=True)
    report = Report(Path(args.out) / "longest_context.json",
                    {"shape": args.shape, "device": device, "caps_gib": caps, "sides": sides,
                     "start": args.start, "max": args.max, "resolution": args.resolution,
                     "steps": args.steps, "cap_rule": "torch allocations only "
                     "(set_per_process_memory_fraction); CUDA context and non-torch memory "
                     "are outside the cap"})  # fmt: skip
    config = plan_config(args.shape)
    planned = planned_longest(
        config, map(_bytes, caps), args.max, args.resolution, device == "cuda"
    )
    report.data["planned"] = {p: {f"{c:g}": v[_bytes(c)] for c in caps} for p, v in planned.items()}
    report.write()
    print(planned_table(planned, caps), flush=True)
    if args.plan_only:
        return 0
    bench.SHAPES[args.shape]["context"] = args.max  # the folder's positions reach --max
    model = work / f"model-{args.max}"
    if not (model / "config.json").exists():  # on CUDA by a process of its own: this one
        bench.make_model(args.shape, model, device)  # holds no GPU memory through the attempts
    idle = bench.device_memory_used() if device == "cuda" else None
    for cap in caps:
        for side in sides:
            folder = work / f"{side}-{cap:g}"
            folder.mkdir(exist_ok=True)

            def attempt(context: int, side: str = side, cap: float = cap, folder: Path = folder):
                left = args.deadline - (time.perf_counter() - began) if args.deadline else None
                if left is not None and left < 10:
                    return None
                job = {"dir": str(folder), "model": str(model), "shape": args.shape,
                       "batches": str(folder / "batches.safetensors"), "context": context,
                       "steps": args.steps, "precision": "bfloat16", "device": device,
                       "cap_bytes": _bytes(cap), "idle_bytes": idle}  # fmt: skip
                limit = args.timeout if left is None else min(args.timeout, left)
                row = run_attempt(side, job, limit)
                if row.get("kind") == "timeout" and limit < args.timeout:
                    row["kind"] = "deadline"
                report.add("attempts", {"side": side, "cap_gib": cap, "context": context, **row})
                print(summary(report.data["attempts"][-1]), flush=True)
                return None if row.get("kind") == "deadline" else bool(row["ok"])

            found = search(attempt, args.start, args.max, args.resolution)
            report.add("longest", longest_row(side, cap, found, report.data["attempts"]))
    print(table(report.data["longest"]))
    return 0


def summary(row: dict[str, Any]) -> str:
    """One line for an attempt as it finishes."""
    head = f"{row['side']} cap {row['cap_gib']:g} GiB context {row['context']:,}"
    if not row["ok"]:
        low = row.get("host_available_low_bytes")
        host = f" (host memory available fell to {low / 1e9:.1f} GB)" if low is not None else ""
        text = row["tail"][-300:].strip()
        return f"{head}: {row['kind']} after {row['seconds']:.0f} s{host}: {text}"
    peak = f"{row['peak_cuda_bytes'] / 1e9:.1f} GB" if row["peak_cuda_bytes"] else "- (CPU)"
    return (f"{head}: trained, peak {peak}, "
            f"{row['tokens_per_s'] or 0:,.0f} tok/s, {row['policy']}, {row['seconds']:.0f} s")  # fmt: skip


if __name__ == "__main__":
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    sys.exit(main())
