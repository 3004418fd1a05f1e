"""benchmarks/gguf_vs_nf4.py's plumbing on a tiny Q4_1 fixture: both storages train, export and
are served by llama.cpp on the same file, and the figures are what each side really computed."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

from aner_lang.runtime.io.gguf import GGUFFile
from aner_lang.testing.fixture import write_fixture

ROOT = Path(__file__).resolve().parents[2]


def _close(a: float, b: float, rel: float) -> bool:
    return abs(a - b) <= rel * abs(b)


@pytest.mark.slow
def test_quick_run_trains_both_storages_and_scores_them_in_llama_cpp(tmp_path: Path) -> None:
    pytest.importorskip("xllamacpp")
    model = write_fixture(tmp_path / "tiny-q4_1.gguf", "tiny", seed=3, tensor_type="q4_1")
    out = tmp_path / "report.json"
    script = ROOT / "benchmarks" / "gguf_vs_nf4.py"
    command = [sys.executable, str(script), "--quick", "--model", f"tiny={model}"]
    command += ["--work", str(tmp_path / "work"), "--out", str(out)]
    proc = subprocess.run(command, capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    report = json.loads(out.read_text())
    assert report["settings"]["updates"] == 4 and report["torch"] and report["commit"]
    (result,) = report["models"]
    assert result["tensor_types"]["Q4_1"] > 0 and result["held_out_tokens"] > 100
    rows = {r["storage"]: r for r in result["rows"]}
    assert set(rows) == {"gguf", "nf4_double_quant"}
    for storage, row in rows.items():
        losses = [v for k, v in row.items() if "loss" in k]
        assert len(losses) == 5 and all(math.isfinite(v) for v in losses), storage
        assert (tmp_path / "work" / f"tiny-{storage}-lora.gguf").exists()
        # training lowers the held-out loss in Aner, and the served adapter lowers llama.cpp's
        assert row["aner_held_out_loss_tuned"] < row["aner_held_out_loss_base"], storage
        assert row["llamacpp_held_out_loss_tuned"] < result["llamacpp_held_out_loss_base"], storage
    served_base = result["llamacpp_held_out_loss_base"]
    gguf, nf4 = rows["gguf"], rows["nf4_double_quant"]
    # the gguf base is the file's own blocks: Aner and llama.cpp agree on it, with and without
    # the adapter (up to llama.cpp's own arithmetic), and it weighs the file's tensor bytes
    assert _close(gguf["aner_held_out_loss_base"], served_base, 2e-3)
    assert _close(gguf["aner_held_out_loss_tuned"], gguf["llamacpp_held_out_loss_tuned"], 2e-3)
    assert gguf["weights_bytes"] == sum(t.nbytes for t in GGUFFile(model).tensors.values())
    # NF4 re-quantizes the blocks: Aner's NF4 base is not the model llama.cpp serves
    assert not _close(nf4["aner_held_out_loss_base"], served_base, 1e-4)
