"""benchmarks/pinned_alloc.py: the copies it pins are the plan's, and a setting whose process fails
(here: no CUDA) is a row with its error, not a stopped benchmark."""

from __future__ import annotations

import json

import pytest
import torch

from aner_lang.runtime.train.footprint import LayerShape, offload_host_bytes


def test_it_pins_what_the_plan_counts_for_a_forward(bench_script):
    pinned = bench_script("pinned_alloc")
    sizes = pinned.copy_sizes("llama3-8b", 14337)
    shape = LayerShape(4096, 4096, 1024, 14336, 32)
    assert sum(sizes) == offload_host_bytes(32, 14337, shape, 2)


@pytest.mark.skipif(torch.cuda.is_available(), reason="the failure it reports is CUDA's absence")
def test_a_setting_that_fails_is_reported_and_the_others_still_run(bench_script, tmp_path):
    pinned = bench_script("pinned_alloc")
    out = tmp_path / "pinned.json"
    args = ["--settings", "default,register-8", "--shape", "tiny", "--tokens", "64"]
    assert pinned.main([*args, "--out", str(out)]) == 0
    rows = json.loads(out.read_text())["rows"]
    assert [r["setting"] for r in rows] == ["default", "register-8"]
    assert all(r["error"] for r in rows)  # this machine has no CUDA: each child says so
