"""Where a model's tensors come from: a GGUF file or a Hugging Face folder, behind one interface.

A `TensorSource` hands out one tensor at a time, by the `aner_lang.architectures.Weight` that
describes it, in Hugging Face layout (a GGUF's permuted q/k rows are un-permuted here) as a new
tensor of the requested dtype on the requested device. Loading, TinyLoRA's re-read of unquantized
weights and the exporters read a model through it, so every source works everywhere.

* `GGUFSource`: one ``.gguf`` file (`aner_lang.runtime.io.gguf.GGUFFile`).
* `SafetensorsSource`: a folder with ``config.json`` and ``model.safetensors`` or shards listed in
  ``model.safetensors.index.json``, read through the `safetensors` library (``safe_open``). A shard
  is opened for each tensor read and closed after, so its memory map never keeps more than that
  tensor resident.

Sources know file formats, not transformers: the head count a GGUF q/k weight is permuted by is
read from the `config` object passed in (by the config field the architecture table names).
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any, Protocol

import torch

from aner_lang.architectures import ARCHITECTURES, Kind, Weight
from aner_lang.host import files, json_text
from aner_lang.problems.errors import AnerRuntimeError
from aner_lang.runtime.io.gguf import GGUFFile, open_gguf, unpermute_rows

HF_CONFIG = "config.json"
SAFETENSORS = "model.safetensors"
SAFETENSORS_INDEX = "model.safetensors.index.json"
MAX_JSON_BYTES = 64 << 20
"""The largest JSON file of a model folder read (configs and indexes are kilobytes; tokenizer.json
of a 256k vocabulary is ~20 MB)."""


class TensorSource(Protocol):
    """A model file (or folder) that hands out tensors one at a time, in Hugging Face layout."""

    path: Path

    def has(self, weight: Weight) -> bool: ...

    def check(self, weight: Weight, config: Any) -> None:
        """Raise the source's own error when the tensor is missing or not of the shape the
        config's fields give; reads no tensor data."""
        ...

    def nbytes(self, weight: Weight) -> int:
        """Bytes the tensor occupies in the file (for progress)."""
        ...

    def read(
        self, weight: Weight, config: Any, dtype: torch.dtype, device: torch.device
    ) -> torch.Tensor:
        """The tensor as a new `dtype` tensor on `device`, Hugging Face layout, checked to have
        the shape the config's fields give."""
        ...

    def is_bfloat16(self, weight: Weight) -> bool:
        """Whether the source stores the tensor in bfloat16 (so 16-bit storage keeps it exact)."""
        ...


def expected_shape(weight: Weight, config: Any) -> tuple[int, ...]:
    return tuple(int(getattr(config, f)) for f in weight.shape)


class GGUFSource:
    """A GGUF file's tensors by their Hugging Face identity."""

    def __init__(self, gguf: GGUFFile) -> None:
        self.gguf = gguf
        self.path = gguf.path

    def has(self, weight: Weight) -> bool:
        return self.gguf.has_tensor(weight.gguf)

    def check(self, weight: Weight, config: Any) -> None:
        self.gguf.info(weight.gguf, self._shape(weight, config))

    def nbytes(self, weight: Weight) -> int:
        whole = self.gguf.tensors[weight.gguf]
        return whole.nbytes // whole.shape[0] if weight.expert is not None else whole.nbytes

    @staticmethod
    def _shape(weight: Weight, config: Any) -> tuple[int, ...]:
        """The GGUF tensor's shape: an expert's matrix is one slice of ``[num_experts, out, in]``."""
        shape = expected_shape(weight, config)
        return shape if weight.expert is None else (int(config.num_experts), *shape)

    def is_bfloat16(self, weight: Weight) -> bool:
        return bool(self.gguf.tensors[weight.gguf].qtype.name == "BF16")

    def read(
        self, weight: Weight, config: Any, dtype: torch.dtype, device: torch.device
    ) -> torch.Tensor:
        t = self.gguf.tensor(weight.gguf, self._shape(weight, config), dtype, device, weight.expert)
        if weight.rope_heads:
            t = unpermute_rows(t, int(getattr(config, weight.rope_heads))).contiguous()
        return t

    def blocks(self, weight: Weight, config: Any, device: torch.device) -> tuple[torch.Tensor, str]:
        """The tensor's bytes as in the file, `[out, row_bytes]` uint8 on `device` with rows in
        Hugging Face order (a q/k weight's byte rows un-permuted: a row is whole blocks), and its
        GGML type name."""
        t = self.gguf.blocks(weight.gguf, self._shape(weight, config), device, weight.expert)
        if weight.rope_heads:
            t = unpermute_rows(t, int(getattr(config, weight.rope_heads))).contiguous()
        return t, self.gguf.tensor_type(weight.gguf)


def read_json(path: Path, code: str) -> Any:
    """A JSON file of a model folder, read through `aner_lang.host.files` (a regular file of at most
    `MAX_JSON_BYTES`), with a clear error when it is bad."""
    try:
        return json_text.loads(files.read_text(path, MAX_JSON_BYTES))
    except AnerRuntimeError as exc:
        raise AnerRuntimeError(exc.message, code=code, notes=exc.notes) from None
    except ValueError as exc:
        raise AnerRuntimeError(f"{path}: cannot be read as JSON ({exc})", code=code) from None


class SafetensorsSource:
    """A Hugging Face model folder's safetensors weights (single file or sharded)."""

    def __init__(self, folder: Path) -> None:
        from safetensors import SafetensorError, safe_open

        self.path = folder
        self.config: dict[str, Any] = read_json(folder / HF_CONFIG, "E-HF-CONFIG")
        if not isinstance(self.config, dict):
            raise AnerRuntimeError(f"{folder / HF_CONFIG}: not a JSON object", code="E-HF-CONFIG")
        index = folder / SAFETENSORS_INDEX
        if index.is_file():
            listing = read_json(index, "E-HF-WEIGHTS")
            weight_map = listing.get("weight_map") if isinstance(listing, dict) else None
            if not isinstance(weight_map, dict):
                raise AnerRuntimeError(f"{index}: no weight_map object", code="E-HF-WEIGHTS")
            shards = sorted(set(weight_map.values()))
        elif (folder / SAFETENSORS).is_file():
            shards = [SAFETENSORS]
        else:
            raise AnerRuntimeError(
                f"{folder}: no {SAFETENSORS} or {SAFETENSORS_INDEX}",
                code="E-HF-WEIGHTS",
                notes=("a Hugging Face model folder holds its weights as safetensors files",),
            )
        self._where: dict[str, Path] = {}
        self._shapes: dict[str, tuple[int, ...]] = {}
        self._nbytes: dict[str, int] = {}
        self._dtypes: dict[str, str] = {}
        for shard in shards:
            file = (folder / shard).resolve()
            if folder.resolve() not in file.parents or not file.is_file():
                raise AnerRuntimeError(
                    f"{folder}: shard {shard!r} is missing or outside the folder",
                    code="E-HF-WEIGHTS",
                )
            try:
                with safe_open(str(file), "pt") as f:
                    for key in f.keys():
                        sl = f.get_slice(key)
                        shape = tuple(int(d) for d in sl.get_shape())
                        self._where[key] = file
                        self._shapes[key] = shape
                        self._nbytes[key] = _dtype_bytes(sl.get_dtype()) * math.prod(shape)
                        self._dtypes[key] = sl.get_dtype().upper()
            except (OSError, SafetensorError) as exc:
                raise AnerRuntimeError(
                    f"{file}: not a readable safetensors file ({exc})", code="E-HF-WEIGHTS"
                ) from None

    def has(self, weight: Weight) -> bool:
        return weight.hf in self._where

    def check(self, weight: Weight, config: Any) -> None:
        if weight.hf not in self._shapes:
            raise AnerRuntimeError(
                f"{self.path}: missing tensor {weight.hf!r}", code="E-HF-WEIGHTS"
            )
        want = expected_shape(weight, config)
        if self._shapes[weight.hf] != want:
            raise AnerRuntimeError(
                f"{self.path}: tensor {weight.hf!r} has shape {list(self._shapes[weight.hf])}, "
                f"expected {list(want)} from config.json",
                code="E-HF-SHAPE",
            )

    def nbytes(self, weight: Weight) -> int:
        return self._nbytes[weight.hf]

    def is_bfloat16(self, weight: Weight) -> bool:
        return self._dtypes.get(weight.hf) == "BF16"

    def read(
        self, weight: Weight, config: Any, dtype: torch.dtype, device: torch.device
    ) -> torch.Tensor:
        from safetensors import safe_open

        self.check(weight, config)
        with safe_open(str(self._where[weight.hf]), "pt") as f:
            t = f.get_tensor(weight.hf)
        if t.device != device:
            t = t.to(device)
        offset = ARCHITECTURES[config.architecture].hf_norm_offset
        if weight.kind is Kind.NORM and offset:  # Gemma stores w of the factor 1 + w
            return t.to(torch.float32).add(offset).to(dtype)
        return t.to(dtype)


_DTYPE_BYTES = {
    "F64": 8,
    "F32": 4,
    "F16": 2,
    "BF16": 2,
    "I64": 8,
    "I32": 4,
    "I16": 2,
    "I8": 1,
    "U8": 1,
    "BOOL": 1,
}


def _dtype_bytes(name: str) -> int:
    return _DTYPE_BYTES.get(name.upper(), 1)


def open_source(path: Path) -> tuple[TensorSource, GGUFFile | None]:
    """The source at `path`: a folder is a Hugging Face model, a file a GGUF (also returned, for
    its metadata)."""
    if path.is_dir():
        return SafetensorsSource(path), None
    gguf = open_gguf(path)
    return GGUFSource(gguf), gguf
