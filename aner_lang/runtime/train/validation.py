"""The held-out loss a training run reports (`validation_loss`): the mean over every scored token
of the validation set, in the run's precision, without gradients.

Rules and reasons:

* Rows go through the model in groups of similar length (shortest first), each group one forward
  of at most `VALIDATION_TOKENS` tokens (its rows times its longest row), and never fewer rows
  than the run's micro-batch. An eager forward of a large model launches thousands of kernels,
  each from Python, so at one row a forward the host rather than the GPU can set the pace (the
  trainer replays its steps from CUDA graphs for that reason; validation runs eagerly). Grouping by length
  keeps a group's padding small.
* Groups grow beyond the micro-batch only under `activations: keep`, and to at most
  `KEEP_MULTIPLE` times the tokens of a training micro-batch: a forward without gradients holds
  one layer's transient tensors at a time, where a `keep` step holds every layer's saved
  activations, so the larger forward stays below the step's peak, which the plan and
  `memory_budget` count. Under `checkpoint` and `offload` a step holds about one layer's worth,
  so validation keeps to the micro-batch. Where the steps replay from CUDA graphs, the step's
  transient memory is the graphs' own pool, which the trainer lends to validation
  (`GraphSteps.sharing_memory`): the same bytes serve both.
* Grouping (`tasks.batches.length_groups`) changes the order of the float sums, never what is
  summed, and depends on the rows and settings only, not on the order the rows come in: a
  resumed run validates to the same bits.
"""

from __future__ import annotations

from typing import Any

from aner_lang.runtime.model.precision import autocast
from aner_lang.runtime.tasks.data import Dataset
from aner_lang.runtime.tasks.evaluate import evaluate
from aner_lang.runtime.train.profile import Profile

VALIDATION_TOKENS = 8192
"""The most tokens (rows times the longest row) of one validation forward beyond a micro-batch."""
KEEP_MULTIPLE = 4
"""Under `keep`, a validation forward holds at most this many times a training micro-batch's
tokens."""


def mean_loss(
    adapter: Any, data: Dataset, micro_batch: int, step_tokens: int, profile: Profile
) -> float:
    """Mean next-token loss over all scored tokens of `data` (`tasks.evaluate`, under the
    module's rules); `step_tokens` are the tokens of one training micro-batch."""
    tokens = 0
    if profile.activations == "keep":
        tokens = min(VALIDATION_TOKENS, KEEP_MULTIPLE * step_tokens)
    with autocast(profile.precision, adapter.device):
        return evaluate(adapter, data, micro_batch, tokens).loss
