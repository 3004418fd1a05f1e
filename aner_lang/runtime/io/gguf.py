"""GGUF files: a bounded reader of the header and metadata, and tensors read one at a time.

The header is parsed here rather than by `gguf.GGUFReader`, for three reasons. Every count and
length in the file is checked against the bytes that remain before anything is allocated, so a
crafted or truncated file is a clear error, never a huge allocation or a numpy traceback. Large
metadata arrays (a 128k-token vocabulary, 280k merges) are decoded in one pass, not as one numpy
view per element. And tensor data is never touched while reading the header: a tensor is read
when it is asked for, through one read-only memory map of the file, and the pages it occupied are
released from this process right after (``madvise(MADV_DONTNEED)``; they stay in the page cache),
so reading a 16 GB model keeps at most one tensor's pages resident.

Tensors are dequantized with the `gguf` package (every type it implements: F32, F16, BF16, Q8_0,
Q4_0, Q4_1, Q5_0, Q5_1, Q2_K to Q6_K, ...), in bounded row chunks, straight into the target
device's tensor. Dense types (F32, F16, BF16) go to the device as they are and are converted there.
"""

from __future__ import annotations

import mmap
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import numpy as np

from aner_lang.problems.errors import AnerRuntimeError

if TYPE_CHECKING:  # torch is imported where tensors are read: a header needs none
    import torch

GGUF_MAGIC = b"GGUF"
T = TypeVar("T", "torch.Tensor", np.ndarray)
# Smallest possible encodings, used to bound header counts by the file size before reading.
_MIN_KV_BYTES = 8 + 1 + 4 + 1  # key length, 1-char key, value type, 1-byte value
_MIN_TENSOR_INFO_BYTES = 8 + 1 + 4 + 8 + 4 + 8  # name length, name, n_dims, 1 dim, type, offset
_MAX_DIMS = 4
_DEFAULT_ALIGNMENT = 32
_CHUNK_BYTES = 64 << 20
"""Dequantized fp32 bytes produced on the host per step: bounds host memory for quantized types."""

# GGUF metadata value types: (struct format, size) of the scalars; 8 = string, 9 = array.
_SCALARS = {
    0: ("<B", 1),
    1: ("<b", 1),
    2: ("<H", 2),
    3: ("<h", 2),
    4: ("<I", 4),
    5: ("<i", 4),
    6: ("<f", 4),
    7: ("<?", 1),
    10: ("<Q", 8),
    11: ("<q", 8),
    12: ("<d", 8),
}
_NUMPY = {
    0: "<u1",
    1: "<i1",
    2: "<u2",
    3: "<i2",
    4: "<u4",
    5: "<i4",
    6: "<f4",
    7: "?",
    10: "<u8",
    11: "<i8",
    12: "<f8",
}
_STRING, _ARRAY = 8, 9
_LENGTH = struct.Struct("<Q")
"""A string's byte length before its bytes."""


def _fail(path: Path, what: str, code: str, *notes: str) -> AnerRuntimeError:
    return AnerRuntimeError(f"{path}: {what}", code=code, notes=notes)


class _Truncated(Exception):
    """A read past the end of the header: the file is cut short or a length is corrupted."""


class _Cursor:
    """Reads GGUF header values from a buffer, every length checked against what remains."""

    def __init__(self, buf: mmap.mmap, pos: int) -> None:
        self.buf, self.pos, self.end = buf, pos, len(buf)

    def take(self, n: int) -> int:
        if n < 0 or self.pos + n > self.end:
            raise _Truncated
        start = self.pos
        self.pos += n
        return start

    def scalar(self, vtype: int) -> Any:
        fmt, size = _SCALARS[vtype]
        return struct.unpack_from(fmt, self.buf, self.take(size))[0]

    def u32(self) -> int:
        return int(self.scalar(4))

    def u64(self) -> int:
        return int(self.scalar(10))

    def string(self) -> str:
        return self.strings(1)[0]

    def value(self, vtype: int) -> Any:
        if vtype in _SCALARS:
            return self.scalar(vtype)
        if vtype == _STRING:
            return self.string()
        if vtype != _ARRAY:
            raise ValueError(f"unknown metadata value type {vtype}")
        item, count = self.u32(), self.u64()
        if item in _NUMPY:
            size = _SCALARS[item][1]
            if count > (self.end - self.pos) // size:
                raise _Truncated
            start = self.take(count * size)
            return np.frombuffer(self.buf, _NUMPY[item], count, start).tolist()
        if count > (self.end - self.pos) // 8:  # every string or array item takes >= 8 bytes
            raise _Truncated
        if item == _STRING:
            return self.strings(count)
        return [self.value(item) for _ in range(count)]

    def strings(self, count: int) -> list[str]:
        """`count` strings in a row: a vocabulary's tokens and merges, hundreds of thousands in
        a model's header, read in one loop (a few function calls a string less than `string`,
        the most of a GGUF header's parse time), every length checked alike."""
        buf, pos, end = self.buf, self.pos, self.end
        length = _LENGTH.unpack_from
        out = []
        for _ in range(count):
            if pos + 8 > end:
                raise _Truncated
            (n,) = length(buf, pos)
            pos += 8
            if n > end - pos:
                raise _Truncated
            out.append(buf[pos : pos + n].decode("utf-8"))
            pos += n
        self.pos = pos
        return out


@dataclass(frozen=True)
class TensorInfo:
    """Where one tensor's bytes are and what they hold."""

    name: str
    shape: tuple[int, ...]
    """Hugging Face order (slowest dimension first): GGUF lists dimensions the other way."""
    qtype: Any
    """The `gguf.GGMLQuantizationType`."""
    offset: int
    """Absolute byte offset of the data in the file."""
    nbytes: int


class GGUFFile:
    """An opened GGUF file: metadata as Python values and tensors read on demand."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        if not self.path.is_file():
            raise AnerRuntimeError(f"{self.path}: no such model file", code="E-GGUF-NOT-FOUND")
        with self.path.open("rb") as f:
            size = self.path.stat().st_size
            if size < 24:
                raise _fail(
                    self.path,
                    f"not a GGUF file: only {size} bytes, shorter than a GGUF header",
                    "E-GGUF-TRUNCATED",
                )
            self._map = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_COPY)
        self.metadata: dict[str, Any] = {}
        self.value_types: dict[str, tuple[int, int | None]] = {}
        """Each metadata key's GGUF value type (and an array's item type), for copying it."""
        self.tensors: dict[str, TensorInfo] = {}
        try:
            self._parse()
        except _Truncated:
            raise _fail(
                self.path,
                "truncated GGUF file: its header runs past the end of the file",
                "E-GGUF-TRUNCATED",
            ) from None
        except (ValueError, UnicodeDecodeError, KeyError, OverflowError) as exc:
            raise _fail(self.path, f"corrupted GGUF file ({exc})", "E-GGUF-CORRUPT") from None

    def _parse(self) -> None:
        import gguf

        buf, size = self._map, len(self._map)
        if buf[:4] != GGUF_MAGIC:
            raise _fail(
                self.path,
                f"not a GGUF file: magic bytes are {bytes(buf[:4])!r}, expected b'GGUF'",
                "E-GGUF-MAGIC",
            )
        version, n_tensors, n_kv = struct.unpack_from("<IQQ", buf, 4)
        if version not in (2, 3):
            raise _fail(
                self.path, f"unsupported GGUF version {version} (supported: 2, 3)", "E-GGUF-VERSION"
            )
        if n_kv * _MIN_KV_BYTES + n_tensors * _MIN_TENSOR_INFO_BYTES > size - 24:
            raise _fail(
                self.path,
                f"corrupted or truncated GGUF header: it declares {n_kv} metadata keys "
                f"and {n_tensors} tensors, which cannot fit in {size} bytes",
                "E-GGUF-TRUNCATED",
            )
        cur = _Cursor(buf, 24)
        for _ in range(n_kv):
            key = cur.string()
            vtype = cur.u32()
            item = None
            if vtype == _ARRAY and cur.pos + 4 <= cur.end:
                item = struct.unpack_from("<I", buf, cur.pos)[0]
            self.metadata[key] = cur.value(vtype)
            self.value_types[key] = (vtype, item)
        raw: list[tuple[str, tuple[int, ...], int, int]] = []
        for _ in range(n_tensors):
            name = cur.string()
            n_dims = cur.u32()
            if not 1 <= n_dims <= _MAX_DIMS:
                raise ValueError(f"tensor {name!r} has {n_dims} dimensions")
            dims = tuple(cur.u64() for _ in range(n_dims))
            raw.append((name, dims, cur.u32(), cur.u64()))
        alignment = self.metadata.get("general.alignment", _DEFAULT_ALIGNMENT)
        if type(alignment) is not int or alignment <= 0 or alignment & (alignment - 1):
            raise ValueError(f"general.alignment {alignment!r} is not a power of two")
        data_start = -(-cur.pos // alignment) * alignment
        for name, dims, type_id, offset in raw:
            try:
                qtype = gguf.GGMLQuantizationType(type_id)
                block, type_size = gguf.GGML_QUANT_SIZES[qtype]
            except (ValueError, KeyError):
                raise _fail(
                    self.path, f"tensor {name!r} has unknown GGML type {type_id}", "E-GGUF-TYPE"
                ) from None
            count = int(np.prod(dims, dtype=object))
            if count == 0 or dims[0] % block:
                raise ValueError(f"tensor {name!r} has shape {list(dims)} for {qtype.name}")
            nbytes = count // block * type_size
            start = data_start + offset
            if offset % alignment or start + nbytes > size:
                raise _fail(
                    self.path,
                    f"truncated GGUF file: tensor {name!r} needs bytes up to "
                    f"{start + nbytes}, the file has {size}",
                    "E-GGUF-TRUNCATED",
                )
            self.tensors[name] = TensorInfo(name, tuple(reversed(dims)), qtype, start, nbytes)

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
        return name in self.tensors

    def tensor_type(self, name: str) -> str:
        return str(self.tensors[name].qtype.name)

    def info(self, name: str, shape: tuple[int, ...], index: int | None = None) -> TensorInfo:
        """Tensor `name`, checked to exist with Hugging Face shape `shape` (out, in); with
        `index`, its slice `index` along the first (slowest) dimension (one expert's matrix of a
        ``[experts, out, in]`` tensor: contiguous bytes, whole rows of blocks)."""
        if index is not None:
            whole = self.info(name, shape)
            size = whole.nbytes // shape[0]
            return TensorInfo(
                f"{name}[{index}]",
                whole.shape[1:],
                whole.qtype,
                whole.offset + index * size,
                size,
            )
        t = self.tensors.get(name)
        if t is None:
            raise _fail(self.path, f"missing tensor {name!r}", "E-GGUF-TENSOR")
        if t.shape != tuple(shape):
            raise _fail(
                self.path,
                f"tensor {name!r} has shape {list(t.shape)}, expected "
                f"{list(shape)} from the model's metadata",
                "E-GGUF-SHAPE",
            )
        return t

    def tensor(
        self,
        name: str,
        shape: tuple[int, ...],
        dtype: torch.dtype | None = None,
        device: torch.device | str = "cpu",
        index: int | None = None,
    ) -> torch.Tensor:
        """Tensor `name` (checked to have shape `shape`; `index`: its slice, as `info` says) as a
        new `dtype` tensor (float32 when None) on `device`, in the file's row order; its pages are
        released from this process afterwards."""
        import gguf
        import torch

        dtype = torch.float32 if dtype is None else dtype
        t = self.info(name, shape, index)
        q = gguf.GGMLQuantizationType
        dense = {q.F32: torch.float32, q.F16: torch.float16, q.BF16: torch.bfloat16}
        try:
            if t.qtype in dense:
                src = torch.frombuffer(
                    self._map,
                    dtype=dense[t.qtype],
                    count=t.nbytes // dense[t.qtype].itemsize,
                    offset=t.offset,
                )
                out = src.reshape(t.shape).to(device=device, copy=True).to(dtype)
            else:
                out = self._dequantize(t, dtype, torch.device(device))
        finally:
            self._release(t)
        return out

    def blocks(
        self,
        name: str,
        shape: tuple[int, ...],
        device: torch.device | str = "cpu",
        index: int | None = None,
    ) -> torch.Tensor:
        """Tensor `name`'s bytes (`index`: its slice, as `info` says) as they are in the file, a
        new `[rows, row_bytes]` uint8 tensor on `device` (a row is whole blocks); its pages are
        released from this process after."""
        import torch

        t = self.info(name, shape, index)
        rows = int(np.prod(t.shape[:-1], dtype=np.int64))
        try:
            src = torch.frombuffer(self._map, dtype=torch.uint8, count=t.nbytes, offset=t.offset)
            return src.reshape(rows, t.nbytes // rows).to(device=device, copy=True)
        finally:
            self._release(t)

    def _dequantize(self, t: TensorInfo, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
        """A block-quantized tensor, dequantized in bounded row chunks: on `device` by the torch
        decoders of the types `storage: gguf` keeps (`io.ggml_blocks`, bit-equal to the gguf
        package's), since numpy on the host takes minutes over an 8B model's K-quants; by the
        gguf package's numpy code for the other types it implements."""
        import gguf
        import torch

        from aner_lang.runtime.io.ggml_blocks import DEQUANTIZERS, dequantize_blocks

        rows = int(np.prod(t.shape[:-1], dtype=np.int64))
        row_bytes = t.nbytes // rows
        data = np.frombuffer(self._map, np.uint8, t.nbytes, t.offset).reshape(rows, row_bytes)
        out = torch.empty((rows, t.shape[-1]), dtype=dtype, device=device)
        step = max(1, _CHUNK_BYTES // (4 * t.shape[-1]))
        type_size = gguf.GGML_QUANT_SIZES[t.qtype][1]
        for r in range(0, rows, step):
            n = min(step, rows - r)
            if t.qtype.name in DEQUANTIZERS:
                raw = torch.frombuffer(
                    self._map,
                    dtype=torch.uint8,
                    count=n * row_bytes,
                    offset=t.offset + r * row_bytes,
                ).to(device)
                decoded = dequantize_blocks(raw.view(-1, type_size), t.qtype.name)
                out[r : r + n].copy_(decoded.view(n, t.shape[-1]))
                continue
            try:  # a non-finite scale is the weight check's to report, not numpy's warning
                with np.errstate(invalid="ignore", over="ignore"):
                    part = gguf.quants.dequantize(data[r : r + n], t.qtype)
            except NotImplementedError:
                raise _fail(
                    self.path,
                    f"tensor {t.name!r} uses GGML type {t.qtype.name}, which cannot be dequantized",
                    "E-GGUF-TYPE",
                ) from None
            out[r : r + n].copy_(torch.from_numpy(part))
        return out.reshape(t.shape)

    def _release(self, t: TensorInfo) -> None:
        """Drop this process's mapping of the tensor's pages (the page cache keeps them)."""
        page = mmap.PAGESIZE
        start = t.offset // page * page
        if hasattr(self._map, "madvise") and hasattr(mmap, "MADV_DONTNEED"):
            self._map.madvise(mmap.MADV_DONTNEED, start, t.offset + t.nbytes - start)


_OPENED: dict[tuple[object, ...], GGUFFile] = {}
"""The last file `open_gguf` parsed, by what makes it the same file."""


def open_gguf(path: str | Path) -> GGUFFile:
    """The file at `path`, its header parsed once while it stays the same file (resolved path,
    inode, size, modification time): the checks before a run (its tokenizer) and the run's
    `load_model` read one header, not two. Only the last file is kept (its mapping, not its
    data)."""
    where = Path(path)
    try:
        st = where.stat()
    except OSError:
        return GGUFFile(where)  # which says what is wrong
    key = (where.resolve(), st.st_ino, st.st_size, st.st_mtime_ns)
    found = _OPENED.get(key)
    if found is None:
        found = GGUFFile(where)
        _OPENED.clear()
        _OPENED[key] = found
    return found


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
