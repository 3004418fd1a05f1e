"""export_hf of every architecture's tiny model (`hf_fixture`), dense and mixture-of-experts:
transformers loads the folder with every tensor under the name it expects and Aner's logits, and
Aner's loader reads it back identically (`check_hf_export`). Tensor names come from the
architecture table, so a name the loader reads and the exporter wrote differently (Qwen2's
q/k/v biases once were) fails here for its family."""

from __future__ import annotations

import pytest

pytest.importorskip("transformers")

from aner_lang.problems.errors import AnerRuntimeError
from aner_lang.runtime.load.loader import load_model
from aner_lang.testing.hf_export import check_hf_export
from aner_lang.testing.hf_fixture import FAMILIES, MOE_FAMILIES, write_hf_model

SCALED_ROPE = "llama3"
"""The fixture whose rope scaling export_hf refuses (tested below)."""


@pytest.mark.parametrize("family", [f for f in FAMILIES + MOE_FAMILIES if f != SCALED_ROPE])
def test_export_hf_is_the_model_to_transformers_and_to_aner(family, tmp_path):
    model = load_model(write_hf_model(tmp_path / "in", family, seed=5), device="cpu")
    check_hf_export(model, tmp_path / "out")


def test_scaled_rope_is_refused_and_nothing_written(tmp_path):
    model = load_model(write_hf_model(tmp_path / "in", SCALED_ROPE, seed=5), device="cpu")
    with pytest.raises(AnerRuntimeError, match="scales its rotary frequencies") as e:
        check_hf_export(model, tmp_path / "out")
    assert e.value.code == "E-EXPORT"
    assert not (tmp_path / "out").exists()
