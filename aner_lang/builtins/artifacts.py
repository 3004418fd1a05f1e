"""Declarations of checkpoint and export builtins: resume, save/load adapters, merge, GGUF.

Implementations live in `aner_lang.runtime.train.checkpoint`, `.adapters.files`,
`.adapters.merge` and `.export.gguf` and load only when first called. Paths are relative to the script's directory.
"""

from __future__ import annotations

from aner_lang.builtins.spec import Builtin, Declarations, EnumDecl, Field, Member, Param, TypeDecl

_NATIVE = ("torch", "gguf", "safetensors")
_CATEGORY = "artifacts"
_RT = "aner_lang.runtime."

FORMAT = EnumDecl(
    "Format",
    (
        Member(
            "peft",
            "adapter_config.json + adapter_model.safetensors, loadable by "
            "peft.PeftModel.from_pretrained (lora, lora_fa, dora, tinylora)",
        ),
        Member(
            "safetensors",
            "Aner's own adapter.json + adapter.safetensors: every method, "
            "reloads bit for bit, remembers its base model",
        ),
    ),
    doc="How save_adapter writes an adapter.",
    category=_CATEGORY,
)
GGUF_DTYPE = EnumDecl(
    "GGUFDtype",
    (
        Member("f16", "half-precision weights (norms stay f32), as llama.cpp's F16 files"),
        Member("f32", "full-precision weights"),
        Member("q8_0", "8-bit blocks of 32 (8.5 bits a weight), as llama.cpp's Q8_0 files"),
        Member(
            "q4_k_m",
            "llama.cpp's Q4_K_M mix: 4-bit K-quant weights, 6-bit for the output matrix and "
            "part of attn_v/ffn_down, with llama.cpp's fallbacks for rows K-quants cannot hold",
        ),
    ),
    doc="The file type of an exported GGUF file (llama.cpp's names).",
    category=_CATEGORY,
)

CHECKPOINT = TypeDecl(
    "Checkpoint",
    "A verified training checkpoint (safetensors + a JSON manifest with a sha256 per file).",
    fields=(
        Field("path", "String", "the checkpoint's folder"),
        Field("updates", "Int", "updates done when it was written"),
        Field("method", "String", "the adapter method"),
        Field("base_sha256", "String?", "sha256 of the base model's GGUF"),
    ),
    category=_CATEGORY,
)

_BUILTINS = (
    Builtin(
        "resume",
        (
            Param("dir", "String", doc="a train(..., checkpoints: dir) directory", path="reads"),
            Param(
                "model",
                "Model?",
                "none",
                "the base it was trained on (checked by sha256); none: load the recorded base",
                keyword_only=True,
            ),
            Param(
                "profile",
                "Profile?",
                "none",
                "if given, must equal the profile the checkpoint was written with",
                keyword_only=True,
            ),
            Param(
                "otherwise",
                "Adapter?",
                "none",
                "returned when dir holds no checkpoint yet (start or continue with one script)",
                keyword_only=True,
            ),
        ),
        "Adapter",
        "The adapter of the latest checkpoint under dir with its full training "
        "state; train() continues it bit-identically to an uninterrupted run. Every file's "
        "sha256, the base model, and the profile (when given) are verified.",
        _RT + "train.checkpoint:resume_builtin",
        examples=('let a = resume("runs/r2", model: base, otherwise: lora(base, rank: 2))',),
        native=True,
        requires=_NATIVE,
        needs_context=True,
        category=_CATEGORY,
    ),
    Builtin(
        "latest_checkpoint",
        (Param("dir", "String", doc="a checkpoint directory", path="reads"),),
        "Checkpoint?",
        "The verified latest checkpoint under dir, or none if there is none.",
        _RT + "train.checkpoint:latest_builtin",
        examples=('let ck = latest_checkpoint("runs/r2")',),
        native=True,
        requires=_NATIVE,
        lets_go=False,
        needs_context=True,
        category=_CATEGORY,
    ),
    Builtin(
        "save_adapter",
        (
            Param("adapter", "Adapter"),
            Param("dir", "String", doc="output folder", path="writes_folder"),
            Param("format", "Format", "peft", keyword_only=True),
            Param(
                "overwrite",
                "Bool",
                "false",
                doc="replace an existing folder's adapter files",
                keyword_only=True,
            ),
        ),
        "String",
        "Write the adapter's tensors (never the base) and return the folder written.",
        _RT + "adapters.files:save_adapter_builtin",
        examples=('adapter.save_adapter("out/adapter", format: peft)',),
        native=True,
        requires=_NATIVE,
        lets_go=False,
        needs_context=True,
        category=_CATEGORY,
    ),
    Builtin(
        "load_adapter",
        (
            Param("model", "Model", doc="the base to attach it to"),
            Param("dir", "String", doc="written by save_adapter or by peft", path="reads"),
        ),
        "Adapter",
        "Read an adapter saved in either Format (PEFT LoRA/DoRA folders from other "
        "tools too) onto model.",
        _RT + "adapters.files:load_adapter_builtin",
        examples=('let a = load_adapter(base, "out/adapter")',),
        native=True,
        requires=_NATIVE,
        needs_context=True,
        category=_CATEGORY,
    ),
    Builtin(
        "merge",
        (Param("adapter", "Adapter"),),
        "Model",
        "The adapter folded into a dense float32 copy of its base (dequantized NF4 + delta): "
        "the same logits, no adapter needed.",
        _RT + "adapters.merge:merge",
        examples=("let merged = merge(adapter)",),
        native=True,
        requires=_NATIVE,
        category=_CATEGORY,
    ),
    Builtin(
        "export_gguf",
        (
            Param("model", "Model"),
            Param("path", "String", doc="output .gguf", path="writes"),
            Param("dtype", "GGUFDtype", "f16", keyword_only=True),
            Param(
                "overwrite",
                "Bool",
                "false",
                doc="replace an existing file (never the model's own)",
                keyword_only=True,
            ),
        ),
        "String",
        "Write model as a llama.cpp GGUF file (q/k rows re-permuted, tokenizer and "
        "metadata copied from its source GGUF); HF transformers and load_model read it.",
        _RT + "export.gguf:export_gguf_builtin",
        examples=('export_gguf(merge(adapter), "out/merged.gguf", dtype: f16)',),
        native=True,
        requires=_NATIVE,
        needs_context=True,
        category=_CATEGORY,
    ),
)

DECLARATIONS = Declarations(builtins=_BUILTINS, enums=(FORMAT, GGUF_DTYPE), types=(CHECKPOINT,))
