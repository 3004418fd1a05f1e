"""A safetensors file streamed from the tensors' own memory: the bytes `safetensors.torch.save`
makes, without building them in one buffer first.

Why not `safetensors.torch.save`: it copies every tensor into one `bytes` object while holding
the interpreter lock, so a checkpoint written from a background thread would stall the training
loop for the whole copy (seconds for a large optimizer state). Here the header is built in
Python and the tensors' bytes are handed to `hashlib` and to the file as views of their memory,
both of which release the lock.

The layout is safetensors' own: an 8-byte little-endian header length, the JSON header (tensors
ordered by dtype, widest kind first as safetensors orders them, then by name; padded with spaces
to a multiple of 8 bytes), then the tensors' bytes back to back in that order. The tensors are
contiguous CPU tensors on a little-endian host, as every host torch runs on.
"""

from __future__ import annotations

import json
import struct
from collections.abc import Iterator
from typing import BinaryIO

import torch

_DTYPES: dict[torch.dtype, tuple[int, str]] = {
    torch.bool: (0, "BOOL"),
    torch.uint8: (1, "U8"),
    torch.int8: (2, "I8"),
    torch.float8_e5m2: (3, "F8_E5M2"),
    torch.float8_e4m3fn: (4, "F8_E4M3"),
    torch.int16: (5, "I16"),
    torch.float16: (7, "F16"),
    torch.bfloat16: (8, "BF16"),
    torch.int32: (9, "I32"),
    torch.float32: (11, "F32"),
    torch.float64: (12, "F64"),
    torch.int64: (13, "I64"),
}
"""Each dtype's rank in safetensors' `Dtype` enum (the file lists higher ranks first) and name."""


class TensorFile:
    """The safetensors serialisation of `tensors` (CPU tensors, not modified while it lives)."""

    def __init__(self, tensors: dict[str, torch.Tensor]) -> None:
        order = sorted(tensors, key=lambda name: (-_DTYPES[tensors[name].dtype][0], name))
        header: dict[str, dict[str, object]] = {}
        self._data: list[memoryview] = []
        offset = 0
        for name in order:
            t = tensors[name]
            if t.device.type != "cpu" or not t.is_contiguous():
                raise ValueError(f"tensor {name!r} is not a contiguous CPU tensor")
            view = t.reshape(-1).view(torch.uint8).numpy().data.cast("B")
            header[name] = {
                "dtype": _DTYPES[t.dtype][1],
                "shape": list(t.shape),
                "data_offsets": [offset, offset + len(view)],
            }
            offset += len(view)
            self._data.append(view)
        text = json.dumps(header, separators=(",", ":")).encode("utf-8")
        text += b" " * (-len(text) % 8)
        self._head = struct.pack("<Q", len(text)) + text
        self.size = len(self._head) + offset
        """The file's length in bytes."""

    def chunks(self) -> Iterator[memoryview]:
        """The file's bytes in order: the header, then each tensor's memory."""
        yield memoryview(self._head)
        yield from self._data

    def write(self, out: BinaryIO) -> None:
        for chunk in self.chunks():
            out.write(chunk)
