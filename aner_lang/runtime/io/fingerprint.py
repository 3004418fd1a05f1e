"""The base model's fingerprint: sha256 of its GGUF file (or of a Hugging Face folder's files),
computed once and cached.

A checkpoint records which base it was trained on, and loading refuses a different base. Hashing
a 100 MB GGUF costs a fraction of a second, far too much to pay at every checkpoint, so the digest
is cached in a small JSON file keyed by the file's resolved path, and trusted only while each file's
size, inode, mtime and ctime (nanoseconds) are unchanged: mtime alone can be set back by anyone
who can write the file (`touch -d`), ctime cannot (the kernel sets it on every change, `utime`
included). The cache lives in ``$ANER_CACHE_DIR`` (default
``$XDG_CACHE_HOME/aner`` or ``~/.cache/aner``); a cache that cannot be read or written is simply
not used, since the digest can always be recomputed.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from pathlib import Path

from aner_lang.host import files, json_text
from aner_lang.problems.errors import AnerRuntimeError

_CACHE_NAME = "fingerprints.json"
_CHUNK = 8 * 1024 * 1024


def cache_dir() -> Path:
    """Where Aner keeps small caches (fingerprints here; kernels elsewhere)."""
    if "ANER_CACHE_DIR" in os.environ:
        return Path(os.environ["ANER_CACHE_DIR"])
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "aner"


def sha256_file(path: Path) -> str:
    """Hex sha256 of a file's bytes, read in large chunks."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(_CHUNK):
            h.update(chunk)
    return h.hexdigest()


def _read_cache(file: Path) -> dict[str, dict[str, object]]:
    try:
        data = json_text.loads(files.read_text(file, files.SCRIPT_LIMIT))
    except (AnerRuntimeError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def _write_cache(file: Path, data: dict[str, dict[str, object]]) -> None:
    """Replace the cache atomically, so concurrent runs never see half a file."""
    try:
        file.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=file.parent, prefix=".fingerprints-", suffix=".tmp")
    except OSError:
        return
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            json.dump(data, f, indent=1, sort_keys=True)
        os.replace(tmp, file)
    except OSError:
        Path(tmp).unlink(missing_ok=True)  # a full disk leaves no temporary file behind


def _files(p: Path) -> list[Path]:
    """The files a fingerprint covers: the file itself, or a folder's files (not sub-folders)."""
    return sorted(f for f in p.iterdir() if f.is_file()) if p.is_dir() else [p]


def _digest(p: Path) -> str:
    if not p.is_dir():
        return sha256_file(p)
    h = hashlib.sha256()
    for f in _files(p):
        h.update(f"{f.name}\0{sha256_file(f)}\n".encode())
    return h.hexdigest()


def fingerprint(path: str | Path) -> str:
    """sha256 of the GGUF at `path` (of a folder: of its files' names and digests), from the cache
    when the total size and every file's inode, mtime and ctime still match."""
    p = Path(path).resolve()
    try:
        stats = [f.stat() for f in _files(p)]
    except OSError as e:
        raise AnerRuntimeError(
            f"cannot fingerprint base model {p}: {e.strerror}", code="E-FINGERPRINT"
        ) from None
    size = sum(st.st_size for st in stats)
    stamps = [[st.st_ino, st.st_mtime_ns, st.st_ctime_ns] for st in stats]
    cache_file = cache_dir() / _CACHE_NAME
    cache = _read_cache(cache_file)
    entry = cache.get(str(p))
    if (
        isinstance(entry, dict)
        and entry.get("size") == size
        and entry.get("stamps") == stamps
        and isinstance(entry.get("sha256"), str)
    ):
        return str(entry["sha256"])
    digest = _digest(p)
    cache[str(p)] = {"size": size, "stamps": stamps, "sha256": digest}
    _write_cache(cache_file, cache)
    return digest
