"""What every exporter shares: refusing an adapter where a model is needed, and writing its
output under a temporary name that is renamed into place only once complete (an interrupted
export never leaves a file that looks finished)."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from aner_lang.errors import AnerRuntimeError


def require_model(model: Any, builtin: str) -> None:
    """Refuse an adapter given to `builtin`, which writes whole models."""
    if hasattr(model, "targets") and not hasattr(model, "module"):
        raise AnerRuntimeError(
            f"{builtin} needs a model; merge the adapter first: {builtin}(merge(adapter), ...)",
            code="E-EXPORT",
        )


@contextmanager
def gguf_writer(path: str | Path, architecture: str) -> Iterator[Any]:
    """A `gguf.GGUFWriter` for `path`; the file appears when the block ends without error."""
    import gguf

    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(f".{out.name}.tmp")
    writer = gguf.GGUFWriter(str(tmp), architecture)
    try:
        yield writer
        writer.write_header_to_file()
        writer.write_kv_data_to_file()
        writer.write_tensors_to_file()
    except BaseException:
        writer.close()
        tmp.unlink(missing_ok=True)
        raise
    writer.close()
    tmp.replace(out)


@contextmanager
def staged_folder(directory: str | Path) -> Iterator[Path]:
    """A fresh folder to fill; it replaces `directory` when the block ends without error."""
    out = Path(directory)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(f".{out.name}.tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    try:
        yield tmp
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    if out.exists():
        shutil.rmtree(out)
    tmp.rename(out)
