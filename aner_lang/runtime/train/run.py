"""`Run`: what `train` returns (the Aner `Run` value)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from aner_lang.runtime.train.profile import Profile


@dataclass
class Run:
    """What `train` returns: histories, counters and the trained adapter."""

    adapter: Any
    profile: Profile
    loss_history: list[float]
    validation_history: list[tuple[int, float]]
    scored_tokens: int
    updates: int
    skipped_updates: int
    retries: int
    loss_scale: float
    optimizer_report: str
    seconds: float
    log_path: str | None
    kernel_identity: str
    cuda_graphs: str
    optimizer_bytes: dict[str, int] = field(default_factory=dict)
    epochs: float = 0.0
    """Passes over the training examples done (the current one in part)."""
    stopped_early: bool = False
    best_update: int | None = None
    best_validation_loss: float | None = None
    accuracy_history: list[tuple[int, float]] = field(default_factory=list)
    """(update, held-out preference accuracy) of each validation of a DPO or ORPO run."""
    training_tokens_per_second: float | None = None
    """Tokens per second of this call's updates after its first, each timed alone: the training
    throughput apart from start-up, validations and checkpoints (None with one update)."""

    @property
    def validation_accuracy(self) -> float | None:
        return self.accuracy_history[-1][1] if self.accuracy_history else None

    @property
    def first_validation_accuracy(self) -> float | None:
        return self.accuracy_history[0][1] if self.accuracy_history else None

    @property
    def validation_loss(self) -> float | None:
        return self.validation_history[-1][1] if self.validation_history else None

    @property
    def first_validation_loss(self) -> float | None:
        return self.validation_history[0][1] if self.validation_history else None

    @property
    def final_loss(self) -> float | None:
        return self.loss_history[-1] if self.loss_history else None

    @property
    def tokens_per_second(self) -> float:
        return self.scored_tokens / self.seconds if self.seconds > 0 else 0.0

    def nbytes(self) -> dict[str, int]:
        """Memory report hook: optimizer moments (and how many of them are managed)."""
        return dict(self.optimizer_bytes)

    def __repr__(self) -> str:
        val = f", validation loss {self.validation_loss:.4f}" if self.validation_history else ""
        return (
            (
                f"Run({self.updates} updates, {self.skipped_updates} skipped, final loss "
                f"{self.final_loss:.4f}{val})"
            )
            if self.loss_history
            else "Run(0 updates)"
        )
