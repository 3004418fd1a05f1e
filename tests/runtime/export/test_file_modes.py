"""Every file a script writes (every export and save format, checkpoints, logs, JSON, pictures)
gets the permissions a new file gets from the umask, and every folder those of a new folder,
whichever library wrote it (safetensors writes its files 0600 on its own)."""

from __future__ import annotations

import io
import os
import stat
from collections.abc import Iterator
from pathlib import Path

import pytest

from aner_lang.builtins import registry
from aner_lang.check import analyze
from aner_lang.interp import ExecContext, run

# One call of every builtin that writes a file a script names, in every format it writes.
SCRIPT = """
let base = load_model("{model}", storage: float32, device: cpu)
let a = lora(base, rank: 2)
let data = texts(["one two three four", "five six seven eight"], context: 16)
let _run = train(a, data, steps: 2, checkpoints: "out/ckpt", checkpoint_every: 1,
  log_dir: "out/tb")
let _p = plot("out/ckpt/events.jsonl", "out/loss.png")
let _s1 = save_adapter(a, "out/peft", format: peft)
let _s2 = save_adapter(a, "out/aner", format: safetensors)
let _e1 = export_gguf(merge(a), "out/merged.gguf")
let _e2 = export_lora_gguf(a, "out/lora.gguf")
let _e3 = export_hf(merge(a), "out/hf")
write_json("out/result.json", [1, 2])
"""
WRITE_PARAMS = {"overwrite", "to", "checkpoints", "log_dir"}
"""A builtin with one of these parameters writes files."""


def _written(root: Path) -> Iterator[tuple[Path, bool]]:
    for folder, dirs, names in os.walk(root):
        yield from ((Path(folder, d), True) for d in dirs)
        yield from ((Path(folder, n), False) for n in names)


def test_the_script_calls_every_writer() -> None:
    writers = {
        name
        for name, overloads in registry().functions.items()
        if any(p.name in WRITE_PARAMS for b in overloads for p in b.params)
    }
    assert writers == {name for name in writers if f"{name}(" in SCRIPT}


@pytest.mark.parametrize("mask", [0o022, 0o027])
def test_every_written_file_has_the_umask_s_permissions(
    tiny_gguf: Path, tmp_path: Path, mask: int
) -> None:
    pytest.importorskip("matplotlib")
    analysis = analyze(SCRIPT.format(model=tiny_gguf), str(tmp_path / "s.aner"))
    assert not analysis.errors, analysis.errors
    old = os.umask(mask)
    try:
        run(analysis, ExecContext(script_dir=tmp_path, stdout=io.StringIO()))
    finally:
        os.umask(old)
    found = list(_written(tmp_path / "out"))
    names = {p.name for p, _ in found}
    assert {"adapter_model.safetensors", "adapter.safetensors", "model.safetensors"} <= names
    for path, is_folder in found:
        mode = stat.S_IMODE(path.lstat().st_mode)
        assert mode == (0o777 if is_folder else 0o666) & ~mask, (path, oct(mode))
