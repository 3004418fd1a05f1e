"""`train(...)`: accumulation windows, loss scaling, clipping, AdamW, validation, checkpoints.

One update = one accumulation window of `accumulation` micro-batches of `micro_batch` examples,
drawn in a per-epoch order fixed by `seed`. The loss of the window is the summed next-token
cross-entropy of its scored targets divided by the window's scored-token count (so every scored
token weighs the same however the window splits into micro-batches). With a loss scale an
overflowing window backs the scale off and is re-run up to `max_retries` times; if it still
overflows the update is skipped (masters, moments and the schedule stay as they were). `steps`
is the total number of windows the adapter's training reaches: a resumed adapter continues to it
(docs/internals.md, "Trainer state contract").
"""

from __future__ import annotations

import json
import math
import os
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import torch

from aner_lang.errors import AnerRuntimeError
from aner_lang.runtime.model.precision import DTYPES, autocast
from aner_lang.runtime.nf4.backends import NF4Backend, using_backend
from aner_lang.runtime.tasks.data import Dataset, collate, token_loss_sum
from aner_lang.runtime.train import checkpoint
from aner_lang.runtime.train.loss_scale import LossScaler
from aner_lang.runtime.train.optim import make_optimizer
from aner_lang.runtime.train.order import Cursor
from aner_lang.runtime.train.profile import Profile
from aner_lang.runtime.train.run import Run
from aner_lang.runtime.train.schedule import SCHEDULES, learning_rate_at
from aner_lang.runtime.train.state import STATE_FORMAT, TrainState


def set_deterministic(device: torch.device) -> None:
    """TF32 off and deterministic kernels, so one seed on one machine kind gives one result."""
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    torch.backends.cudnn.benchmark = False
    torch.use_deterministic_algorithms(True, warn_only=True)
    if device.type == "cuda":
        torch.backends.cuda.matmul.allow_fp16_reduced_precision_reduction = False
        torch.backends.cuda.matmul.allow_bf16_reduced_precision_reduction = False


def _mean_loss(adapter: Any, data: Dataset, micro_batch: int, profile: Profile) -> float:
    """Mean next-token loss over all scored tokens of `data` (no gradients, eval mode)."""
    total, count = 0.0, 0
    pad = adapter.tokenizer.pad_id or 0
    examples = data.examples(adapter.tokenizer)
    with torch.no_grad():
        for i in range(0, len(examples), micro_batch):
            batch = collate(examples[i : i + micro_batch], pad, adapter.device)
            with autocast(profile.precision, adapter.device):
                logits = adapter.forward(batch.input_ids)
            total += float(token_loss_sum(logits, batch))
            count += batch.scored_tokens
    return total / max(count, 1)


def run_identity(adapter: Any, profile: Profile, backend: NF4Backend) -> str:
    """What a run's numbers depend on besides its inputs: the NF4 kernel's identity (or the dense
    base's), torch, the device, fp32 masters. Recorded in every state and checkpoint; continuing
    a state under a different identity would not be bit-identical, so `train` refuses it."""
    device = adapter.device
    base = adapter.base.module
    dtype = DTYPES[profile.precision]
    nf4 = any(getattr(m, "storage", None) == "nf4_double_quant" for m in base.modules())
    kernel = backend.identity(device, dtype) if nf4 else f"aner.dense/1;compute={profile.precision}"
    where = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    return f"{kernel};torch={torch.__version__};device={where};masters=float32"


def _require_same_kernel(prev: TrainState, identity: str) -> None:
    recorded = prev.meta.get("kernel_identity")
    if recorded != identity:
        raise AnerRuntimeError(
            "train: this adapter's training state was produced by a different kernel, so "
            "continuing it here would not be bit-identical to an uninterrupted run",
            code="E-CKPT-KERNEL",
            notes=(
                f"recorded: {recorded}",
                f"now:      {identity}",
                "continue with the profile and machine the state was trained with",
            ),
        )


def _validate_options(
    tokenizer: Any,
    data: Dataset,
    steps: int,
    micro_batch: int,
    accumulation: int,
    schedule: str,
    validation: Dataset | None,
) -> None:
    if len(data) == 0 or data.scored_tokens(tokenizer) == 0:
        raise AnerRuntimeError("train: the training set has no scored tokens", code="E-TRAIN-DATA")
    if steps < 1 or micro_batch < 1 or accumulation < 1:
        raise AnerRuntimeError(
            "train: steps, micro_batch and accumulation must be at least 1", code="E-TRAIN-OPTIONS"
        )
    if schedule not in SCHEDULES:
        raise AnerRuntimeError(
            f"train: unknown schedule {schedule!r}; expected one of {', '.join(SCHEDULES)}",
            code="E-TRAIN-OPTIONS",
        )
    if validation is not None and validation.scored_tokens(tokenizer) == 0:
        raise AnerRuntimeError(
            "train: the validation set has no scored tokens", code="E-TRAIN-DATA"
        )


def train(
    adapter: Any,
    data: Dataset,
    profile: Profile,
    steps: int = 10,
    learning_rate: float = 2e-4,
    micro_batch: int = 1,
    accumulation: int = 1,
    clip_norm: float | None = 1.0,
    seed: int = 0,
    weight_decay: float = 0.0,
    warmup: int = 0,
    schedule: str = "constant",
    validation: Dataset | None = None,
    eval_every: int = 0,
    checkpoints: str | None = None,
    checkpoint_every: int = 0,
    log: str | None = None,
) -> Run:
    """Train `adapter` on `data` until it has done `steps` updates; see the module docstring."""
    _validate_options(
        adapter.tokenizer, data, steps, micro_batch, accumulation, schedule, validation
    )
    device = adapter.device
    profile.validate(device)
    set_deterministic(device)
    backend = profile.backend(device)
    kernel_identity = run_identity(adapter, profile, backend)
    options = {
        "steps": steps,
        "learning_rate": learning_rate,
        "micro_batch": micro_batch,
        "accumulation": accumulation,
        "clip_norm": clip_norm,
        "seed": seed,
        "weight_decay": weight_decay,
        "warmup": warmup,
        "schedule": schedule,
    }
    prev = adapter.state
    if prev is not None:
        _require_same_kernel(prev, kernel_identity)
    opt = make_optimizer(
        profile.optimizer,
        adapter.params,
        profile.page_bytes,
        lr=learning_rate,
        weight_decay=weight_decay,
    )
    gen = torch.Generator(device=device)
    gen.manual_seed(seed)
    if prev is None:
        scaler = LossScaler(replace(profile.loss_scale))
        counters = {
            "updates": 0,
            "applied": 0,
            "skipped_updates": 0,
            "retries": 0,
            "scored_tokens": 0,
            "loss_history": [],
            "validation_history": [],
        }
        cursor = Cursor(len(data), seed)
    else:
        opt.load_state_tensors(prev.tensors)
        scaler = LossScaler.from_json(prev.meta["loss_scale"])
        counters = json.loads(json.dumps(prev.meta["counters"]))
        d = prev.meta["data"]
        cursor = Cursor(len(data), d["seed"], d["epoch"], d["position"])
        gen.set_state(prev.tensors["rng/generator"])
    adapter.dropout_generator = gen
    log_path = _log_path(log, checkpoints)
    log_file = open(log_path, "a", encoding="utf-8") if log_path else None
    bar = _progress(steps, counters["updates"])
    pad = adapter.tokenizer.pad_id or 0
    params = list(adapter.params.items())
    examples = data.examples(adapter.tokenizer)
    start = time.perf_counter()
    if log_file:
        _write_event(
            log_file,
            {
                "event": "start",
                "kernel_identity": kernel_identity,
                "profile": profile.to_json(),
                "options": options,
            },
        )
    try:
        with using_backend(backend):
            while counters["updates"] < steps:
                mark = cursor.mark()
                for attempt in range(scaler.state.max_retries + 1):
                    cursor.restore(mark)
                    adapter.train_mode(True)
                    loss, scored = _window(
                        adapter, examples, cursor, micro_batch, accumulation, pad, profile, scaler
                    )
                    grads = {n: p.grad for n, p in params if p.grad is not None}
                    overflow = scaler.unscale_(grads.values()) or not math.isfinite(loss)
                    scaler.update(overflow)
                    if not overflow:
                        break
                    counters["retries"] += attempt < scaler.state.max_retries
                    _zero_grads(params)
                k = counters["updates"]
                event = {
                    "event": "update",
                    "update": k + 1,
                    "loss": loss,
                    "scored_tokens": scored,
                    "loss_scale": scaler.state.scale,
                    "skipped": overflow,
                }
                if overflow:
                    counters["skipped_updates"] += 1
                else:
                    lr = learning_rate_at(
                        counters["applied"], learning_rate, steps, warmup, schedule
                    )
                    if clip_norm is not None and clip_norm > 0:
                        event["grad_norm"] = float(
                            torch.nn.utils.clip_grad_norm_(
                                [p for _, p in params if p.grad is not None],
                                clip_norm,
                                foreach=False,
                            )
                        )
                    opt.step(grads, lr=lr)
                    counters["applied"] += 1
                    counters["loss_history"].append(loss)
                    counters["scored_tokens"] += scored
                    event["learning_rate"] = lr
                _zero_grads(params)
                counters["updates"] = k + 1
                adapter.train_mode(False)
                done = counters["updates"] == steps
                if validation is not None and (
                    done
                    or counters["updates"] == 1
                    or (eval_every and counters["updates"] % eval_every == 0)
                ):
                    v = _mean_loss(adapter, validation, micro_batch, profile)
                    counters["validation_history"].append([counters["updates"], v])
                    event["validation_loss"] = v
                adapter.state = _snapshot(
                    adapter, opt, scaler, cursor, counters, profile, options, kernel_identity, gen
                )
                if log_file:
                    _write_event(log_file, event)
                if bar is not None:
                    bar.update(1)
                    bar.set_postfix(loss=f"{loss:.4f}")
                if checkpoints and (
                    done or (checkpoint_every and counters["updates"] % checkpoint_every == 0)
                ):
                    checkpoint.save(checkpoints, adapter.state)
    finally:
        adapter.train_mode(False)
        if log_file:
            log_file.close()
        if bar is not None:
            bar.close()
    st = adapter.state
    c = st.meta["counters"]
    return Run(
        adapter=adapter,
        profile=profile,
        loss_history=list(c["loss_history"]),
        validation_history=[tuple(v) for v in c["validation_history"]],
        scored_tokens=c["scored_tokens"],
        updates=c["updates"],
        skipped_updates=c["skipped_updates"],
        retries=c["retries"],
        loss_scale=scaler.state.scale,
        optimizer_report=opt.report(),
        seconds=time.perf_counter() - start,
        log_path=log_path,
        kernel_identity=kernel_identity,
        optimizer_bytes={"optimizer": opt.state_bytes(), "managed": opt.managed_bytes()},
    )


def _window(
    adapter: Any,
    examples: tuple,
    cursor: Cursor,
    micro_batch: int,
    accumulation: int,
    pad: int,
    profile: Profile,
    scaler: LossScaler,
) -> tuple[float, int]:
    """Forward/backward one accumulation window; returns (mean loss, scored tokens)."""
    batches = [
        collate([examples[i] for i in cursor.take(micro_batch)], pad, adapter.device)
        for _ in range(accumulation)
    ]
    scored = sum(b.scored_tokens for b in batches)
    total = 0.0
    for batch in batches:
        if batch.scored_tokens == 0:
            continue
        with autocast(profile.precision, adapter.device):
            logits = adapter.forward(batch.input_ids)
        loss = token_loss_sum(logits, batch) / scored
        scaler.scale(loss).backward()
        total += float(loss.detach())
    return total, scored


def _zero_grads(params: list[tuple[str, torch.Tensor]]) -> None:
    for _, p in params:
        p.grad = None


def _snapshot(
    adapter: Any,
    opt: Any,
    scaler: LossScaler,
    cursor: Cursor,
    counters: dict,
    profile: Profile,
    options: dict,
    kernel_identity: str,
    gen: torch.Generator,
) -> TrainState:
    tensors = {f"adapter/{k}": v for k, v in adapter.tensors().items()}
    tensors.update(opt.state_tensors())
    tensors["rng/generator"] = gen.get_state().clone()
    meta = {
        "format": STATE_FORMAT,
        "adapter": adapter.config,
        "profile": profile.to_json(),
        "base": {"path": str(adapter.base.path), "storage": adapter.base.storage},
        "kernel_identity": kernel_identity,
        "loss_scale": scaler.to_json(),
        "data": {
            "seed": cursor.seed,
            "epoch": cursor.epoch,
            "position": cursor.position,
            "accumulation_offset": 0,
        },
        "counters": json.loads(json.dumps(counters)),
        "options": options,
    }
    return TrainState(tensors, meta)


def _write_event(log_file: Any, event: dict[str, Any]) -> None:
    log_file.write(json.dumps(event) + "\n")
    log_file.flush()


def _log_path(log: str | None, checkpoints: str | None) -> str | None:
    """Where the JSON events go: `log:` if given, else `<checkpoints>/events.jsonl`."""
    path = log or (str(Path(checkpoints) / "events.jsonl") if checkpoints else None)
    if path:
        Path(path).parent.mkdir(parents=True, exist_ok=True)
    return path


def _progress(total: int, done: int):
    """A tqdm bar on a terminal, nothing otherwise."""
    if not sys.stderr.isatty():
        return None
    from tqdm import tqdm

    return tqdm(total=total, initial=done, desc="train", unit="update", leave=False)


def train_builtin(
    ctx: Any, *, checkpoints: str | None = None, log: str | None = None, **kwargs: Any
) -> Run:
    """Builtin `train`: script-relative `checkpoints` and `log` paths, then `train`."""
    return train(
        checkpoints=str(ctx.resolve_path(checkpoints)) if checkpoints else None,
        log=str(ctx.resolve_path(log)) if log else None,
        **kwargs,
    )
