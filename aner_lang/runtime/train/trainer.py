"""`train(...)`: epochs, accumulation windows, loss scaling, clipping, AdamW, validation with the
best checkpoint kept and early stopping, checkpoints, events, progress, Ctrl-C.

One update = one accumulation window of up to `accumulation` micro-batches of up to `micro_batch`
examples, drawn in a per-epoch order (a permutation seeded by `seed`, or the dataset's own order
with `shuffle: false`); a window never crosses the end of an epoch, so an epoch is
`order.updates_per_epoch` updates and its last window may be smaller. The loss of a window is the
summed next-token cross-entropy of its scored targets divided by the window's scored-token count
(so every scored token weighs the same however the window splits into micro-batches). With a
loss scale an overflowing window backs the scale off and is re-run up to `max_retries` times; if
it still overflows the update is skipped (masters, moments and the schedule stay as they were).

Length: `steps` is the total number of windows the adapter's training reaches; `epochs` (a number
of passes, fractions allowed) is the alternative, turned into that total; a resumed adapter
continues to it (docs/internals.md, "Trainer state contract").

Validation runs after the first update, every `eval_every` updates and after the last. With
`checkpoints`, every new best validation loss is also saved to `<checkpoints>/best`. With
`patience: n`, training stops once n validations in a row have not improved on the best one
(recorded in the state, so a resumed run stays stopped).

With an `objective` (`dpo`, `orpo`, `kto`; `preference.py`) the data are preference pairs or
labeled completions, a window's loss is the objective's (normalised per pair), update events carry
its rewards, margins, accuracy and log-probabilities, and validation reports its loss and
held-out preference accuracy. Everything else (epochs, schedule, checkpoints, resume, early
stopping on the validation loss) is the same.

Ctrl-C (SIGINT) or SIGTERM during training lets the current update finish, writes the state (and
a checkpoint when checkpoints are on), and ends the script (Ctrl-C: with one line saying how to
resume; SIGTERM: `RunStopped`); a second Ctrl-C abandons the update at once. A stop asked during
the last update still ends the script: the request is for the run, not for this `train` call.

On several ranks every micro-step draws `micro_batch` examples per rank, rank 0 alone logs, shows
progress and writes checkpoints, and `distributed.Parallel` says what else differs
(docs/distributed.md).
"""

from __future__ import annotations

import json
import math
import signal
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import torch

from aner_lang.host import files
from aner_lang.host.process_clock import add as add_phase
from aner_lang.host.process_clock import phases, seconds_running
from aner_lang.host.units import human_bytes
from aner_lang.problems.errors import AnerRuntimeError
from aner_lang.runtime.ggml.linear import STORAGE as GGUF_STORAGE
from aner_lang.runtime.ggml.linear import gguf_backend
from aner_lang.runtime.io.host_copy import host_copies_soon, keeping_staging, staging_bytes
from aner_lang.runtime.io.world import once, world
from aner_lang.runtime.model import fused_ops
from aner_lang.runtime.model.activations import ActivationPolicy, keeping
from aner_lang.runtime.model.moe import MoeMLP
from aner_lang.runtime.model.precision import DTYPES, autocast
from aner_lang.runtime.model.sections import section
from aner_lang.runtime.nf4.backends import NF4Backend, using_backend
from aner_lang.runtime.tasks.batches import Batch, collate
from aner_lang.runtime.tasks.data import Dataset, no_scored_tokens
from aner_lang.runtime.train import budget, control
from aner_lang.runtime.train.checkpoint_writer import CheckpointWriter, Submitted, Written
from aner_lang.runtime.train.determinism import deterministic
from aner_lang.runtime.train.distributed import Parallel, for_run
from aner_lang.runtime.train.graphs import GraphSteps, eligibility
from aner_lang.runtime.train.kept import keep, release_kept, take_kept
from aner_lang.runtime.train.loss_scale import LossScaler
from aner_lang.runtime.train.objectives import Objective
from aner_lang.runtime.train.objectives import to_json as objective_json
from aner_lang.runtime.train.optim import make_optimizer
from aner_lang.runtime.train.optim.adamw import PreparedStep
from aner_lang.runtime.train.order import Cursor, updates_per_epoch
from aner_lang.runtime.train.preference import PreferenceSteps, check_options, training_examples
from aner_lang.runtime.train.profile import Profile
from aner_lang.runtime.train.run import Run
from aner_lang.runtime.train.schedule import SCHEDULES, learning_rate_at
from aner_lang.runtime.train.state import STATE_FORMAT, Counters, TrainState
from aner_lang.runtime.train.validation import mean_loss as validation_loss
from aner_lang.runtime.train.watch import EventLog, Progress, clock_text

BEST = "best"
"""The folder under `checkpoints` that holds the best validation checkpoint."""
WAIT_WARNING_SECONDS = 1.0
"""A checkpoint that waits this long for earlier ones to reach the disk is worth a warning (once
a run): the loop pauses for the disk, which a larger `checkpoint_every` avoids."""


def _slow_disk(updates: int, submitted: Submitted, state: TrainState) -> str | None:
    """The warning for a checkpoint that replaced one the disk had not begun, or that waited at
    least `WAIT_WARNING_SECONDS` for earlier writes; None for one that did neither."""
    if submitted.replaced is not None:
        what = f"replaced the one of update {submitted.replaced}, which the disk had not begun"
    elif submitted.waited >= WAIT_WARNING_SECONDS:
        what = f"waited {submitted.waited:.1f} s for earlier ones to reach the disk"
    else:
        return None
    return (
        f"the checkpoint of update {updates} {what}: checkpoints ({human_bytes(state.nbytes)} each) "
        "come faster than it writes them; a larger checkpoint_every writes each of them"
    )


def _experts_read_host(adapter: Any, precision: str) -> bool:
    """Whether a mixture-of-experts layer of the adapter's base reads its group sizes on the
    host in this run's compute dtype (`MoeMLP.reads_host`)."""
    layers = [m for m in adapter.base.module.modules() if isinstance(m, MoeMLP)]
    if not layers:
        return False
    with adapter.active():
        return any(m.reads_host(DTYPES[precision]) for m in layers)


def run_identity(adapter: Any, profile: Profile, backend: NF4Backend) -> str:
    """What a run's numbers depend on besides its inputs: the NF4 kernel's identity (or the GGUF
    blocks' path, or the dense base's) and how an NF4 base stores its embedding and `lm_head`, torch, the device, fp32
    masters. Recorded in every state and checkpoint; continuing
    a state under a different identity would not be bit-identical, so `train` refuses it."""
    device = adapter.device
    base = adapter.base.module
    dtype = DTYPES[profile.precision]
    nf4 = any(getattr(m, "storage", None) == "nf4_double_quant" for m in base.modules())
    if adapter.base.storage == GGUF_STORAGE:
        kernel = gguf_backend(backend).identity(device, dtype)
    elif nf4:
        kernel = f"{backend.identity(device, dtype)};embeddings={base.embed_tokens.storage}"
    else:
        kernel = f"aner.dense/1;compute={profile.precision}"
    where = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    identity = f"{kernel};torch={torch.__version__};device={where};masters=float32"
    if dtype != torch.float32:
        identity += f";fused_ops={fused_ops.implementation(device)}"
    return identity


def graph_key(adapter: Any, profile: Profile, identity: str) -> tuple[object, ...]:
    """What a recorded step reads besides its inputs and the buffers its graph holds: the
    settings it was recorded under, and where the base's, the adapter's and the gradients'
    tensors live (a tensor replaced since would leave the graph reading freed memory), in that
    order (`Kept.fits` compares the first three)."""
    base = adapter.base.module.state_dict(keep_vars=True).values()
    tensors = [*adapter.params.values(), *adapter.frozen.values()]
    grads = [p.grad for p in adapter.params.values()]
    return (
        identity,
        json.dumps(profile.to_json(), sort_keys=True),
        tuple(t.data_ptr() for t in base),
        tuple(t.data_ptr() for t in tensors),
        tuple(None if g is None else g.data_ptr() for g in grads),
    )


def adapter_form(adapter: Any) -> tuple[object, ...]:
    """What two adapters' recorded steps share when their tensors live at the same addresses:
    the method, the settings a step reads (`Adapter.step_config`: all but the seed, which only
    draws initial values; alpha and rank are constants of a recording), and every tensor's
    name, shape and dtype (`train.kept`)."""
    tensors = {**adapter.params, **adapter.frozen}
    return (
        adapter.method,
        json.dumps(adapter.step_config(), sort_keys=True),
        tuple((name, tuple(t.shape), t.dtype) for name, t in tensors.items()),
    )


def step_family(adapter: Any, profile: Profile, identity: str) -> tuple[object, ...]:
    """What makes two calls' steps run the same kernels on the same shapes, whatever tensors they
    read (`GraphSteps`'s `family`): the kernel identity, the profile, the base's config, and the
    adapter's method and trainable tensors' shapes."""
    return (
        identity,
        json.dumps(profile.to_json(), sort_keys=True),
        repr(adapter.base.config),
        adapter.method,
        tuple((name, tuple(p.shape), p.dtype) for name, p in adapter.params.items()),
    )


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


def total_updates(
    examples: int, steps: int | None, epochs: float | None, micro_batch: int, accumulation: int
) -> int:
    """The updates a run reaches: `steps`, or `epochs` passes over `examples` (1 when neither is
    given); both at once is an error."""
    if steps is not None and epochs is not None:
        raise AnerRuntimeError("train: give steps or epochs, not both", code="E-TRAIN-OPTIONS")
    if steps is not None:
        return steps
    per_epoch = updates_per_epoch(examples, micro_batch, accumulation)
    return max(1, math.ceil((1.0 if epochs is None else epochs) * per_epoch - 1e-9))


def _validate_options(
    tokenizer: Any,
    data: Dataset,
    steps: int,
    micro_batch: int,
    accumulation: int,
    schedule: str,
    validation: Dataset | None,
    patience: int,
) -> None:
    if len(data.examples(tokenizer)) == 0 or data.scored_tokens(tokenizer) == 0:
        raise no_scored_tokens("training")
    if steps < 1 or micro_batch < 1 or accumulation < 1:
        raise AnerRuntimeError(
            "train: steps, epochs, micro_batch and accumulation must be positive",
            code="E-TRAIN-OPTIONS",
        )
    if schedule not in SCHEDULES:
        raise AnerRuntimeError(
            f"train: unknown schedule {schedule!r}; expected one of {', '.join(SCHEDULES)}",
            code="E-TRAIN-OPTIONS",
        )
    if validation is not None and validation.scored_tokens(tokenizer) == 0:
        raise no_scored_tokens("validation")
    if patience and validation is None:
        raise AnerRuntimeError(
            "train: patience stops on the validation loss, so it needs validation:",
            code="E-TRAIN-OPTIONS",
        )


def train(
    adapter: Any,
    data: Dataset,
    profile: Profile,
    steps: int | None = 10,
    epochs: float | None = None,
    learning_rate: float = 2e-4,
    micro_batch: int = 1,
    accumulation: int = 1,
    clip_norm: float | None = 1.0,
    seed: int = 0,
    shuffle: bool = True,
    weight_decay: float = 0.0,
    warmup: int = 0,
    schedule: str = "constant",
    validation: Dataset | None = None,
    eval_every: int = 0,
    patience: int = 0,
    checkpoints: str | None = None,
    checkpoint_every: int = 0,
    log: str | None = None,
    log_dir: str | None = None,
    objective: Objective | None = None,
) -> Run:
    """Train `adapter` on `data` until it has done its updates; see the module docstring."""
    entered = time.perf_counter()
    tokenizer = adapter.tokenizer
    examples = _examples(data, tokenizer, objective)
    if objective is not None:
        check_options(objective, micro_batch)
    drawn = micro_batch * world().size  # examples a micro-step draws, all ranks together
    total = total_updates(len(examples), steps, epochs, drawn, accumulation)
    _validate_options(
        tokenizer, data, total, micro_batch, accumulation, schedule, validation, patience
    )
    if objective is None:
        _check_lengths(adapter.base.config.max_position_embeddings, tokenizer, data, validation)
    device = adapter.device
    profile.validate(device)
    picked = None
    if profile.memory_budget is not None:
        picked = budget.pick(
            adapter,
            profile,
            context=data.context,
            micro_batch=micro_batch,
            accumulation=accumulation,
        )
        profile = replace(profile, activations=picked.policy)
    backend = profile.backend(device)
    options = {
        "steps": total,
        "epochs": epochs,
        "learning_rate": learning_rate,
        "micro_batch": micro_batch,
        "accumulation": accumulation,
        "clip_norm": clip_norm,
        "seed": seed,
        "shuffle": shuffle,
        "weight_decay": weight_decay,
        "warmup": warmup,
        "schedule": schedule,
        "eval_every": eval_every,
        "patience": patience,
        "objective": None if objective is None else objective_json(objective),
    }
    run_control = control.begin(adapter, profile, options, checkpoints, checkpoint_every)
    checkpoints, checkpoint_every = run_control.checkpoints, run_control.checkpoint_every
    parallel = for_run(adapter, profile, objective)
    identity = run_identity(adapter, profile, backend)
    loop = _Loop(parallel.trained, data, profile, options, identity, parallel, objective)
    main = parallel.world.main  # only rank 0 logs, shows progress and writes
    log_path = _outputs(log, checkpoints, log_dir)
    events = EventLog(log_path, log_dir) if main else EventLog(None, None)
    progress = Progress(total, loop.counters.updates) if main else None
    start = time.perf_counter()
    stop = "done"
    best_dir = Path(checkpoints) / BEST if checkpoints else None
    writer = CheckpointWriter(_reporter(run_control))
    warned_slow_disk = False
    finished = False
    try:
        add_phase("train_setup", time.perf_counter() - entered)
        first = loop.start_event(data)
        if picked is not None and profile.memory_budget is not None:
            first["memory_budget"] = picked.event(profile.memory_budget)
            if main:
                print(f"train: {picked.reason}", file=sys.stderr, flush=True)
        tokens = micro_batch * data.context
        host = budget.host_fit(adapter.base, profile, tokens, device.type == "cuda")
        loop.activations = replace(loop.activations, keeps=host.keeps)
        if host.message is not None and main:
            print(f"train: {host.message}", file=sys.stderr, flush=True)
        events.add(first)
        run_control.emit({**first, "steps": total})
        with (
            deterministic(device),
            using_backend(backend),
            keeping(loop.activations),
            keeping_staging(loop.staging_bytes()),
            run_control.stop_signals(),
        ):
            while loop.counters.updates < total and not loop.counters.stopped_early:
                updates = loop.counters.updates + 1  # this update's number
                done = updates == total
                validating = validation is not None and (
                    done or updates == 1 or bool(eval_every and updates % eval_every == 0)
                )
                saving = bool(checkpoints and checkpoint_every and updates % checkpoint_every == 0)
                event = loop.update(ahead=not (done or validating or saving))
                best = False
                if validating and validation is not None:
                    began = time.perf_counter()
                    event.update(loop.validate(validation))
                    event["validation_seconds"] = time.perf_counter() - began
                    best = bool(checkpoints) and loop.best()[0] == updates
                    if patience and loop.validations_since_best() >= patience:
                        loop.counters.stopped_early = True
                        stop = "early_stopping"
                if parallel.any_rank(run_control.stop_requested):  # every rank stops together
                    run_control.stop_requested = True
                    stop = "interrupted" if stop == "done" and not done else stop
                    loop.withdraw()  # the state saved is the one after this update
                writer.poll()
                end = done or stop != "done"
                due = end or saving
                if best or due:
                    began = time.perf_counter()
                    state = loop.snapshot()
                    snapshot_seconds = time.perf_counter() - began
                    if due:
                        adapter.state = state
                    if main and checkpoints:
                        submitted = writer.submit(
                            checkpoints if due else None, state, best_dir if best else None
                        )
                        event["checkpoint_seconds"] = time.perf_counter() - began
                        event["snapshot_seconds"] = snapshot_seconds
                        if submitted.waited:
                            event["checkpoint_wait_seconds"] = submitted.waited
                        if submitted.replaced is not None:
                            event["checkpoint_replaced"] = submitted.replaced
                        slow = _slow_disk(updates, submitted, state)
                        if slow is not None and not warned_slow_disk:
                            warned_slow_disk = True
                            print(f"train: warning: {slow}", file=sys.stderr, flush=True)
                events.add(event)
                run_control.emit({**event, "steps": total})
                if progress is not None:
                    progress.update(event)
                if end:
                    break
        once(writer.close)  # the last checkpoint is on disk before the run's end is logged
        events.add(loop.end_event(stop, time.perf_counter() - start))
        parallel.finish()  # not after a failure: the other ranks may never reach its collectives
        finished = not run_control.stop_requested
    finally:
        writer.abandon()
        loop.withdraw()  # a window issued ahead of an update that never came (a failure)
        if finished:  # for the next call on this adapter (`train.kept`)
            loop.keep()
        else:
            loop.steps.release()
        loop.steps.adopt(None)
        adapter.train_mode(False)
        events.close()
        if progress is not None:
            progress.close(loop.summary(stop, time.perf_counter() - start))
    saved = writer.last.folder if writer.last is not None else None
    if run_control.stop_requested:  # even after the last update: the script stops too
        if run_control.stop_signal == signal.SIGINT:
            raise KeyboardInterrupt(_resume_hint(loop.counters.updates, total, saved, checkpoints))
        raise run_control.stopped(loop.counters.updates, total, saved)
    return loop.result(time.perf_counter() - start, log_path, stop)


def _reporter(run_control: control.RunControl) -> Callable[[Written], None]:
    """What a published checkpoint is reported as: a `checkpoint` event to a job's supervisor."""

    def report(written: Written) -> None:
        if written.latest:
            run_control.checkpointed(written.folder, written.updates)

    return report


def _check_lengths(context: int, tokenizer: Any, data: Dataset, validation: Dataset | None) -> None:
    """Every example fits the model's `context`, or E-CONTEXT now, at the call: a longer one
    would fail at its first forward pass, after the start-up (seconds to minutes on a GPU)."""
    for name, dataset in (("training", data), ("validation", validation)):
        if dataset is None:
            continue
        longest = max((len(e.ids) for e in dataset.examples(tokenizer)), default=0)
        if longest > context:
            raise AnerRuntimeError(
                f"train: the longest {name} example has {longest} tokens, more than the "
                f"model's context length {context}",
                code="E-CONTEXT",
                notes=(f"give the dataset a context: of at most {context}",),
            )


def _examples(data: Dataset, tokenizer: Any, objective: Objective | None) -> list[Any]:
    """What the run trains on: the dataset's examples, or the objective's rows of it."""
    if objective is None:
        return list(data.examples(tokenizer))
    return training_examples(data, tokenizer, objective)


def _resume_hint(updates: int, total: int, saved: Path | None, checkpoints: str | None) -> str:
    where = f"train: interrupted after update {updates} of {total}"
    if saved is None:
        return f"{where}; no checkpoint was written (train with checkpoints: to be able to resume)"
    return (
        f"{where}; checkpoint saved in {saved}; run the script again to continue "
        f'(with resume("{checkpoints}", model: ..., otherwise: ...))'
    )


@dataclass
class _Issued:
    """An update's window once queued (`_Loop._issue`): what its wait and its step read."""

    mark: tuple[int, int]
    """The data cursor before the window (a re-run or a withdrawal goes back there)."""
    generator: torch.Tensor | None
    """The run's generator state before the window, where its layers draw from it (dropout)."""
    lr: float
    flags: torch.Tensor
    """The window's loss and overflow flag, on the device."""
    norm: torch.Tensor
    prepared: PreparedStep
    scored: int
    tokens: int
    began: float
    """Where its update's clock starts: its issue, or for a window issued ahead, the end of the
    update that issued it."""


class _Loop:
    """One `train` call's state: optimizer, loss scaler, counters, data cursor, RNG, and the
    steps of an update. Built fresh, or from the adapter's `TrainState` to continue it exactly."""

    def __init__(
        self,
        adapter: Any,
        data: Dataset,
        profile: Profile,
        options: dict[str, Any],
        identity: str,
        parallel: Parallel,
        objective: Objective | None = None,
    ) -> None:
        self.adapter, self.profile, self.options, self.identity = (
            adapter,
            profile,
            options,
            identity,
        )
        self.objective, self.parallel = objective, parallel
        self.drawn = options["micro_batch"] * parallel.world.size
        """Examples a micro-step draws, all ranks' shares together."""
        self.step_tokens = options["micro_batch"] * data.context
        """Tokens of one micro-batch on one rank."""
        self.examples = _examples(data, adapter.tokenizer, objective)
        self.preference = (
            None if objective is None else PreferenceSteps(adapter, objective, profile.precision)
        )
        dropout = float(adapter.config.get("dropout", 0.0))
        off = parallel.graphs_off or eligibility(
            adapter.device,
            dropout,
            profile.activations,
            profile.graphs,
            self.step_tokens,
        )
        if not off and _experts_read_host(adapter, profile.precision):
            off = "a mixture-of-experts layer sizes its expert groups on the host"
        if objective is not None:
            off = f"the {objective.name} objective runs its steps eagerly"
        kept = take_kept()  # before this call allocates: a set it cannot use goes
        if kept is not None and not kept.owned_by(adapter):
            if not off and kept.fits(graph_key(adapter, profile, identity), adapter_form(adapter)):
                kept.move_into(adapter)  # before the optimizer reads where its tensors live
            else:
                kept.release()
                kept = None
        prev = adapter.state
        if prev is not None:
            _require_same_kernel(prev, identity)
        self.opt = make_optimizer(
            profile.optimizer,
            parallel.optimizer_params(adapter.params),
            profile.page_bytes,
            lr=options["learning_rate"],
            weight_decay=options["weight_decay"],
        )
        self.gen = torch.Generator(device=adapter.device)
        self.gen.manual_seed(options["seed"])
        n = len(self.examples)
        if prev is None:
            self.scaler = LossScaler(replace(profile.scale_state))
            self.counters = Counters()
            self.cursor = Cursor(n, options["seed"], shuffle=options["shuffle"])
        else:  # from the device where the call before left this very state (`train.kept`)
            saved = (
                kept.live if kept is not None and kept.state is prev and kept.live else prev.tensors
            )
            self.opt.load_state_tensors(parallel.scattered(saved))
            self.scaler = LossScaler.from_json(prev.meta["loss_scale"])
            self.counters = Counters.from_json(prev.meta["counters"])
            d = prev.meta["data"]
            self.cursor = Cursor(n, d["seed"], d["epoch"], d["position"], d.get("shuffle", True))
            self.gen.set_state(saved["rng/generator"])
        adapter.dropout_generator = self.gen
        self.pad = adapter.tokenizer.pad_id or 0
        self.params = list(adapter.params.items())
        # the run's generator is the only one a layer draws from, and only with dropout on
        self.activations = ActivationPolicy(profile.activations, (self.gen,) if dropout else ())
        replay = None
        if kept is not None:  # its moments were loaded above, or are not this state's: they go
            if not off and kept.key == graph_key(adapter, profile, identity):
                replay = kept.steps
                replay.adopt(self._forward_backward)
                kept.live = {}
            else:
                kept.release()
        self.steps = replay or GraphSteps(
            self._forward_backward,
            [p for _, p in self.params],
            off,
            step_family(adapter, profile, identity),
        )
        self.issues_ahead = (
            adapter.device.type == "cuda" and parallel.world.size == 1 and objective is None
        )
        """Whether `update(ahead=True)` issues the next window early: only where the device
        computes while the host goes on (not the CPU), and not across ranks (a stop is agreed by
        a collective that would wait for the window issued ahead) nor for preference objectives
        (an update's event reads their metrics of the last window)."""
        self._ahead: _Issued | None = None
        self._collated: dict[tuple[int, ...], Batch] = {}
        """The next window's micro-batches by their example indices (`_collate_next`)."""
        self.kept_shapes = self.steps.shapes
        """Batch shapes whose graphs the call before recorded (and this one replays)."""
        self.last_snapshot: tuple[TrainState, dict[str, torch.Tensor]] | None = None
        """The latest snapshot and the live tensors it copied."""
        self.tokens_seen = 0
        self.startup: float | None = None
        """Seconds from the process start to the end of this call's first update."""
        self.steady = [0, 0.0]
        """Tokens and seconds of the updates after the first: the training throughput, apart
        from the start-up (imports, loading, warm-up, graph recording) and from validations
        and checkpoints."""

    def start_event(self, data: Dataset) -> dict[str, Any]:
        o = self.options
        return {
            "event": "start",
            "update": self.counters.updates,
            "examples": len(self.examples),
            "packed": data.packed,
            "context": data.context,
            "updates_per_epoch": updates_per_epoch(
                len(self.examples), self.drawn, o["accumulation"]
            ),
            "tokens_per_update": self.drawn * o["accumulation"] * data.context,
            "before_start": {"seconds": seconds_running(), **phases()},
            "cuda_graphs": self.steps.status,
            "cuda_graphs_kept": self.kept_shapes,
            "kernel_identity": self.identity,
            "profile": self.profile.to_json(),
            "options": o,
            "world_size": self.parallel.world.size,
        }

    def update(self, ahead: bool = False) -> dict[str, Any]:
        """One accumulation window, re-run with a backed-off loss scale while it overflows (up
        to `max_retries`), then the optimizer step or the skip; returns the update's event.

        The host waits for the device once per update: to read the window's loss and overflow
        flag together, which decide between the step and the skip. Everything that does not
        depend on that decision is issued before the wait, while the device still computes the
        window (`_issue`): the clipping (it only scales gradients that a skip then drops) and
        the optimizer's host-side preparation. With `ahead` (the caller's word that the next
        update follows this one directly: no validation, checkpoint or end in between), the next
        update's window is issued right after this one's optimizer step, before this update's
        event is made, logged and shown: the device goes from one update to the next without
        waiting for the host's work between them (`withdraw` takes it back where the run stops
        instead). An update issued ahead is timed from the end of the one before it."""
        c, scaler = self.counters, self.scaler
        first, self._ahead = self._ahead or self._issue(self.cursor.mark()), None
        issued = first
        for attempt in range(scaler.state.max_retries + 1):
            if attempt:  # the same examples again, at the backed-off scale
                issued = self._issue(issued.mark)
            loss, found_inf = issued.flags.tolist()
            overflow = bool(found_inf) or not math.isfinite(loss)
            scaler.update(overflow)
            if not overflow:
                break
            c.retries += attempt < scaler.state.max_retries
            self._zero_grads()
        event: dict[str, Any] = {
            "event": "update",
            "update": c.updates + 1,
            "loss": loss,
            "learning_rate": issued.lr,
            "loss_scale": scaler.state.scale,
            "skipped": overflow,
            "tokens": issued.tokens,
            "scored_tokens": issued.scored,
        }
        if self.preference is not None:
            event.update(self.preference.metrics())
        if overflow:
            c.skipped_updates += 1
        else:
            event["grad_norm"] = issued.norm  # a 0-d host tensor, read when the event is written
            with section("optimizer"):
                issued.prepared.apply()
            c.applied += 1
            c.loss_history.append(loss)
            c.scored_tokens += issued.scored
        self._zero_grads()
        c.updates += 1
        event["epoch"] = self.cursor.epochs
        recording = self.steps.take_recording_seconds()
        if recording:
            event["recording_seconds"] = recording
        tokens, began = issued.tokens, first.began
        # the windows' prepared steps hold this update's gradients, which eager steps drop
        # (`_zero_grads`): a window issued ahead must not find them still held
        del first, issued
        # this update ends here: issuing the next window is the next update's time (an eager
        # window's issuing waits for the device as its launch queue fills: most of its step)
        ended = time.perf_counter()
        if ahead and self.issues_ahead:
            self._ahead = self._issue(self.cursor.mark())
            self._ahead.began = ended  # its update is timed from the end of this one
        self.adapter.train_mode(False)
        self.tokens_seen += tokens
        seconds = ended - began
        if self.startup is None:
            self.startup = seconds_running()
        else:
            self.steady[0] += tokens
            self.steady[1] += seconds
        event["tokens_per_second"] = tokens / max(seconds, 1e-9)
        return event

    def _issue(self, mark: tuple[int, int]) -> _Issued:
        """Queue the window at cursor `mark` (its forward, backward, clipping and the loss and
        overflow flags the wait reads) and prepare its optimizer step on the host."""
        o, scaler = self.options, self.scaler
        began = time.perf_counter()
        generator = self.gen.get_state() if self.activations.generators else None
        self.cursor.restore(mark)
        lr = learning_rate_at(
            self.counters.applied, o["learning_rate"], o["steps"], o["warmup"], o["schedule"]
        )
        self.adapter.train_mode(True)
        loss_sum, scored, tokens = self._window()
        grads = self.parallel.gradients(self.params)
        with section("optimizer"):
            found = scaler.unscale_(grads.values())
            flags = self.parallel.total(
                torch.stack([loss_sum, found.to(loss_sum.device, torch.float64)])
            )
            trained = [p for _, p in self.params if p.grad is not None]
            if o["clip_norm"] is not None and o["clip_norm"] > 0:
                norm = self.parallel.clip_grad_norm(trained, grads, o["clip_norm"])
            else:
                norm = self.parallel.grad_norm(grads)
            # on its way to the host before the wait, so reading it never waits
            norm = norm.to("cpu", non_blocking=True)
            prepared = self.opt.prepare(grads, lr=lr)
        return _Issued(mark, generator, lr, flags, norm, prepared, scored, tokens, began)

    def withdraw(self) -> None:
        """Take back a window issued ahead (the run stops before its update): its examples are
        drawn again by the next update, its gradients are dropped and the generator is where it
        was, so the state is the one after the last update, as if it had never been issued."""
        issued, self._ahead = self._ahead, None
        if issued is None:
            return
        self.cursor.restore(issued.mark)
        if issued.generator is not None:
            self.gen.set_state(issued.generator)
        self._zero_grads()

    def training_tokens_per_second(self) -> float | None:
        """Tokens per second of the updates after the first (None with one update)."""
        tokens, seconds = self.steady
        return tokens / max(seconds, 1e-9) if tokens else None

    def _window(self) -> tuple[torch.Tensor, int, int]:
        """Forward/backward this rank's share of one accumulation window; returns its loss (on
        the device: the sum over its scored tokens divided by the window's count), and the
        window's scored tokens and tokens (all ranks')."""
        o, adapter, parallel = self.options, self.adapter, self.parallel
        drawn = self.cursor.window(self.drawn, o["accumulation"])
        window = [[self.examples[i] for i in indices] for indices in drawn]
        scale = self.scaler.state.scale if self.scaler.enabled else None
        if self.preference is not None:
            return self.preference.window(window, scale)
        scored = sum(e.scored_tokens for batch in window for e in batch)
        tokens = sum(len(e.ids) for batch in window for e in batch)
        total = torch.zeros((), dtype=torch.float64, device=adapter.device)
        collated, self._collated = self._collated, {}
        for indices, drawn_examples in zip(drawn, window):
            examples = parallel.share(drawn_examples)
            if not parallel.collective_forward and not any(e.scored_tokens for e in examples):
                continue
            batch = collated.get(tuple(indices)) or collate(examples, self.pad, adapter.device)
            total += self.steps(batch.input_ids, batch.targets, batch.positions, scored, scale)
        if self.issues_ahead:
            self._collate_next()
        return total, scored, tokens

    def _collate_next(self) -> None:
        """The next window's micro-batches, made and on their way to the device now, while the
        device computes this one: the host's share of the next update, done before the wait
        instead of between the two updates (`update`'s `ahead`). One rank only (`issues_ahead`):
        a rank's share is then the whole micro-batch."""
        mark = self.cursor.mark()
        drawn = self.cursor.window(self.drawn, self.options["accumulation"])
        self.cursor.restore(mark)
        self._collated = {
            tuple(ix): collate([self.examples[i] for i in ix], self.pad, self.adapter.device)
            for ix in drawn
        }

    def _forward_backward(
        self,
        ids: torch.Tensor,
        targets: torch.Tensor,
        positions: torch.Tensor | None,
        scored: torch.Tensor,
        scale: torch.Tensor | None,
    ) -> torch.Tensor:
        """One micro-batch: its loss sum over the window's `scored` count, scaled by `scale`
        for backward; returns the unscaled loss (eager, or recorded by `GraphSteps`)."""
        adapter = self.adapter
        with adapter.active():  # through backward: checkpointed layers run forward again
            with autocast(self.profile.precision, adapter.device):
                loss = adapter.loss(ids, targets, positions) / scored
            (loss if scale is None else loss * scale).backward()
        return loss.detach()

    def _zero_grads(self) -> None:
        """Gradients dropped, or zeroed where they live when graphs accumulate into them (one
        multi-tensor launch, not one per tensor: the GPU waits for the host between updates)."""
        if self.steps.on:
            grads = [p.grad for _, p in self.params if p.grad is not None]
            if grads:
                torch._foreach_zero_(grads)
            return
        for _, p in self.params:
            p.grad = None

    def validate(self, validation: Dataset) -> dict[str, float]:
        """The validation event fields: the loss (and the objective's held-out metrics)."""
        micro_batch = self.options["micro_batch"]
        if self.preference is None:
            with self.steps.sharing_memory():  # no tensor outlives it: the loss is a float
                v = validation_loss(
                    self.adapter, validation, micro_batch, self.step_tokens, self.profile
                )
            values = {"validation_loss": v}
        else:  # preference objectives run eagerly: no graphs, no pool to share
            rows = _examples(validation, self.adapter.tokenizer, self.objective)
            found = self.preference.evaluate(rows, micro_batch)
            values = {f"validation_{k}": v for k, v in found.items()}
            if "validation_accuracy" in values:
                self.counters.validation_accuracy.append(
                    [self.counters.updates, values["validation_accuracy"]]
                )
        self.counters.validation_history.append([self.counters.updates, values["validation_loss"]])
        return values

    def best(self) -> tuple[int | None, float | None]:
        """(update, loss) of the best validation so far (the earliest of equal ones)."""
        history = self.counters.validation_history
        if not history:
            return None, None
        update, loss = min(history, key=lambda h: h[1])
        return int(update), loss

    def validations_since_best(self) -> int:
        history = self.counters.validation_history
        best = min(range(len(history)), key=lambda i: history[i][1])
        return len(history) - 1 - best

    def staging_bytes(self) -> int:
        """Pinned staging bytes this run's snapshots will use (`host_copy`): the adapter's
        tensors and the optimizer's two moments of each trainable one, copied together (counted
        from the tensors themselves: `live_tensors` of a sharded adapter gathers them)."""
        adapter = self.adapter
        trained = staging_bytes(adapter.params)
        return staging_bytes({**adapter.params, **adapter.frozen}) + 2 * trained

    def snapshot(self) -> TrainState:
        """The state after this update (consistent: optimizer stepped, scale updated)."""
        adapter = self.adapter
        tensors = {f"adapter/{k}": v for k, v in adapter.live_tensors().items()}
        tensors.update(self.parallel.gathered(self.opt.state_tensors()))
        tensors["rng/generator"] = self.gen.get_state()
        meta = {
            "format": STATE_FORMAT,
            "adapter": adapter.config,
            "profile": self.profile.to_json(),
            "base": {"path": str(adapter.base.path), "storage": adapter.base.storage},
            "kernel_identity": self.identity,
            "loss_scale": self.scaler.to_json(),
            "data": {
                "seed": self.cursor.seed,
                "shuffle": self.cursor.shuffle,
                "epoch": self.cursor.epoch,
                "position": self.cursor.position,
                "accumulation_offset": 0,
            },
            "counters": self.counters.to_json(),
            "options": self.options,
        }
        state = TrainState(host_copies_soon(tensors), meta)
        self.last_snapshot = (state, tensors)
        return state

    def keep(self) -> None:
        """Keep this call's graphs (under their key, where it recorded any), and the live tensors
        of the state it leaves on one device, for the adapter's next call (`train.kept`)."""
        state, live = self.last_snapshot or (None, {})
        if self.parallel.world.size > 1 or state is not self.adapter.state:
            live = {}
        key = graph_key(self.adapter, self.profile, self.identity) if self.steps.shapes else None
        keep(self.adapter, key, self.steps, state, live, adapter_form(self.adapter))

    def end_event(self, stop: str, seconds: float) -> dict[str, Any]:
        best_update, best_loss = self.best()
        return {
            "event": "end",
            "update": self.counters.updates,
            "epoch": self.cursor.epochs,
            "stopped": stop,
            "seconds": seconds,
            "best_update": best_update,
            "best_validation_loss": best_loss,
            "startup_seconds": self.startup,
            "training_tokens_per_second": self.training_tokens_per_second(),
            **self.gpu_memory(),
        }

    def gpu_memory(self) -> dict[str, int]:
        """On CUDA, the process's peak GPU bytes so far as torch's allocator counts them: those
        tensors held (`peak_gpu_allocated_bytes`) and those it reserved from the device
        (`peak_gpu_reserved_bytes`, the larger: its cache and CUDA graphs' pools). The device's
        own count (nvidia-smi) adds the CUDA context and the libraries' modules."""
        device = self.adapter.device
        if device.type != "cuda":
            return {}
        return {
            "peak_gpu_allocated_bytes": torch.cuda.max_memory_allocated(device),
            "peak_gpu_reserved_bytes": torch.cuda.max_memory_reserved(device),
        }

    def summary(self, stop: str, seconds: float) -> str:
        """The line that ends a run's progress output."""
        c = self.counters
        why = {"early_stopping": " (early stopping)", "interrupted": " (interrupted)"}.get(stop, "")
        parts = [
            f"train: {c.updates}/{self.options['steps']} updates{why} in {clock_text(seconds)}",
            f"epoch {self.cursor.epochs:.2f}",
        ]
        if c.loss_history:
            parts.append(f"final loss {c.loss_history[-1]:.4f}")
        best_update, best_loss = self.best()
        if best_loss is not None:
            parts.append(
                f"validation loss {c.validation_history[-1][1]:.4f} "
                f"(best {best_loss:.4f} at update {best_update})"
            )
        if self.startup is not None:
            parts.append(f"start-up {self.startup:.1f} s")
        steady = self.training_tokens_per_second()
        if steady is not None:
            parts.append(f"{steady:.0f} tokens/s training")
        parts.append(f"{self.tokens_seen / max(seconds, 1e-9):.0f} tokens/s overall")
        memory = self.gpu_memory()
        if memory:
            parts.append(
                f"peak GPU memory {human_bytes(memory['peak_gpu_allocated_bytes'])} "
                f"({human_bytes(memory['peak_gpu_reserved_bytes'])} reserved)"
            )
        return ", ".join(parts)

    def result(self, seconds: float, log_path: str | None, stop: str) -> Run:
        c = self.counters
        best_update, best_loss = self.best()
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
            cuda_graphs=self.steps.status,
            optimizer_bytes={
                "optimizer": self.opt.state_bytes(),
                "managed": self.opt.managed_bytes(),
            },
            epochs=self.cursor.epochs,
            stopped_early=c.stopped_early,
            best_update=best_update,
            best_validation_loss=best_loss,
            accuracy_history=[(int(u), v) for u, v in c.validation_accuracy],
            training_tokens_per_second=self.training_tokens_per_second(),
        )


def _outputs(log: str | None, checkpoints: str | None, log_dir: str | None) -> str | None:
    """Where the JSON events go: `log:` if given, else `<checkpoints>/events.jsonl`. The folders
    of the run's outputs are made before the first update, so that a path of the wrong kind (a
    file named as `checkpoints:`) is an error naming it before any training, not at the first
    checkpoint (`files.make_folder`)."""
    for folder in (checkpoints, log_dir):
        if folder:
            files.make_folder(folder)
    path = log or (str(Path(checkpoints) / "events.jsonl") if checkpoints else None)
    if path:
        files.make_parent(files.check_target(path, overwrite=True))
    return path


def train_builtin(
    ctx: Any,
    *,
    checkpoints: str | None = None,
    log: str | None = None,
    log_dir: str | None = None,
    **kwargs: Any,
) -> Run:
    """Builtin `train`: script-relative `checkpoints`, `log` and `log_dir` paths, then `train`;
    the graphs it keeps for the next call go before the script's other GPU work."""
    ctx.held["train"] = release_kept
    return train(
        checkpoints=str(ctx.resolve_path(checkpoints)) if checkpoints else None,
        log=str(ctx.resolve_path(log)) if log else None,
        log_dir=str(ctx.resolve_path(log_dir)) if log_dir else None,
        **kwargs,
    )
