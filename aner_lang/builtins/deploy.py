"""Declarations of the deployment exports: an adapter as a llama.cpp LoRA file, a model as a
Hugging Face folder. (Quantized GGUF files are `export_gguf`'s `GGUFDtype`s, in `artifacts`.)
Implementations live in `aner_lang.runtime.export` and load only when first called."""

from __future__ import annotations

from aner_lang.builtins.spec import NATIVE, Builtin, Declarations, EnumDecl, Member, Param

_NATIVE = NATIVE + ("safetensors",)
_CATEGORY = "artifacts"
_RT = "aner_lang.runtime.export."

TENSOR_DTYPE = EnumDecl(
    "TensorDtype",
    (
        Member("float32", "4 bytes a weight: exactly the model Aner runs"),
        Member("float16", "2 bytes a weight"),
        Member("bfloat16", "2 bytes a weight, fp32's range"),
    ),
    doc="The floating-point type of the weights a Hugging Face export writes.",
    category=_CATEGORY,
)

DECLARATIONS = Declarations(
    builtins=(
        Builtin(
            "export_lora_gguf",
            (
                Param("adapter", "Adapter", doc="a lora, lora_fa or tinylora adapter"),
                Param("path", "String", doc="output .gguf", path="writes"),
                Param(
                    "overwrite",
                    "Bool",
                    "false",
                    doc="replace the file if it exists",
                    keyword_only=True,
                ),
            ),
            "String",
            "Write the adapter as a llama.cpp LoRA GGUF (`llama-server -m base.gguf --lora "
            "FILE`) for the GGUF of its base; q/k rows in llama.cpp's order. A dora or full "
            "adapter does not fit llama.cpp's LoRA: export its merged model instead.",
            _RT + "lora_gguf:export_lora_gguf_builtin",
            examples=('export_lora_gguf(adapter, "out/adapter.gguf")',),
            native=True,
            requires=_NATIVE,
            needs_context=True,
            category=_CATEGORY,
        ),
        Builtin(
            "export_hf",
            (
                Param("model", "Model", doc="a base, or merge(adapter)"),
                Param("dir", "String", doc="output folder", path="writes_folder"),
                Param("dtype", "TensorDtype", "float32", keyword_only=True),
                Param(
                    "overwrite",
                    "Bool",
                    "false",
                    doc="replace the folder's files if it holds any",
                    keyword_only=True,
                ),
            ),
            "String",
            "Write the model as a Hugging Face folder: model.safetensors, config.json, "
            "generation_config.json, tokenizer.json and tokenizer_config.json (with the chat "
            "template); `transformers.AutoModelForCausalLM.from_pretrained(dir)` loads it.",
            _RT + "hf:export_hf_builtin",
            examples=('export_hf(merge(adapter), "out/merged-hf")',),
            native=True,
            requires=_NATIVE,
            needs_context=True,
            category=_CATEGORY,
        ),
    ),
    enums=(TENSOR_DTYPE,),
)
