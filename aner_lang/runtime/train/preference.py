"""Training steps and validation of the preference objectives (`objectives.py`).

A micro-batch of pairs is one batch of rows, the chosen responses then the rejected ones (as TRL
batches them); the policy is the adapter, the reference (DPO, KTO) the frozen base with the
adapter off: the same module and weights, no copy, evaluated on the same rows without gradients.
KTO rows are single completions; its KL estimate pairs each row's prompt with the completion of
the row before it in the micro-batch (the last one's for the first), evaluated without gradients
by both models, so KTO needs micro-batches of at least 2.

Normalization: a window's loss is the sum of its pairs' (KTO: examples') losses divided by their
number, so it does not depend on how the window splits into micro-batches; ORPO's next-token term
is the chosen rows' summed loss over every target, prompt included (`objectives` says why),
divided by those targets in the window (`nll_targets`). Metrics are
means over the window's pairs (KTO: rewards and log-probabilities over the desirable, or the
undesirable, examples).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from typing import Any

import torch

from aner_lang.problems.errors import AnerRuntimeError
from aner_lang.runtime.model.precision import autocast
from aner_lang.runtime.tasks.batches import collate
from aner_lang.runtime.tasks.data import Dataset, Example
from aner_lang.runtime.train import objectives as obj


def training_examples(data: Dataset, tokenizer: Any, objective: obj.Objective) -> list[Example]:
    """The rows an objective trains on: pairs for DPO and ORPO; labeled completions for KTO (a
    pair gives its chosen response as desirable and its rejected one as undesirable, all chosen
    first, as TRL unpairs a preference set)."""
    examples = list(data.examples(tokenizer))
    if objective.paired:
        if data.kind != "pairs":
            raise _wrong_data(objective, data)
        return examples
    if data.kind == "feedback":
        return examples
    if data.kind != "pairs":
        raise _wrong_data(objective, data)
    chosen = [replace(e, rejected=None, desirable=True) for e in examples]
    rejected = [replace(e.rejected, desirable=False) for e in examples if e.rejected is not None]
    return chosen + rejected


def _wrong_data(objective: obj.Objective, data: Dataset) -> AnerRuntimeError:
    want = "pairs (load_pairs)" if objective.paired else "pairs or feedback (load_feedback)"
    return AnerRuntimeError(
        f"train: objective {objective.name} trains on {want}, and {data.source} is {data.kind}",
        code="E-OBJECTIVE-DATA",
    )


def check_options(objective: obj.Objective, micro_batch: int) -> None:
    if isinstance(objective, obj.KTO) and micro_batch < 2:
        raise AnerRuntimeError(
            "train: kto estimates its KL term from the other completions of a micro-batch, so it "
            "needs micro_batch >= 2",
            code="E-OBJECTIVE-OPTIONS",
        )


class PreferenceSteps:
    """Forward and backward of one objective's micro-batches, and the window's metrics."""

    def __init__(self, adapter: Any, objective: obj.Objective, precision: str) -> None:
        self.adapter, self.objective, self.precision = adapter, objective, precision
        self.pad = adapter.tokenizer.pad_id or 0
        self.sums: dict[str, torch.Tensor] = {}

    def window(
        self, window: Sequence[Sequence[Example]], scale: float | None
    ) -> tuple[torch.Tensor, int, int]:
        """Forward and backward of a window; its loss (on the device), the scored tokens of all
        its responses, and all its tokens."""
        rows = [e for batch in window for e in batch]
        responses = rows + [e.rejected for e in rows if e.rejected is not None]
        nll_tokens = nll_targets(rows)
        self.sums = {}
        total = torch.zeros((), dtype=torch.float64, device=self.adapter.device)
        for examples in window:
            total += self._micro_batch(examples, len(rows), nll_tokens, scale, backward=True)
        scored = sum(e.scored_tokens for e in responses)
        return total, scored, sum(len(e.ids) for e in responses)

    def metrics(self) -> dict[str, torch.Tensor]:
        """The window's mean metrics (device tensors; the event log reads them later)."""
        sums = dict(self.sums)
        rows = sums.pop("rows")
        desirable = sums.pop("desirable", None)
        out = {}
        for key, value in sums.items():
            n = rows
            if desirable is not None and key.endswith("_chosen"):
                n = desirable
            elif desirable is not None and key.endswith("_rejected"):
                n = rows - desirable
            out[key] = value / n.clamp(min=1.0)
        out["pairs"] = rows
        return out

    def evaluate(self, examples: Sequence[Example], micro_batch: int) -> dict[str, float]:
        """The objective's loss and metrics over held-out examples (no gradients, eval mode)."""
        pairs = len(examples)
        nll_tokens = nll_targets(examples)
        self.sums = {}
        total = 0.0
        with torch.no_grad():
            for i in range(0, len(examples), micro_batch):
                part = examples[i : i + micro_batch]
                total += float(self._micro_batch(part, pairs, nll_tokens, None, backward=False))
        return {"loss": total, **{k: float(v) for k, v in self.metrics().items()}}

    def _micro_batch(
        self,
        examples: Sequence[Example],
        pairs: int,
        nll_tokens: int,
        scale: float | None,
        backward: bool,
    ) -> torch.Tensor:
        """One micro-batch's share of the window's loss (detached), its gradient accumulated
        when `backward`, its metrics added to the window's."""
        o, device = self.objective, self.adapter.device
        kto = isinstance(o, obj.KTO)
        rejected = [] if kto else [e.rejected for e in examples if e.rejected is not None]
        batch = collate(list(examples) + rejected, self.pad, device)
        shifted = collate(_mismatched(examples), self.pad, device) if kto else None
        if o.reference:
            with torch.no_grad():
                reference = self._logps(self.adapter.base, batch)
                kl_reference = self._logps(self.adapter.base, shifted).sums if shifted else None
        every = _every_target(examples, self.pad, device) if isinstance(o, obj.ORPO) else None
        with self.adapter.active():  # through backward (checkpointed layers run again)
            policy = self._logps(self.adapter, batch, every)
            if isinstance(o, obj.KTO):
                assert shifted is not None and kl_reference is not None
                with torch.no_grad():
                    kl_policy = self._logps(self.adapter, shifted).sums
                desirable = torch.tensor([bool(e.desirable) for e in examples], device=device)
                losses, metrics = obj.kto_losses(
                    o, policy, reference, kl_policy, kl_reference, desirable
                )
                metrics["desirable"] = desirable.to(torch.float32)
                loss = losses.sum() / pairs
            elif isinstance(o, obj.ORPO):
                odds, nll, metrics = obj.orpo_losses(o, policy)
                loss = odds.sum() / pairs + nll.sum() / max(nll_tokens, 1)
            else:
                losses, metrics = obj.dpo_losses(o, policy, reference)
                loss = losses.sum() / pairs
            if backward:
                (loss if scale is None else loss * scale).backward()
        self._add(metrics, len(examples))
        return loss.detach()

    def _logps(
        self, model: Any, batch: Any, every: torch.Tensor | None = None
    ) -> obj.SequenceLogps:
        """Log-probabilities of each row's scored targets under `model` (the adapter, or its
        base: the reference), and with `every` (the first rows' targets, prompt included) those
        rows' whole sums."""
        with autocast(self.precision, self.adapter.device):
            logits = model.forward(batch.input_ids)
        return obj.sequence_logps(logits, batch.targets, every)

    def _add(self, metrics: obj.Metrics, rows: int) -> None:
        for key, value in metrics.items():
            total = value.detach().to(torch.float64).sum()
            self.sums[key] = self.sums[key] + total if key in self.sums else total
        n = torch.tensor(float(rows), dtype=torch.float64, device=self.adapter.device)
        self.sums["rows"] = self.sums["rows"] + n if "rows" in self.sums else n


def nll_targets(examples: Sequence[Example]) -> int:
    """The targets ORPO's next-token term covers in these chosen rows: every token after the
    first, prompt included."""
    return sum(len(e.ids) - 1 for e in examples)


def _every_target(examples: Sequence[Example], pad: int, device: torch.device) -> torch.Tensor:
    """Next-token targets of every token after the first of each row (pads ignored)."""
    whole = [replace(e, scored=(True,) * len(e.ids)) for e in examples]
    return collate(whole, pad, device).targets


def _mismatched(examples: Sequence[Example]) -> list[Example]:
    """Each row's prompt with the previous row's completion (the last row's for the first)."""
    out = []
    for i, e in enumerate(examples):
        other = examples[i - 1]
        p, q = e.prompt_length, other.prompt_length
        out.append(Example(e.ids[:p] + other.ids[q:], (False,) * p + other.scored[q:]))
    return out
