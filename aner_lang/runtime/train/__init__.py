"""Training: the update loop (`trainer`), its resumable state (`state`, `order`), profiles and
loss scaling, optimizers, the memory report and checkpoints."""
