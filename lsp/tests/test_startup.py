"""The server starts fast and never imports torch, cupy or numpy."""

from __future__ import annotations

import subprocess
import sys


def test_server_starts_fast_without_torch():
    """Import the server as `aner lsp` does and count the CPU it costs (wall time on this shared
    2-core box mostly measures the other jobs); the features must never import torch or cupy."""
    probe = (
        "import sys, time; t = time.process_time(); import aner_lang.cli, aner_lsp.server; "
        "print(time.process_time() - t); import aner_lsp.features; aner_lsp.features.registry(); "
        "print(any(m in sys.modules for m in ('torch', 'cupy', 'numpy')))"
    )
    out = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, timeout=60
    ).stdout.split()
    assert out[1] == "False"
    assert float(out[0]) < 1.0, f"server start-up took {out[0]} s of CPU"
