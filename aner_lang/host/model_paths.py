"""Model references: Hugging Face repository ids, and the error for a model path that names
nothing, shared by `aner check`'s precheck, `aner plan` and `load_model`, so that each says the
same.

Aner reads only local files and never downloads. A path written like a Hugging Face hub id
(`HuggingFaceTB/SmolLM2-135M-Instruct`) that names no local file is most likely meant as one, so
the error says so and gives the command that downloads it. A path is read as a hub id when it is
relative, has exactly one `/` between an owner and a name of the hub's characters, the name has
no file suffix of a model or data file, and no local folder of the owner's name exists (when it
does, the path is a local one with a typo).
"""

from __future__ import annotations

import re
from pathlib import Path

from aner_lang.problems.errors import AnerRuntimeError

_HUB_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,95}/[A-Za-z0-9][A-Za-z0-9_.-]{0,95}")
"""A Hugging Face repository id: `owner/name`, each of letters, digits, `_`, `.` and `-`."""
_HUB_URL = re.compile(r"https?://(?:www\.)?(?:huggingface\.co|hf\.co)/([^/?#]+/[^/?#]+)")
_NOT_MODELS = ("datasets", "spaces")
"""The first part of a hub URL's path that names no model repository."""
_FILE_SUFFIXES = (".gguf", ".safetensors", ".bin", ".json", ".jsonl", ".txt", ".pt", ".aner")


def hub_repo(value: object) -> str | None:
    """The Hugging Face model repository id that a model's metadata names, as an id or a
    `https://huggingface.co/owner/name` URL; None for anything else (a dataset or a space, another
    site, not a string)."""
    if not isinstance(value, str):
        return None
    m = _HUB_URL.match(value.strip())
    repo = m.group(1) if m else value.strip()
    if not _HUB_ID.fullmatch(repo) or repo.split("/")[0] in _NOT_MODELS:
        return None
    return repo


def hub_id(given: str, resolved: Path) -> str | None:
    """`given` when it reads as a Hugging Face hub id rather than a local path (rules above)."""
    if not _HUB_ID.fullmatch(given) or given.lower().endswith(_FILE_SUFFIXES):
        return None
    owner = resolved.parent
    return None if owner.exists() else given


def missing_model(given: str, resolved: Path) -> AnerRuntimeError:
    """`E-GGUF-NOT-FOUND` for the model path `given` (as the script wrote it), which resolved to
    `resolved` and names nothing there."""
    repo = hub_id(given, resolved)
    if repo is None:
        return AnerRuntimeError(
            f"{resolved}: no such model file or folder", code="E-GGUF-NOT-FOUND"
        )
    folder = f"models/{repo.split('/')[1]}"
    return AnerRuntimeError(
        f"{resolved}: no such model file or folder; {repo!r} looks like a Hugging Face hub id, "
        "and Aner never downloads",
        code="E-GGUF-NOT-FOUND",
        notes=(
            f"download it first, in the script's folder: hf download {repo} --local-dir {folder} "
            "(`huggingface-cli download` with an older huggingface_hub)",
            f'then load the folder: load_model("{folder}"), or a .gguf file of the model',
        ),
    )
