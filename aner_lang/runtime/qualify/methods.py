"""The real-model qualification: every adapter method on the real SmolLM2, as the reference did.

For each method, with the reference's data and options (one training text, one held-out text,
context 32, rank 2, alpha 4, seed 71, TinyLoRA's 13 numbers shared globally; micro batch 1, seed
11, clip norm 1, learning rate 2e-4 for adapters and 1e-5 for full):

1. the first update, with the held-out validation loss after it, timed, and the memory report;
2. a checkpoint write and a reload (every file re-hashed, base and profile checked), timed, and
   whether the reloaded state equals the saved one (parameters, moments, loss scale, counters);
3. one more update from the reloaded checkpoint, and two uninterrupted updates from scratch,
   timed, and whether "1 + checkpoint + 1" equals "2" bit for bit;
4. that the base model and the profile are unchanged, and that training moved the parameters
   with a finite loss.

The profile is the reference's where this machine can run it: on a CUDA GPU float16 compute with
a dynamic loss scale (initial 128, growth interval 2), paged AdamW with 2 MiB pages and the fused
NF4 kernels; elsewhere float32, AdamW and host_tiled.
"""

from __future__ import annotations

import hashlib
import math
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import torch

from aner_lang.runtime import adapters
from aner_lang.runtime.load.loader import load_model
from aner_lang.runtime.model.loaded import LoadedModel
from aner_lang.runtime.tasks.data import from_texts
from aner_lang.runtime.train import checkpoint
from aner_lang.runtime.train.memory import memory_report
from aner_lang.runtime.train.profile import Profile, dynamic
from aner_lang.runtime.train.trainer import train

TRAINING_TEXT = "Aner makes model adaptation explicit and reproducible."
VALIDATION_TEXT = "The quiet mountain lake reflects the clear morning sky."
CONTEXT = 32
ADAPTER_OPTIONS: dict[str, Any] = {
    "rank": 2,
    "alpha": 4.0,
    "seed": 71,
    "tiny_parameters": 13,
    "tiny_sharing": "global",
}
UPDATE_OPTIONS: dict[str, Any] = {
    "micro_batch": 1,
    "accumulation": 1,
    "seed": 11,
    "clip_norm": 1.0,
    "adapter_learning_rate": 2e-4,
    "full_learning_rate": 1e-5,
}


@dataclass(frozen=True)
class Method:
    name: str
    """As the reference names it (``qlora`` is Aner's `lora` on an NF4 base)."""
    adapter: str
    storage: str

    def make(self, base: LoadedModel) -> Any:
        o, targets = ADAPTER_OPTIONS, ["q_proj", "v_proj"]
        if self.adapter == "tinylora":
            return adapters.tinylora(
                base, o["tiny_parameters"], o["tiny_sharing"], o["rank"], targets, o["seed"]
            )
        if self.adapter == "full":
            return adapters.full(base)
        make = {"lora": adapters.lora, "lora_fa": adapters.lora_fa, "dora": adapters.dora}
        return make[self.adapter](base, o["rank"], o["alpha"], 0.0, targets, o["seed"])

    @property
    def learning_rate(self) -> float:
        key = "full_learning_rate" if self.adapter == "full" else "adapter_learning_rate"
        return float(UPDATE_OPTIONS[key])


METHODS = (
    Method("qlora", "lora", "nf4_double_quant"),
    Method("lora_fa", "lora_fa", "nf4_double_quant"),
    Method("tinylora", "tinylora", "nf4_double_quant"),
    Method("dora", "dora", "nf4_double_quant"),
    Method("full", "full", "float32"),
)


def profile_for(device: torch.device) -> Profile:
    if device.type == "cuda":
        return Profile(
            precision="float16",
            optimizer="paged_adamw",
            kernel="auto",
            page_bytes=2 << 20,
            loss_scale=dynamic(initial=128.0, growth_interval=2),
        )
    return Profile(precision="float32", optimizer="adamw", kernel="auto")


def _timed(fn: Callable[[], Any]) -> tuple[Any, float]:
    if torch.cuda.is_available():
        torch.cuda.synchronize()
    start = time.perf_counter()
    result = fn()
    if torch.cuda.is_available():
        torch.cuda.synchronize()
    return result, time.perf_counter() - start


def _digest(tensors: dict[str, torch.Tensor]) -> str:
    h = hashlib.sha256()
    for name in sorted(tensors):
        h.update(name.encode())
        flat = tensors[name].detach().cpu().contiguous().reshape(-1)
        h.update(flat.view(torch.uint8).numpy().tobytes())
    return h.hexdigest()


def _base_digest(base: LoadedModel) -> str:
    return _digest(dict(base.module.state_dict()))


def _same(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor], prefix: str) -> bool:
    keys = {k for k in a if k.startswith(prefix)}
    return keys == {k for k in b if k.startswith(prefix)} and all(
        torch.equal(a[k].cpu(), b[k].cpu()) for k in keys
    )


def _train(adapter: Any, method: Method, profile: Profile, steps: int, data: Any, val: Any) -> Any:
    o = UPDATE_OPTIONS
    return train(
        adapter,
        data,
        profile,
        steps=steps,
        learning_rate=method.learning_rate,
        micro_batch=int(o["micro_batch"]),
        accumulation=int(o["accumulation"]),
        clip_norm=float(o["clip_norm"]),
        seed=int(o["seed"]),
        validation=val,
    )


def qualify_method(method: Method, base: LoadedModel, workdir: Path) -> dict[str, Any]:
    """One method's entry of the report (see the module docstring)."""
    profile = profile_for(base.device)
    profile_before = profile.to_json()
    base_before = _base_digest(base)
    data, val = from_texts([TRAINING_TEXT], CONTEXT), from_texts([VALIDATION_TEXT], CONTEXT)

    first = method.make(base)
    initial = first.tensors()
    run, t_first = _timed(lambda: _train(first, method, profile, 1, data, val))
    memory = memory_report(first, profile).as_dict()
    saved_state = first.state
    folder, t_write = _timed(lambda: checkpoint.save(workdir / method.name, saved_state))
    reloaded, t_reload = _timed(
        lambda: checkpoint.resume(workdir / method.name, model=base, profile=profile)
    )
    exact_reload = (
        _same(saved_state.tensors, reloaded.state.tensors, "")
        and saved_state.meta == reloaded.state.meta
    )
    resumed, t_resume = _timed(lambda: _train(reloaded, method, profile, 2, data, val))
    whole = method.make(base)
    straight, t_two = _timed(lambda: _train(whole, method, profile, 2, data, val))
    a, b = reloaded.state, whole.state
    equal = {
        "event": "exact_resume",
        "method": method.adapter,
        "equal_parameters": _same(a.tensors, b.tensors, "adapter/"),
        "equal_optimizer": _same(a.tensors, b.tensors, "optim/"),
        "equal_profile_state": a.meta["loss_scale"] == b.meta["loss_scale"],
        "equal_counters": a.meta["counters"] == b.meta["counters"],
        "updates": a.updates,
        "profile": a.meta["profile"],
    }
    moved = any(
        not torch.equal(initial[k], v) for k, v in first.tensors().items() if k in first.params
    )
    exact = all(equal[k] for k in ("equal_parameters", "equal_optimizer", "equal_profile_state"))
    passed = exact and exact_reload and moved and math.isfinite(run.loss_history[0])
    return {
        "method": method.name,
        "backend_adapter_method": method.adapter,
        "status": "pass" if passed else "fail",
        "base_storage": method.storage,
        "device": str(base.device),
        "parameters": base.parameter_count(),
        "trainable_parameters": first.trainable_parameters,
        "target_tensor_count": first.target_tensors,
        "first_update_profile": {**profile.to_json(), "kernel_identity": run.kernel_identity},
        "first_update_loss": run.loss_history[0],
        "first_update_scored_tokens": run.scored_tokens,
        "first_update_validation_loss": run.validation_loss,
        "single_model_owned_buffers": memory,
        "checkpoint_bytes": sum(p.stat().st_size for p in folder.iterdir()),
        "exact_checkpoint_reload_parameter_moments_scaler": exact_reload,
        "exact_resumed_scored_token_counters": a.meta["counters"]["scored_tokens"]
        == b.meta["counters"]["scored_tokens"],
        "exact_one_plus_checkpoint_plus_one_equals_uninterrupted_two": equal,
        "source_model_and_profile_immutable": _base_digest(base) == base_before
        and profile.to_json() == profile_before,
        "actual_parameter_update_and_finite_loss": moved
        and all(math.isfinite(x) for x in run.loss_history + straight.loss_history),
        "timings_seconds": {
            "first_update": t_first,
            "checkpoint_write": t_write,
            "checkpoint_reload": t_reload,
            "resume_one": t_resume,
            "uninterrupted_two": t_two,
        },
        "final_losses": {"resumed": resumed.loss_history, "uninterrupted": straight.loss_history},
    }


def real_model(path: Path, methods: tuple[Method, ...] = METHODS) -> dict[str, Any]:
    """The `real_model` section: the source file, the NF4 base's memory, and every method."""
    device = "cuda" if torch.cuda.is_available() else "cpu"
    section: dict[str, Any] = {
        "source_filename": path.name,
        "source_sha256": hashlib.sha256(path.read_bytes()).hexdigest(),
        "source_bytes": path.stat().st_size,
        "training_context": CONTEXT,
        "training_text": TRAINING_TEXT,
        "validation_text": VALIDATION_TEXT,
        "adapter_options": ADAPTER_OPTIONS,
        "update_options": UPDATE_OPTIONS,
        "qualification": [],
    }
    bases: dict[str, LoadedModel] = {}
    with tempfile.TemporaryDirectory(prefix="aner-qualify-") as tmp:
        for method in methods:
            if method.storage not in bases:
                bases.clear()  # one base in memory at a time
                # the reference quantized the embedding too: its packed-base figure needs that
                load = partial(load_model, path, method.storage, device, quantize_embeddings=True)
                base, seconds = _timed(load)
                bases[method.storage] = base
                section.setdefault("name", base.name)
                section.setdefault("parameters", base.parameter_count())
                section.setdefault("load_seconds", {})[method.storage] = seconds
                section.setdefault("input_memory", {})[method.storage] = memory_report(
                    base
                ).as_dict()
            section["qualification"].append(
                qualify_method(method, bases[method.storage], Path(tmp))
            )
    return section
