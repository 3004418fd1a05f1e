"""What one decoder layer keeps for backward, measured on a GPU, against the plan's count
(`train.footprint.layer_activation_bytes`), the figure `aner plan` and `memory()` rest on.

A random-weight model of one of train_scale's shapes, cut to `--layers` decoder layers, LoRA rank
16 on all seven targets, bf16, activations kept, one eager forward and backward of a
`--context`-token sequence through the fused NF4 kernels, as the trainer runs it. Printed per
layer: the CUDA bytes each layer's forward leaves allocated (what it keeps for backward, its
output included), and the peak of the backward over what the forward left; once as Aner runs,
once with the recomputation of copies switched off (`model.activations.recomputing`).

    python benchmarks/activation_memory.py --shape llama3-8b --layers 4 --context 2048
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import sys
import tempfile
from pathlib import Path
from typing import Any

import torch
import train_scale as bench  # this directory is on sys.path when run as a script

from aner_lang.runtime import adapters as A
from aner_lang.runtime.load.loader import load_model
from aner_lang.runtime.model import transformer
from aner_lang.runtime.model.activations import ActivationPolicy, keeping
from aner_lang.runtime.model.loss import IGNORE
from aner_lang.runtime.model.precision import autocast
from aner_lang.runtime.train import footprint


def measure(adapter: Any, ids: torch.Tensor) -> tuple[list[int], int, int]:
    """Bytes left allocated by each layer's forward, the forward's total over the weights, and
    the backward's peak over what the forward left."""
    model = adapter.model
    marks: list[int] = []
    hooks = [
        layer.register_forward_hook(lambda *_: marks.append(torch.cuda.memory_allocated()))
        for layer in model.module.layers
    ]
    targets = torch.cat([ids[:, 1:], torch.full((1, 1), IGNORE, device=ids.device)], dim=1)
    torch.cuda.synchronize()
    before = torch.cuda.memory_allocated()
    try:
        with keeping(ActivationPolicy("keep")), adapter.active():
            with autocast("bfloat16", ids.device):
                loss = adapter.loss(ids, targets)
            torch.cuda.synchronize()
            after = torch.cuda.memory_allocated()
            torch.cuda.reset_peak_memory_stats()
            loss.backward()
            torch.cuda.synchronize()
    finally:
        for hook in hooks:
            hook.remove()
    per_layer = [b - a for a, b in itertools.pairwise(marks)]
    return per_layer, after - before, torch.cuda.max_memory_allocated() - after


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shape", default="llama3-8b")
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--context", type=int, default=2048)
    args = ap.parse_args(argv)
    if not torch.cuda.is_available():
        print("needs a CUDA GPU", file=sys.stderr)
        return 2
    sizes = bench.SHAPES[args.shape]
    sizes.update(num_hidden_layers=args.layers, context=args.context)
    folder = Path(tempfile.mkdtemp()) / "model"
    bench.make_model(args.shape, folder, "cuda")
    model = load_model(folder, storage="nf4_double_quant", device="cuda")
    adapter = A.lora(model, rank=bench.RANK, alpha=bench.ALPHA, targets=bench.TARGETS, seed=0)
    c = model.config
    shape = footprint.LayerShape(
        c.hidden_size, c.q_size, c.kv_size, c.intermediate_size, c.num_attention_heads
    )
    planned = footprint.layer_activation_bytes(
        shape, args.context, 2, bench.RANK * len(bench.TARGETS)
    )
    ids = torch.randint(3, c.vocab_size, (1, args.context), device="cuda")
    print(
        f"{args.shape}, {args.layers} layers, context {args.context}, LoRA r{bench.RANK} x7, bf16"
    )
    print(f"plan: {planned / 2**20:.1f} MiB kept per layer, "
          f"{footprint.BACKWARD_FACTOR * planned / 2**20:.1f} MiB layer backward")  # fmt: skip
    for label, recompute in (("as run", True), ("no recomputation", False)):
        with contextlib.ExitStack() as stack:
            if not recompute:
                original = transformer.recomputing
                transformer.recomputing = lambda *_: contextlib.nullcontext()  # type: ignore[assignment]
                stack.callback(setattr, transformer, "recomputing", original)
            measure(adapter, ids)  # warm: kernels compiled, caches and buffers allocated
            per_layer, forward, backward = measure(adapter, ids)
        kept = ", ".join(f"{b / 2**20:.1f}" for b in per_layer)
        print(f"{label}: per layer kept MiB [{kept}]; forward total {forward / 2**20:.1f} MiB; "
              f"backward peak over it {backward / 2**20:.1f} MiB")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
