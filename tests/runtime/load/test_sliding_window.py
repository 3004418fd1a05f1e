"""Sliding-window families (Gemma 3: 5 sliding layers of 6; Gemma 2: alternating, with
soft-capped attention) past their tiny fixtures' 4-position window, against transformers:
decoding with a KV cache, one token or several at a time, equals the full forward, packed rows
keep each example's attention (window included) within the example, and the Hugging Face export
(from a folder and from a GGUF) loads in transformers as the family's class with equal logits
and tokens."""

from __future__ import annotations

import pytest
import torch

transformers = pytest.importorskip("transformers")

from aner_lang.runtime.export.hf import export_hf  # noqa: E402
from aner_lang.runtime.load.loader import load_model  # noqa: E402
from aner_lang.testing.hf_fixture import tiny_family  # noqa: E402

TEXT = (
    "The history of the city goes back more than two thousand years. It was founded on the banks "
    "of a wide river, where traders met to exchange grain, salt and cloth."
)


@pytest.fixture(scope="module", params=["gemma3", "gemma2"])
def tiny(request, tmp_path_factory):
    """(folder, gguf, transformers model) of one sliding-window family."""
    return tiny_family(tmp_path_factory.mktemp(request.param), request.param, seed=3)


def _ids(model, text=TEXT):
    return torch.tensor([model.tokenizer.encode(text)])


def test_incremental_decoding_past_the_window_equals_the_full_forward(tiny):
    _, gguf, hf = tiny
    model = load_model(gguf, device="cpu")
    ids = _ids(model)[:, :20]
    assert ids.shape[1] == 20 > 4 * hf.config.sliding_window
    with torch.no_grad():
        want = hf(ids).logits
        cache = model.module.new_cache()
        first = model.module(ids[:, :3], cache)
        rest = [model.module(ids[:, i : i + 1], cache) for i in range(3, ids.shape[1])]
        cache = model.module.new_cache()
        most = model.module(ids[:, :15], cache)
        last = model.module(ids[:, 15:], cache)  # several new tokens over a cache
    torch.testing.assert_close(torch.cat([first, *rest], 1), want, atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(torch.cat([most, last], 1), want, atol=1e-4, rtol=1e-4)


def test_packed_rows_keep_the_window_within_each_example(tiny):
    folder, _, _ = tiny
    model = load_model(folder, device="cpu")
    a, b = _ids(model, TEXT[:60])[0], _ids(model, TEXT[60:130])[0]
    positions = torch.cat([torch.arange(len(a)), torch.arange(len(b))])[None]
    packed = torch.cat([a, b])[None]
    with torch.no_grad():
        together = model.module.logits(model.module.hidden_states(packed, positions=positions))
        alone = model.module(b[None])
    torch.testing.assert_close(together[:, len(a) :], alone, atol=1e-4, rtol=1e-4)


def test_hf_export_loads_in_transformers_with_equal_logits_and_tokens(tiny, tmp_path):
    folder, gguf, hf = tiny
    for i, source in enumerate((folder, gguf)):
        model = load_model(source, device="cpu")
        out = export_hf(model, tmp_path / f"out{i}")
        back = transformers.AutoModelForCausalLM.from_pretrained(str(out), dtype=torch.float32)
        assert type(back) is type(hf)
        tok = transformers.AutoTokenizer.from_pretrained(str(out))
        ids = _ids(model)
        assert tok(TEXT).input_ids == ids[0].tolist()
        with torch.no_grad():
            torch.testing.assert_close(back.eval()(ids).logits, hf(ids).logits, atol=1e-4, rtol=0)
        assert load_model(out, device="cpu").config == model.config
