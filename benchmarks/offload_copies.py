"""What `offload` moves to the host in a `train()` call and what that costs the host: per kind
of tensor copied (how it was saved or kept, its shape, strides and dtype), how many; per update
its seconds, the host time spent packing, keeping, fetching and unpacking, torch's pinned-memory
allocator counters (allocations, cudaHostAlloc time) and the GPU's peak; its loss and gradient
norm, to compare codes bit for bit. `--device cpu` runs the plumbing alone (offload keeps CPU
tensors as they are).

    python benchmarks/offload_copies.py --model /tmp/train_scale/llama3-8b/model --context 16384
"""

from __future__ import annotations

import argparse
import collections
import json
import tempfile
import time
from contextlib import ExitStack
from pathlib import Path
from typing import Any
from unittest import mock

import torch
from update_timeline import run_inputs  # this directory is on sys.path

from aner_lang.runtime.load.loader import load_model
from aner_lang.runtime.model import host_copies

try:  # an older aner_lang/ (offload_check.sh CODES) pinned with torch's allocator alone
    from aner_lang.runtime.model import pinned_blocks
except ImportError:
    pinned_blocks = None  # type: ignore[assignment]
from aner_lang.runtime.train import trainer
from aner_lang.runtime.train.profile import profile as train_profile


def _exact_pinned(cuda: bool) -> int:
    """Bytes this code pinned in its exact-size blocks (`model.pinned_blocks`); 0 for code without."""
    return pinned_blocks.pinned_bytes(torch.device("cuda", 0)) if cuda and pinned_blocks else 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", required=True, help="an HF folder or GGUF file")
    ap.add_argument("--context", type=int, default=16384)
    ap.add_argument("--updates", type=int, default=4)
    ap.add_argument("--device", default="cuda", help="cuda, or cpu for the plumbing alone")
    ap.add_argument("--out", default="/tmp/offload_copies.json")
    args = ap.parse_args(argv)
    cuda = args.device == "cuda"
    model = load_model(Path(args.model), storage="nf4_double_quant", device=args.device)
    data, lora = run_inputs(model, args.context, rows=8)
    kinds: collections.Counter[str] = collections.Counter()
    host_s: dict[str, float] = collections.defaultdict(float)
    stats: list[dict[str, Any]] = []

    depth = 0  # only the outermost of nested calls counts (`pack` may go through `keep`)

    def timed(name: str) -> Any:
        original = getattr(host_copies.HostCopies, name)

        def wrapper(self: Any, t: Any, *rest: Any) -> Any:
            nonlocal depth
            began = time.perf_counter()
            depth += 1
            try:
                out = original(self, t, *rest)
            finally:
                depth -= 1
            if depth == 0:
                host_s[name] += time.perf_counter() - began
                if name in ("keep", "pack"):
                    layout = f"{tuple(t.shape)} {t.stride()} {t.dtype}"
                    kinds[f"{name} {layout} contiguous={t.is_contiguous()}"] += 1
            return out

        return wrapper

    def sync() -> None:
        if cuda:
            torch.cuda.synchronize()

    update = trainer._Loop.update

    def counted(loop: Any, *given: Any, **named: Any) -> Any:
        sync()
        began = time.perf_counter()
        host_s.clear()
        out = update(loop, *given, **named)
        sync()
        host: dict[str, Any] = torch.cuda.host_memory_stats() if cuda else {}
        stats.append({
            "seconds": round(time.perf_counter() - began, 6),
            "host_seconds": {k: round(v, 6) for k, v in host_s.items()},
            "host_memory": {k: v for k, v in host.items() if "alloc" in k or "time" in k},
            "exact_pinned_bytes": _exact_pinned(cuda),
            "gpu_peak_gb": round(torch.cuda.max_memory_allocated() / 1e9, 2) if cuda else 0.0,
        })  # fmt: skip
        print(json.dumps(stats[-1]), flush=True)
        return out

    folder = Path(tempfile.mkdtemp(prefix="aner-offload-"))
    with ExitStack() as patches:
        for name in ("keep", "pack", "_fetch", "unpack"):
            patches.enter_context(mock.patch.object(host_copies.HostCopies, name, timed(name)))
        patches.enter_context(mock.patch.object(trainer._Loop, "update", counted))
        trainer.train(
            lora, data, train_profile(precision="bfloat16", activations="offload"),
            steps=args.updates, learning_rate=2e-4, seed=1, log=str(folder / "events.jsonl"),
        )  # fmt: skip
    for kind, n in kinds.most_common(40):
        print(n, kind)
    updates = _updates(folder / "events.jsonl")
    losses = [(r["loss"], r.get("grad_norm")) for r in updates]
    print("losses", losses)
    tokens = [r["tokens"] for r in updates]
    Path(args.out).write_text(
        json.dumps(
            {"updates": stats, "losses": losses, "tokens": tokens, "copies": dict(kinds)}, indent=1
        )
    )
    return 0


def _updates(events: Path) -> list[dict[str, Any]]:
    """The run's update events, as logged: their losses and gradient norms (where logged) compare
    two codes' runs bit for bit, and their tokens size what offload pinned."""
    rows = [json.loads(line) for line in events.read_text().splitlines()]
    return [r for r in rows if r["event"] == "update"]


if __name__ == "__main__":
    raise SystemExit(main())
