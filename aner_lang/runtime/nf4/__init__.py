"""NF4 double-quantized base weights (bitsandbytes layout) and the NF4 matmul paths.

`quantize_model` turns a freshly loaded `LlamaModel` into a QLoRA base in place: every projection,
the embedding table and `lm_head` become `NF4Linear` (a tied `lm_head` stays the same object as
the embedding), while the RMSNorm weights stay fp32.
"""

from __future__ import annotations

from torch import nn

from aner_lang.runtime.model.linear import FrozenLinear
from aner_lang.runtime.nf4.linear import NF4Linear


def quantize_model(model: nn.Module, blocksize: int = 64) -> None:
    """Replace every dense `FrozenLinear` of `model` by an `NF4Linear`, in place."""
    if blocksize != 64:
        raise ValueError("Aner's NF4 storage uses blocks of 64 (the bitsandbytes default)")
    converted: dict[int, NF4Linear] = {}
    # remove_duplicate=False: a shared module (a tied lm_head) is visited under every name it
    # has, so each alias is replaced by the one NF4Linear made for it and the tie survives.
    for qualified, child in list(model.named_modules(remove_duplicate=False)):
        if not isinstance(child, FrozenLinear) or isinstance(child, NF4Linear):
            continue
        if id(child) not in converted:
            converted[id(child)] = NF4Linear.from_dense(child.dense_weight())
        parent_name, _, name = qualified.rpartition(".")
        setattr(model.get_submodule(parent_name), name, converted[id(child)])
