"""Gemma 2 against transformers, PEFT and llama.cpp: what the shared family tests
(test_architectures.py) do not reach.

The tiny random model (hf_fixture's ``gemma2``: sliding layers of a 4-position window alternating
with global ones, attention and final logit soft-caps small enough to bite) checks that every Gemma
2 feature is needed for the match, the loss and tokens on text longer than the window
(test_sliding_window.py: decoding, packed rows, the Hugging Face export), the half-precision loss
(which must not take the uncapped chunked head path), how configs without or with null soft-caps
are read, an uncapped model's Hugging Face export, the GGUF export read back by Aner and by
llama.cpp and its refusal of what llama.cpp would read differently, and adapters other than LoRA
against PEFT.
"""

from __future__ import annotations

import copy
import json
import math
from dataclasses import replace

import pytest
import torch

transformers = pytest.importorskip("transformers")

from aner_lang.problems.errors import AnerRuntimeError  # noqa: E402
from aner_lang.runtime import adapters  # noqa: E402
from aner_lang.runtime.adapters.files import save_adapter  # noqa: E402
from aner_lang.runtime.export.gguf import export_gguf  # noqa: E402
from aner_lang.runtime.export.hf import export_hf  # noqa: E402
from aner_lang.runtime.load.loader import load_model  # noqa: E402
from aner_lang.runtime.model.config import FULL, SLIDING, config_from_hf  # noqa: E402
from aner_lang.runtime.model.loss import logits_loss_sum  # noqa: E402
from aner_lang.testing.hf_fixture import GEMMA2_SOFTCAPS, tiny_family  # noqa: E402

TEXT = (
    "The history of the city goes back more than two thousand years. It was founded on the banks "
    "of a wide river, where traders met to exchange grain, salt and cloth. Le café est très bon."
)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """(folder, gguf, transformers model) of the tiny random Gemma 2."""
    return tiny_family(tmp_path_factory.mktemp("gemma2"), "gemma2", seed=5)


def _ids(model, text=TEXT):
    return torch.tensor([model.tokenizer.encode(text)])


def _loss(logits: torch.Tensor, ids: torch.Tensor) -> float:
    return float(torch.nn.functional.cross_entropy(logits[0, :-1], ids[0, 1:]))


def test_loss_and_tokens_equal_transformers_past_the_window(tiny):
    folder, gguf, hf = tiny
    assert type(hf).__name__ == "Gemma2ForCausalLM"
    tok = transformers.AutoTokenizer.from_pretrained(str(folder))
    for path in (folder, gguf):
        model = load_model(path, device="cpu")
        ids = _ids(model)
        assert ids[0].tolist() == tok(TEXT).input_ids
        assert ids.shape[1] > 8 * hf.config.sliding_window
        with torch.no_grad():
            theirs, ours = _loss(hf(ids).logits, ids), _loss(model.forward(ids), ids)
        assert math.isclose(ours, theirs, rel_tol=1e-3)
        assert model.config.layer_types == (SLIDING, FULL) * 2
        assert model.config.rope_local_theta is None  # one rope base for every layer


def test_every_gemma2_feature_is_needed_to_match_transformers(tiny):
    """Each feature, switched off, changes the logits: the soft-caps are active, not decoration."""
    folder, _, hf = tiny
    ids = _ids(load_model(folder, device="cpu"))
    with torch.no_grad():
        want = hf(ids).logits
        assert float(want.abs().max()) > 0.75 * GEMMA2_SOFTCAPS[1]  # where tanh bends

        def error(change) -> float:
            model = load_model(folder, device="cpu")
            change(model.module)
            return float((model.forward(ids) - want).abs().max())

        def uncap_final(m):
            m.config = replace(m.config, final_logit_softcapping=None)

        assert error(lambda m: None) <= 1e-4
        assert error(lambda m: [setattr(la.self_attn, "softcap", None) for la in m.layers]) > 0.1
        assert error(uncap_final) > 0.5
        assert error(lambda m: [setattr(la.self_attn, "window", None) for la in m.layers]) > 0.1
        assert error(lambda m: setattr(m, "embed_scale", None)) > 0.1


def test_half_precision_loss_is_that_of_the_capped_logits(tiny):
    """Under autocast the loss of a capped model comes from its capped logits, not from the
    chunked head path (which cannot cap): the same number as the forward's logits give."""
    folder, _, _ = tiny
    model = load_model(folder, device="cpu")
    ids = _ids(model)
    targets = torch.cat([ids[:, 1:], torch.full((1, 1), -100)], 1)
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        loss = model.module.loss(ids, targets)
        want = logits_loss_sum(model.module.forward(ids), targets)
        uncapped = logits_loss_sum(model.module.lm_head(model.module.hidden_states(ids)), targets)
    assert float(loss) == float(want)
    assert abs(float(loss) - float(uncapped)) > 1.0


def test_configs_without_soft_caps_get_transformers_defaults_and_null_turns_them_off(tiny):
    folder, _, _ = tiny
    cfg = json.loads((folder / "config.json").read_text())
    defaults = transformers.Gemma2Config()
    absent = {k: v for k, v in cfg.items() if not k.endswith("softcapping")}
    config = config_from_hf(absent, folder)
    assert config.attn_logit_softcapping == defaults.attn_logit_softcapping
    assert config.final_logit_softcapping == defaults.final_logit_softcapping
    off = config_from_hf({**cfg, "final_logit_softcapping": None}, folder)
    assert off.final_logit_softcapping is None and off.attn_logit_softcapping == 2.0
    with pytest.raises(AnerRuntimeError) as err:
        config_from_hf({**cfg, "attn_logit_softcapping": -1.0}, folder)
    assert err.value.code == "E-HF-CONFIG" and "attn_logit_softcapping" in err.value.message


def test_hf_export_of_an_uncapped_model_writes_null_not_transformers_default(tiny, tmp_path):
    folder, _, _ = tiny
    model = load_model(folder, device="cpu")
    model.config = model.module.config = replace(model.config, final_logit_softcapping=None)
    out = export_hf(model, tmp_path / "out")
    back = transformers.AutoModelForCausalLM.from_pretrained(str(out), dtype=torch.float32)
    assert back.config.final_logit_softcapping is None
    ids = _ids(model)
    with torch.no_grad():
        torch.testing.assert_close(back.eval()(ids).logits, model.forward(ids), atol=1e-4, rtol=0)


def test_gguf_export_writes_the_soft_caps_under_ggufs_keys(tiny, tmp_path):
    from gguf import Keys

    from aner_lang.runtime.io.gguf import GGUFFile

    folder, _, _ = tiny
    model = load_model(folder, device="cpu")
    out = export_gguf(model, tmp_path / "out.gguf", dtype="f32")
    meta = GGUFFile(out).metadata
    assert meta["general.architecture"] == "gemma2"
    assert meta[Keys.LLM.ATTN_LOGIT_SOFTCAPPING.format(arch="gemma2")] == GEMMA2_SOFTCAPS[0]
    assert meta[Keys.LLM.FINAL_LOGIT_SOFTCAPPING.format(arch="gemma2")] == GEMMA2_SOFTCAPS[1]
    back = load_model(out, device="cpu")  # GGUF keeps epsilon as f32
    assert replace(back.config, rms_norm_eps=model.config.rms_norm_eps) == model.config
    ids = _ids(model)
    torch.testing.assert_close(back.forward(ids), model.forward(ids), atol=1e-5, rtol=0)


@pytest.mark.parametrize(
    "change",
    [
        {"attn_logit_softcapping": None},
        {"final_logit_softcapping": None},
        {"layer_types": (FULL,) * 4},
        {"query_pre_attn_scalar": 100.0},
    ],
)
def test_gguf_export_refuses_what_llamacpp_would_read_differently(tiny, tmp_path, change):
    """llama.cpp soft-caps every Gemma 2 (a missing cap has no GGUF form), alternates the layers
    and takes the softmax scale from the head size."""
    folder, _, _ = tiny
    model = load_model(folder, device="cpu")
    model.config = replace(model.config, **change)
    with pytest.raises(AnerRuntimeError) as err:
        export_gguf(model, tmp_path / "out.gguf", dtype="f32")
    assert err.value.code == "E-EXPORT" and next(iter(change)) in err.value.message
    assert not (tmp_path / "out.gguf").exists()


@pytest.mark.slow
def test_llama_cpp_reads_the_exported_gguf_with_our_probabilities(tiny):
    """llama.cpp (xllamacpp's server) on the f32 GGUF Aner wrote: the same next-token
    log-probabilities for prompts longer than the window, through both soft-caps."""
    pytest.importorskip("xllamacpp")
    from aner_lang.testing.llamacpp import llama_server, next_token_logprobs

    _, gguf, _ = tiny
    model = load_model(gguf, device="cpu")
    ids = _ids(model)[0].tolist()
    compared = 0
    with llama_server(gguf, context=256) as url:
        for n in (6, 9, 13, 17, 22, 28, len(ids)):
            theirs = next_token_logprobs(url, ids[:n])
            if theirs is None:
                continue
            compared += 1
            with torch.no_grad():
                ours = model.forward(torch.tensor([ids[:n]]))[0, -1].log_softmax(-1)
            for token, logprob in theirs.items():
                assert abs(float(ours[token]) - logprob) < 3e-3, (n, token, logprob)
            assert max(theirs, key=lambda t: theirs[t]) == int(ours.argmax())
    assert compared >= 3


@pytest.mark.parametrize("method", ["dora", "tinylora"])
def test_other_adapters_train_and_load_in_peft_on_transformers_gemma2(
    tiny, method, tmp_path, trained_like
):
    from aner_lang.runtime.tasks.data import from_texts
    from aner_lang.runtime.train.profile import profile
    from aner_lang.runtime.train.trainer import train

    peft = pytest.importorskip("peft")
    folder, _, hf = tiny
    model = load_model(folder, device="cpu")
    targets = list(model.architecture.targets)
    if method == "tinylora":
        adapter = adapters.tinylora(model, parameters=8, rank=2, targets=targets, seed=1)
    else:
        adapter = adapters.dora(model, rank=4, alpha=8.0, targets=targets, seed=1)
    data = from_texts([TEXT[:90], TEXT[90:]], context=32)
    rate = 1e-1 if method == "tinylora" else 1e-2  # tinylora trains 8 numbers
    run = train(adapter, data, profile(), steps=6, learning_rate=rate)
    assert run.loss_history[-1] < run.loss_history[0]
    trained_like(adapter)
    out = save_adapter(adapter, tmp_path / "peft", format="peft")
    ids = _ids(model)
    want = adapter.forward(ids)
    with torch.no_grad():
        base = hf(ids).logits
        theirs = peft.PeftModel.from_pretrained(copy.deepcopy(hf), str(out)).eval()
        assert (want - base).abs().max().item() > 1e-3  # the adapter changes the logits
        torch.testing.assert_close(theirs(ids).logits, want, atol=1e-4, rtol=1e-4)


def test_full_finetune_trains(tiny):
    from aner_lang.runtime.tasks.data import from_texts
    from aner_lang.runtime.train.profile import profile
    from aner_lang.runtime.train.trainer import train

    folder, _, _ = tiny
    adapter = adapters.full(load_model(folder, device="cpu"))
    data = from_texts([TEXT[:90], TEXT[90:]], context=32)
    run = train(adapter, data, profile(), steps=4, learning_rate=1e-3)
    assert run.loss_history[-1] < run.loss_history[0]


@pytest.mark.cuda
def test_cuda_half_precision_loss_and_gradients_match_float32_on_cpu(tiny):
    """On CUDA in bfloat16 (fused rope and norm kernels, the soft-capped attention, the capped
    logits) the loss is the fp32 CPU loss to bfloat16's precision."""
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    folder, _, _ = tiny
    cpu = load_model(folder, device="cpu")
    gpu = load_model(folder, device="cuda")
    ids = _ids(cpu)
    targets = torch.cat([ids[:, 1:], torch.full((1, 1), -100)], 1)
    with torch.no_grad():
        want = float(cpu.module.loss(ids, targets))
        with torch.autocast("cuda", dtype=torch.bfloat16):
            got = float(gpu.module.loss(ids.cuda(), targets.cuda()))
    assert math.isclose(got, want, rel_tol=2e-2)
