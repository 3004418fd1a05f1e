"""Declaration of the memory report builtin and its record type."""

from __future__ import annotations

from aner_lang.builtins.spec import Builtin, Declarations, Field, Param, TypeDecl

_CATEGORY = "memory"

MEMORY_REPORT = TypeDecl(
    "MemoryReport",
    "Bytes Aner owns, per category; each buffer counted "
    "once; not allocator overhead or process RSS.",
    fields=(
        Field("weights", "Bytes", "all base weights: floating_base + packed_base"),
        Field(
            "floating_base",
            "Bytes",
            "base tensors kept in floating point (norms; every weight "
            "under float32/float16 storage)",
        ),
        Field("packed_base", "Bytes", "NF4 packed weights with their double-quantized statistics"),
        Field("gpu_packed_base", "Bytes", "the part of packed_base resident on a GPU"),
        Field("adapters", "Bytes", "adapter tensors: trainable masters and stored frozen tensors"),
        Field("frozen_adapter", "Bytes", "frozen adapter tensors (LoRA-FA's A, TinyLoRA's bases)"),
        Field("trainable", "Bytes", "fp32 master tensors the optimizer updates"),
        Field("optimizer", "Bytes", "AdamW moments (two fp32 values per trainable number)"),
        Field("managed_optimizer", "Bytes", "moments held in CUDA managed memory by paged_adamw"),
        Field("prefetch_window", "Bytes", "bytes prefetched to the GPU at a time (one page)"),
        Field("dequant_tile", "Bytes", "the host_tiled dequantization buffer budget"),
    ),
    category=_CATEGORY,
)


def _memory(receiver: str) -> Builtin:
    return Builtin(
        "memory",
        (
            Param("target", receiver, doc="what to account for"),
            Param("profile", "Profile?", "none", "the training profile (optimizer, paging)"),
        ),
        "MemoryReport",
        "Bytes held per category by a model, or by an adapter trained under a profile.",
        "aner_lang.runtime.train.memory:memory_report",
        examples=('let report = memory(base)\nprint("packed base: ${report.packed_base}")',),
        native=True,
        requires=("torch",),
        category=_CATEGORY,
    )


DECLARATIONS = Declarations(builtins=(_memory("Model"), _memory("Adapter")), types=(MEMORY_REPORT,))
