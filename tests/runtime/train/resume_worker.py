"""Run in a fresh process by test_resume_exact.py: train every (method, profile) combination.

    python resume_worker.py whole   GGUF OUT DEVICE  # 2 updates, a checkpoint after each
    python resume_worker.py resumed GGUF OUT DEVICE  # resume each update-1 checkpoint, train to 2

`whole` leaves OUT/whole/<combo>/ with the checkpoints of update 1 and 2; `resumed` continues
from the update-1 folder (a run interrupted after its first update) into OUT/resumed/<combo>.
"""

from __future__ import annotations

import sys
from pathlib import Path

from aner_lang.runtime import adapters as A
from aner_lang.runtime.load.loader import load_model
from aner_lang.runtime.tasks.records import from_texts
from aner_lang.runtime.train.checkpoint import resume
from aner_lang.runtime.train.profile import dynamic, profile
from aner_lang.runtime.train.trainer import train

TEXTS = [
    "Aner makes model adaptation explicit and reproducible.",
    "The quiet mountain lake reflects the clear morning sky.",
    "Seven engineers share one worktree and commit their own files.",
]
MAKERS = {
    "lora": lambda m: A.lora(
        m, rank=2, alpha=4.0, dropout=0.1, targets=["q_proj", "v_proj"], seed=3
    ),
    "lora_fa": lambda m: A.lora_fa(m, rank=2, alpha=4.0, seed=4),
    "dora": lambda m: A.dora(m, rank=2, alpha=4.0, targets=["q_proj", "down_proj"], seed=5),
    "tinylora": lambda m: A.tinylora(m, parameters=13, rank=2, seed=6),
    "full": A.full,
}


def profiles(device: str) -> dict[str, dict]:
    if device == "cuda":
        return {
            p: {"precision": p, "optimizer": "paged_adamw", "kernel": "fused"}
            for p in ("float32", "float16", "bfloat16")
        }
    return {p: {"precision": p} for p in ("float32", "float16", "bfloat16")}


def combos(device: str) -> list[tuple[str, str, str, dict]]:
    """(name, method, base storage, profile kwargs)."""
    out = [(f"{m}-{p}", m, "float32", kw) for m in MAKERS for p, kw in profiles(device).items()]
    if nf4_available():
        out += [
            (f"qlora-{p}", "lora", "nf4_double_quant", kw) for p, kw in profiles(device).items()
        ]
    return out


def nf4_available() -> bool:
    """QLoRA combinations run once the NF4 base (aner_lang.runtime.nf4) has landed."""
    try:
        from aner_lang.runtime.nf4 import quantize_model  # noqa: F401
    except ImportError:
        return False
    return True


def _profile(kw: dict):
    ls = dynamic(initial=256.0, growth_interval=1) if kw["precision"] == "float16" else None
    return profile(**kw, loss_scale=ls)


def main(phase: str, gguf: str, out: str, device: str) -> None:
    data = from_texts(TEXTS, context=24)
    opts = {
        "learning_rate": 1e-2,
        "micro_batch": 2,
        "accumulation": 2,
        "seed": 9,
        "warmup": 1,
        "schedule": "cosine",
        "clip_norm": 0.5,
        "weight_decay": 0.01,
        "checkpoint_every": 1,
    }
    bases = {}
    for name, method, storage, kw in combos(device):
        if storage not in bases or method == "full":
            # a fresh base for full: training full on a tied-embedding base currently leaves the
            # adapter's embedding inside the base module (reported to TRAIN), which would leak
            # into the next combination of this process
            bases[storage] = load_model(gguf, storage=storage, device=device)
        base = bases[storage]
        if phase == "resumed":
            first = next((Path(out) / "whole" / name).glob("update-000001-*"))
            adapter = resume(first, model=base)
        else:
            adapter = MAKERS[method](base)
        train(
            adapter, data, _profile(kw), steps=2, checkpoints=str(Path(out) / phase / name), **opts
        )
        print(name, "ok", flush=True)


if __name__ == "__main__":
    main(*sys.argv[1:5])
