"""Every path a script names for output, where something of the wrong kind is in the way: a file
where a folder is written, a folder where a file is written, a file where a folder above it
should be. Each is an E-FILE-KIND error at the call's line naming the path in the way, never
E-INTERNAL, and what is in the way is left as it was."""

from __future__ import annotations

from pathlib import Path

import pytest

from aner_lang.cli import main as aner

SETUP = """let m = load_model("{gguf}", storage: float32, device: cpu)
let data = texts(["Aner makes model adaptation explicit."], context: 16)
let a = lora(m, rank: 2, alpha: 4.0, seed: 3)
let p = profile(precision: float32, optimizer: adamw, kernel: host_tiled)
print(train(lora(m, rank: 2, alpha: 4.0, seed: 3), data, p, steps: 1, log: "events.jsonl"))
"""
LINE = SETUP.count("\n") + 1
FOLDERS = {
    "checkpoints": 'print(train(a, data, p, steps: 1, checkpoints: "{out}"))',
    "log_dir": 'print(train(a, data, p, steps: 1, log_dir: "{out}"))',
    "save_adapter": 'print(save_adapter(a, "{out}"))',
    "export_hf": 'print(export_hf(m, "{out}"))',
}
FILES = {
    "log": 'print(train(a, data, p, steps: 1, log: "{out}"))',
    "write_json": 'write_json("{out}", [1])',
    "export_gguf": 'print(export_gguf(m, "{out}"))',
    "plot": 'print(plot("events.jsonl", "{out}.png"))',
}


def _folder_in_the_way(root: Path) -> tuple[str, Path]:
    """A non-empty folder where a file is to be written."""
    (root / "taken.png").mkdir()
    (root / "taken.png" / "mine.txt").write_text("mine")
    (root / "taken").mkdir()
    (root / "taken" / "mine.txt").write_text("mine")
    return "taken", root / "taken"


def _file_in_the_way(root: Path) -> tuple[str, Path]:
    """A file where a folder is to be written."""
    (root / "taken").write_text("mine")
    return "taken", root / "taken"


def _file_above(root: Path) -> tuple[str, Path]:
    """A file where a folder above the output should be."""
    (root / "notes").write_text("mine")
    return "notes/sub/out", root / "notes"


def _cases() -> list[tuple[str, str, object]]:
    cases = [(n, call, _file_in_the_way) for n, call in FOLDERS.items()]
    cases += [(n, call, _folder_in_the_way) for n, call in FILES.items()]
    cases += [(n, call, _file_above) for n, call in {**FOLDERS, **FILES}.items()]
    return cases


@pytest.mark.parametrize(
    "name, call, obstacle",
    _cases(),
    ids=[f"{n}-{o.__name__.strip('_')}" for n, _, o in _cases()],  # type: ignore[attr-defined]
)
def test_an_output_path_of_the_wrong_kind_is_a_located_error(
    tmp_path, capsys, tiny_bytes_gguf, name, call, obstacle
):
    out, in_the_way = obstacle(tmp_path)
    before = {p: p.read_bytes() for p in tmp_path.rglob("*") if p.is_file()}
    script = tmp_path / "s.aner"
    script.write_text(SETUP.format(gguf=tiny_bytes_gguf) + call.format(out=out) + "\n")
    assert aner(["run", str(script)]) == 1
    err = capsys.readouterr().err
    first = next(line for line in err.splitlines() if "error[" in line)
    assert first.startswith(f"{script}:{LINE}:") and "error[E-FILE-KIND]" in first, err
    assert str(in_the_way) in first and "Traceback" not in err, err
    assert all(p.read_bytes() == data for p, data in before.items())
    assert in_the_way.is_file() == (obstacle is not _folder_in_the_way)
