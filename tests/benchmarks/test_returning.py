"""benchmarks/returning.sh: a device call's results packed into one tar, also when it is cut."""

from __future__ import annotations

import os
import subprocess
import tarfile
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "returning.sh"


def _env(tmp_path: Path, every: str) -> dict[str, str]:
    """The script's environment: results under tmp_path/out, its scratch folder in tmp_path."""
    (tmp_path / "out").mkdir()
    return {
        **os.environ,
        "OUT": str(tmp_path / "out"),
        "TMPDIR": str(tmp_path),
        "PACK_EVERY_S": every,
    }


def _names(tgz: Path) -> set[str]:
    with tarfile.open(tgz) as t:
        return {Path(n).name for n in t.getnames() if n != "."}


def test_packs_what_the_command_wrote_and_keeps_its_status(tmp_path: Path) -> None:
    env = _env(tmp_path, "60")
    cmd = 'echo a > "$OUT/a.txt"; mkdir "$OUT/d"; echo b > "$OUT/d/b.txt"; exit 3'
    # its output is closed when it ends: nothing of it (the packer's sleep) waits on
    done = subprocess.run(
        [str(SCRIPT), "r", "bash", "-c", cmd], env=env, capture_output=True, timeout=30, check=False
    )
    assert done.returncode == 3
    assert _names(tmp_path / "out" / "r.tgz") == {"a.txt", "d", "b.txt"}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]  # the scratch folder is gone
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["r.tgz"]


@pytest.mark.parametrize(
    ("signal", "every", "status"),
    [("TERM", "100", {124}), ("KILL", "1", {137, -9})],  # KILL reaches timeout's group too
    ids=["stopped: packed on the way out", "killed: the last periodic pack"],
)
def test_a_call_cut_short_still_returns_what_it_wrote(
    tmp_path: Path, signal: str, every: str, status: set[int]
) -> None:
    env = _env(tmp_path, every)
    name = f"cut{os.getpid()}"  # in the packer's and the command's command lines
    cmd = f'echo a > "$OUT/first.txt"; sleep 30; echo b > "$OUT/never.txt" # {name}'
    done = subprocess.run(
        ["timeout", "-s", signal, "4", str(SCRIPT), name, "bash", "-c", cmd],
        env=env,
        timeout=30,
        check=False,
    )
    assert done.returncode in status
    assert _names(tmp_path / "out" / f"{name}.tgz") == {"first.txt"}
    stray = subprocess.run(["pgrep", "-f", name], capture_output=True, check=False)
    assert stray.stdout == b"", "the packer or the command outlived the script"
