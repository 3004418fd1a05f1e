"""`Evaluation`, what `evaluate` returns for a local model or a service alike (no torch here)."""

from __future__ import annotations

import math
from dataclasses import dataclass

from aner_lang.interp.values import record_text
from aner_lang.problems.errors import AnerRuntimeError


@dataclass(frozen=True)
class Evaluation:
    """Mean next-token cross-entropy over scored tokens, its exp, and the count it averages."""

    loss: float
    perplexity: float
    scored_tokens: int

    def __str__(self) -> str:
        return record_text(self)


def evaluation(total: float, count: int) -> Evaluation:
    """The evaluation of `count` scored tokens whose negative log-likelihoods sum to `total`."""
    if count == 0:
        raise AnerRuntimeError(
            "evaluate: the dataset has no scored tokens (every example is "
            "a prompt only, or one token long)",
            code="E-DATA-EMPTY",
        )
    loss = total / count
    return Evaluation(loss=loss, perplexity=math.exp(min(loss, 700.0)), scored_tokens=count)
