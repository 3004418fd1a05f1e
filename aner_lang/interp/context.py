"""What a builtin implementation with `needs_context=True` receives as its first argument."""

from __future__ import annotations

import sys
from collections.abc import Callable
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
    held: dict[str, Callable[[], None]] = field(default_factory=dict)
    """What a builtin keeps for its next call (`train`: its CUDA graphs and optimizer state, which
    hold GPU memory), by the builtin's name, with the function that lets it go. The interpreter lets it go
    before any other builtin that needs torch runs, unless that one allocates little on the GPU
    (`Builtin.lets_go`), and when the script ends (`let_go`), so that nothing else a script does
    on the GPU finds that memory taken."""

    def let_go(self, unless: str | None = None) -> None:
        """Let go of what builtins hold, except what `unless` (a builtin's name) holds."""
        for name in [n for n in self.held if n != unless]:
            self.held.pop(name)()

    def resolve_path(self, path: str) -> Path:
        """A script-relative path made absolute (absolute paths are kept); a path no file can
        have (a NUL character) is an error."""
        check_name(path)
        return resolve(path, self.script_dir)
