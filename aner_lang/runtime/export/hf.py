"""A model (a base, or a merged adapter) as a Hugging Face folder that `transformers` loads:

    model.safetensors        every weight under HF's names (dense fp32, or `dtype`)
    config.json              the hyper-parameters (already HF-named in `LlamaConfig`)
    generation_config.json   BOS and end-of-generation ids
    tokenizer.json           the GGUF vocabulary as a `tokenizers` tokenizer (BOS added by its
                             post-processor where the vocabulary asks for it)
    tokenizer_config.json    special tokens, context length and the chat template

Names: every weight is saved under its Hugging Face name in the architecture table
(`Architecture.weights`, the names the loader reads), for every architecture of
`aner_lang.architectures`: ``model.<module>.weight`` mostly (the runtime's module tree uses HF's
module names, docs/internals.md), ``lm_head.weight`` for an untied output. A mixture-of-experts
layer is written as the Hub's checkpoints store it, which transformers 5 fuses into its 3-D
expert parameters on loading: the router and one matrix per expert and projection under the
family's names (Mixtral's ``block_sparse_moe.gate`` and ``block_sparse_moe.experts.{e}.w1``,
Qwen3-MoE's ``mlp.gate`` and ``mlp.experts.{e}.gate_proj``), with the family's config keys
(`hf_expert_config`). An architecture's table name is HF's ``model_type`` and its class is the
CamelCase name + ``ForCausalLM`` (LlamaForCausalLM, Qwen3MoeForCausalLM, MixtralForCausalLM,
Phi3ForCausalLM, Gemma2ForCausalLM, ...), which is how `transformers` chooses the model class;
Gemma 3 is written as ``gemma3_text``/``Gemma3ForCausalLM``. Gemma's sliding-window fields (and
Gemma 2's soft-caps, null where the model has none: transformers would default an absent one)
are written as transformers 5 names them, its norm weights as the offsets from 1 its files
store.
"""

from __future__ import annotations

import json
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import save_file
from tokenizers import Tokenizer as HFTokenizer
from tokenizers import processors

from aner_lang.architectures import Architecture, Kind
from aner_lang.host import files
from aner_lang.problems.errors import AnerRuntimeError
from aner_lang.runtime.export.files import module_tensor, require_model
from aner_lang.runtime.io.world import once
from aner_lang.runtime.model.config import (
    EXPERT_FIELDS,
    RopeScaling,
    hf_expert_config,
    rope_freq_factors,
    scaling_of_factors,
)

DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}
WEIGHTS = "model.safetensors"


def _hf_tensors(model: Any, dtype: torch.dtype) -> dict[str, torch.Tensor]:
    """Every weight under the Hugging Face name the loader reads it by (`Architecture.weights`:
    a mixture-of-experts layer's router and each expert's matrices under the family's own
    names); a tied output matrix is the embedding, saved once."""
    c = model.config
    offset = model.architecture.hf_norm_offset  # Gemma's files store factor - 1
    out: dict[str, torch.Tensor] = {}
    for w in model.architecture.weights(c.num_hidden_layers, c.tie_word_embeddings, c.experts_in):
        t = module_tensor(model.module, w).detach()
        if offset and w.kind is Kind.NORM:
            t = t.float() - offset
        out[w.hf] = t.to(dtype).contiguous().cpu()
    return out


def _model_class(name: str) -> str:
    """transformers' causal-LM class of the architecture `name` (``qwen3_moe``:
    ``Qwen3MoeForCausalLM``)."""
    return "".join(part.capitalize() for part in name.split("_")) + "ForCausalLM"


_SLIDING_FIELDS = ("query_pre_attn_scalar", "sliding_window", "layer_types", "rope_local_theta")
_SOFTCAP_FIELDS = ("attn_logit_softcapping", "final_logit_softcapping")


def _sliding_config(c: Any, arch: Architecture) -> dict[str, Any]:
    """A sliding-window model's config.json fields as transformers 5 names them (Gemma 2 and 3):
    ``model_type`` and class, ``layer_types``, ``sliding_window``, ``query_pre_attn_scalar``, and
    ``rope_parameters``: per layer type where sliding layers have their own base (Gemma 3; only
    global layers' rope scaled), else one."""
    full: dict[str, Any] = {"rope_type": "default", "rope_theta": c.rope_theta}
    scalar = c.query_pre_attn_scalar or c.head_dim  # transformers' config takes an int
    if c.rope_scaling is not None:
        full = {**full, "rope_type": c.rope_scaling.rope_type, "factor": c.rope_scaling.factor}
    rope = full
    if arch.sliding_rope:
        local = {"rope_type": "default", "rope_theta": c.rope_local_theta or c.rope_theta}
        rope = {"full_attention": full, "sliding_attention": local}
    model_type = arch.hf_model_types[0]
    return {
        "architectures": [_model_class(arch.name)],
        "model_type": model_type,
        "hidden_activation": "gelu_pytorch_tanh",
        "hidden_act": "gelu_pytorch_tanh",
        "layer_types": list(c.layer_types),
        "sliding_window": c.sliding_window,
        "query_pre_attn_scalar": int(scalar) if float(scalar).is_integer() else scalar,
        "rope_parameters": rope,
    }


def _config(model: Any, dtype: str, rope: RopeScaling | None) -> dict[str, Any]:
    """config.json of `model`, its rope scaling `rope` (`_rope_scaling`)."""
    c, tok = model.config, model.tokenizer
    fields = asdict(c)
    arch = fields.pop("architecture")
    for key in EXPERT_FIELDS:  # named per family, or absent from a dense model's config
        fields.pop(key)
    for key in _SLIDING_FIELDS + (() if model.architecture.softcapping else _SOFTCAP_FIELDS):
        fields.pop(key)
    fields.pop("rope_scaling")
    sliding: dict[str, Any] = {}
    if model.architecture.sliding_pattern:
        sliding = _sliding_config(c, model.architecture)
    elif rope is not None:
        fields["rope_scaling"] = _hf_rope_scaling(rope)
        if rope.rope_type == "longrope":  # as Phi-3's own configs write it
            fields["original_max_position_embeddings"] = rope.original_max_position_embeddings
    return {
        "architectures": [_model_class(arch)],
        "model_type": arch,
        **fields,
        "hidden_act": "silu",
        **sliding,
        **hf_expert_config(c),
        "bos_token_id": tok.bos_id,
        "eos_token_id": tok.eos_id,
        "pad_token_id": tok.pad_id,
        "torch_dtype": dtype,
        "use_cache": True,
    }


def _tokenizer(tok: Any) -> HFTokenizer:
    """The vocabulary's tokenizer as HF loads it: BOS by the post-processor, not by the caller."""
    backend = HFTokenizer.from_str(tok.backend.to_str())
    backend.encode_special_tokens = False
    if tok.add_bos and tok.bos_id is not None:
        bos = tok.token_text(tok.bos_id)
        backend.post_processor = processors.TemplateProcessing(
            single=f"{bos} $A", pair=f"{bos} $A {bos} $B", special_tokens=[(bos, tok.bos_id)]
        )
    return backend


def _stops(tok: Any) -> int | list[int] | None:
    """generation_config.json's ``eos_token_id``: the EOS id, or every end-of-generation id (EOS
    first) where there are more, as transformers writes it for chat models (Gemma's
    ``[1, 106]``): a chat template's end-of-turn token stops `generate` there too."""
    others = sorted(tok.stop_ids - {tok.eos_id})
    return [tok.eos_id, *others] if others and tok.eos_id is not None else tok.eos_id


def _tokenizer_config(model: Any) -> dict[str, Any]:
    tok = model.tokenizer

    def text(i: int | None) -> str | None:
        return tok.token_text(i) if i is not None else None

    return {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": text(tok.bos_id),
        "eos_token": text(tok.eos_id),
        "pad_token": text(tok.pad_id),
        "add_bos_token": tok.add_bos,
        "model_max_length": model.config.max_position_embeddings,
        "clean_up_tokenization_spaces": False,
        **({"chat_template": tok.chat_template} if tok.chat_template else {}),
    }


def _rope_scaling(model: Any) -> RopeScaling | None:
    """The rope scaling config.json states for `model` (None: plain frequencies): the config's
    own, or, for a GGUF whose ``rope_freqs`` hold Llama 3's factors in place of the parameters,
    the parameters that reproduce them (`scaling_of_factors`). The model's frequencies must be
    the ones transformers computes from what is written, else E-EXPORT: nothing else could
    say them (LongRoPE's own factors are written as they are)."""
    c = model.config
    s = c.rope_scaling
    if s is not None and s.rope_type == "longrope":
        return s
    if s is None and model.rope_freqs is not None:
        s = scaling_of_factors(c, model.rope_freqs)
    d = c.rotary_dim
    plain = 1.0 / (c.rope_theta ** (torch.arange(0, d, 2).float() / d))
    factors = rope_freq_factors(replace(c, rope_scaling=s))
    expected = plain if factors is None else plain / factors
    used = model.module.rotary.get_buffer("inv_freq").float().cpu()
    if not torch.allclose(used, expected, rtol=1e-6, atol=0.0):
        raise AnerRuntimeError(
            "export_hf: this model's rotary frequencies are scaled in a way no Hugging Face "
            "rope_scaling (linear, llama3) reproduces",
            code="E-EXPORT",
            notes=("export it as GGUF instead: export_gguf(model, path)",),
        )
    return s


def _hf_rope_scaling(s: RopeScaling) -> dict[str, Any]:
    """`s` as config.json's ``rope_scaling`` (transformers' keys for its type)."""
    if s.rope_type == "longrope":  # as Phi-3's own configs write it
        return {
            "rope_type": "longrope",
            "short_factor": list(s.short_factor),
            "long_factor": list(s.long_factor),
            "factor": s.factor,
            "attention_factor": s.attention_factor,
        }
    if s.rope_type == "linear":
        return {"rope_type": "linear", "factor": s.factor}
    return {
        "rope_type": "llama3",
        "factor": s.factor,
        "low_freq_factor": s.low_freq_factor,
        "high_freq_factor": s.high_freq_factor,
        "original_max_position_embeddings": s.original_max_position_embeddings,
    }


def export_hf(
    model: Any, directory: str | Path, dtype: str = "float32", *, overwrite: bool = False
) -> Path:
    """Write `model` as a Hugging Face folder (see the module docstring); returns the folder."""
    require_model(model, "export_hf")
    if dtype not in DTYPES:
        raise AnerRuntimeError(
            f"export_hf: unknown dtype {dtype!r}; expected one of {', '.join(DTYPES)}",
            code="E-EXPORT",
        )
    rope = _rope_scaling(model)
    tok = model.tokenizer

    def dump(obj: Any) -> str:
        return json.dumps(obj, indent=2, ensure_ascii=False) + "\n"

    with (
        files.replacing(
            directory, overwrite=overwrite, protected=[model.path], folder=True
        ) as folder,
        torch.no_grad(),
    ):
        save_file(_hf_tensors(model, DTYPES[dtype]), folder / WEIGHTS, metadata={"format": "pt"})
        config = _config(model, dtype, rope)
        (folder / "config.json").write_text(dump(config), encoding="utf-8")
        generation = {"bos_token_id": tok.bos_id, "eos_token_id": _stops(tok)}
        (folder / "generation_config.json").write_text(dump(generation), encoding="utf-8")
        _tokenizer(tok).save(str(folder / "tokenizer.json"))
        (folder / "tokenizer_config.json").write_text(
            dump(_tokenizer_config(model)), encoding="utf-8"
        )
    return Path(directory)


def export_hf_builtin(ctx: Any, *, model: Any, dir: str, dtype: str, overwrite: bool) -> str:
    """Builtin `export_hf`: `dir` is relative to the script; returns the folder written (by rank
    0 alone in a distributed run)."""
    folder = ctx.resolve_path(dir)
    return str(once(export_hf, model, folder, dtype, overwrite=overwrite) or folder)
