"""What every exporter shares: refusing an adapter where a model is needed, and writing its
output under the rules of `aner_lang.host.files` (an existing file or non-empty folder replaced only
with `overwrite`, never the model's own files, a temporary name published only once complete, so
an interrupted export never leaves a file that looks finished)."""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from aner_lang.host import files
from aner_lang.problems.errors import AnerRuntimeError


def require_model(model: Any, builtin: str) -> None:
    """Refuse an adapter given to `builtin`, which writes whole models."""
    if hasattr(model, "targets") and not hasattr(model, "module"):
        raise AnerRuntimeError(
            f"{builtin} needs a model; merge the adapter first: {builtin}(merge(adapter), ...)",
            code="E-EXPORT",
        )


def refuse_experts(config: Any, builtin: str) -> None:
    """Refuse a mixture-of-experts model given to `builtin`, a Hugging Face folder writer: a
    folder of one needs its family's own config keys and transformers' fused 3-D expert
    parameters, which Aner does not write (export_gguf writes such models)."""
    if config.num_experts:
        raise AnerRuntimeError(
            f"{builtin}: the model is a mixture of experts ({config.architecture}); Aner does "
            "not write mixture-of-experts Hugging Face folders (export_gguf writes them)",
            code="E-EXPORT",
            notes=("save_adapter(adapter, dir, format: safetensors) keeps a trained adapter",),
        )


@contextmanager
def gguf_writer(
    path: str | Path, architecture: str, *, overwrite: bool, protected: Iterable[str | Path]
) -> Iterator[Any]:
    """A `gguf.GGUFWriter` for `path`; the file appears when the block ends without error."""
    import gguf

    with files.replacing(path, overwrite=overwrite, protected=protected) as tmp:
        writer = gguf.GGUFWriter(str(tmp), architecture)
        try:
            yield writer
            writer.write_header_to_file()
            writer.write_kv_data_to_file()
            writer.write_tensors_to_file()
        finally:
            writer.close()
