"""Phi-3 / Phi-4 particulars against transformers, PEFT and llama.cpp.

`test_architectures.py` covers what every family shares. Here: LongRoPE past the pretraining
context (the long factors take over, the attention factor scales cos/sin), with and without a KV
cache crossing that boundary, from a folder and from a GGUF; every adapter method on the fused
`qkv_proj`/`gate_up_proj` exported to PEFT (loaded onto transformers' `Phi3ForCausalLM`), merged
to a Hugging Face folder and to GGUF; a Llama-only target named in a script fails with the
targets the loaded model has and the script position; llama.cpp reads the exported GGUF with
our next-token probabilities.
"""

from __future__ import annotations

import copy
import io
import json
from pathlib import Path

import pytest
import torch

transformers = pytest.importorskip("transformers")

from aner_lang.runtime import adapters  # noqa: E402
from aner_lang.runtime.adapters.files import save_adapter  # noqa: E402
from aner_lang.runtime.adapters.merge import merge  # noqa: E402
from aner_lang.runtime.export.gguf import export_gguf  # noqa: E402
from aner_lang.runtime.export.hf import export_hf  # noqa: E402
from aner_lang.runtime.load.loader import load_model  # noqa: E402
from aner_lang.testing.hf_fixture import (  # noqa: E402
    LONGROPE_ORIGINAL,
    write_gguf_from_hf,
    write_hf_model,
)

FUSED = ["qkv_proj", "o_proj", "gate_up_proj", "down_proj"]


@pytest.fixture(scope="module", params=["phi3", "phi4mini"])
def phi(request, tmp_path_factory):
    """(family, folder, GGUF path, transformers model)."""
    root = tmp_path_factory.mktemp(request.param)
    folder = write_hf_model(root / "hf", request.param, seed=3)
    gguf = write_gguf_from_hf(folder, root / "model.gguf")
    hf = transformers.AutoModelForCausalLM.from_pretrained(str(folder), dtype=torch.float32)
    return request.param, folder, gguf, hf.eval()


@pytest.fixture(scope="module")
def phi4mini(tmp_path_factory):
    root = tmp_path_factory.mktemp("phi4mini-longrope")
    folder = write_hf_model(root / "hf", "phi4mini", seed=5)
    gguf = write_gguf_from_hf(folder, root / "model.gguf")
    hf = transformers.AutoModelForCausalLM.from_pretrained(str(folder), dtype=torch.float32)
    return folder, gguf, hf.eval()


def _ids(n: int, seed: int = 0) -> torch.Tensor:
    return torch.randint(0, 300, (1, n), generator=torch.Generator().manual_seed(seed))


def test_config_reads_longrope_and_partial_rotary_from_folder_and_gguf(phi4mini):
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    folder, gguf, hf = phi4mini
    _, their_scale = ROPE_INIT_FUNCTIONS["longrope"](hf.config)
    for path in (folder, gguf):
        c = load_model(path, device="cpu").config
        s = c.rope_scaling
        assert (c.architecture, c.rotary_dim, c.head_dim) == ("phi3", 12, 16)
        assert s is not None and s.rope_type == "longrope"
        assert s.original_max_position_embeddings == LONGROPE_ORIGINAL
        assert s.long_factor == (1.0, 1.5, 3.0, 6.0, 12.0, 24.0)
        assert their_scale > 1.0 and s.attention_factor == pytest.approx(their_scale, rel=1e-6)


@pytest.mark.parametrize("length", [LONGROPE_ORIGINAL - 4, LONGROPE_ORIGINAL, 150])
def test_longrope_logits_equal_transformers_on_both_sides_of_the_original_context(phi4mini, length):
    folder, gguf, hf = phi4mini
    ids = _ids(length)
    with torch.no_grad():
        want = hf(ids).logits
        for path in (folder, gguf):
            got = load_model(path, device="cpu").forward(ids)
            assert (got - want).abs().max().item() <= 1e-4 * float(want.abs().max())


def test_long_factors_change_the_early_positions_once_the_sequence_is_long(phi4mini):
    """The factor choice is per forward, by its longest sequence, as in transformers: the first
    20 positions of a 150-token forward are not those of a 20-token forward."""
    folder, _, hf = phi4mini
    model = load_model(folder, device="cpu")
    ids = _ids(150, seed=1)
    with torch.no_grad():
        short, long = model.forward(ids[:, :20]), model.forward(ids)[:, :20]
        assert (short - long).abs().max().item() > 1e-2
        torch.testing.assert_close(long, hf(ids).logits[:, :20], atol=1e-4, rtol=1e-4)


def test_decoding_across_the_original_context_matches_transformers_cache(phi4mini):
    folder, _, hf = phi4mini
    model = load_model(folder, device="cpu")
    ids = _ids(LONGROPE_ORIGINAL + 10, seed=2)
    cut = LONGROPE_ORIGINAL - 4
    with torch.no_grad():
        cache = model.new_cache()
        model.module(ids[:, :cut], cache)
        ours = [model.module(ids[:, i : i + 1], cache) for i in range(cut, ids.shape[1])]
        past = hf(ids[:, :cut], use_cache=True).past_key_values
        for i, got in zip(range(cut, ids.shape[1]), ours):
            out = hf(ids[:, i : i + 1], past_key_values=past, use_cache=True)
            past = out.past_key_values
            torch.testing.assert_close(got, out.logits, atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("method", ["lora", "lora_fa", "dora", "tinylora"])
def test_every_low_rank_method_on_fused_targets_loads_in_peft(phi, method, tmp_path, trained_like):
    peft = pytest.importorskip("peft")
    _, folder, _, hf = phi
    model = load_model(folder, device="cpu")
    if method == "tinylora":
        adapter = adapters.tinylora(model, parameters=8, rank=2, targets=FUSED, seed=1)
    else:
        make = getattr(adapters, method)
        adapter = make(model, rank=4, alpha=8.0, targets=FUSED, seed=1)
    trained_like(adapter)
    names = {name.rsplit(".", 1)[-1] for name, _ in adapter.targets}
    assert names == set(FUSED)
    out = save_adapter(adapter, tmp_path / "peft", format="peft")
    config = json.loads((out / "adapter_config.json").read_text())
    assert sorted(config["target_modules"]) == sorted(FUSED)
    ids = _ids(24, seed=3)
    want = adapter.forward(ids)
    with torch.no_grad():
        base = hf(ids).logits
        theirs = peft.PeftModel.from_pretrained(copy.deepcopy(hf), str(out)).eval()
        assert (want - base).abs().max().item() > 1e-3  # the adapter changes the logits
        torch.testing.assert_close(theirs(ids).logits, want, atol=1e-4, rtol=1e-4)


def test_full_finetune_merges_to_a_folder_transformers_loads_and_to_gguf(phi, tmp_path):
    from aner_lang.runtime.tasks.data import from_texts
    from aner_lang.runtime.train.profile import profile
    from aner_lang.runtime.train.trainer import train

    _, folder, _, _ = phi
    model = load_model(folder, device="cpu")
    adapter = adapters.full(model)
    texts = ["The quiet mountain lake reflects the clear morning sky.", "Hello, world! 1234"]
    run = train(adapter, from_texts(texts, context=32), profile(), steps=4, learning_rate=1e-3)
    assert run.loss_history[-1] < run.loss_history[0]
    merged = merge(adapter)
    ids = _ids(90, seed=4)  # past the phi4mini fixture's original context
    want = adapter.forward(ids)
    out = export_hf(merged, tmp_path / "merged")
    hf = transformers.AutoModelForCausalLM.from_pretrained(str(out), dtype=torch.float32).eval()
    assert type(hf).__name__ == "Phi3ForCausalLM"
    with torch.no_grad():
        torch.testing.assert_close(hf(ids).logits, want, atol=1e-4, rtol=1e-4)
    back = load_model(export_gguf(merged, tmp_path / "merged.gguf", dtype="f32"), device="cpu")
    assert back.source_architecture == "phi3"
    torch.testing.assert_close(back.forward(ids), want, atol=1e-4, rtol=1e-4)


def test_a_llama_target_on_a_phi3_model_names_its_targets_and_the_script_line(phi, tmp_path):
    from aner_lang.check import analyze
    from aner_lang.interp import ExecContext, run
    from aner_lang.interp.failures import AnerError

    _, folder, _, _ = phi
    path = tmp_path / "script.aner"
    source = (
        f'let m = load_model("{folder}", device: cpu)\n'
        "let a = lora(m, rank: 4, targets: [q_proj, v_proj])\n"
    )
    analysis = analyze(source, str(path))
    assert not [d for d in analysis.diagnostics if d.severity == "error"]
    with pytest.raises(AnerError) as err:
        run(analysis, ExecContext(script_dir=tmp_path, stdout=io.StringIO(), script_path=path))
    d = err.value.diagnostic
    assert (d.code, d.path, d.span.line) == ("E-ADAPTER-TARGET", str(path), 2)
    assert "['q_proj', 'v_proj']" in d.message
    assert "qkv_proj, o_proj, gate_up_proj, down_proj" in d.message
    assert any("qkv_proj" in n for n in d.notes)


@pytest.mark.slow
def test_llama_cpp_reads_the_exported_gguf_with_our_probabilities(phi, request):
    """llama.cpp (xllamacpp's server) on the f32 GGUF Aner wrote: the same next-token
    log-probabilities for prompts of several lengths (its context is the fixture's original one,
    where llama.cpp uses LongRoPE's short factors, as we do for these lengths). llama.cpp's CPU
    kernels round differently from torch's: log-probabilities agree to 1e-3, not 1e-5."""
    pytest.importorskip("xllamacpp")
    from aner_lang.testing.llamacpp import llama_server, next_token_logprobs

    name, _, gguf, _ = phi
    if name == "phi4mini":  # transformers is the reference for LongRoPE; llama.cpp differs
        request.applymarker(
            pytest.mark.xfail(
                strict=True,
                reason="llama.cpp's LongRoPE + partial rotary phi3 graph gives log-probabilities "
                "0.07 away from transformers' and ours on this fixture (not yet explained)",
            )
        )
    model = load_model(gguf, device="cpu")
    prompts = [_ids(n, seed=n)[0].tolist() for n in (5, 9, 12, 17, 23, 31, 40, 50)]
    compared = 0
    with llama_server(gguf, context=LONGROPE_ORIGINAL) as url:
        for ids in prompts:
            theirs = next_token_logprobs(url, ids)
            if theirs is None:
                continue
            compared += 1
            with torch.no_grad():
                ours = model.forward(torch.tensor([ids]))[0, -1].log_softmax(-1)
            assert len(theirs) == 5
            for token, logprob in theirs.items():
                assert abs(float(ours[token]) - logprob) < 3e-3, (ids, token, logprob)
            assert max(theirs, key=lambda t: theirs[t]) == int(ours.argmax())
    assert compared >= 3


def test_export_is_written_under_phi3_names(phi, tmp_path):
    from aner_lang.runtime.io.gguf import GGUFFile

    name, _, gguf, _ = phi
    file = GGUFFile(Path(gguf))
    assert file.architecture == "phi3"
    assert file.has_tensor("blk.0.attn_qkv.weight") and file.has_tensor("blk.1.ffn_up.weight")
    assert not file.has_tensor("blk.0.attn_q.weight") and not file.has_tensor(
        "blk.0.ffn_gate.weight"
    )
    assert file.has_tensor("rope_factors_long.weight") == (name == "phi4mini")
    assert file.metadata["phi3.rope.dimension_count"] == (12 if name == "phi4mini" else 16)
