"""Read a GGUF file into HF-layout torch tensors, with errors a user can act on.

`gguf.GGUFReader` memory-maps the file and trusts its header; a truncated or corrupted file makes
it fail deep inside numpy. We check the header against the file size first (so a crafted count can
never drive a huge allocation), wrap every reader failure into `AnerRuntimeError` naming the file,
then validate the architecture, the tensor set and every tensor shape before dequantizing.
"""

from __future__ import annotations

import struct
from pathlib import Path
from typing import Any, TypeVar

import numpy as np
import torch

from aner_lang.errors import AnerRuntimeError

GGUF_MAGIC = b"GGUF"
T = TypeVar("T", torch.Tensor, np.ndarray)
# Smallest possible encodings, used to bound header counts by the file size before reading.
_MIN_KV_BYTES = 8 + 1 + 4 + 1  # key length, 1-char key, value type, 1-byte value
_MIN_TENSOR_INFO_BYTES = 8 + 1 + 4 + 8 + 4 + 8  # name length, name, n_dims, 1 dim, type, offset


def _fail(path: Path, what: str, code: str, *notes: str) -> AnerRuntimeError:
    return AnerRuntimeError(f"{path}: {what}", code=code, notes=notes)


def _check_header(path: Path) -> None:
    """Reject files that are not GGUF or whose header counts cannot fit in the file."""
    size = path.stat().st_size
    with path.open("rb") as f:
        head = f.read(24)
    if len(head) < 24:
        raise _fail(
            path,
            f"not a GGUF file: only {size} bytes, shorter than a GGUF header",
            "E-GGUF-TRUNCATED",
        )
    if head[:4] != GGUF_MAGIC:
        raise _fail(
            path, f"not a GGUF file: magic bytes are {head[:4]!r}, expected b'GGUF'", "E-GGUF-MAGIC"
        )
    version, n_tensors, n_kv = struct.unpack("<IQQ", head[4:24])
    if version not in (2, 3):
        raise _fail(path, f"unsupported GGUF version {version} (supported: 2, 3)", "E-GGUF-VERSION")
    budget = size - 24
    if n_kv * _MIN_KV_BYTES + n_tensors * _MIN_TENSOR_INFO_BYTES > budget:
        raise _fail(
            path,
            f"corrupted or truncated GGUF header: it declares {n_kv} metadata keys "
            f"and {n_tensors} tensors, which cannot fit in {size} bytes",
            "E-GGUF-TRUNCATED",
        )


class GGUFFile:
    """An opened GGUF file: metadata as Python values and lazily dequantized HF-layout tensors."""

    def __init__(self, path: str | Path) -> None:
        import gguf

        self.path = Path(path)
        if not self.path.is_file():
            raise AnerRuntimeError(f"{self.path}: no such model file", code="E-GGUF-NOT-FOUND")
        _check_header(self.path)
        try:
            self._reader = gguf.GGUFReader(str(self.path))
        except (
            ValueError,
            IndexError,
            KeyError,
            TypeError,
            struct.error,
            OverflowError,
            MemoryError,
            UnicodeDecodeError,
        ) as exc:
            raise _fail(
                self.path, f"corrupted or truncated GGUF file ({exc})", "E-GGUF-CORRUPT"
            ) from None
        self.metadata: dict[str, Any] = {}
        for key, field in self._reader.fields.items():
            try:
                self.metadata[key] = field.contents()
            except (ValueError, IndexError, UnicodeDecodeError) as exc:
                raise _fail(
                    self.path, f"metadata key {key!r} is corrupted ({exc})", "E-GGUF-CORRUPT"
                ) from None
        self._tensors = {t.name: t for t in self._reader.tensors}
        self._check_tensor_extents()

    def _check_tensor_extents(self) -> None:
        size = self.path.stat().st_size
        for t in self._tensors.values():
            end = int(t.data_offset) + int(t.n_bytes)
            if end > size or t.data.nbytes != int(t.n_bytes):
                raise _fail(
                    self.path,
                    f"truncated GGUF file: tensor {t.name!r} needs bytes up to "
                    f"{end}, the file has {size}",
                    "E-GGUF-TRUNCATED",
                )

    # -- metadata --------------------------------------------------------------------------------
    @property
    def architecture(self) -> str:
        return str(self.metadata.get("general.architecture", ""))

    def require(self, key: str) -> Any:
        if key not in self.metadata:
            raise _fail(self.path, f"missing GGUF metadata key {key!r}", "E-GGUF-METADATA")
        return self.metadata[key]

    # -- tensors ---------------------------------------------------------------------------------
    def has_tensor(self, name: str) -> bool:
        return name in self._tensors

    def tensor_type(self, name: str) -> str:
        return self._tensors[name].tensor_type.name

    def tensor(
        self, name: str, shape: tuple[int, ...], dtype: torch.dtype = torch.float32
    ) -> torch.Tensor:
        """Dequantize GGUF tensor `name`, checking it has HF shape `shape` (out, in)."""
        import gguf

        t = self._tensors.get(name)
        if t is None:
            raise _fail(self.path, f"missing tensor {name!r}", "E-GGUF-TENSOR")
        got = tuple(int(d) for d in reversed(t.shape))  # GGUF lists dims fastest-first
        if got != tuple(shape):
            raise _fail(
                self.path,
                f"tensor {name!r} has shape {list(got)}, expected "
                f"{list(shape)} from the model's metadata",
                "E-GGUF-SHAPE",
            )
        qtype = t.tensor_type
        if qtype in (gguf.GGMLQuantizationType.F32, gguf.GGMLQuantizationType.F16):
            array = np.array(t.data)  # a writable copy: the memmap is read-only
        else:
            try:
                array = gguf.quants.dequantize(t.data, qtype)
            except NotImplementedError:
                raise _fail(
                    self.path,
                    f"tensor {name!r} uses GGML type {qtype.name}, which cannot be dequantized",
                    "E-GGUF-TYPE",
                ) from None
        return torch.from_numpy(array.reshape(shape)).to(dtype)


def unpermute_rows(weight: T, n_head: int) -> T:
    """Undo llama.cpp's q/k row permutation (interleaved-pair RoPE -> HF rotate_half layout).

    GGUF row h*D + 2i + j holds HF row h*D + j*D/2 + i (research/training.md section 9). Works on
    torch tensors and numpy arrays alike (the fixture writer permutes numpy weights).
    """
    out = weight.shape[0]
    pairs = weight.reshape(n_head, out // n_head // 2, 2, *weight.shape[1:])
    return pairs.swapaxes(1, 2).reshape(weight.shape)


def permute_rows(weight: T, n_head: int) -> T:
    """llama.cpp's conversion permutation (HF layout -> GGUF), the inverse of `unpermute_rows`."""
    out = weight.shape[0]
    halves = weight.reshape(n_head, 2, out // n_head // 2, *weight.shape[1:])
    return halves.swapaxes(1, 2).reshape(weight.shape)
