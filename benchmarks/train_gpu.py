"""QLoRA update throughput and peak memory: Aner's trainer vs PEFT + bitsandbytes, same run.

Both sides train the same LoRA (rank 2, alpha 4, q/v) on an NF4 double-quantized base of the
SmolLM2-135M shape at context 512, fp16 autocast with dynamic loss scaling, AdamW, clip 1, for
the same number of updates on the same random token batches. Prints tokens/s and peak CUDA
memory of each and the ratios (Aner / PEFT). Needs CUDA; the model is the real SmolLM2 GGUF
given as an argument, or a deterministic fixture of its shape written with `aner fixture`.

    python benchmarks/train_gpu.py [model.gguf] [--updates 20] [--batch 4] [--context 512]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch


def _fixture(tmp: Path) -> Path:
    out = tmp / "smollm2-shape.gguf"
    subprocess.run(
        [sys.executable, "-m", "aner_lang.cli", "fixture", "--shape", "smollm2-135m", str(out)],
        check=True,
    )
    return out


def _batches(vocab: int, n: int, batch: int, context: int) -> list[torch.Tensor]:
    gen = torch.Generator().manual_seed(0)
    return [torch.randint(0, vocab, (batch, context), generator=gen) for _ in range(n)]


def _measure(step, batches) -> dict:
    step(batches[0])  # warm-up: kernels compiled, buffers allocated
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    start = time.perf_counter()
    for b in batches[1:]:
        step(b)
    torch.cuda.synchronize()
    seconds = time.perf_counter() - start
    tokens = sum(b.numel() for b in batches[1:])
    return {"tokens_per_s": tokens / seconds, "peak_bytes": torch.cuda.max_memory_allocated()}


def aner_side(path: Path, batches: list[torch.Tensor]) -> dict:
    from aner_lang.runtime import adapters as A
    from aner_lang.runtime.load.loader import load_model
    from aner_lang.runtime.tasks.data import Dataset, Example, Record
    from aner_lang.runtime.train.profile import profile
    from aner_lang.runtime.train.trainer import train

    model = load_model(path, storage="nf4_double_quant", device="cuda")
    prof = profile(precision="float16", optimizer="adamw", kernel="fused")
    rows = torch.cat(batches[1:])
    data = Dataset(tuple(Record("", "") for _ in range(len(rows))), rows.shape[1], "benchmark")
    # the random token rows stand in for tokenized text: every target is scored
    data._cache[id(model.tokenizer)] = (
        model.tokenizer,
        tuple(Example(tuple(r.tolist()), (True,) * rows.shape[1]) for r in rows),
    )
    batch = batches[0].shape[0]
    warm = A.lora(model, rank=2, alpha=4.0, targets=["q_proj", "v_proj"], seed=70)
    train(warm, data, prof, steps=1, learning_rate=2e-4, micro_batch=batch, clip_norm=1.0)
    adapter = A.lora(model, rank=2, alpha=4.0, targets=["q_proj", "v_proj"], seed=71)
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    start = time.perf_counter()
    run = train(
        adapter,
        data,
        prof,
        steps=len(batches) - 1,
        learning_rate=2e-4,
        micro_batch=batch,
        clip_norm=1.0,
    )
    torch.cuda.synchronize()
    seconds = time.perf_counter() - start
    out = {
        "tokens_per_s": rows.numel() / seconds,
        "peak_bytes": torch.cuda.max_memory_allocated(),
        "skipped_updates": run.skipped_updates,
    }
    del model, adapter, warm
    torch.cuda.empty_cache()
    return out


def peft_side(path: Path, batches: list[torch.Tensor], tmp: Path) -> dict:
    import peft
    import transformers

    # A model loaded with gguf_file= refuses save_pretrained; copy its weights into a plain one.
    src = transformers.LlamaForCausalLM.from_pretrained(
        str(path.parent), gguf_file=path.name, dtype=torch.float32
    )
    config = src.config
    if hasattr(config, "quantization_config"):  # the GGUF loader marks the config as quantized
        del config.quantization_config
    dense = transformers.LlamaForCausalLM(config)
    dense.load_state_dict(src.state_dict())
    del src
    dense.save_pretrained(tmp / "hf")
    del dense
    q = transformers.BitsAndBytesConfig(
        load_in_4bit=True,
        bnb_4bit_quant_type="nf4",
        bnb_4bit_use_double_quant=True,
        bnb_4bit_compute_dtype=torch.float16,
    )
    hf = transformers.LlamaForCausalLM.from_pretrained(
        tmp / "hf", quantization_config=q, dtype=torch.float32, device_map={"": 0}
    )
    model = peft.get_peft_model(
        hf,
        peft.LoraConfig(r=2, lora_alpha=4, lora_dropout=0.0, target_modules=["q_proj", "v_proj"]),
    )
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=2e-4, weight_decay=0.0, foreach=False)
    scaler = torch.amp.GradScaler("cuda")

    def step(b: torch.Tensor) -> None:
        ids = b.cuda()
        with torch.autocast("cuda", dtype=torch.float16):
            loss = model(input_ids=ids, labels=ids).loss
        scaler.scale(loss).backward()
        scaler.unscale_(opt)
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        scaler.step(opt)
        scaler.update()
        opt.zero_grad(set_to_none=True)

    return _measure(step, batches)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("model", nargs="?", help="GGUF file (default: a SmolLM2-shape fixture)")
    ap.add_argument("--updates", type=int, default=20)
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--context", type=int, default=512)
    args = ap.parse_args()
    if not torch.cuda.is_available():
        sys.exit("train_gpu.py needs a CUDA GPU")
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        path = Path(args.model) if args.model else _fixture(tmp)
        from aner_lang.runtime.io.gguf import GGUFFile

        vocab = GGUFFile(path).hyperparams().vocab_size  # the fixture's vocabulary may be small
        batches = _batches(vocab, args.updates + 1, args.batch, args.context)
        ours = aner_side(path, batches)
        try:
            theirs = peft_side(path, batches, tmp)
        except ImportError as exc:  # bitsandbytes/peft missing on the machine
            theirs = {"error": str(exc)}
    report = {
        "shape": "smollm2-135m",
        "context": args.context,
        "batch": args.batch,
        "updates": args.updates,
        "aner": ours,
        "peft_bnb": theirs,
    }
    if "error" not in theirs:
        report["ratio_tokens_per_s"] = ours["tokens_per_s"] / theirs["tokens_per_s"]
        report["ratio_peak_bytes"] = ours["peak_bytes"] / theirs["peak_bytes"]
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
