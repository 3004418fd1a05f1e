"""Tiny random-weight models of every supported architecture, built with HF transformers.

`write_hf_model(folder, family)` saves a Hugging Face model folder (config.json, safetensors,
tokenizer.json, tokenizer_config.json with a chat template) whose distinctive features are all on:

| family | transformers class | features |
|---|---|---|
| ``llama3`` | `LlamaForCausalLM` | ``llama3`` rope scaling, tied embeddings, Llama 3 pre-tokenizer, BOS |
| ``mistral`` | `MistralForCausalLM` | untied output, GQA, Tekken pre-tokenizer, BOS |
| ``qwen2`` | `Qwen2ForCausalLM` | q/k/v biases, tied embeddings, a padded vocabulary, Qwen2 split |
| ``qwen3`` | `Qwen3ForCausalLM` | q/k RMSNorm, head size unlike hidden/heads, untied output |
| ``gemma3`` | `Gemma3ForCausalLM` | sandwich norms (1 + w), q/k norms, GeGLU, scaled embedding, a |
| | | 4-position sliding window on 5 of 6 layers with their own rope base, SentencePiece-style BPE |
| ``gemma2`` | `Gemma2ForCausalLM` | Gemma 3's sandwich norms, GeGLU and embedding without q/k norms; |
| | | sliding (4 positions) and global layers alternating under one rope base; attention and |
| | | final logit soft-caps small enough (`GEMMA2_SOFTCAPS`) to change the logits |
| ``phi3`` | `Phi3ForCausalLM` | fused qkv and gate/up matrices, GQA, untied output (Phi-3, Phi-4) |
| ``phi4mini`` | `Phi3ForCausalLM` | as ``phi3``, plus LongRoPE and partial rotary dims, tied (Phi-4-mini) |
| ``mixtral`` | `MixtralForCausalLM` | 4 experts, top 2 (renormalised), untied output, GQA |
| ``qwen3_moe`` | `Qwen3MoeForCausalLM` | 4 experts of their own size, top 2 unnormalised, a dense layer |

The mixture-of-experts families (`MOE_FAMILIES`) are kept apart from `FAMILIES`: ``qwen3_moe``'s
dense layer and unnormalised routing have no GGUF form llama.cpp reads the same way
(`LLAMACPP_MOE` gives the config a GGUF can carry).

Every parameter is seeded noise (biases and norm weights included: transformers initialises those
to 0 and 1, which would hide a missing bias or norm). The tokenizer is a byte-level BPE trained
with the `tokenizers` library on a small corpus, with the family's own split regex as its
tokenizer.json writes it (Gemma: SentencePiece-style BPE with byte fallback and scores, as
`build_spm_tokenizer` says). `write_gguf_from_hf` converts a folder to GGUF through Aner's exporter,
which writes llama.cpp's converter's layout (names, q/k permutation, rope_freqs, metadata).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from aner_lang.architectures import for_hf
from aner_lang.runtime.model.tokenizer import HF_SPLIT_NAMES

FAMILIES = ("llama3", "mistral", "qwen2", "qwen3", "gemma3", "gemma2", "phi3", "phi4mini")
MOE_FAMILIES = ("mixtral", "qwen3_moe")
LLAMACPP_MOE: dict[str, Any] = {"norm_topk_prob": True, "mlp_only_layers": []}
"""Config fields that make a ``qwen3_moe`` fixture what llama.cpp's graph assumes (every layer
sparse, routing weights renormalised); Mixtral's already is."""
CORPUS = [
    "Aner is a small, statically typed scripting language for adapting language models.",
    "A user writes a script that declares a base model, adapters, a training profile and data.",
    "The quiet mountain lake reflects the clear morning sky; the old pine trees stand still.",
    "In 1969, 3 astronauts flew 384,400 km to the Moon. The trip took about 76 hours!",
    "Don't stop: it's what they've said we'd do, and I'll do it. Isn't it?",
    "def train(model, steps=20):\n    return model.fit(steps)  # code has indentation\n",
    "Le café est très bon. Der Bär läuft schnell. Ça va? Naïve coöperation, déjà vu.",
    "Numbers like 2024, 3.14159 and 1,000,000 appear in text, as do e-mail@example.com and URLs.",
]
TEXTS = [
    "The quiet mountain lake reflects the clear morning sky.",
    "Hello, world! 1234567 numbers: 3.14159 and 2,718",
    "DON'T won't I'll they've  double  spaces\n\nnew lines\ttabs",
    "Le café est très bon. 東京 🤗",
]
"""Probe texts the fixtures' tests tokenize and score (digits, contractions, runs of spaces,
accents, CJK and an emoji: the pre-tokenizers' hard cases)."""
_SPLITS = {name: pattern for pattern, name in HF_SPLIT_NAMES.items()}


@dataclass(frozen=True)
class Family:
    model_type: str
    split: str
    """The llama.cpp pre-tokenizer name of the family's split regex (`HF_SPLIT_NAMES`)."""
    specials: tuple[str, ...]
    bos: str | None
    eos: str
    template: str
    ignore_merges: bool = False
    nfc: bool = False
    spm: bool = False
    """SentencePiece-style BPE (`build_spm_tokenizer`) instead of byte-level BPE."""


_LLAMA3_TEMPLATE = (
    "{{ bos_token }}{% for m in messages %}<|start_header_id|>{{ m['role'] }}<|end_header_id|>"
    "\n\n{{ m['content'] | trim }}<|eot_id|>{% endfor %}"
    "{% if add_generation_prompt %}<|start_header_id|>assistant<|end_header_id|>\n\n{% endif %}"
)
_CHATML = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
_MISTRAL_TEMPLATE = (
    "{{ bos_token }}{% for m in messages %}{% if m['role'] == 'user' %}[INST]{{ m['content'] }}"
    "[/INST]{% elif m['role'] == 'assistant' %}{{ m['content'] }}{{ eos_token }}"
    "{% else %}{{ raise_exception('only user and assistant messages') }}{% endif %}{% endfor %}"
)
_QWEN = Family(
    "qwen2",
    "qwen2",
    ("<|endoftext|>", "<|im_start|>", "<|im_end|>"),
    None,
    "<|im_end|>",
    _CHATML,
    nfc=True,
)
_GEMMA_TEMPLATE = (
    "{{ bos_token }}{% for m in messages %}<start_of_turn>"
    "{{ 'model' if m['role'] == 'assistant' else m['role'] }}\n{{ m['content'] | trim }}"
    "<end_of_turn>\n{% endfor %}{% if add_generation_prompt %}<start_of_turn>model\n{% endif %}"
)
_PHI3_TEMPLATE = (
    "{% for m in messages %}<|{{ m['role'] }}|>\n{{ m['content'] }}<|end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>\n{% else %}{{ eos_token }}{% endif %}"
)
_PHI3 = Family(
    "phi3",
    "llama-bpe",  # Phi-4's byte-level BPE splits as GPT-4 does, Llama 3's regex
    ("<|endoftext|>", "<|system|>", "<|user|>", "<|assistant|>", "<|end|>"),
    None,
    "<|end|>",
    _PHI3_TEMPLATE,
)
GEMMA2_SOFTCAPS = (2.0, 4.0)
"""The ``gemma2`` fixture's attention and final logit soft-caps: its scores and logits exceed
them, so capping changes them."""
LONGROPE_ORIGINAL = 64
"""The ``phi4mini`` fixture's pretraining context: longer sequences use the long factors."""
FAMILY = {
    "llama3": Family(
        "llama",
        "llama-bpe",
        (
            "<|begin_of_text|>",
            "<|end_of_text|>",
            "<|start_header_id|>",
            "<|end_header_id|>",
            "<|eot_id|>",
        ),
        "<|begin_of_text|>",
        "<|eot_id|>",
        _LLAMA3_TEMPLATE,
        ignore_merges=True,
    ),
    "mistral": Family(
        "mistral",
        "tekken",
        ("<unk>", "<s>", "</s>", "[INST]", "[/INST]"),
        "<s>",
        "</s>",
        _MISTRAL_TEMPLATE,
        ignore_merges=True,
    ),
    "qwen2": _QWEN,
    "qwen3": replace(_QWEN, model_type="qwen3"),
    "gemma3": Family(
        "gemma3_text",
        "",
        ("<pad>", "<eos>", "<bos>", "<unk>", "<start_of_turn>", "<end_of_turn>"),
        "<bos>",
        "<eos>",
        _GEMMA_TEMPLATE,
        spm=True,
    ),
    "phi3": _PHI3,
    "phi4mini": _PHI3,
    "qwen3_moe": replace(_QWEN, model_type="qwen3_moe"),
}
FAMILY["mixtral"] = replace(FAMILY["mistral"], model_type="mixtral")
FAMILY["gemma2"] = replace(FAMILY["gemma3"], model_type="gemma2")


def build_tokenizer(family: str, vocab_size: int = 320) -> Any:
    """The family's `tokenizers.Tokenizer`, trained on `CORPUS`: byte-level BPE, or for a
    SentencePiece family `build_spm_tokenizer`'s (at its own vocabulary size)."""
    if FAMILY[family].spm:
        return build_spm_tokenizer(family)
    from tokenizers import (
        Regex,
        Tokenizer,
        decoders,
        models,
        normalizers,
        pre_tokenizers,
        processors,
        trainers,
    )

    f = FAMILY[family]
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(_SPLITS[f.split]), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False),
        ]
    )
    if f.nfc:
        tok.normalizer = normalizers.NFC()
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=list(f.specials),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(CORPUS, trainer)
    spec = json.loads(tok.to_str())
    spec["model"]["ignore_merges"] = f.ignore_merges
    tok = Tokenizer.from_str(json.dumps(spec))
    if f.bos is not None:
        bos_id = tok.token_to_id(f.bos)
        tok.post_processor = processors.TemplateProcessing(
            single=f"{f.bos} $A", pair=f"{f.bos} $A {f.bos} $B", special_tokens=[(f.bos, bos_id)]
        )
    return tok


def build_spm_tokenizer(family: str, vocab_size: int = 400) -> Any:
    """A SentencePiece-style `tokenizers.Tokenizer` as Gemma's tokenizer.json is: the family's
    special tokens first, then the 256 ``<0xXX>`` byte-fallback tokens, then pieces learnt by BPE
    on `CORPUS` (spaces as "▁", no pre-tokenizer), each scored by when it was learnt, with every
    split of a piece into two pieces a merge ranked by the piece's score (`spm_merges`, as
    transformers' converter derives merges from SentencePiece scores)."""
    from tokenizers import (
        AddedToken,
        Tokenizer,
        decoders,
        models,
        normalizers,
        processors,
        trainers,
    )

    from aner_lang.runtime.model.tokenizer import spm_merges

    f = FAMILY[family]
    learner = Tokenizer(models.BPE())
    learner.normalizer = normalizers.Replace(" ", "\u2581")
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, show_progress=False)
    learner.train_from_iterator(CORPUS, trainer)
    learnt = sorted(learner.get_vocab().items(), key=lambda kv: kv[1])
    tokens = [*f.specials, *(f"<0x{b:02X}>" for b in range(256)), *(t for t, _ in learnt)]
    scores = [0.0] * (len(tokens) - len(learnt)) + [-float(i) for i in range(len(learnt))]
    vocab = {t: i for i, t in enumerate(tokens)}
    tok = Tokenizer(
        models.BPE(
            vocab, spm_merges(tokens, scores), unk_token="<unk>", fuse_unk=True, byte_fallback=True
        )
    )
    tok.normalizer = normalizers.Replace(" ", "\u2581")
    tok.decoder = decoders.Sequence(
        [decoders.Replace("\u2581", " "), decoders.ByteFallback(), decoders.Fuse()]
    )
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in f.specials])
    assert f.bos is not None
    tok.post_processor = processors.TemplateProcessing(
        single=f"{f.bos} $A", pair=f"{f.bos} $A {f.bos} $B", special_tokens=[(f.bos, vocab[f.bos])]
    )
    return tok


def _config(family: str, vocab: int, overrides: dict[str, Any] | None = None) -> Any:
    """The family's transformers config; `overrides` replaces some of its fields."""
    config = _family_config(family, vocab)
    for key, value in (overrides or {}).items():
        setattr(config, key, value)
    return config


def _family_config(family: str, vocab: int) -> Any:
    import transformers

    common: dict[str, Any] = {
        "vocab_size": vocab,
        "hidden_size": 64,
        "intermediate_size": 96,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "max_position_embeddings": 256,
        "rms_norm_eps": 1e-5,
    }
    if family == "llama3":
        return transformers.LlamaConfig(
            **common,
            tie_word_embeddings=True,
            rope_parameters={
                "rope_type": "llama3",
                "rope_theta": 500000.0,
                "factor": 8.0,
                "low_freq_factor": 1.0,
                "high_freq_factor": 4.0,
                "original_max_position_embeddings": 64,
            },
        )
    if family == "mistral":
        return transformers.MistralConfig(
            **common,
            tie_word_embeddings=False,
            sliding_window=4096,
            rope_parameters={"rope_type": "default", "rope_theta": 1000000.0},
        )
    if family == "qwen2":
        return transformers.Qwen2Config(
            **common,
            tie_word_embeddings=True,
            rope_parameters={"rope_type": "default", "rope_theta": 1000000.0},
        )
    if family == "gemma3":
        return transformers.Gemma3TextConfig(
            **{**common, "num_hidden_layers": 6, "num_key_value_heads": 1},
            head_dim=24,
            query_pre_attn_scalar=24,
            sliding_window=4,
            tie_word_embeddings=True,
            rope_parameters={
                "full_attention": {"rope_type": "linear", "factor": 8.0, "rope_theta": 1e6},
                "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
            },
            pad_token_id=0,
            eos_token_id=1,
            bos_token_id=2,
        )
    if family == "gemma2":
        return transformers.Gemma2Config(
            **{**common, "num_hidden_layers": 4},
            head_dim=24,
            query_pre_attn_scalar=24,
            sliding_window=4,
            tie_word_embeddings=True,
            attn_logit_softcapping=GEMMA2_SOFTCAPS[0],
            final_logit_softcapping=GEMMA2_SOFTCAPS[1],
            rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
            pad_token_id=0,
            eos_token_id=1,
            bos_token_id=2,
        )
    if family in ("phi3", "phi4mini"):
        return _phi3_config(family, common)
    if family == "mixtral":
        return transformers.MixtralConfig(
            **common,
            tie_word_embeddings=False,
            num_local_experts=4,
            num_experts_per_tok=2,
            rope_parameters={"rope_type": "default", "rope_theta": 1000000.0},
        )
    if family == "qwen3_moe":  # layer 1 dense: mlp_only_layers; norm_topk_prob off (HF default)
        common["head_dim"] = 24  # a keyword Qwen3MoeConfig takes through its **kwargs
        return transformers.Qwen3MoeConfig(
            **common,
            tie_word_embeddings=False,
            num_experts=4,
            num_experts_per_tok=2,
            moe_intermediate_size=40,
            norm_topk_prob=False,
            mlp_only_layers=[1],
        )
    return transformers.Qwen3Config(**common, head_dim=24, tie_word_embeddings=False)


def _phi3_config(family: str, common: dict[str, Any]) -> Any:
    """Phi-3 (untied, full rotary) or Phi-4-mini's features (LongRoPE with distinct short and
    long factors, rope over 3/4 of each 16-dimension head, tied embeddings)."""
    import transformers

    ids: dict[str, Any] = {
        "pad_token_id": 0,
        "bos_token_id": None,
        "eos_token_id": 4,
        "sliding_window": None,
    }
    if family == "phi3":
        return transformers.Phi3Config(**common, **ids, tie_word_embeddings=False)
    return transformers.Phi3Config(
        **common,
        **ids,
        tie_word_embeddings=True,
        original_max_position_embeddings=LONGROPE_ORIGINAL,
        rope_parameters={
            "rope_type": "longrope",
            "rope_theta": 10000.0,
            "partial_rotary_factor": 0.75,
            "short_factor": [1.0, 1.05, 1.2, 1.5, 2.0, 2.5],
            "long_factor": [1.0, 1.5, 3.0, 6.0, 12.0, 24.0],
        },
    )


def build_hf_model(
    family: str, vocab: int, seed: int = 0, config: dict[str, Any] | None = None
) -> Any:
    """The family's transformers model (`config`: fields replaced in its config), every
    parameter seeded noise, in eval mode."""
    import torch
    import transformers

    classes = {
        "llama3": transformers.LlamaForCausalLM,
        "mistral": transformers.MistralForCausalLM,
        "qwen2": transformers.Qwen2ForCausalLM,
        "qwen3": transformers.Qwen3ForCausalLM,
        "gemma3": transformers.Gemma3ForCausalLM,
        "gemma2": transformers.Gemma2ForCausalLM,
        "phi3": transformers.Phi3ForCausalLM,
        "phi4mini": transformers.Phi3ForCausalLM,
        "mixtral": transformers.MixtralForCausalLM,
        "qwen3_moe": transformers.Qwen3MoeForCausalLM,
    }
    model = classes[family](_config(family, vocab, config))
    # norm factors near 1 whether the file stores the factor or its offset from 1 (Gemma)
    unit = 1.0 - for_hf(FAMILY[family].model_type).hf_norm_offset  # type: ignore[union-attr]
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            noise = torch.randn(p.shape, generator=gen)
            if name.endswith("norm.weight"):
                p.copy_(unit + 0.1 * noise)
            elif p.dim() == 1:
                p.copy_(0.1 * noise)
            else:
                p.copy_(noise / p.shape[1] ** 0.5)
    return model.eval()


def write_hf_model(
    folder: str | Path, family: str, seed: int = 0, config: dict[str, Any] | None = None
) -> Path:
    """Write the family's tiny model (`config`: fields replaced in its config) as a Hugging Face
    folder and return it."""
    if family not in FAMILY:
        known = ", ".join(FAMILIES + MOE_FAMILIES)
        raise ValueError(f"unknown family {family!r}; choose from {known}")
    f = FAMILY[family]
    out = Path(folder)
    out.mkdir(parents=True, exist_ok=True)
    tok = build_tokenizer(family)
    size = tok.get_vocab_size()
    vocab = -(-size // 64) * 64 if family == "qwen2" else size  # Qwen pads its embedding
    model = build_hf_model(family, vocab, seed, config)
    model.save_pretrained(str(out))
    tok.save(str(out / "tokenizer.json"))
    config = {
        "bos_token": f.bos,
        "eos_token": f.eos,
        "pad_token": f.specials[0],
        "chat_template": f.template,
        "model_max_length": 256,
    }
    (out / "tokenizer_config.json").write_text(json.dumps(config, indent=1), encoding="utf-8")
    return out


def write_gguf_from_hf(folder: str | Path, out: str | Path) -> Path:
    """Convert a Hugging Face folder to an f32 GGUF in llama.cpp's converter's layout."""
    from aner_lang.runtime.export.gguf import export_gguf
    from aner_lang.runtime.load.loader import load_model

    return export_gguf(load_model(folder, device="cpu"), out, dtype="f32")


def tiny_family(root: str | Path, family: str, seed: int = 0) -> tuple[Path, Path, Any]:
    """(folder, f32 GGUF, transformers' fp32 model in eval mode) of the family's tiny model,
    written under `root`: the three forms the family tests compare."""
    import torch
    import transformers

    folder = write_hf_model(Path(root) / "hf", family, seed=seed)
    gguf = write_gguf_from_hf(folder, Path(root) / "model.gguf")
    hf = transformers.AutoModelForCausalLM.from_pretrained(str(folder), dtype=torch.float32)
    return folder, gguf, hf.eval()
