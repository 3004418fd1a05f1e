"""Every builtin that writes a file or a folder the user names replaces an existing one only on
request: it declares `overwrite: Bool = false` (keyword-only), which the checks before a run and
the call itself honour (`files.check_target`). `train` is the one exception: its checkpoints,
event log and TensorBoard folder are resumed from and appended to, never replaced."""

from __future__ import annotations

from aner_lang.builtins import registry
from aner_lang.builtins.spec import WRITES

APPENDS = {"train"}


def test_every_writer_declares_overwrite_false():
    writers = [
        b
        for overloads in registry().functions.values()
        for b in overloads
        if any(p.path in WRITES for p in b.params) and b.name not in APPENDS
    ]
    assert {b.name for b in writers} >= {"plot", "save_adapter", "export_gguf", "write_json"}
    for b in writers:
        overwrite = [p for p in b.params if p.name == "overwrite"]
        assert overwrite, f"{b.name} writes a path but has no overwrite parameter"
        p = overwrite[0]
        assert (p.type, p.default, p.keyword_only) == ("Bool", "false", True), b.name
