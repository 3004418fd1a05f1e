"""benchmarks/train_scale.py's model folder: one built for fewer positions than a run's context
is raised to them, and is then the folder a rebuild for that context writes, weights and config."""

from __future__ import annotations

import json

from safetensors.torch import load_file


def test_a_model_raised_to_more_positions_is_the_model_built_for_them(
    tmp_path, monkeypatch, bench_script
):
    ts = bench_script("train_scale")
    monkeypatch.setitem(ts.SHAPES, "tiny", dict(ts.SHAPES["tiny"]))
    raised, rebuilt = tmp_path / "raised", tmp_path / "rebuilt"
    ts.model_for("tiny", raised, "cpu")
    assert ts._positions(raised) == 8192  # the least a folder is built for
    weights = (raised / "model.safetensors").stat().st_mtime_ns
    ts.SHAPES["tiny"]["context"] = 16384
    ts.model_for("tiny", raised, "cpu")
    assert (raised / "model.safetensors").stat().st_mtime_ns == weights  # not rebuilt
    ts.make_model("tiny", rebuilt, "cpu")
    assert ts._positions(raised) == ts._positions(rebuilt) == 16384
    config = json.loads((raised / "config.json").read_text())
    assert config == json.loads((rebuilt / "config.json").read_text())
    a, b = load_file(raised / "model.safetensors"), load_file(rebuilt / "model.safetensors")
    assert a.keys() == b.keys() and all(a[k].equal(b[k]) for k in a)
    ts.model_for("tiny", raised, "cpu")  # enough positions: left as it is
    assert json.loads((raised / "config.json").read_text()) == config
    assert not list(raised.glob("*.partial"))
