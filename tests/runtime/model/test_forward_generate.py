"""The torch forward (KV cache, storages, module contract) and generation on tiny fixtures."""

from __future__ import annotations

import pytest
import torch

from aner_lang.problems.errors import AnerRuntimeError
from aner_lang.runtime.load.loader import load_model
from aner_lang.runtime.model.linear import FrozenLinear
from aner_lang.runtime.tasks.generate import Sampling, generate_ids


def _ids(model, text="Aner makes model adaptation explicit and reproducible, 42 times."):
    return torch.tensor([model.tokenizer.encode(text)])


def test_kv_cache_matches_full_forward(tiny_model):
    ids = _ids(tiny_model)
    with torch.no_grad():
        full = tiny_model.forward(ids)
        cache = tiny_model.new_cache()
        first = tiny_model.forward(ids[:, :5], cache)
        rest = [tiny_model.forward(ids[:, t : t + 1], cache) for t in range(5, 8)]
        chunk = tiny_model.forward(ids[:, 8:], cache)
    stepped = torch.cat([first, *rest, chunk], dim=1)
    assert cache.length == ids.shape[1]
    assert (stepped - full).abs().max().item() < 1e-5


def test_right_padding_does_not_change_earlier_logits(tiny_model):
    ids = _ids(tiny_model)
    padded = torch.cat([ids, torch.full((1, 4), 2)], dim=1)
    with torch.no_grad():
        a, b = tiny_model.forward(ids), tiny_model.forward(padded)[:, : ids.shape[1]]
    assert torch.allclose(a, b, atol=1e-5)


def test_every_projection_is_a_frozen_linear_called_as_a_module(tiny_model):
    m = tiny_model.module
    names = [n for n, mod in m.named_modules() if isinstance(mod, FrozenLinear)]
    assert "layers.0.self_attn.q_proj" in names and "layers.1.mlp.down_proj" in names
    assert len(names) == 1 + 7 * 2  # embedding (tied lm_head is the same module) + 7 per layer
    calls: list[str] = []
    hooks = [
        mod.register_forward_hook(lambda mod, i, o, n=n: calls.append(n))
        for n, mod in m.named_modules()
        if isinstance(mod, FrozenLinear)
    ]
    with torch.no_grad():
        tiny_model.forward(_ids(tiny_model))
    for h in hooks:
        h.remove()
    assert set(calls) == set(names)  # the tied embedding runs once more, as lm_head
    assert all(not p.requires_grad for p in m.parameters())


def test_float16_storage_close_to_float32(tiny_gguf, tiny_model):
    half = load_model(tiny_gguf, storage="float16", device="cpu")
    assert half.module.layers[0].mlp.up_proj.weight.dtype == torch.float16
    assert half.module.layers[0].input_layernorm.weight.dtype == torch.float32
    assert half.module.layers[0].mlp.up_proj.nbytes()["weights"] == 128 * 64 * 2
    ids = _ids(tiny_model)
    with torch.no_grad():
        assert (half.forward(ids) - tiny_model.forward(ids)).abs().max().item() < 5e-2


def test_bad_storage_and_device(tiny_gguf):
    with pytest.raises(AnerRuntimeError, match="unknown storage"):
        load_model(tiny_gguf, storage="int3")
    if not torch.cuda.is_available():
        with pytest.raises(AnerRuntimeError, match="no CUDA GPU"):
            load_model(tiny_gguf, device="cuda")


def test_greedy_generation_is_argmax_and_deterministic(tiny_model):
    prompt = tiny_model.tokenizer.encode("Once upon a time")
    out = generate_ids(tiny_model, prompt, Sampling(max_tokens=6, stop_at_eos=False))
    assert len(out) == 6 and out == generate_ids(
        tiny_model, prompt, Sampling(max_tokens=6, stop_at_eos=False)
    )
    ids = list(prompt)
    with torch.no_grad():
        for _ in range(6):
            ids.append(int(tiny_model.forward(torch.tensor([ids]))[0, -1].argmax()))
    assert out == ids[len(prompt) :]


def test_seeded_sampling(tiny_model):
    prompt = tiny_model.tokenizer.encode("Once upon a time")

    def run(seed, top_p=1.0):
        return generate_ids(
            tiny_model,
            prompt,
            Sampling(max_tokens=12, temperature=1.5, top_p=top_p, seed=seed, stop_at_eos=False),
        )

    assert run(7) == run(7)
    assert len({tuple(run(s)) for s in range(4)}) > 1
    greedy = generate_ids(tiny_model, prompt, Sampling(max_tokens=12, stop_at_eos=False))
    assert run(7, top_p=1e-9) == greedy  # nucleus of one token is argmax


def test_generation_stops_at_eos(tiny_model):
    """A wrapper with the forward protocol makes EOS the third pick: two tokens come out."""
    eos = tiny_model.tokenizer.eos_id

    class EosAfterTwo:
        def __init__(self, inner):
            self.inner, self.steps = inner, 0
            self.tokenizer, self.device, self.base = inner.tokenizer, inner.device, inner

        def forward(self, ids, cache=None):
            logits = self.inner.forward(ids, cache)
            self.steps += 1
            if self.steps == 3:
                logits[0, -1, eos] = 1e9
            return logits

    out = generate_ids(EosAfterTwo(tiny_model), [1, 2, 3], Sampling(max_tokens=10))
    assert len(out) == 2 and eos not in out


def test_generation_errors(tiny_model):
    with pytest.raises(AnerRuntimeError, match="top_p"):
        generate_ids(tiny_model, [1], Sampling(top_p=0.0))
    with pytest.raises(AnerRuntimeError, match="context"):
        generate_ids(tiny_model, [1] * 300, Sampling())


def test_nf4_storage_quantizes_or_says_it_is_unavailable(tiny_bytes_gguf):
    try:
        from aner_lang.runtime.nf4 import quantize_model  # noqa: F401
    except ImportError:
        with pytest.raises(AnerRuntimeError) as info:
            load_model(tiny_bytes_gguf, storage="nf4_double_quant", device="cpu")
        assert info.value.code == "E-NF4-UNAVAILABLE"
        return
    tiny_model = load_model(tiny_bytes_gguf, device="cpu")
    nf4 = load_model(tiny_bytes_gguf, storage="nf4_double_quant", device="cpu")
    m = nf4.module
    # every projection NF4; the tied embedding and lm_head kept 16-bit, as QLoRA keeps them
    assert {mod.storage for mod in m.modules() if isinstance(mod, FrozenLinear)} == {
        "nf4_double_quant",
        "float16",
    }
    assert m.embed_tokens.storage == "float16"
    assert m.lm_head is m.embed_tokens and m.norm.weight.dtype == torch.float32
    assert nf4.parameter_count() == tiny_model.parameter_count()
    ids = _ids(tiny_model)
    with torch.no_grad():
        ref, got = tiny_model.forward(ids).flatten(), nf4.forward(ids).flatten()
    assert ids.shape[1] > 20
    # 4-bit weights in a random-weight net: close in direction, not equal
    assert torch.nn.functional.cosine_similarity(ref, got, dim=0) > 0.9


@pytest.mark.cuda
def test_cuda_forward_and_generation_match_cpu(tiny_gguf, tiny_model):
    if not torch.cuda.is_available():
        pytest.skip("no CUDA GPU")
    gpu = load_model(tiny_gguf, device="cuda")
    assert gpu.device.type == "cuda" and gpu.module.norm.weight.is_cuda
    ids = _ids(tiny_model)
    with torch.no_grad():
        diff = (gpu.forward(ids.cuda()).cpu() - tiny_model.forward(ids)).abs().max().item()
    assert diff < 1e-3
    prompt = tiny_model.tokenizer.encode("Once upon a time")
    s = Sampling(max_tokens=8, stop_at_eos=False)
    assert generate_ids(gpu, prompt, s) == generate_ids(tiny_model, prompt, s)
