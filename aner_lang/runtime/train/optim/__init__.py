"""Optimizers over fp32 master tensors: AdamW and paged AdamW (moments in CUDA managed memory)."""

from aner_lang.runtime.train.optim.adamw import AdamW, AdamWState
from aner_lang.runtime.train.optim.paged import PagedAdamW, make_optimizer

__all__ = ["AdamW", "AdamWState", "PagedAdamW", "make_optimizer"]
