"""Loading a Llama-3-8B-shaped model into NF4: Aner (GGUF and safetensors folder) vs transformers +
bitsandbytes (the same folder), time and peak host RSS of each.

The model (random weights, f16) is written once under --dir, as a Hugging Face folder (config.json,
sharded safetensors, tokenizer) and as a GGUF of the same tensors, streamed tensor by tensor so
writing an 8B model needs no 16 GB of memory. Each loader then runs in a fresh subprocess, after
the files were read once (a warm page cache for all), and reports its wall time (imports
included) and the peak resident set size of its process (`ru_maxrss`).

    python benchmarks/load_model.py --shape llama3-8b --device cuda        # full depth, 32 layers
    python benchmarks/load_model.py --shape llama3-8b-8l --device cuda     # 8 layers
    python benchmarks/load_model.py --dry-run                               # small shape, CPU

Targets (issue 22, on the H200): Aner's peak host RSS <= 4 GB and time <= transformers + bnb.
"""

from __future__ import annotations

import argparse
import json
import os
import struct
import subprocess
import sys
from pathlib import Path

SHAPES = {
    "llama3-8b": {
        "layers": 32,
        "hidden": 4096,
        "ffn": 14336,
        "heads": 32,
        "kv": 8,
        "vocab": 128256,
    },
    "llama3-8b-8l": {
        "layers": 8,
        "hidden": 4096,
        "ffn": 14336,
        "heads": 32,
        "kv": 8,
        "vocab": 128256,
    },
    "dry-run": {"layers": 4, "hidden": 512, "ffn": 1536, "heads": 8, "kv": 2, "vocab": 16384},
}
SHARD_BYTES = 5 << 30

ANER = """
import json, resource, sys, time
t = time.perf_counter()
import torch
from aner_lang.runtime.load.loader import load_model
m = load_model(sys.argv[1], storage="nf4_double_quant", device=sys.argv[2])
if m.device.type == "cuda":
    torch.cuda.synchronize()
hwm = [l for l in open("/proc/self/status") if l.startswith("VmHWM:")]  # not the parent's
print(json.dumps({"seconds": time.perf_counter() - t,
                  "peak_rss": int(hwm[0].split()[1]) * 1024 if hwm else
                  resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024}))
"""

HF_BNB = """
import json, resource, sys, time
t = time.perf_counter()
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, BitsAndBytesConfig
q = BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type="nf4",
                       bnb_4bit_use_double_quant=True, bnb_4bit_compute_dtype=torch.bfloat16)
m = AutoModelForCausalLM.from_pretrained(sys.argv[1], quantization_config=q,
                                         device_map=sys.argv[2], dtype=torch.bfloat16)
AutoTokenizer.from_pretrained(sys.argv[1])
if sys.argv[2] == "cuda":
    torch.cuda.synchronize()
hwm = [l for l in open("/proc/self/status") if l.startswith("VmHWM:")]  # not the parent's
print(json.dumps({"seconds": time.perf_counter() - t,
                  "peak_rss": int(hwm[0].split()[1]) * 1024 if hwm else
                  resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024}))
"""


def _tensors(s: dict) -> list[tuple[str, tuple[int, ...]]]:
    """(HF name, shape) of every tensor of the Llama shape, untied output."""
    from aner_lang.architectures import LLAMA
    from aner_lang.runtime.model.config import ModelConfig

    c = ModelConfig(
        s["vocab"],
        s["hidden"],
        s["ffn"],
        s["layers"],
        s["heads"],
        s["kv"],
        s["hidden"] // s["heads"],
        tie_word_embeddings=False,
    )
    return [(w, c.dims(w.shape)) for w in LLAMA.weights(s["layers"], tied=False)]


def _values(index: int, shape: tuple[int, ...]):
    """Seeded f16 values of one tensor (norms near 1)."""
    import torch

    g = torch.Generator().manual_seed(index)
    if len(shape) == 1:
        return (1.0 + 0.1 * torch.randn(shape, generator=g)).half()
    return (torch.randn(shape, generator=g) / shape[1] ** 0.5).half()


def write_model(root: Path, s: dict) -> tuple[Path, Path]:
    """The folder and the GGUF, written tensor by tensor."""
    import gguf
    import numpy as np

    from aner_lang.runtime.export.gguf import write_keys
    from aner_lang.runtime.io.gguf import permute_rows
    from aner_lang.testing.hf_fixture import build_tokenizer

    folder, path = root / "hf", root / "model.gguf"
    if (folder / "done").is_file() and path.is_file():
        return folder, path
    folder.mkdir(parents=True, exist_ok=True)
    tensors = _tensors(s)
    config = {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "vocab_size": s["vocab"],
        "hidden_size": s["hidden"],
        "intermediate_size": s["ffn"],
        "num_hidden_layers": s["layers"],
        "num_attention_heads": s["heads"],
        "num_key_value_heads": s["kv"],
        "max_position_embeddings": 8192,
        "rms_norm_eps": 1e-5,
        "rope_theta": 500000.0,
        "tie_word_embeddings": False,
        "torch_dtype": "float16",
        "rope_scaling": {
            "rope_type": "llama3",
            "factor": 8.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 8192,
        },
    }
    (folder / "config.json").write_text(json.dumps(config))
    tok = build_tokenizer("llama3")
    tok.save(str(folder / "tokenizer.json"))
    (folder / "tokenizer_config.json").write_text(
        json.dumps({"bos_token": "<|begin_of_text|>", "eos_token": "<|eot_id|>"})
    )
    # safetensors shards, each written with its header first, then tensor data one at a time
    shards: list[list[tuple[str, tuple[int, ...], int]]] = [[]]
    size = 0
    for i, (w, shape) in enumerate(tensors):
        n = 2 * int(np.prod(shape))
        if size + n > SHARD_BYTES and shards[-1]:
            shards.append([])
            size = 0
        shards[-1].append((w.hf, shape, i))
        size += n
    weight_map = {}
    for k, shard in enumerate(shards):
        name = f"model-{k + 1:05d}-of-{len(shards):05d}.safetensors"
        header: dict = {"__metadata__": {"format": "pt"}}
        offset = 0
        for hf, shape, _ in shard:
            n = 2 * int(np.prod(shape))
            header[hf] = {
                "dtype": "F16",
                "shape": list(shape),
                "data_offsets": [offset, offset + n],
            }
            offset += n
            weight_map[hf] = name
        blob = json.dumps(header).encode()
        blob += b" " * (-len(blob) % 8)
        with open(folder / name, "wb") as f:
            f.write(struct.pack("<Q", len(blob)) + blob)
            for _, shape, i in shard:
                f.write(_values(i, shape).numpy().tobytes())
    index = {"metadata": {"total_size": sum(2 * int(np.prod(sh)) for _, sh in tensors)}}
    (folder / "model.safetensors.index.json").write_text(
        json.dumps({**index, "weight_map": weight_map})
    )
    # the GGUF: header and tensor infos first, then the data, as llama.cpp's converter lays it out
    from aner_lang.runtime.model.config import config_from_hf, gguf_hyperparameters
    from aner_lang.runtime.model.tokenizer import Tokenizer

    c = config_from_hf(config, folder)
    writer = gguf.GGUFWriter(str(path), "llama")

    meta = Tokenizer.from_hf_folder(folder).gguf_metadata(c.vocab_size)
    write_keys(writer, {"general.name": "llama3-8b-shape", **gguf_hyperparameters(c), **meta})
    writer.add_file_type(1)
    for w, shape in tensors:
        writer.add_tensor_info(
            w.gguf,
            shape,
            np.float16 if len(shape) == 2 else np.float32,
            2 * int(np.prod(shape)) if len(shape) == 2 else 4 * shape[0],
        )
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_ti_data_to_file()
    for i, (w, shape) in enumerate(tensors):
        t = _values(i, shape)
        if w.rope_heads:
            t = permute_rows(t, s["heads"] if w.rope_heads == "num_attention_heads" else s["kv"])
        writer.write_tensor_data(t.numpy() if len(shape) == 2 else t.float().numpy())
    writer.close()
    (folder / "done").write_text("")
    return folder, path


def run(script: str, *args: str) -> dict:
    done = subprocess.run([sys.executable, "-c", script, *args], capture_output=True, text=True)
    if done.returncode:
        return {"error": done.stderr.strip().splitlines()[-1] if done.stderr else "failed"}
    return json.loads(done.stdout.strip().splitlines()[-1])


def _warm(path: Path) -> None:
    files = sorted(path.iterdir()) if path.is_dir() else [path]
    for f in files:
        with open(f, "rb") as fh:
            while fh.read(64 << 20):
                pass


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shape", choices=sorted(SHAPES), default="llama3-8b")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--dir", default=os.environ.get("TMPDIR", "/tmp") + "/aner-load-bench")
    ap.add_argument("--dry-run", action="store_true", help="the small shape on the CPU")
    args = ap.parse_args()
    if args.dry_run:
        args.shape, args.device = "dry-run", "cpu"
    root = Path(args.dir) / args.shape
    folder, path = write_model(root, SHAPES[args.shape])
    results = {}
    for label, script, target in (
        ("aner gguf", ANER, path),
        ("aner safetensors", ANER, folder),
        ("transformers+bnb safetensors", HF_BNB, folder),
    ):
        _warm(target)
        results[label] = r = run(script, str(target), args.device)
        if "error" in r:
            print(f"{label:30s} unavailable: {r['error']}")
        else:
            print(
                f"{label:30s} {r['seconds']:7.2f} s   peak host RSS {r['peak_rss'] / 1e9:6.2f} GB"
            )
    print(json.dumps({"shape": args.shape, "device": args.device, **results}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
