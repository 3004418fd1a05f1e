"""The whole run, as each tool's users run it: from launching a process to the saved adapter.

Three sides fine-tune the same random-weight HF folder on the same text JSONL, each as one
process started from scratch and timed from launch to exit:

- `aner`: `aner run script.aner` (`load_model(folder, storage: nf4_double_quant)`, `lora`,
  `train`, `save_adapter`);
- `unsloth`: Unsloth's `FastLanguageModel` + TRL's `SFTTrainer` (its documented recipe);
- `peft`: transformers + bitsandbytes NF4 + PEFT + TRL's `SFTTrainer` (the usual QLoRA recipe).

The same work on every side: LoRA rank 16, alpha 32, no dropout, the seven linear targets;
AdamW (torch's, fp32 moments) at a constant 2e-4 with weight decay 0.0, clipping at 1.0; bf16
compute; batch 1, no packing, activations kept (no gradient checkpointing: TRL turns it on by
default, so it is turned off here), or with `--checkpointing` each side's own gradient
checkpointing (Aner's `activations: checkpoint`, Unsloth's offloaded "unsloth" checkpointing,
transformers' through TRL's `gradient_checkpointing`), as long contexts need; `--updates`
updates, validation every `--every` on `--val-rows` rows, a checkpoint (adapter and optimizer
state) every `--every`. Aner also validates after its first update, as its `train` always does:
extra work on its side.

Reported per side and repeat (`--repeats`, every side once per repeat, in turn): time from
launch to the end of the first update (Aner logs an update after its validation and checkpoint,
whose seconds the event names and which are taken off here; the peers' callback fires before
theirs), training tokens/s between the first and last update (validation
and checkpoint stalls included), the whole process's wall time, peak GPU memory while the side
runs as `nvidia-smi` sees the device, over what was in use before (the same count for every
side: CUDA context, allocator cache and all), the pause per validation and checkpoint (the time
between updates beyond the median gap, over `updates // every` of them; Aner's extra validation
after its first update counts in its pauses) and, for Aner, the longest pause its event log names
for a checkpoint (`checkpoint_seconds`: the snapshot and the hand-over to the background writer),
the final training loss and the last validation loss, and the achieved model TFLOP/s and MFU
against this GPU's measured dense bf16 GEMM rate. Model FLOPs per token: 4 x the base's matmul
parameters (forward and the input gradient; the frozen base has no weight gradient) + 6 x the
LoRA parameters + causal attention (3 x 2 x layers x context x hidden).

    python benchmarks/train_e2e.py --shapes llama3.2-1b --repeats 2 --out /tmp/e2e
    python benchmarks/train_e2e.py --dry-run     # CPU, tiny shape, aner and peft (no bnb)

The peers need `.peers/site` on PYTHONPATH and the offline variables (shared/device/peers.md).
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import random
import shutil
import subprocess
import sys
import threading
import time
from datetime import datetime
from pathlib import Path
from typing import Any

import train_scale as bench  # this directory is on sys.path when run as a script

SIDES = ("aner", "unsloth", "peft")


# ---- the work: folder, data, script ---------------------------------------------------------


def make_data(shape: str, rows: int, path: Path, seed: int) -> None:
    """`rows` texts of the shape's context less one token (room for an EOS a side may add), in
    the folder's word-level vocabulary (`<tN>`), drawn from one small first-order chain (the
    same for every seed, so held-out rows follow what training rows teach) so that the loss can
    fall."""
    cfg = bench.SHAPES[shape]
    words = min(cfg["vocab_size"] - 3, 2000)
    chain = random.Random(0)
    jump = [chain.randrange(words) for _ in range(words)]
    rng = random.Random(seed)
    with path.open("w") as f:
        for _ in range(rows):
            tok, ids = rng.randrange(words), []
            for _ in range(cfg["context"] - 1):
                ids.append(tok + 3)
                tok = jump[tok] if rng.random() < 0.8 else rng.randrange(words)
            f.write(json.dumps({"text": " ".join(f"<t{i}>" for i in ids)}) + "\n")


def aner_script(job: dict[str, Any]) -> str:
    """The Aner side's whole program."""
    targets = ", ".join(bench.TARGETS)
    precision = "bfloat16" if job["device"] == "cuda" else "float32"
    activations = "checkpoint" if job["checkpointing"] else "keep"
    return f"""
let base = load_model("{job["model"]}", storage: nf4_double_quant, device: auto)
let data = load_jsonl("{job["train"]}", field: "text", context: {job["context"]})
let held_out = load_jsonl("{job["val"]}", field: "text", context: {job["context"]})
let adapter = lora(base, rank: {bench.RANK}, alpha: {bench.ALPHA}, targets: [{targets}], seed: 0)
let run = train(adapter, data, profile(precision: {precision}, activations: {activations}),
                steps: {job["updates"]},
                learning_rate: {bench.LR}, clip_norm: 1.0, weight_decay: 0.0, seed: 0,
                validation: held_out, eval_every: {job["every"]},
                checkpoints: "{job["dir"]}/ckpt", checkpoint_every: {job["every"]},
                log: "{job["dir"]}/events.jsonl")
save_adapter(run.adapter, "{job["dir"]}/adapter", format: peft)
"""


# ---- the parent: one process per side and repeat, polled for GPU memory ----------------------


class GpuMemory(threading.Thread):
    """The most GPU memory in use while one side runs, over what was in use before it started,
    as `nvidia-smi` reports the device (one side runs at a time; container PID namespaces hide
    which process holds what)."""

    def __init__(self) -> None:
        super().__init__()
        self.baseline = bench.device_memory_used() or 0
        self.peak, self.done = 0, threading.Event()

    def run(self) -> None:
        while not self.done.wait(0.2):
            used = bench.device_memory_used()
            if used is None:
                return
            self.peak = max(self.peak, used - self.baseline)


def run_side(side: str, job: dict[str, Any], repeat: int) -> dict[str, Any]:
    """Launch one side as its users would, wait for it, and read what it recorded."""
    work = Path(job["dir"]) / f"{side}-{repeat}"
    shutil.rmtree(work, ignore_errors=True)  # this benchmark's own scratch: a run starts afresh
    work.mkdir(parents=True)
    job = {**job, "dir": str(work)}
    if side == "aner":
        script = work / "script.aner"
        script.write_text(aner_script(job))
        profiled = ["-m", "cProfile", "-o", str(work / "aner.prof")] if job["profile"] else []
        cmd = [sys.executable, *profiled, "-m", "aner_lang.cli", "run", str(script)]
    else:
        cmd = [sys.executable, __file__, "--worker", side, "--job", json.dumps(job)]
    memory = GpuMemory()
    launched = time.time()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    if job["device"] == "cuda":
        memory.start()
    try:
        output, _ = proc.communicate(timeout=job["timeout"])
    except subprocess.TimeoutExpired:
        proc.kill()
        output, _ = proc.communicate()
    wall = time.time() - launched
    memory.done.set()
    if memory.is_alive():
        memory.join()
    (work / "output.log").write_text(output)
    row: dict[str, Any] = {"side": side, "repeat": repeat, "wall_s": wall, "exit": proc.returncode}
    if proc.returncode != 0:
        return {**row, "error": output[-1500:]}
    events = (
        _aner_events(work) if side == "aner" else json.loads((work / "record.json").read_text())
    )
    return {**row, **_timeline(events, launched, job), "peak_gpu_bytes": memory.peak}


def _aner_events(work: Path) -> dict[str, Any]:
    """Aner's event log as the peers' record: update times and losses, validation losses."""
    updates, validations, checkpoints = [], [], []
    torch_peak: list[int | None] = [None, None]
    started, before_start = None, None
    for line in (work / "events.jsonl").read_text().splitlines():
        e = json.loads(line)
        stamp = datetime.fromisoformat(e["time"].replace("Z", "+00:00")).timestamp()
        if e["event"] == "update":
            # logged after the update's validation and checkpoint: the update ended before them
            paused = e.get("validation_seconds", 0.0) + e.get("checkpoint_seconds", 0.0)
            updates.append((stamp - paused if not updates else stamp, e["loss"]))
        if e.get("validation_loss") is not None:
            validations.append(e["validation_loss"])
        if "checkpoint_seconds" in e:
            checkpoints.append(e["checkpoint_seconds"])
        if e["event"] == "end":
            torch_peak = [e.get("peak_gpu_allocated_bytes"), e.get("peak_gpu_reserved_bytes")]
        if e["event"] == "start":
            started, before_start = stamp, e.get("before_start")
    return {"updates": updates, "validations": validations, "checkpoint_s": checkpoints,
            "torch_peak_bytes": torch_peak, "started": started,
            "before_start": before_start}  # fmt: skip


def _timeline(record: dict[str, Any], launched: float, job: dict[str, Any]) -> dict[str, Any]:
    """Time to the first update, tokens/s from the first to the last, the last losses."""
    times = [t for t, _ in record["updates"]]
    tokens = (len(times) - 1) * job["context"]
    gaps = sorted(b - a for a, b in itertools.pairwise(times))
    pauses = len(times) // job["every"]
    return {
        "updates": len(times),
        "first_update_s": times[0] - launched,
        "train_tokens_per_s": tokens / max(times[-1] - times[0], 1e-9),
        # the time between updates beyond the median gap, per validation and checkpoint
        "pause_s": (sum(gaps) - len(gaps) * gaps[len(gaps) // 2]) / pauses if pauses else None,
        "checkpoint_s": record.get("checkpoint_s"),
        # Aner's own count, allocated and reserved (its end event), beside the device's
        "torch_peak_bytes": record.get("torch_peak_bytes"),
        # Aner's start-up in two parts: imports, loading and data until `train` starts; then
        # compiles, warm-up and graph recording until the first update has ended
        "before_start_s": record["started"] - launched if record.get("started") else None,
        # of which, by Aner's own count: loading the model and building the fused kernels
        "before_start_phases": record.get("before_start"),
        "final_loss": record["updates"][-1][1],
        "validation_loss": record["validations"][-1] if record["validations"] else None,
    }


def flops_per_token(shape: str, context: int) -> float:
    """Model FLOPs per trained token (see the module docstring)."""
    c = bench.SHAPES[shape]
    h, f, layers = c["hidden_size"], c["intermediate_size"], c["num_hidden_layers"]
    kv = h * c["num_key_value_heads"] // c["num_attention_heads"]
    base = layers * (2 * h * h + 2 * h * kv + 3 * h * f) + h * c["vocab_size"]
    dims = [(h, h), (h, kv), (h, kv), (h, h), (h, f), (h, f), (f, h)]
    lora = layers * sum(bench.RANK * (i + o) for i, o in dims)
    return 4.0 * base + 6.0 * lora + 6.0 * layers * context * h


def dense_peak_flops() -> float:
    """This GPU's dense bf16 GEMM rate (8192^3, best of 20 after a warm-up)."""
    import torch

    a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    b = torch.randn_like(a)
    for _ in range(3):
        a @ b
    best = float("inf")
    for _ in range(20):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        a @ b
        end.record()
        end.synchronize()
        best = min(best, start.elapsed_time(end) / 1e3)
    return 2 * 8192**3 / best


def table(shape: str, rows: list[dict[str, Any]], per_token: float, peak: float) -> str:
    lines = [f"## {shape}", "",
             "| side | repeat | first update s | train tok/s | MFU | whole process s | vs Aner | "
             "peak GPU GB | pause s | checkpoint s | final loss | validation loss |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|"]  # fmt: skip
    aner_wall = {r["repeat"]: r["wall_s"] for r in rows if r["side"] == "aner" and "updates" in r}
    for r in rows:
        if "updates" not in r:
            lines.append(
                f"| {r['side']} | {r['repeat']} | {r.get('error', '?')[-120:]!r} |||||||||| "
            )
            continue
        mfu = f"{100 * r['train_tokens_per_s'] * per_token / peak:.0f}%" if peak else "-"
        ratio = f"{r['wall_s'] / aner_wall[r['repeat']]:.2f}x" if r["repeat"] in aner_wall else "-"
        val = f"{r['validation_loss']:.4f}" if r["validation_loss"] is not None else "-"
        pause = f"{r['pause_s']:.2f}" if r.get("pause_s") is not None else "-"
        saved = f"{max(r['checkpoint_s']):.2f}" if r.get("checkpoint_s") else "-"
        lines.append(f"| {r['side']} | {r['repeat']} | {r['first_update_s']:.1f} | "
                     f"{r['train_tokens_per_s']:,.0f} | {mfu} | {r['wall_s']:.1f} | {ratio} | "
                     f"{r['peak_gpu_bytes'] / 1e9:.2f} | {pause} | {saved} | {r['final_loss']:.4f} | "
                     f"{val} |")  # fmt: skip
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shapes", default="smollm2,llama3.2-1b")
    ap.add_argument("--sides", default=",".join(SIDES))
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--updates", type=int, default=300)
    ap.add_argument("--every", type=int, default=100, help="validation and checkpoint interval")
    ap.add_argument("--val-rows", type=int, default=16)
    ap.add_argument("--context", type=int, default=0, help="override the shape's context")
    ap.add_argument("--checkpointing", action="store_true",
                    help="every side with its own gradient checkpointing")  # fmt: skip
    ap.add_argument("--out", default="/tmp/train_e2e")
    ap.add_argument("--timeout", type=int, default=900)
    ap.add_argument("--dry-run", action="store_true", help="CPU, tiny shape, aner and peft")
    ap.add_argument("--profile", action="store_true",
                    help="aner under cProfile (aner.prof, top functions printed): where its "
                    "start-up goes; its times are not comparable")  # fmt: skip
    ap.add_argument("--worker", help=argparse.SUPPRESS)
    ap.add_argument("--job", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.worker:
        WORKERS[args.worker](json.loads(args.job))
        return 0
    import torch

    device = "cuda" if torch.cuda.is_available() else "cpu"
    shapes, sides = args.shapes.split(","), args.sides.split(",")
    if args.dry_run:
        shapes, sides, device = ["tiny"], ["aner", "peft"], "cpu"
        args.updates, args.every, args.val_rows, args.repeats = 6, 3, 2, 1
    peak = dense_peak_flops() if device == "cuda" else 0.0
    report: dict[str, Any] = {"machine": _machine(device), "dense_bf16_flops": peak, "shapes": []}
    for shape in shapes:
        if args.context:
            bench.SHAPES[shape]["context"] = args.context
        work = Path(args.out) / shape
        work.mkdir(parents=True, exist_ok=True)
        model = work / "model"
        if not (model / "config.json").exists():
            bench.make_model(shape, model, device)
        make_data(shape, args.updates + 8, work / "train.jsonl", seed=1)
        make_data(shape, args.val_rows, work / "val.jsonl", seed=2)
        job = {"model": str(model), "train": str(work / "train.jsonl"),
               "val": str(work / "val.jsonl"), "dir": str(work), "device": device,
               "context": bench.SHAPES[shape]["context"], "updates": args.updates,
               "every": args.every, "timeout": args.timeout,
               "checkpointing": args.checkpointing, "profile": args.profile}  # fmt: skip
        per_token = flops_per_token(shape, job["context"])
        entry: dict[str, Any] = {"shape": shape, "job": job, "rows": [], "table": ""}
        report["shapes"].append(entry)
        for repeat in range(1, args.repeats + 1):
            for side in sides:  # written as each side finishes: a stopped run keeps the rest
                row = run_side(side, job, repeat)
                if args.profile and side == "aner":
                    _print_profile(Path(job["dir"]) / f"aner-{repeat}" / "aner.prof")
                entry["rows"].append(row)
                print(json.dumps(row)[:400], flush=True)
                entry["table"] = table(shape, entry["rows"], per_token, peak)
                (Path(args.out) / "train_e2e.json").write_text(json.dumps(report, indent=1))
        print(entry["table"], flush=True)
    return 0


def _print_profile(path: Path, top: int = 40) -> None:
    """The profiled run's functions by cumulative time: imports, loading, NVRTC and Triton
    compiles, graph recording and training each show as a subtree."""
    import pstats

    if path.exists():
        print(f"profile {path}", flush=True)
        pstats.Stats(str(path), stream=sys.stdout).sort_stats("cumulative").print_stats(top)


def _machine(device: str) -> dict[str, Any]:
    import torch

    out = {"device": device, "torch": torch.__version__, "commit": _commit()}
    if device == "cuda":
        out["gpu"] = torch.cuda.get_device_name()
    return out


def _commit() -> str:
    here = Path(__file__).resolve().parent
    proc = subprocess.run(
        ["git", "-C", str(here), "rev-parse", "HEAD"], capture_output=True, text=True
    )
    return proc.stdout.strip() or "unknown (no git metadata)"


# ---- the peers: TRL's SFTTrainer, as their users run it ---------------------------------------


def _sft(
    model: Any, tokenizer: Any, job: dict[str, Any], peft_config: Any = None, unsloth: bool = False
) -> None:
    """Train with TRL's SFTTrainer under the shared settings, record each update's time and
    loss and each validation's loss, and save the adapter. An `unsloth` model checkpoints (or
    not) as `get_peft_model` set it up; TRL's own checkpointing stays off for it."""
    from datasets import load_dataset
    from transformers import TrainerCallback
    from trl import SFTConfig, SFTTrainer

    cuda = job["device"] == "cuda"
    data = load_dataset("json", data_files={"train": job["train"], "val": job["val"]})
    record: dict[str, Any] = {"updates": [], "validations": []}

    class Record(TrainerCallback):  # type: ignore[misc]
        def on_step_end(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
            record["updates"].append([time.time(), None])

        def on_log(self, args: Any, state: Any, control: Any, logs: Any = None, **kw: Any) -> None:
            logs = logs or {}
            if "loss" in logs and record["updates"]:
                record["updates"][-1][1] = logs["loss"]
            if "eval_loss" in logs:
                record["validations"].append(logs["eval_loss"])

    config = SFTConfig(
        output_dir=f"{job['dir']}/ckpt", max_steps=job["updates"], per_device_train_batch_size=1,
        per_device_eval_batch_size=1, gradient_accumulation_steps=1, learning_rate=bench.LR,
        lr_scheduler_type="constant", warmup_steps=0, weight_decay=0.0, max_grad_norm=1.0,
        optim="adamw_torch", bf16=cuda, use_cpu=not cuda,
        gradient_checkpointing=job["checkpointing"] and not unsloth,
        max_length=job["context"], packing=False, dataset_text_field="text", logging_steps=1,
        eval_strategy="steps", eval_steps=job["every"], save_strategy="steps",
        save_steps=job["every"], report_to="none", seed=0, dataloader_num_workers=0)  # fmt: skip
    trainer = SFTTrainer(model=model, args=config, train_dataset=data["train"],
                         eval_dataset=data["val"], processing_class=tokenizer,
                         peft_config=peft_config, callbacks=[Record()])  # fmt: skip
    trainer.train()
    trainer.save_model(f"{job['dir']}/adapter")
    record["updates"] = [
        [t, loss if loss is not None else float("nan")] for t, loss in record["updates"]
    ]
    Path(job["dir"], "record.json").write_text(json.dumps(record))


def _lora_config() -> Any:
    from peft import LoraConfig

    return LoraConfig(r=bench.RANK, lora_alpha=bench.ALPHA, lora_dropout=0.0,
                      target_modules=bench.TARGETS, task_type="CAUSAL_LM")  # fmt: skip


def unsloth_worker(job: dict[str, Any]) -> None:
    import torch
    from unsloth import FastLanguageModel

    model, tokenizer = FastLanguageModel.from_pretrained(
        model_name=job["model"], max_seq_length=job["context"], dtype=torch.bfloat16,
        load_in_4bit=True)  # fmt: skip
    model = FastLanguageModel.get_peft_model(
        model, r=bench.RANK, lora_alpha=bench.ALPHA, lora_dropout=0, target_modules=bench.TARGETS,
        use_gradient_checkpointing="unsloth" if job["checkpointing"] else False,
        random_state=0)  # fmt: skip
    _sft(model, tokenizer, job, unsloth=True)


def peft_worker(job: dict[str, Any]) -> None:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    kwargs: dict[str, Any] = {"attn_implementation": "sdpa"}
    if job["device"] == "cuda":
        from transformers import BitsAndBytesConfig

        kwargs.update(dtype=torch.bfloat16, device_map="cuda")
        kwargs["quantization_config"] = BitsAndBytesConfig(
            load_in_4bit=True, bnb_4bit_quant_type="nf4", bnb_4bit_use_double_quant=True,
            bnb_4bit_compute_dtype=torch.bfloat16)  # fmt: skip
    model = AutoModelForCausalLM.from_pretrained(job["model"], **kwargs)
    _sft(model, AutoTokenizer.from_pretrained(job["model"]), job, _lora_config())


WORKERS = {"unsloth": unsloth_worker, "peft": peft_worker}

if __name__ == "__main__":
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    sys.exit(main())
