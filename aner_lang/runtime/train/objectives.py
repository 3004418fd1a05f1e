"""Preference objectives: DPO (sigmoid, IPO and hinge losses, with label smoothing), ORPO and KTO,
as TRL defines them, computed from sequence log-probabilities.

A response's log-probability is the sum of its scored targets' log-probabilities (the prompt is
never scored); `counts` is how many there are. The reference model of DPO and KTO is the frozen
base with the adapter off, evaluated on the same batch (`runtime.train.preference`).

* DPO, per pair, with Δ = (chosen - ref_chosen) - (rejected - ref_rejected):
  ``sigmoid``: -(1 - ε) log σ(βΔ) - ε log σ(-βΔ) (ε = `label_smoothing`: conservative DPO, TRL's
  sigmoid loss before TRL 1.0 and its ``aot`` loss on one pair; ε = 0 is TRL's ``sigmoid``);
  ``hinge``: relu(1 - βΔ); ``ipo``: (Δ_c/n_c - Δ_r/n_r - 1/(2β))² with each log-ratio averaged
  over its response's tokens. Rewards are β times the log-ratios.
* ORPO: the chosen rows' mean next-token loss minus λ times the mean of
  log σ(log odds(chosen) - log odds(rejected)), the odds from the responses' per-token mean
  log-probabilities; rewards are λ times those means (TRL's ORPOTrainer with beta = λ). The
  next-token term covers the whole chosen row, prompt and response (every token after the
  first), as ORPO's authors' code and TRL compute it; the odds cover the responses only.
* KTO: with z = max(0, mean over the batch of policy - reference log-probability of mismatched
  (prompt, completion) pairs), detached, a desirable completion's loss is
  w_d (1 - σ(β(r - z))) and an undesirable one's w_u (1 - σ(β(z - r))), r its log-ratio (TRL's
  KTOTrainer, loss_type kto). The mismatched pairs rotate the batch's completions by one.

Each function returns per-pair (per-example for KTO) losses and the metric values the event log
records; the trainer sums them over an accumulation window and divides by its pairs.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

import torch
import torch.nn.functional as F

from aner_lang.interp.values import record_fields, record_text
from aner_lang.problems.errors import AnerRuntimeError

DPO_LOSSES = ("sigmoid", "ipo", "hinge")


@dataclass(frozen=True)
class DPO:
    beta: float = 0.1
    loss: str = "sigmoid"
    label_smoothing: float = 0.0
    name = "dpo"
    paired = True
    reference = True

    def __str__(self) -> str:
        return record_text(self)


@dataclass(frozen=True)
class ORPO:
    lam: float = 0.1
    name = "orpo"
    paired = True
    reference = False

    def __str__(self) -> str:
        return record_fields("ORPO", [("lambda", self.lam)])  # the parameter's Aner name


@dataclass(frozen=True)
class KTO:
    beta: float = 0.1
    desirable_weight: float = 1.0
    undesirable_weight: float = 1.0
    name = "kto"
    paired = False
    reference = True

    def __str__(self) -> str:
        return record_text(self)


Objective = DPO | ORPO | KTO


def to_json(objective: Objective) -> dict[str, Any]:
    """The objective as the training state records it."""
    return {"name": objective.name, **asdict(objective)}


def dpo(beta: float, loss: str, label_smoothing: float) -> DPO:
    """Builtin `dpo(beta:, loss:, label_smoothing:)`."""
    if beta <= 0 or loss not in DPO_LOSSES or not 0.0 <= label_smoothing < 0.5:
        raise AnerRuntimeError(
            f"dpo: beta must be positive, loss one of {', '.join(DPO_LOSSES)}, label_smoothing "
            f"in [0, 0.5) (got {beta}, {loss!r}, {label_smoothing})",
            code="E-OBJECTIVE-OPTIONS",
        )
    if label_smoothing and loss != "sigmoid":
        raise AnerRuntimeError(
            f"dpo: label_smoothing applies to the sigmoid loss, not {loss}",
            code="E-OBJECTIVE-OPTIONS",
        )
    return DPO(beta, loss, label_smoothing)


def orpo(**options: float) -> ORPO:
    """Builtin `orpo(lambda:)` (`lambda` is a Python keyword, hence the mapping)."""
    lam = options["lambda"]
    if lam <= 0:
        raise AnerRuntimeError(
            f"orpo: lambda must be positive, got {lam}", code="E-OBJECTIVE-OPTIONS"
        )
    return ORPO(lam)


def kto(beta: float, desirable_weight: float, undesirable_weight: float) -> KTO:
    """Builtin `kto(beta:, desirable_weight:, undesirable_weight:)`."""
    if beta <= 0 or desirable_weight <= 0 or undesirable_weight <= 0:
        raise AnerRuntimeError(
            "kto: beta and both weights must be positive", code="E-OBJECTIVE-OPTIONS"
        )
    return KTO(beta, desirable_weight, undesirable_weight)


@dataclass
class SequenceLogps:
    """Per-row sums of scored targets' log-probabilities, and how many targets each row has;
    `whole`: the sums over every target (prompt included) of the rows it was asked for."""

    sums: torch.Tensor
    counts: torch.Tensor
    whole: torch.Tensor | None = None


def sequence_logps(
    logits: torch.Tensor, targets: torch.Tensor, every: torch.Tensor | None = None
) -> SequenceLogps:
    """From fp32 logits `[B, T, V]` and next-token targets `[B, T]` (`IGNORE` where unscored);
    `every` `[b, T' <= T]`, the targets of the first b rows with the prompt's too, adds their
    `whole` sums (one cross-entropy: the scored targets are a subset of those)."""
    from aner_lang.runtime.model.loss import IGNORE

    wanted = targets
    if every is not None:
        wanted = targets.clone()
        wanted[: every.shape[0], : every.shape[1]] = every  # the rest of those rows is padding
    nll = F.cross_entropy(
        logits.float().reshape(-1, logits.shape[-1]),
        wanted.reshape(-1),
        ignore_index=IGNORE,
        reduction="none",
    ).view(targets.shape)
    scored = targets != IGNORE
    whole = None if every is None else -nll[: every.shape[0]].sum(-1)
    return SequenceLogps(-(nll * scored).sum(-1), scored.sum(-1).to(torch.float32), whole)


Metrics = dict[str, torch.Tensor]
"""Per-pair (or per-example) metric values: ``rewards_chosen``, ``logps_chosen``, ..."""


def dpo_losses(
    o: DPO,
    policy: SequenceLogps,
    reference: SequenceLogps,
) -> tuple[torch.Tensor, Metrics]:
    """Per-pair DPO losses; `policy` and `reference` hold the chosen rows, then the rejected."""
    chosen, rejected = policy.sums.chunk(2)
    ref_chosen, ref_rejected = reference.sums.chunk(2)
    chosen_ratio, rejected_ratio = chosen - ref_chosen, rejected - ref_rejected
    delta = chosen_ratio - rejected_ratio
    if o.loss == "sigmoid":
        losses = -(1 - o.label_smoothing) * F.logsigmoid(o.beta * delta) - (
            o.label_smoothing * F.logsigmoid(-o.beta * delta)
        )
    elif o.loss == "hinge":
        losses = torch.relu(1 - o.beta * delta)
    else:
        n_chosen, n_rejected = policy.counts.clamp(min=1.0).chunk(2)
        losses = (chosen_ratio / n_chosen - rejected_ratio / n_rejected - 1 / (2 * o.beta)) ** 2
    return losses, _pair_metrics(o.beta * chosen_ratio, o.beta * rejected_ratio, chosen, rejected)


def log1mexp(x: torch.Tensor) -> torch.Tensor:
    """log(1 - exp(x)) for x < 0, without cancellation on either side of -ln 2."""
    return torch.where(
        x < -0.6931471805599453, torch.log1p(-torch.exp(x)), torch.log(-torch.expm1(x))
    )


def orpo_losses(o: ORPO, policy: SequenceLogps) -> tuple[torch.Tensor, torch.Tensor, Metrics]:
    """(per-pair odds-ratio terms -λ log σ(log odds), the chosen rows' summed next-token loss
    over every target, metrics). `policy.whole` holds the chosen rows' whole sums; the trainer
    divides the loss sum by those rows' targets in its window."""
    assert policy.whole is not None, "ORPO needs the chosen rows' whole log-probabilities"
    chosen_sum = policy.whole
    mean = policy.sums / policy.counts.clamp(min=1.0)
    chosen, rejected = mean.chunk(2)
    log_odds = (chosen - rejected) - (log1mexp(chosen) - log1mexp(rejected))
    ratio = F.logsigmoid(log_odds)
    metrics = _pair_metrics(o.lam * chosen.detach(), o.lam * rejected.detach(), chosen, rejected)
    metrics["log_odds"] = log_odds.detach()
    return -o.lam * ratio, -chosen_sum, metrics


def kto_losses(
    o: KTO,
    policy: SequenceLogps,
    reference: SequenceLogps,
    mismatched_policy: torch.Tensor,
    mismatched_reference: torch.Tensor,
    desirable: torch.Tensor,
) -> tuple[torch.Tensor, Metrics]:
    """Per-example KTO losses; `desirable` is a bool per row, the mismatched log-probabilities
    (no gradient) estimate the KL term of the batch."""
    kl = (mismatched_policy - mismatched_reference).mean().detach().clamp(min=0)
    ratio = policy.sums - reference.sums
    losses = torch.where(
        desirable,
        o.desirable_weight * (1 - torch.sigmoid(o.beta * (ratio - kl))),
        o.undesirable_weight * (1 - torch.sigmoid(o.beta * (kl - ratio))),
    )
    rewards = (o.beta * ratio).detach()
    zero = torch.zeros_like(rewards)
    metrics = {
        "rewards_chosen": torch.where(desirable, rewards, zero),
        "rewards_rejected": torch.where(desirable, zero, rewards),
        "logps_chosen": torch.where(desirable, policy.sums.detach(), zero),
        "logps_rejected": torch.where(desirable, zero, policy.sums.detach()),
        "kl": kl.expand_as(rewards),
    }
    return losses, metrics


def _pair_metrics(
    chosen_rewards: torch.Tensor,
    rejected_rewards: torch.Tensor,
    chosen_logps: torch.Tensor,
    rejected_logps: torch.Tensor,
) -> Metrics:
    chosen_rewards, rejected_rewards = chosen_rewards.detach(), rejected_rewards.detach()
    return {
        "rewards_chosen": chosen_rewards,
        "rewards_rejected": rejected_rewards,
        "margin": chosen_rewards - rejected_rewards,
        "accuracy": (chosen_rewards > rejected_rewards).to(torch.float32),
        "logps_chosen": chosen_logps.detach(),
        "logps_rejected": rejected_logps.detach(),
    }
