"""benchmarks/train_e2e.py's plumbing on CPU: both sides run as whole processes on one folder and
JSONL, and the numbers it reports come from what each side really did."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_dry_run_trains_both_sides_on_the_same_work(tmp_path: Path) -> None:
    pytest.importorskip("trl")
    proc = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "train_e2e.py"), "--dry-run", "--out", str(tmp_path)],
        capture_output=True, text=True, timeout=600, cwd=ROOT,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    report = json.loads((tmp_path / "train_e2e.json").read_text())
    rows = {r["side"]: r for r in report["shapes"][0]["rows"]}
    assert set(rows) == {"aner", "peft"}
    for side, row in rows.items():
        assert row["exit"] == 0, row
        assert row["updates"] == 6, side
        assert 0 < row["first_update_s"] < row["wall_s"]
        assert (tmp_path / "tiny" / f"{side}-1" / "adapter" / "adapter_config.json").exists()
    # the same model, data and settings: the losses of the two trainers agree closely
    aner, peft = rows["aner"], rows["peft"]
    phases = aner["before_start_phases"]
    assert 0 < phases["load_model"] < aner["before_start_s"]
    assert 0 < phases["checks"] < aner["before_start_s"]  # `aner run`'s own, before the script
    assert abs(aner["final_loss"] - peft["final_loss"]) / peft["final_loss"] < 0.01
    assert abs(aner["validation_loss"] - peft["validation_loss"]) / peft["validation_loss"] < 0.01
