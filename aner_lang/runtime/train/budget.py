"""The activation policy a profile's `memory_budget:` picks for a `train` call.

Rules:

* The candidates are the policies from the profile's `activations:` onward, largest first
  (`keep`, `checkpoint`, `offload`): a budget never picks a policy that keeps more than the one
  asked for, only one that needs less memory.
* A candidate's peak is the plan's (`plan.plan`, the counting rules `aner plan` prints) for the
  run's model, adapter, data context, micro-batch and device; of the candidates whose planned
  peak is at most the budget, the fastest runs (`by_speed`).
* `offload` fits only where the host can hold its pinned copies of the layer inputs (within
  `host.memory.available_bytes()`, where that is known): pinned memory cannot be swapped out,
  and a run that outgrows it is killed without a word. What else it keeps (attention's
  output, the queries, keys and values, o_proj's output) it keeps as far as the host holds it
  (`host_fit`), recomputing the rest; the plan's peak does not depend on it.
* When none fits, the call stops before any training with E-PROFILE-BUDGET, giving the budget
  and each candidate's planned peak.
* An adapter the plan does not cover (a full fine-tune) runs the policy asked for: the budget
  cannot be planned for it, and the pick says so rather than refusing a run that may fit.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from aner_lang.builtins import members
from aner_lang.host import memory as host_memory
from aner_lang.problems.errors import AnerRuntimeError
from aner_lang.runtime.train.footprint import (
    EAGER_FROM_TOKENS,
    OFFLOAD_KEEPS,
    LayerShape,
    activation_bytes,
    layer_shape,
    offload_host_bytes,
    offload_keeps,
)
from aner_lang.runtime.train.memory import human_bytes
from aner_lang.runtime.train.plan import plan

POLICIES = members("Activations")
"""The activation policies, largest first."""
PLANNED_ADAPTERS = ("lora", "lora_fa", "dora")
"""The adapter methods `plan.plan` counts."""


def by_speed(cuda: bool, tokens: int) -> list[str]:
    """The policies, fastest first, for micro-batches of `tokens` tokens. `keep` is the fastest
    where it fits. On CUDA, below `EAGER_FROM_TOKENS` a checkpointed step replays from a CUDA graph
    and an offloaded one runs eagerly, so `checkpoint` is faster; from there on both run eagerly
    and `offload` is the faster (measured on the H200, docs/finetuning.md). On the CPU the copies
    an offload would make do not happen, and it recomputes as a checkpoint does."""
    if cuda and tokens >= EAGER_FROM_TOKENS:
        return ["keep", "offload", "checkpoint"]
    return list(POLICIES)


@dataclass(frozen=True)
class Pick:
    """The policy a budget picked, each candidate's planned peak (empty when not planned), and
    the sentence the run prints about it."""

    policy: str
    peaks: dict[str, int]
    reason: str

    def event(self, budget: int) -> dict[str, Any]:
        """The start event's account of the pick."""
        return {"budget": budget, "activations": self.policy, "planned_peaks": self.peaks}


def pick(
    adapter: Any,
    profile: Any,
    *,
    context: int,
    micro_batch: int,
    accumulation: int,
) -> Pick:
    """The policy `profile.memory_budget` (not None) picks for training `adapter` (module rules)."""
    budget = profile.memory_budget
    candidates = POLICIES[POLICIES.index(profile.activations) :]
    if adapter.method not in PLANNED_ADAPTERS:
        return Pick(
            profile.activations,
            {},
            f"memory_budget {human_bytes(budget)}: activations {profile.activations} as asked "
            f"(the plan does not cover a {adapter.method} adapter)",
        )
    base = adapter.base
    plans = {
        mode: plan(
            base.config,
            storage=base.storage,
            method=adapter.method,
            rank=int(adapter.config["rank"]),
            targets=list(adapter.config["targets"]),
            profile={**profile.to_json(), "activations": mode},
            context=context,
            micro_batch=micro_batch,
            accumulation=accumulation,
            updates=None,
            cuda=adapter.device.type == "cuda",
            quantize_embeddings=getattr(base.module.embed_tokens, "storage", None) == base.storage,
        )
        for mode in candidates
    }
    peaks = {mode: p.peak for mode, p in plans.items()}
    host = host_memory.available_bytes()
    planned = ", ".join(f"{mode} {human_bytes(peak)}" for mode, peak in peaks.items())
    # offload fits the host where the layer inputs do: it keeps what else fits (`host_fit`);
    # off CUDA it pins nothing (the plan's `pinned_host` is 0)
    unhosted = False
    if plans["offload"].pinned_host and host is not None:
        least = offload_host_bytes(*_offload_sizes(base, profile, micro_batch * context), keeps=())
        if least > host:
            unhosted = True
            planned += (
                f"; offload would pin {human_bytes(least)} of host memory for the layer inputs "
                f"alone, {human_bytes(host)} available"
            )
    for mode in by_speed(adapter.device.type == "cuda", micro_batch * context):
        if mode == "offload" and unhosted:
            continue
        if mode in peaks and peaks[mode] <= budget:
            return Pick(
                mode,
                peaks,
                f"memory_budget {human_bytes(budget)}: activations {mode}, the fastest whose "
                f"planned peak fits (planned: {planned})",
            )
    raise AnerRuntimeError(
        f"profile: memory_budget {human_bytes(budget)} ({budget} bytes) is less than the planned "
        f"peak of every activation policy from {profile.activations} on ({planned})",
        code="E-PROFILE-BUDGET",
        notes=(
            "raise the budget, or lower micro_batch or the data's context, or train a smaller "
            "rank or fewer targets",
        ),
    )


@dataclass(frozen=True)
class HostFit:
    """What an `offload` run keeps in pinned host memory on this machine, and what to say."""

    keeps: frozenset[str] | None
    """The `kept_through_backward` calls kept (`footprint.offload_keeps`); None: all."""
    message: str | None
    """A warning (not even the layer inputs fit) or a note (some kept calls dropped); None when
    everything fits or the host's memory is not known."""


def host_fit(model: Any, profile: Any, tokens: int, cuda: bool) -> HostFit:
    """What an `offload` run on CUDA of micro-batches of `tokens` tokens keeps for the host memory
    available: the most of `footprint.OFFLOAD_KEEPS` whose pinned copies fit, and a word when
    that is not everything (all of it, silently, off CUDA, under another policy or where the
    available memory is not known)."""
    if profile.activations != "offload" or not cuda:
        return HostFit(None, None)
    sizes = _offload_sizes(model, profile, tokens)
    host = host_memory.available_bytes()
    keeps = offload_keeps(*sizes, host)
    if host is None or keeps == OFFLOAD_KEEPS:
        return HostFit(None, None)
    pinned = offload_host_bytes(*sizes, keeps)
    if pinned > host:
        return HostFit(frozenset(), (
            f"warning: activations offload pins {human_bytes(pinned)} of host memory for the "
            f"layer inputs alone, more than the {human_bytes(host)} this machine has available: "
            f"the run may be killed for memory (checkpoint keeps the inputs on the GPU instead)"
        ))  # fmt: skip
    full = offload_host_bytes(*sizes)
    dropped = ", ".join(k for k in OFFLOAD_KEEPS if k not in keeps)
    return HostFit(frozenset(keeps), (
        f"activations offload keeps {', '.join(('inputs', *keeps))} in {human_bytes(pinned)} of "
        f"pinned host memory and recomputes {dropped}: keeping everything would pin "
        f"{human_bytes(full)}, more than the {human_bytes(host)} available"
    ))  # fmt: skip


def _offload_sizes(model: Any, profile: Any, tokens: int) -> tuple[int, int, LayerShape, int]:
    """`footprint.offload_host_bytes`'s first arguments for micro-batches of `tokens` tokens of
    `model` under `profile`: its layers, the tokens, a layer's shape and an activation's bytes."""
    c = model.config
    return c.num_hidden_layers, tokens, layer_shape(c), activation_bytes(profile.precision)
