"""QLoRA training at the sizes users train: Aner against PEFT + bitsandbytes, Liger and Unsloth.

Every side trains the same LoRA (rank 16, alpha 32, all seven linear targets, no dropout) on the
same NF4 double-quantized base of random weights of a real model's shape, from the same initial
adapter weights (Aner's, copied into the others), on the same token batches, with AdamW at the
same learning rate and weight decay (none) and no clipping. Each side runs in its own process,
one after another.

Reported per side: tokens/s over `--steps` updates after `--warmup` (for Aner by its trainer's
clock, the updates of a call of 2 x `--steps` after its first, each timed alone; beside it the
difference of that call and one of `--steps`, with the per-call cost it implies), the ratio to
PEFT + bnb and
to Unsloth, peak CUDA memory (weights included), peak host RSS, and the largest relative
difference of its first `--compare` losses from Aner's. For Aner also the device time of two
profiled updates split by what it was for (NF4 forward/backward, LoRA, attention, norms and
activations, loss, optimizer, other, idle).

    python benchmarks/train_scale.py --shapes llama3-8b-8,llama3-8b --out /tmp/scale
    python benchmarks/train_scale.py --dry-run          # CPU, tiny shape: the plumbing only
    python benchmarks/train_scale.py --shapes llama3-8b --gguf q4_k_m --repeats 3   # A B A B A B

`--repeats N` runs the sides in turn N times, each repeat its own row (`#2`...), so that ratios
can be read within one repeat and the spread across repeats; `storage: gguf` against NF4 is then
reported per repeat, by wall clock and by the device time of the profiled updates.

Shapes: smollm2 (context 512), llama3.2-1b, llama3-8b-8 (8 of 32 layers), llama3-8b (context
2048), qwen3-30b-a3b-4 (Qwen3-30B-A3B's mixture of experts, 128 experts of 768 top-8, at 4 of
48 layers; Aner's sides only, `MOE_SIDES`) and tiny-moe (its CPU-sized form), gemma3-1b (Gemma 3
1B: 262k vocabulary, sliding-window layers 5 of every 6, context 2048) and tiny-gemma3.
Sides: aner, peft, peft-gc (gradient checkpointing), peft-liger, unsloth, unsloth-gc,
and aner-checkpoint / aner-offload (Aner under that `activations:`, whatever `--activations` says)
and aner-checkpoint-eager (the same without CUDA graphs); on a MoE shape aner-moe-loop (the
experts one by one, as before the grouped GEMMs).
The peers need `.peers/site` on PYTHONPATH (shared/device/peers-site.sh) and the offline
variables that script lists; a side whose packages are missing is reported as skipped.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
RANK, ALPHA, LR = 16, 32.0, 2e-4
WEIGHT_DECAY = 0.0
"""Every side's AdamW weight decay (torch's AdamW defaults to 0.01, Aner's `train` to 0)."""
SHAPES: dict[str, dict[str, Any]] = {
    "tiny": {"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
                 "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 512,
                 "tie_word_embeddings": True, "rope_theta": 10000.0, "context": 32},
    "smollm2": {"hidden_size": 576, "intermediate_size": 1536, "num_hidden_layers": 30,
                    "num_attention_heads": 9, "num_key_value_heads": 3, "vocab_size": 49152,
                    "tie_word_embeddings": True, "rope_theta": 100000.0, "context": 512},
    "llama3.2-1b": {"hidden_size": 2048, "intermediate_size": 8192, "num_hidden_layers": 16,
                        "num_attention_heads": 32, "num_key_value_heads": 8, "vocab_size": 128256,
                        "tie_word_embeddings": True, "rope_theta": 500000.0, "context": 2048,
                        "rope_scaling": {"rope_type": "llama3", "factor": 32.0,
                                      "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                                      "original_max_position_embeddings": 8192}},
    "llama3-8b-8": {"hidden_size": 4096, "intermediate_size": 14336, "num_hidden_layers": 8,
                        "num_attention_heads": 32, "num_key_value_heads": 8, "vocab_size": 128256,
                        "tie_word_embeddings": False, "rope_theta": 500000.0, "context": 2048},
    "llama3-8b": {"hidden_size": 4096, "intermediate_size": 14336, "num_hidden_layers": 32,
                      "num_attention_heads": 32, "num_key_value_heads": 8, "vocab_size": 128256,
                      "tie_word_embeddings": False, "rope_theta": 500000.0, "context": 2048},
    "tiny-moe": {"model_type": "qwen3_moe", "hidden_size": 64, "intermediate_size": 128,
                     "moe_intermediate_size": 32, "num_experts": 8, "num_experts_per_tok": 2,
                     "norm_topk_prob": True, "num_hidden_layers": 2, "num_attention_heads": 4,
                     "num_key_value_heads": 2, "head_dim": 16, "vocab_size": 512,
                     "tie_word_embeddings": False, "rope_theta": 10000.0, "context": 32},
    "qwen3-30b-a3b-4": {"model_type": "qwen3_moe", "hidden_size": 2048,
                            "intermediate_size": 6144, "moe_intermediate_size": 768,
                            "num_experts": 128, "num_experts_per_tok": 8, "norm_topk_prob": True,
                            "num_hidden_layers": 4, "num_attention_heads": 32,
                            "num_key_value_heads": 4, "head_dim": 128, "vocab_size": 151936,
                            "tie_word_embeddings": False, "rope_theta": 1000000.0,
                            "context": 2048},
    "tiny-gemma3": {"model_type": "gemma3_text", "hidden_size": 64, "intermediate_size": 128,
                        "num_hidden_layers": 2, "num_attention_heads": 4,
                        "num_key_value_heads": 2, "head_dim": 16, "vocab_size": 512,
                        "sliding_window": 16, "query_pre_attn_scalar": 16,
                        "tie_word_embeddings": True, "rope_theta": 1000000.0,
                        "context": 32},
    "gemma3-1b": {"model_type": "gemma3_text", "hidden_size": 1152, "intermediate_size": 6912,
                      "num_hidden_layers": 26, "num_attention_heads": 4,
                      "num_key_value_heads": 1, "head_dim": 256, "vocab_size": 262144,
                      "sliding_window": 512, "query_pre_attn_scalar": 256,
                      "tie_word_embeddings": True, "rope_theta": 1000000.0, "context": 2048},
}  # fmt: skip
MOE_SIDES = ("aner", "aner-checkpoint", "aner-offload", "aner-checkpoint-eager", "aner-moe-loop")
"""The sides of a mixture-of-experts shape: transformers keeps experts as 3-D parameters, which
the peers' LoRA targets (`gate_proj`...) do not reach, so only Aner's runs are comparable."""
SIDES = ("aner", "peft", "peft-gc", "peft-liger", "unsloth", "unsloth-gc")
"""The default sides; `aner-checkpoint` and `aner-offload` are Aner under those activations."""


# ---- the parent: model folder, batches, one process per side, the table -----------------------


def positions(shape: str) -> int:
    """The positions a model of `shape` is built for: its context, at least 8192."""
    return max(8192, SHAPES[shape]["context"])


def hf_config(shape: str) -> Any:
    """The transformers config of `shape`, for its `positions`."""
    from transformers import Gemma3TextConfig, LlamaConfig, Qwen3MoeConfig

    CONFIGS = {"llama": LlamaConfig, "qwen3_moe": Qwen3MoeConfig, "gemma3_text": Gemma3TextConfig}

    cfg = {k: v for k, v in SHAPES[shape].items() if k != "context"}
    kind = cfg.pop("model_type", "llama")
    return CONFIGS[kind](**cfg, max_position_embeddings=positions(shape),
                         bos_token_id=1, eos_token_id=2, pad_token_id=0)  # fmt: skip


def device_memory_used() -> int | None:
    """Bytes in use on GPU 0 as `nvidia-smi` reports them (every process's, CUDA contexts
    included; container PID namespaces hide which process holds what), None without one."""
    query = ["nvidia-smi", "--query-gpu=memory.used", "--format=csv,noheader,nounits", "-i", "0"]
    try:
        out = subprocess.run(query, capture_output=True, text=True, timeout=5).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return None
    return int(out) * 2**20 if out.isdigit() else None


def _positions(folder: Path) -> int:
    """The positions a built model folder takes (0 where none is built)."""
    config = folder / "config.json"
    return json.loads(config.read_text())["max_position_embeddings"] if config.exists() else 0


def model_for(shape: str, folder: Path, device: str) -> None:
    """`folder` holding `shape`'s model for its context (Aner refuses rows longer than a model's
    positions): built where absent; where built for fewer positions, its config's
    `max_position_embeddings` raised (written beside and renamed over it). A rebuild would write
    the same weights, since `_write_model` seeds them and none depends on the positions (the
    shapes' rotary angles are computed at load, from settings the positions do not enter), and it
    costs a device call about a minute at 8B."""
    wanted = positions(shape)
    built = _positions(folder)
    if built == 0:
        make_model(shape, folder, device)
    elif built < wanted:
        config = folder / "config.json"
        values = json.loads(config.read_text())
        values["max_position_embeddings"] = wanted
        partial = config.with_name(config.name + ".partial")
        partial.write_text(json.dumps(values, indent=2) + "\n")
        partial.replace(config)


def make_model(shape: str, folder: Path, device: str) -> None:
    """Random weights of `shape` in bf16 (fp32 on the CPU), saved with a tokenizer whose vocabulary
    has the model's size (the batches are token ids; Unsloth wants a tokenizer in the folder).
    Written beside `folder` and renamed to it once complete: the callers take a folder with a
    `config.json` as built, which a write cut short (a full disk) must not leave behind. On CUDA
    the weights are made by a process of its own (`SHAPES[shape]` as it stands is handed over),
    so the caller holds no GPU memory (a CUDA context, the allocator's cache of the weights it
    made) while the processes it starts next measure theirs. The folder's pages are written back
    before it returns (`os.sync`): a process timed next would otherwise wait behind that
    write-back in its own fsyncs (a checkpoint's), as runs right after a 16 GB folder did."""
    if device == "cuda":
        build = ["--build-model", shape, "--spec", json.dumps(SHAPES[shape]), "--out", str(folder)]
        subprocess.run([sys.executable, __file__, *build], check=True)
    else:
        _write_model(shape, folder, device)
    os.sync()


def _write_model(shape: str, folder: Path, device: str) -> None:
    """`make_model`'s work, in this process."""
    import torch
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import AutoModelForCausalLM, PreTrainedTokenizerFast

    config = hf_config(shape)
    torch.manual_seed(0)
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(config).to(dtype)
    partial = folder.with_name(folder.name + ".partial")
    shutil.rmtree(partial, ignore_errors=True)
    model.save_pretrained(partial, safe_serialization=True)
    vocab = {f"<t{i}>": i for i in range(config.vocab_size)}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<t0>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<t1>", eos_token="<t2>",
                                   pad_token="<t0>", unk_token="<t0>")  # fmt: skip
    fast.save_pretrained(partial)
    del model
    shutil.rmtree(folder, ignore_errors=True)  # an earlier build's remains, never a complete one
    partial.rename(folder)


def make_gguf(shape: str, path: Path, kind: str) -> None:
    """Random weights of `shape` as a GGUF written by the project's fixture writer: `f16` (for runs
    of Aner alone, before a peer's folder is needed), or `q4_k_m`, random blocks of llama.cpp's
    Q4_K_M type mix (`write_random_blocks`), which the sides `aner` (re-quantized to NF4) and
    `aner-gguf` (`storage: gguf`, the file's own blocks) both load."""
    from aner_lang.testing.fixture import (
        Shape,
        embedded_tokenizer,
        write_fixture,
        write_random_blocks,
    )

    c = SHAPES[shape]
    if "model_type" in c:
        raise SystemExit(f"{shape}: --gguf runs Llama shapes only (the fixture writer's)")
    fixture = Shape(layers=c["num_hidden_layers"], hidden=c["hidden_size"],
                    heads=c["num_attention_heads"], kv_heads=c["num_key_value_heads"],
                    ffn=c["intermediate_size"], context=positions(shape),
                    rope_theta=c["rope_theta"], vocab_size=c["vocab_size"])  # fmt: skip
    tied, tokenizer = c["tie_word_embeddings"], embedded_tokenizer()
    if kind == "q4_k_m":
        write_random_blocks(path, fixture, tied=tied, tokenizer=tokenizer)
    else:
        write_fixture(path, fixture, tensor_type="f16", tied=tied, tokenizer=tokenizer)


def make_batches(shape: str, count: int, path: Path) -> None:
    import torch
    from safetensors.torch import save_file

    gen = torch.Generator().manual_seed(1)
    ids = torch.randint(3, SHAPES[shape]["vocab_size"], (count, SHAPES[shape]["context"]),
                        generator=gen)  # fmt: skip
    save_file({"ids": ids}, str(path))


def run_side(side: str, job: dict[str, Any]) -> dict[str, Any]:
    """The side's row, from a process of its own; a side that fails or outlasts `--timeout`
    gives a row with its error, and the sides after it still run."""
    out = Path(job["dir"]) / f"{side}.json"
    out.unlink(missing_ok=True)  # a row left by an earlier run is not this one's
    cmd = [sys.executable, __file__, "--worker", side, "--job", json.dumps(job), "--json", str(out)]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=job["timeout"])
    except subprocess.TimeoutExpired:
        return {"side": side, "error": f"did not finish within --timeout {job['timeout']} s"}
    if proc.returncode != 0 or not out.exists():
        tail = (proc.stderr or proc.stdout)[-1500:]
        return {"side": side, "error": f"exit {proc.returncode}: {tail}"}
    return dict(json.loads(out.read_text()))


def _busy_ms(row: dict[str, Any]) -> float | None:
    """Device milliseconds of the side's two profiled eager updates, idle left out."""
    sections = row.get("device_time", {}).get("sections")
    return sum(v for k, v in sections.items() if k != "idle") / 1e3 if sections else None


def table(shape: str, rows: list[dict[str, Any]], activations: str = "keep") -> str:
    """The shape's Markdown table. Ratios are to the peers run the way Aner runs: `peft` and
    `unsloth` when Aner keeps its activations, their gradient-checkpointing sides (`peft-gc`,
    `unsloth-gc`) when it checkpoints or offloads them. Losses are compared with the first Aner
    row's."""
    ok = {r["side"]: r for r in rows if "tokens_per_s" in r}
    ref_p, ref_u = ("peft", "unsloth") if activations == "keep" else ("peft-gc", "unsloth-gc")
    peft, unsloth = ok.get(ref_p), ok.get(ref_u)
    aner = next((r for r in rows if "tokens_per_s" in r and r["side"].startswith("aner")), None)
    lines = [f"## {shape}", "",
             f"| side | tok/s | vs {ref_p} | vs {ref_u} | peak CUDA GB | host RSS GB | loss vs Aner |",
             "|---|---|---|---|---|---|---|"]  # fmt: skip
    for r in rows:
        if "tokens_per_s" not in r:
            lines.append(f"| {r['side']} | {r.get('error', r.get('skipped', '?'))[:80]} |||||| ")
            continue
        tps = r["tokens_per_s"]
        vs_p = f"{tps / peft['tokens_per_s']:.2f}x" if peft else "-"
        vs_u = f"{tps / unsloth['tokens_per_s']:.2f}x" if unsloth else "-"
        diff = "-"
        if aner and r is not aner:
            n = min(len(aner["losses"]), len(r["losses"]))
            d = max(abs(a - b) / abs(a) for a, b in zip(aner["losses"][:n], r["losses"][:n]))
            diff = f"{100 * d:.2f}% over {n}"
        label = r["side"] + (f" #{r['repeat']}" if r.get("repeat", 1) > 1 else "")
        lines.append(f"| {label} | {tps:,.0f} | {vs_p} | {vs_u} | "
                     f"{r['peak_cuda_bytes'] / 1e9:.1f} | {r['host_rss_bytes'] / 1e9:.1f} | {diff} |")  # fmt: skip
    if aner:
        lines += ["", f"{aner['side']}: CUDA graphs {aner.get('cuda_graphs')}; "
                  f"{aner['precision']}, activations {aner['activations']}, loaded in "
                  f"{aner['load_seconds']:.1f} s, per train() call {aner['call_overhead_s']:.2f} s "
                  f"beside the updates; tok/s by the trainer's clock ({aner['difference_tokens_per_s']:,.0f} "
                  "by the difference of a 2S- and an S-update call)"]  # fmt: skip
    lines += [f"- {r['side']}: {r['storage']} base weights {r['weights_bytes'] / 1e9:.3f} GB"
              for r in ok.values() if "weights_bytes" in r]  # fmt: skip
    nf4 = [r for r in rows if r["side"] == "aner" and "tokens_per_s" in r]
    gguf = [r for r in rows if r["side"] == "aner-gguf" and "tokens_per_s" in r]
    for i, (a, g) in enumerate(zip(nf4, gguf)):  # the repeats in the order they ran
        busy = [_busy_ms(a), _busy_ms(g)]
        device = f", {busy[1] / busy[0]:.3f} by device time" if all(busy) else ""
        diff = [a.get("difference_tokens_per_s"), g.get("difference_tokens_per_s")]
        calls = f", {diff[0] / diff[1]:.3f} by the calls' difference" if all(diff) else ""
        lines.append(f"- repeat {i + 1}: storage: gguf update time / NF4 update time "
                     f"{a['tokens_per_s'] / g['tokens_per_s']:.3f} by the trainer's clock"
                     f"{calls}{device}")  # fmt: skip
    if aner and aner.get("device_time"):
        lines += ["", "Aner device time of two profiled eager updates, by section:", ""]
        sections = aner["device_time"]["sections"]
        total = sum(sections.values())
        for name, us in sorted(sections.items(), key=lambda kv: -kv[1]):
            lines.append(f"- {name}: {us / 1e3:.1f} ms ({100 * us / total:.0f}%)")
        lines += ["", "Heaviest kernels outside the sections:", ""]
        for name, us in aner["device_time"]["other_kernels"].items():
            lines.append(f"- {us / 1e3:.2f} ms {name}")
        for section_name, kernels in aner["device_time"].get("section_kernels", {}).items():
            lines += ["", f"Heaviest kernels of {section_name}:", ""]
            lines += [f"- {us / 1e3:.2f} ms {name}" for name, us in kernels.items()]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shapes", default="smollm2,llama3.2-1b,llama3-8b-8,llama3-8b")
    ap.add_argument("--sides", default=",".join(SIDES))
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=1, help="run the sides in turn this many times")
    ap.add_argument("--compare", type=int, default=20, help="losses compared with Aner's")
    ap.add_argument("--precision", default="bfloat16", choices=("bfloat16", "float16"))
    ap.add_argument("--activations", default="keep", choices=("keep", "checkpoint", "offload"))
    ap.add_argument("--context", type=int, default=0, help="override the shape's context")
    ap.add_argument("--out", default="/tmp/train_scale")
    ap.add_argument("--timeout", type=int, default=900)
    ap.add_argument("--dry-run", action="store_true", help="CPU, tiny shape, aner and peft")
    ap.add_argument("--gguf", nargs="?", const="f16", choices=("f16", "q4_k_m"),
                    help="Aner alone, on a fixture GGUF: f16 weights, or random Q4_K_M blocks "
                    "trained as NF4 (aner) and as the file's blocks (aner-gguf)")  # fmt: skip
    ap.add_argument("--worker", help=argparse.SUPPRESS)
    ap.add_argument("--job", help=argparse.SUPPRESS)
    ap.add_argument("--json", help=argparse.SUPPRESS)
    ap.add_argument("--build-model", help=argparse.SUPPRESS)
    ap.add_argument("--spec", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.build_model:  # make_model's process on CUDA: the folder is --out
        SHAPES[args.build_model] = json.loads(args.spec)
        _write_model(args.build_model, Path(args.out), "cuda")
        return 0
    if args.worker:
        result = {**WORKERS[args.worker](json.loads(args.job)), "side": args.worker}
        Path(args.json).write_text(json.dumps(result))
        return 0
    import torch

    device = "cuda" if torch.cuda.is_available() else "cpu"
    shapes, sides = args.shapes.split(","), args.sides.split(",")
    if args.dry_run:  # the tiny shapes asked for (default: tiny), Aner and PEFT, on the CPU
        shapes = [s for s in shapes if s.startswith("tiny")] or ["tiny"]
        sides, device = ["aner", "peft"], "cpu"
    report = []
    for shape in shapes:
        sides_here = sides
        if "num_experts" in SHAPES[shape]:
            sides_here = [s for s in sides if s in MOE_SIDES]
        if args.context:
            SHAPES[shape]["context"] = args.context
        work = Path(args.out) / shape
        work.mkdir(parents=True, exist_ok=True)
        if args.gguf:
            model = work / f"model-{args.gguf}.gguf"
            sides = sides_here = ["aner", "aner-gguf"] if args.gguf == "q4_k_m" else ["aner"]
            if not model.exists():
                make_gguf(shape, model, args.gguf)
        else:
            model = work / "model"
            model_for(shape, model, device)
        count = args.warmup + max(args.steps, args.compare)
        make_batches(shape, count, work / "batches.safetensors")
        job = {"dir": str(work), "model": str(model), "shape": shape,
               "batches": str(work / "batches.safetensors"), "steps": args.steps,
               "warmup": args.warmup, "compare": args.compare, "precision": args.precision,
               "activations": args.activations, "device": device, "timeout": args.timeout,
               "context": SHAPES[shape]["context"]}  # fmt: skip
        rows: list[dict[str, Any]] = []
        report.append({"shape": shape, "job": job, "rows": rows, "table": ""})
        for repeat in range(args.repeats):  # the sides in turn, again per repeat (A B A B)
            for side in sides_here:  # each result is shown and written as soon as it is in, so a
                rows.append({**run_side(side, job), "repeat": repeat + 1})  # run stopped by a
                print(summary(shape, rows[-1]), flush=True)  # time limit keeps what it measured
                report[-1]["table"] = table(shape, rows, args.activations)
                (Path(args.out) / "train_scale.json").write_text(json.dumps(report, indent=1))
        print(report[-1]["table"], flush=True)
    return 0


def summary(shape: str, row: dict[str, Any]) -> str:
    """One line for a side as it finishes."""
    if "tokens_per_s" not in row:
        return f"{shape} {row['side']}: {row.get('error', '?')[-300:]}"
    return (f"{shape} {row['side']}: {row['tokens_per_s']:,.0f} tok/s, peak CUDA "
            f"{row['peak_cuda_bytes'] / 1e9:.1f} GB")  # fmt: skip


# ---- the sides -----------------------------------------------------------------------------------


def _peak_rss() -> int:
    """This process's peak resident set (VmHWM: unlike ru_maxrss, not inherited from the parent
    that forked it)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def _batches(job: dict[str, Any]) -> Any:
    from safetensors.torch import load_file

    return load_file(job["batches"])["ids"]


def _measure(step: Any, ids: Any, job: dict[str, Any]) -> dict[str, Any]:
    """Warm up, then time `--steps` updates; the first `--compare` losses are kept as well. The
    batches are taken in the order Aner's trainer draws them (its seeded epoch order)."""
    import torch

    from aner_lang.runtime.train.order import epoch_order

    ids = ids[epoch_order(len(ids), 0, 0)]
    cuda = job["device"] == "cuda"
    losses = []
    for i in range(job["warmup"]):
        step(ids[i : i + 1])
    if cuda:
        torch.cuda.synchronize()
        warmup_peak = torch.cuda.max_memory_allocated()
        torch.cuda.reset_peak_memory_stats()
    start = time.perf_counter()
    for i in range(job["warmup"], job["warmup"] + job["steps"]):
        losses.append(step(ids[i : i + 1]))
    if cuda:
        torch.cuda.synchronize()
    seconds = time.perf_counter() - start
    losses = [float(x) for x in losses]
    while len(losses) < job["compare"]:
        i = job["warmup"] + len(losses)
        losses.append(float(step(ids[i : i + 1])))
    return {
        "tokens_per_s": job["steps"] * ids.shape[1] / seconds,
        "peak_cuda_bytes": torch.cuda.max_memory_allocated() if cuda else 0,
        "warmup_peak_cuda_bytes": warmup_peak if cuda else 0,  # loading and warm-up included
        "host_rss_bytes": _peak_rss(),
        "losses": losses,
    }


def _token_dataset(ids: Any) -> Any:
    """A Dataset whose examples are the given token rows, every target scored."""
    from aner_lang.runtime.tasks.data import Dataset

    return Dataset.of_tokens(ids.tolist(), ids.shape[1], "benchmark")


def aner_worker(
    job: dict[str, Any],
    activations: str | None = None,
    graphs: bool = True,
    storage: str = "nf4_double_quant",
    moe_loop: bool = False,
) -> dict[str, Any]:
    """Aner's own trainer (`train`), as a script runs it, continued across the timed calls;
    `activations` overrides the run's `--activations` (the sides `aner-checkpoint` and
    `aner-offload`, so one run can show both beside the peers' checkpointing); `graphs=False`
    (`aner-checkpoint-eager`) turns CUDA graphs off, to show what recording the step buys;
    `storage: gguf` (`aner-gguf`) keeps a GGUF file's own blocks; `moe_loop` (`aner-moe-loop`)
    runs each expert's own modules in turn instead of the grouped GEMMs, to show what they buy."""
    job = {**job, "activations": activations or job["activations"]}
    if moe_loop:
        from aner_lang.runtime.model.moe import MoeMLP

        MoeMLP._grouped_adapters = lambda self: None  # type: ignore[method-assign]
    import torch
    from safetensors.torch import save_file

    from aner_lang.runtime.model.sections import sections_on
    from aner_lang.runtime.train.memory import memory_report
    from aner_lang.runtime.train.profile import profile
    from aner_lang.runtime.train.trainer import train

    model, adapter, load_s = aner_adapter(job, storage)
    prof = profile(precision=job["precision"], activations=job["activations"], graphs=graphs)
    save_file(adapter.tensors(), str(Path(job["dir"]) / "init_adapter.safetensors"))
    data = _token_dataset(_batches(job))
    cuda = job["device"] == "cuda"
    done = 0

    def run(steps: int, settings: Any = prof) -> Any:
        nonlocal done
        done += steps
        return train(adapter, data, settings, steps=done, learning_rate=LR, clip_norm=None,
                     weight_decay=WEIGHT_DECAY, seed=0)  # fmt: skip

    # The peak from here: the load's transients apart, the warm-up call's included. That call
    # records the CUDA graphs the later calls replay, whose activations live in the graphs' pool,
    # allocated at the recording: a peak reset after it would miss them.
    if cuda:
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
    run(job["warmup"])
    # Steady state by the trainer's own clock: the long call's updates after its first, each
    # timed alone (what a long run gets). Two calls of S and 2S updates also give it as their
    # difference, S updates without the per-call cost (recording the CUDA graph, the final
    # state snapshot), but that cost differs between calls (by 0.15 s at 8B on an H100): over 10
    # updates it read 10% above the trainer's clock and the event log's timestamps, which agreed
    # (results/h100_session15.md), so it is kept beside the headline.
    short, timed_run = _timed(lambda: run(job["steps"]), cuda)
    long, long_run = _timed(lambda: run(2 * job["steps"]), cuda)
    per_update = (long - short) / job["steps"]
    losses = timed_run.loss_history[job["warmup"] :]
    if len(losses) < job["compare"]:
        losses = run(job["compare"] - len(losses)).loss_history[job["warmup"] :]
    result = {
        "tokens_per_s": long_run.training_tokens_per_second,
        "difference_tokens_per_s": data.context / per_update,
        "call_overhead_s": short - job["steps"] * per_update,
        "peak_cuda_bytes": torch.cuda.max_memory_allocated() if cuda else 0,
        "host_rss_bytes": _peak_rss(),
        "losses": losses[: job["compare"]],
        "cuda_graphs": timed_run.cuda_graphs,
        "load_seconds": load_s,
        "storage": storage,
        "weights_bytes": memory_report(model).weights,
        "kernel_identity": timed_run.kernel_identity,
        "precision": job["precision"],
        "activations": job["activations"],
    }
    if cuda:  # eagerly, so that every kernel launch sits under its section
        eager = profile(precision=job["precision"], activations=job["activations"], graphs=False)
        with sections_on():
            result["device_time"] = _profile(lambda: run(2, eager))
    return result


def aner_adapter(job: dict[str, Any], storage: str = "nf4_double_quant") -> tuple[Any, Any, float]:
    """The job's model loaded in `storage` on its device, the benchmark's LoRA on it (seed 0),
    and the seconds the load took."""
    from aner_lang.runtime import adapters as A
    from aner_lang.runtime.load.loader import load_model

    start = time.perf_counter()
    model = load_model(job["model"], storage=storage, device=job["device"])
    load_s = time.perf_counter() - start
    return model, A.lora(model, rank=RANK, alpha=ALPHA, targets=TARGETS, seed=0), load_s


def _timed(call: Any, cuda: bool) -> tuple[float, Any]:
    """Wall seconds of `call()` (device work included) and its result."""
    import torch

    start = time.perf_counter()
    out = call()
    if cuda:
        torch.cuda.synchronize()
    return time.perf_counter() - start, out


def _profile(updates: Any) -> dict[str, Any]:
    """Device time (us) of `updates()` by section (`runtime/model/sections.py`), plus idle, the
    heaviest kernels outside every section (`other_kernels`: op > kernel -> us) and those of each
    section (`section_kernels`: section -> op > kernel -> us)."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        start = time.perf_counter()
        updates()
        torch.cuda.synchronize()
        wall_us = (time.perf_counter() - start) * 1e6
    totals: dict[str, float] = {}
    inside: dict[str, dict[str, float]] = {}
    busy = 0.0
    for evt in prof.events():
        if not evt.kernels:
            continue
        name, parent = "other", evt
        while parent is not None:  # the innermost section or backward node above the launch
            label = _category(parent.name)
            if label:
                name = label
                break
            parent = parent.cpu_parent
        us = sum(k.duration for k in evt.kernels)
        totals[name] = totals.get(name, 0.0) + us
        busy += us
        # outside every section the op above the launch's op says more about where it came from
        if name == "other":
            outer = evt.cpu_parent.name if evt.cpu_parent is not None else "-"
            op, width = f"{outer} > {evt.name}", 70
        else:
            op, width = evt.name, 60
        kernels = inside.setdefault(name, {})
        for k in evt.kernels:
            key = f"{op} > {k.name[:width]}"
            kernels[key] = kernels.get(key, 0.0) + k.duration
    totals["idle"] = max(0.0, wall_us - busy)

    def heaviest(name: str, most: int) -> dict[str, float]:
        return dict(sorted(inside.get(name, {}).items(), key=lambda kv: -kv[1])[:most])

    sections = {name: heaviest(name, 10) for name in inside if name != "other"}
    return {"sections": totals, "other_kernels": heaviest("other", 25), "section_kernels": sections}


def _category(op: str) -> str | None:
    from aner_lang.runtime.model.sections import PREFIX

    if op.startswith(PREFIX):
        return op[len(PREFIX) :]
    rules = (("NF4Matmul", "nf4_backward"), ("HeadCrossEntropy", "loss"),
             ("ScaledDotProduct", "attention"), ("Flash", "attention"),
             ("MmBackward", "lora"), ("AddmmBackward", "lora"),
             ("Silu", "norms_activations"), ("Rsqrt", "norms_activations"),
             ("RMSNorm", "norms_activations"), ("SwiGLU", "norms_activations"),
             ("SiLUMul", "norms_activations"),
             ("Pow", "norms_activations"), ("Mean", "norms_activations"))  # fmt: skip
    if "Backward" in op:
        for key, label in rules:
            if key in op:
                return label
    return None


def _peft_model(job: dict[str, Any], liger: bool, checkpointing: bool) -> Any:
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    from aner_lang.runtime.model.precision import DTYPES

    if liger:
        from liger_kernel.transformers import apply_liger_kernel_to_llama

        apply_liger_kernel_to_llama()
    dtype = DTYPES[job["precision"]]
    kwargs: dict[str, Any] = {"dtype": dtype, "attn_implementation": "sdpa"}
    if job["device"] == "cuda":
        from transformers import BitsAndBytesConfig

        kwargs["quantization_config"] = BitsAndBytesConfig(
            load_in_4bit=True, bnb_4bit_quant_type="nf4", bnb_4bit_use_double_quant=True,
            bnb_4bit_compute_dtype=dtype)  # fmt: skip
        kwargs["device_map"] = "cuda"
    model = AutoModelForCausalLM.from_pretrained(job["model"], **kwargs)
    if checkpointing:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        model.enable_input_require_grads()
    config = LoraConfig(r=RANK, lora_alpha=ALPHA, lora_dropout=0.0, target_modules=TARGETS,
                        task_type="CAUSAL_LM")  # fmt: skip
    return get_peft_model(model, config)


def _copy_initial_adapter(model: Any, job: dict[str, Any]) -> None:
    """Aner's initial A and B into the PEFT modules (`layers.3.self_attn.q_proj.lora_A` ->
    `...layers.3.self_attn.q_proj.lora_A.default.weight`)."""
    import torch
    from safetensors.torch import load_file

    ours = load_file(str(Path(job["dir"]) / "init_adapter.safetensors"))
    params = dict(model.named_parameters())
    with torch.no_grad():
        for key, t in ours.items():
            module, kind = key.rsplit(".", 1)
            matches = [n for n in params if n.endswith(f"{module}.{kind}.default.weight")]
            if len(matches) != 1:
                raise KeyError(f"no single PEFT parameter for {key}: {matches}")
            params[matches[0]].copy_(t.to(params[matches[0]].dtype))


def _hf_step(model: Any, job: dict[str, Any]) -> Any:
    """One update as a Hugging Face user runs it: the forward under autocast in `--precision`;
    under float16 with dynamic loss scaling (`GradScaler`, as the Trainer's `fp16=True` does; the
    adapter's weights are fp32, PEFT's default)."""
    import torch

    from aner_lang.runtime.model.precision import DTYPES

    device = next(model.parameters()).device
    trainable = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(trainable, lr=LR, weight_decay=WEIGHT_DECAY)
    dtype = DTYPES[job["precision"]]
    scaler = torch.amp.GradScaler(device.type, enabled=dtype == torch.float16)
    model.train()

    def step(ids: torch.Tensor) -> torch.Tensor:
        ids = ids.to(device)
        with torch.autocast(device.type, dtype=dtype):
            loss = model(input_ids=ids, labels=ids).loss
        scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()
        opt.zero_grad(set_to_none=True)
        return loss.detach()

    return step


def peft_worker(job: dict[str, Any], liger: bool = False, checkpointing: bool = False) -> Any:
    model = _peft_model(job, liger, checkpointing)
    _copy_initial_adapter(model, job)
    result = _measure(_hf_step(model, job), _batches(job), job)
    quant = "bnb nf4" if job["device"] == "cuda" else "no quantization (CPU dry run)"
    return {**result, "base": quant}


def unsloth_model(job: dict[str, Any], checkpointing: bool) -> Any:
    """Unsloth's NF4 model of the job's folder, sequences up to `job["context"]`, with the
    benchmark's LoRA (`checkpointing`: Unsloth's own gradient checkpointing, which offloads)."""
    from unsloth import FastLanguageModel

    from aner_lang.runtime.model.precision import DTYPES

    model, _ = FastLanguageModel.from_pretrained(
        model_name=job["model"], max_seq_length=job["context"],
        dtype=DTYPES[job["precision"]], load_in_4bit=True)  # fmt: skip
    model = FastLanguageModel.get_peft_model(
        model, r=RANK, lora_alpha=ALPHA, lora_dropout=0, target_modules=TARGETS,
        use_gradient_checkpointing="unsloth" if checkpointing else False)  # fmt: skip
    return model


def unsloth_worker(job: dict[str, Any], checkpointing: bool = False) -> dict[str, Any]:
    model = unsloth_model(job, checkpointing)
    _copy_initial_adapter(model, job)
    return _measure(_hf_step(model, job), _batches(job), job)


WORKERS = {  # side -> its worker; the side's name is put into the result by `main`
    "aner": aner_worker,
    "aner-checkpoint": lambda job: aner_worker(job, "checkpoint"),
    "aner-offload": lambda job: aner_worker(job, "offload"),
    "aner-checkpoint-eager": lambda job: aner_worker(job, "checkpoint", graphs=False),
    "aner-gguf": lambda job: aner_worker(job, storage="gguf"),
    "aner-moe-loop": lambda job: aner_worker(job, moe_loop=True),
    "peft": peft_worker,
    "peft-gc": lambda job: peft_worker(job, checkpointing=True),
    "peft-liger": lambda job: peft_worker(job, liger=True),
    "unsloth": unsloth_worker,
    "unsloth-gc": lambda job: unsloth_worker(job, checkpointing=True),
}

if __name__ == "__main__":
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    sys.exit(main())
