"""Where Triton keeps the kernels it compiles: a persistent folder of Aner's cache, one per Triton
version, unless the user chose one (`TRITON_CACHE_DIR`).

Triton compiles each kernel on its first launch in a process (about a second per kernel) and
reuses a compiled kernel found in its cache folder; its own default (`~/.triton/cache`) is shared
with every other Triton user and kept forever. Aner's folder sits with its other caches
(`$ANER_CACHE_DIR`, default `~/.cache/aner`) under `triton/<version>`, so a Triton upgrade starts
a fresh folder and the stale one can be deleted whole. Within it Triton's own keys already name
the kernel's source, its options, the target and the compiler's versions.
"""

from __future__ import annotations

import os
from pathlib import Path

from aner_lang.runtime.io.fingerprint import cache_dir

VARIABLE = "TRITON_CACHE_DIR"


def folder(triton_version: str) -> Path:
    """Aner's Triton cache folder for one Triton version."""
    return cache_dir() / "triton" / triton_version


def use_persistent_cache(triton_version: str) -> None:
    """Point Triton at Aner's folder unless `TRITON_CACHE_DIR` is set; Triton reads the variable
    when it compiles, so this must run before a kernel's first launch."""
    if VARIABLE not in os.environ:
        os.environ[VARIABLE] = str(folder(triton_version))
