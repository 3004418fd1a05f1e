"""The rope scaling a GGUF's per-frequency factors come from (`scaling_of_factors`): llama.cpp's
converter keeps Llama 3.1's parameters only as ``rope_freqs``, and a Hugging Face config needs
them back. Checked at the real head size, where the ramp covers several frequencies."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from aner_lang.runtime.model.config import (
    ModelConfig,
    RopeScaling,
    rope_freq_factors,
    scaling_of_factors,
)

LLAMA3 = ModelConfig(vocab_size=128256, hidden_size=4096, intermediate_size=14336,
                     num_hidden_layers=32, num_attention_heads=32, num_key_value_heads=8,
                     head_dim=128, rope_theta=500000.0)  # fmt: skip


@pytest.mark.parametrize(
    "scaling",
    [
        RopeScaling("llama3", 8.0, 1.0, 4.0, 8192),  # Llama 3.1
        RopeScaling("llama3", 32.0, 1.0, 4.0, 8192),  # Llama 3.2
        RopeScaling("llama3", 16.0, 1.0, 8.0, 4096),
        RopeScaling("linear", 4.0),
    ],
)
def test_the_parameters_behind_a_ggufs_factors_are_found(scaling):
    factors = rope_freq_factors(replace(LLAMA3, rope_scaling=scaling))
    assert factors is not None
    assert scaling_of_factors(LLAMA3, factors) == scaling


def test_parameters_scaled_alike_are_the_same_factors_and_found_at_low_factor_one():
    """low 2, high 8 over 16,384 positions ramps where low 1, high 4 over 8,192 does."""
    doubled = rope_freq_factors(
        replace(LLAMA3, rope_scaling=RopeScaling("llama3", 8.0, 2.0, 8.0, 16384))
    )
    assert doubled is not None
    assert scaling_of_factors(LLAMA3, doubled) == RopeScaling("llama3", 8.0, 1.0, 4.0, 8192)


def test_factors_no_scaling_makes_are_none():
    factors = rope_freq_factors(
        replace(LLAMA3, rope_scaling=RopeScaling("llama3", 8.0, 1.0, 4.0, 8192))
    )
    assert factors is not None
    bent = factors.clone()
    bent[31] *= 1.01  # one ramp frequency off the ramp
    assert scaling_of_factors(LLAMA3, bent) is None
    assert scaling_of_factors(LLAMA3, torch.linspace(1.0, 3.0, 64)) is None
