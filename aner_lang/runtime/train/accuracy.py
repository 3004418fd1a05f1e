"""How sure `aner plan` is: the band of its error against measured peaks, and the shapes measured.

The figures are those of tests/runtime/train/test_plan.py, which predicts every Aner row of
benchmarks/results/ (each measured on an H200 with `torch.cuda.max_memory_allocated`) and fails
when one falls outside the band or the range below differs from the rows'. Inside the measured
range the plan states the band; outside it (another architecture's layer, a hidden size, context
or layer count beyond the measured ones) it says plainly that the plan is an estimate.
"""

from __future__ import annotations

from aner_lang.runtime.model.config import ModelConfig

UNDER = 0.02
"""The most a measured peak has been above the plan, as a fraction of the peak."""
OVER = 0.08
"""The most the plan has been above a measured peak, as a fraction of the peak."""
RUNS = 7
"""Measured runs the band is taken over."""
HIDDEN = (4096, 4096)
LAYERS = (32, 32)
CONTEXT = (2048, 8192)
ARCHITECTURES = ("llama",)


def statement(c: ModelConfig, context: int, cuda: bool) -> str:
    """One line: the band and what it rests on, or why this run is outside what was measured."""
    if not cuda:
        return "accuracy: not measured on the CPU (plan counts CUDA memory)"
    outside = []
    if c.architecture not in ARCHITECTURES:
        outside.append(f"architecture {c.architecture}")
    if not HIDDEN[0] <= c.hidden_size <= HIDDEN[1]:
        outside.append(f"hidden size {c.hidden_size}")
    if not LAYERS[0] <= c.num_hidden_layers <= LAYERS[1]:
        outside.append(f"{c.num_hidden_layers} layers")
    if not CONTEXT[0] <= context <= CONTEXT[1]:
        outside.append(f"context {context}")
    if outside:
        return (
            f"accuracy: WARNING: {', '.join(outside)} outside what was measured; this plan is "
            "an estimate, leave a margin"
        )
    return (
        f"accuracy: -{UNDER:.0%} to +{OVER:.0%} against {RUNS} measured H200 runs of this code "
        f"(hidden {HIDDEN[0]}-{HIDDEN[1]}, {LAYERS[0]}-{LAYERS[1]} layers, "
        f"contexts {CONTEXT[0]}-{CONTEXT[1]})"
    )
