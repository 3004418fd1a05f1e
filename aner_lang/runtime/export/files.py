"""What every exporter shares: refusing an adapter where a model is needed, reading a weight of
the architecture table from the model, and writing its output under the rules of
`aner_lang.host.files` (an existing file or non-empty folder replaced only with `overwrite`, never
the model's own files, a temporary name published only once complete, so an interrupted export
never leaves a file that looks finished)."""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from aner_lang.architectures import Kind, Weight
from aner_lang.host import files
from aner_lang.problems.errors import AnerRuntimeError


def require_model(model: Any, builtin: str) -> None:
    """Refuse an adapter given to `builtin`, which writes whole models."""
    if hasattr(model, "targets") and not hasattr(model, "module"):
        raise AnerRuntimeError(
            f"{builtin} needs a model; merge the adapter first: {builtin}(merge(adapter), ...)",
            code="E-EXPORT",
        )


def module_tensor(module: Any, weight: Weight) -> Any:
    """The tensor the architecture table's `weight` names in the runtime's `module`, as the
    runtime holds it (HF layout, a norm's whole factor): a linear's dense matrix, a norm's
    weight or a bias parameter."""
    if weight.kind is Kind.LINEAR:
        return module.get_submodule(weight.name).dense_weight()
    if weight.kind is Kind.NORM:
        return module.get_submodule(weight.name).weight
    return module.get_parameter(weight.name)


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
