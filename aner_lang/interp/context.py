"""What a builtin implementation with `needs_context=True` receives as its first argument."""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import TextIO

from aner_lang.host.files import check_name, resolve


@dataclass
class ExecContext:
    """The running script's surroundings: its directory (relative paths in scripts are relative to
    it, not to the shell's working directory) and the stream `print` writes to."""

    script_dir: Path = field(default_factory=Path.cwd)
    stdout: TextIO = field(default_factory=lambda: sys.stdout)
    script_path: Path | None = None
    writes_files: bool = True
    """False on the ranks other than 0 of a distributed run: only rank 0 writes (and prints)."""

    def resolve_path(self, path: str) -> Path:
        """A script-relative path made absolute (absolute paths are kept); a path no file can
        have (a NUL character) is an error."""
        check_name(path)
        return resolve(path, self.script_dir)
