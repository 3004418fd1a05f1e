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
from aner_lang.runtime.tasks.data import collate, token_loss_sum
from aner_lang.runtime.tasks.records import Dataset
from aner_lang.runtime.train import control
from aner_lang.runtime.train.loss_scale import LossScaler
from aner_lang.runtime.train.optim import make_optimizer
from aner_lang.runtime.train.order import Cursor
from aner_lang.runtime.train.profile import Profile
from aner_lang.runtime.train.run import Run
from aner_lang.runtime.train.schedule import SCHEDULES, learning_rate_at
from aner_lang.runtime.train.state import STATE_FORMAT, Counters, TrainState


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
    run_control = control.begin(adapter, profile, options, checkpoints, checkpoint_every)
    checkpoints, checkpoint_every = run_control.checkpoints, run_control.checkpoint_every
    loop = _Loop(adapter, data, profile, options, run_identity(adapter, profile, backend))
    log_path = _log_path(log, checkpoints)
    log_file = open(log_path, "a", encoding="utf-8") if log_path else None
    bar = _progress(steps, loop.counters.updates)
    start = time.perf_counter()
    try:
        if log_file:
            _write_event(log_file, loop.start_event())
        run_control.emit({**loop.start_event(), "steps": steps})
        with using_backend(backend), run_control.stop_signals():
            while loop.counters.updates < steps:
                event = loop.update()
                done = loop.counters.updates == steps
                updates = loop.counters.updates
                if validation is not None and (
                    done or updates == 1 or (eval_every and updates % eval_every == 0)
                ):
                    event["validation_loss"] = loop.validate(validation)
                adapter.state = loop.snapshot()
                if log_file:
                    _write_event(log_file, event)
                run_control.emit({**event, "steps": steps})
                if bar is not None:
                    bar.update(1)
                    bar.set_postfix(loss=f"{event['loss']:.4f}")
                stop = run_control.stop_requested and not done
                saved = None
                if checkpoints and (
                    done or stop or (checkpoint_every and updates % checkpoint_every == 0)
                ):
                    saved = run_control.save(adapter.state)
                if stop:
                    raise run_control.stopped(updates, steps, saved)
    finally:
        adapter.train_mode(False)
        if log_file:
            log_file.close()
        if bar is not None:
            bar.close()
    return loop.result(time.perf_counter() - start, log_path)


class _Loop:
    """One `train` call's state: optimizer, loss scaler, counters, data cursor, RNG, and the
    steps of an update. Built fresh, or from the adapter's `TrainState` to continue it exactly."""

    def __init__(
        self, adapter: Any, data: Dataset, profile: Profile, options: dict[str, Any], identity: str
    ) -> None:
        self.adapter, self.profile, self.options, self.identity = (
            adapter,
            profile,
            options,
            identity,
        )
        prev = adapter.state
        if prev is not None:
            _require_same_kernel(prev, identity)
        self.opt = make_optimizer(
            profile.optimizer,
            adapter.params,
            profile.page_bytes,
            lr=options["learning_rate"],
            weight_decay=options["weight_decay"],
        )
        self.gen = torch.Generator(device=adapter.device)
        self.gen.manual_seed(options["seed"])
        if prev is None:
            self.scaler = LossScaler(replace(profile.scale_state))
            self.counters = Counters()
            self.cursor = Cursor(len(data), options["seed"])
        else:
            self.opt.load_state_tensors(prev.tensors)
            self.scaler = LossScaler.from_json(prev.meta["loss_scale"])
            self.counters = Counters.from_json(prev.meta["counters"])
            d = prev.meta["data"]
            self.cursor = Cursor(len(data), d["seed"], d["epoch"], d["position"])
            self.gen.set_state(prev.tensors["rng/generator"])
        adapter.dropout_generator = self.gen
        self.pad = adapter.tokenizer.pad_id or 0
        self.params = list(adapter.params.items())
        self.examples = data.examples(adapter.tokenizer)

    def start_event(self) -> dict[str, Any]:
        return {
            "event": "start",
            "kernel_identity": self.identity,
            "profile": self.profile.to_json(),
            "options": self.options,
        }

    def update(self) -> dict[str, Any]:
        """One accumulation window, re-run with a backed-off loss scale while it overflows (up
        to `max_retries`), then the optimizer step or the skip; returns the update's event."""
        c, o, scaler = self.counters, self.options, self.scaler
        mark = self.cursor.mark()
        for attempt in range(scaler.state.max_retries + 1):
            self.cursor.restore(mark)
            self.adapter.train_mode(True)
            loss, scored = self._window()
            grads = {n: p.grad for n, p in self.params if p.grad is not None}
            overflow = scaler.unscale_(grads.values()) or not math.isfinite(loss)
            scaler.update(overflow)
            if not overflow:
                break
            c.retries += attempt < scaler.state.max_retries
            self._zero_grads()
        event: dict[str, Any] = {
            "event": "update",
            "update": c.updates + 1,
            "loss": loss,
            "scored_tokens": scored,
            "loss_scale": scaler.state.scale,
            "skipped": overflow,
        }
        if overflow:
            c.skipped_updates += 1
        else:
            lr = learning_rate_at(
                c.applied, o["learning_rate"], o["steps"], o["warmup"], o["schedule"]
            )
            if o["clip_norm"] is not None and o["clip_norm"] > 0:
                trained = [p for _, p in self.params if p.grad is not None]
                norm = torch.nn.utils.clip_grad_norm_(trained, o["clip_norm"], foreach=False)
                event["grad_norm"] = float(norm)
            self.opt.step(grads, lr=lr)
            c.applied += 1
            c.loss_history.append(loss)
            c.scored_tokens += scored
            event["learning_rate"] = lr
        self._zero_grads()
        c.updates += 1
        self.adapter.train_mode(False)
        return event

    def _window(self) -> tuple[float, int]:
        """Forward/backward one accumulation window; returns (mean loss, scored tokens)."""
        o, adapter = self.options, self.adapter
        batches = [
            collate(
                [self.examples[i] for i in self.cursor.take(o["micro_batch"])],
                self.pad,
                adapter.device,
            )
            for _ in range(o["accumulation"])
        ]
        scored = sum(b.scored_tokens for b in batches)
        total = 0.0
        for batch in batches:
            if batch.scored_tokens == 0:
                continue
            with autocast(self.profile.precision, adapter.device):
                logits = adapter.forward(batch.input_ids)
            loss = token_loss_sum(logits, batch) / scored
            self.scaler.scale(loss).backward()
            total += float(loss.detach())
        return total, scored

    def _zero_grads(self) -> None:
        for _, p in self.params:
            p.grad = None

    def validate(self, validation: Dataset) -> float:
        v = _mean_loss(self.adapter, validation, self.options["micro_batch"], self.profile)
        self.counters.validation_history.append([self.counters.updates, v])
        return v

    def snapshot(self) -> TrainState:
        """The state after this update (consistent: optimizer stepped, scale updated)."""
        adapter = self.adapter
        tensors = {f"adapter/{k}": v for k, v in adapter.tensors().items()}
        tensors.update(self.opt.state_tensors())
        tensors["rng/generator"] = self.gen.get_state().clone()
        meta = {
            "format": STATE_FORMAT,
            "adapter": adapter.config,
            "profile": self.profile.to_json(),
            "base": {"path": str(adapter.base.path), "storage": adapter.base.storage},
            "kernel_identity": self.identity,
            "loss_scale": self.scaler.to_json(),
            "data": {
                "seed": self.cursor.seed,
                "epoch": self.cursor.epoch,
                "position": self.cursor.position,
                "accumulation_offset": 0,
            },
            "counters": self.counters.to_json(),
            "options": self.options,
        }
        return TrainState(tensors, meta)

    def result(self, seconds: float, log_path: str | None) -> Run:
        c = self.counters
        return Run(
            adapter=self.adapter,
            profile=self.profile,
            loss_history=list(c.loss_history),
            validation_history=[(int(u), v) for u, v in c.validation_history],
            scored_tokens=c.scored_tokens,
            updates=c.updates,
            skipped_updates=c.skipped_updates,
            retries=c.retries,
            loss_scale=self.scaler.state.scale,
            optimizer_report=self.opt.report(),
            seconds=seconds,
            log_path=log_path,
            kernel_identity=self.identity,
            optimizer_bytes={
                "optimizer": self.opt.state_bytes(),
                "managed": self.opt.managed_bytes(),
            },
        )


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
