"""Learning-rate schedules: linear warmup, then constant, linear or cosine decay to 0."""

from __future__ import annotations

import math

SCHEDULES = ("constant", "linear", "cosine")


def learning_rate_at(k: int, lr: float, total: int, warmup: int, schedule: str) -> float:
    """Learning rate of applied update `k` (0-based): linear warmup over `warmup` updates,
    then constant, linear or cosine decay to 0 at `total`."""
    if k < warmup:
        return lr * (k + 1) / warmup
    if schedule == "constant" or total <= warmup:
        return lr
    progress = min(1.0, (k - warmup) / (total - warmup))
    if schedule == "linear":
        return lr * (1.0 - progress)
    return lr * 0.5 * (1.0 + math.cos(math.pi * progress))
