"""The server starts fast, loads the parser and checker only after start-up, and never imports
torch, cupy or numpy (not even for the file checks)."""

from __future__ import annotations

import subprocess
import sys

PROBE = """
import sys
import aner_lang.cli, aner_lsp.server
print(any(m in sys.modules for m in ("aner_lang.check", "lark", "torch", "cupy", "numpy")))
from aner_lang.check import analyze
from aner_lsp.features import completion, hover
from aner_lsp.positions import LineIndex
text = 'let m = load_model("m.gguf")\\nlet a = lora(m, '
completion.completion(analyze(text), text, len(text), None)
hover.hover(analyze(text), text.index("lora"), LineIndex(text))
from aner_lang.check.surroundings import surroundings  # the server's file checks
script = 'let m = load_model("m.gguf", device: cuda)\\nlet d = load_jsonl("d.jsonl", field: "t")\\n'
assert surroundings(analyze(script, "/nonexistent/s.aner"), before_running=False)
print(any(m in sys.modules for m in ("torch", "cupy", "numpy")))
"""


def test_server_starts_fast_without_torch():
    """Import the server as `aner lsp` does: registering the features must not load the checker
    or its parser (they load after `initialize` is answered), nor torch, cupy or numpy; answering
    and the file checks must not load torch, cupy or numpy either. What start-up imports is
    asserted, not how long it takes (a timed test fails on a loaded machine)."""
    out = subprocess.run(
        [sys.executable, "-c", PROBE], capture_output=True, text=True, timeout=60
    ).stdout.split()
    assert out == ["False", "False"], out
