"""What a model file or folder says without its weights: where a script's model path points, its
tokenizer and its hyper-parameters. Nothing here imports torch, so the checks before a run (the
plan, the training data's scored tokens) read a model's header without the weights' libraries,
and a tokenizer built for them is kept for the run's `load_model` of the same file.
"""

from __future__ import annotations

from pathlib import Path

from aner_lang.host import files, json_text
from aner_lang.host.model_paths import missing_model
from aner_lang.host.prechecks import PACKAGE_SCHEME
from aner_lang.problems.errors import AnerRuntimeError
from aner_lang.runtime.io.gguf import GGUFFile, open_gguf
from aner_lang.runtime.io.packages import packaged_model
from aner_lang.runtime.model.config import ModelConfig, config_from_gguf, config_from_hf
from aner_lang.runtime.model.tokenizer import Tokenizer


def model_location(path: str, script_dir: Path) -> Path:
    """`model_file` for a script in `script_dir` (the checks before a run resolve it alike)."""
    if path.startswith(PACKAGE_SCHEME):
        return packaged_model(path)
    files.check_name(path)
    resolved = files.resolve(path, script_dir)
    if not resolved.exists():
        raise missing_model(path, resolved)
    return resolved


TOKENIZERS_KEPT = 4
"""Tokenizers kept by `model_tokenizer` (a 262k-token vocabulary takes tens of MB)."""
_tokenizers: dict[tuple[Path, tuple[tuple[str, int, int], ...]], Tokenizer] = {}
_TOKENIZER_FILES = (".json", ".jinja", ".model", ".txt")
"""The files of a Hugging Face folder a tokenizer may be built from (by their suffix)."""


def model_tokenizer(path: Path, gguf: GGUFFile | None = None) -> Tokenizer:
    """The tokenizer of the model file or folder at `path`, without its weights (`gguf`: the
    file already opened). It is kept for the file as it is (path, size, modification time), so
    the checks before a run and the run's `load_model` build it once."""
    key = (path.resolve(), _stamp(path))
    found = _tokenizers.get(key)
    if found is None:
        if path.is_dir():
            found = Tokenizer.from_hf_folder(path)
        else:
            found = Tokenizer.from_gguf(gguf if gguf is not None else open_gguf(path))
        while len(_tokenizers) >= TOKENIZERS_KEPT:
            del _tokenizers[next(iter(_tokenizers))]
        _tokenizers[key] = found
    return found


def model_config(path: str, script_dir: Path) -> ModelConfig:
    """The hyper-parameters of the model at `path` (as `load_model` resolves it), header only."""
    file = model_location(path, script_dir)
    if file.is_dir():
        text = files.read_text(file / "config.json", files.TEXT_LIMIT)
        try:
            cfg = json_text.loads(text)
        except ValueError as e:
            raise AnerRuntimeError(f"{file}/config.json: {e}", code="E-HF-CONFIG") from None
        return config_from_hf(cfg, file)
    return config_from_gguf(open_gguf(file))


def gguf_storage_of_folder(path: str | Path) -> AnerRuntimeError:
    """The error of `storage: gguf` asked of a Hugging Face folder."""
    return AnerRuntimeError(
        f"{path}: storage: gguf keeps a GGUF file's quantized blocks, but this is a "
        "Hugging Face folder",
        code="E-GGUF-STORAGE",
        notes=("load the folder with storage: float32, float16 or nf4_double_quant",),
    )


def gguf_base_bytes(path: str, script_dir: Path) -> int:
    """What a `storage: gguf` base of the file at `path` keeps on the device: every tensor's bytes
    as the file stores them (the loader keeps blocks, F16, BF16 and F32 tensors as they are;
    `memory()` counts the same bytes). A folder has no such tensors: `load_model` refuses it, and
    so does this."""
    file = model_location(path, script_dir)
    if file.is_dir():
        raise gguf_storage_of_folder(path)
    return sum(t.nbytes for t in open_gguf(file).tensors.values())


def _stamp(path: Path) -> tuple[tuple[str, int, int], ...]:
    """The size and modification time of the file, or of each tokenizer file of the folder."""
    found = sorted(path.iterdir()) if path.is_dir() else [path]
    stamps = []
    for f in found:
        if f is path or f.suffix in _TOKENIZER_FILES:
            st = f.stat()
            stamps.append((f.name, st.st_size, st.st_mtime_ns))
    return tuple(stamps)
