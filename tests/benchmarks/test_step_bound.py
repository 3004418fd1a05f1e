"""benchmarks/step_bound.py: the products it times are exactly the model's base linears, the
floor adds them up per layer, and the 1.5x arithmetic against a train_scale run is right."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def sb(bench_script: Callable[[str], ModuleType]) -> ModuleType:
    return bench_script("step_bound")


def test_products_are_the_models_linears(sb: ModuleType) -> None:
    """Per layer the products multiply by every base weight of a transformers model of the shape
    once (q/k/v and gate/up stacked), and the lm_head by the output embedding."""
    import torch
    from transformers import AutoModelForCausalLM

    config = sb.bench.hf_config("tiny")
    config.tie_word_embeddings = False
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config)
    layer = model.model.layers[0]
    linears = {
        n: m.weight.shape for n, m in layer.named_modules() if isinstance(m, torch.nn.Linear)
    }
    prods = sb.products(sb.dims("tiny"))
    assert prods["qkv"] == (
        sum(linears[f"self_attn.{p}_proj"][0] for p in "qkv"),
        config.hidden_size,
    )
    assert prods["o"] == tuple(linears["self_attn.o_proj"])
    gate, up = linears["mlp.gate_proj"], linears["mlp.up_proj"]
    assert prods["gate_up"] == (gate[0] + up[0], gate[1])
    assert prods["down"] == tuple(linears["mlp.down_proj"])
    assert prods["lm_head"] == tuple(model.lm_head.weight.shape)
    per_layer = sum(n * k for name, (n, k) in prods.items() if name != "lm_head")
    assert per_layer == sum(s[0] * s[1] for s in linears.values())


def test_floor_sums_layers_attention_and_dequantization(sb: ModuleType) -> None:
    d = {**sb.dims("tiny"), "layers": 10}
    prods = {
        n: {"forward_us": 100.0, "grad_input_us": 50.0} for n in ("qkv", "o", "gate_up", "down")
    }
    prods["lm_head"] = {"forward_us": 1000.0, "grad_input_us": 2000.0}
    floor = sb.floors(d, 2048, prods, {"us": 200.0}, 30.0)
    assert floor["gemm_ms"] == pytest.approx((10 * 4 * 150 + 3000) / 1000)  # 9 ms
    assert floor["attention_ms"] == pytest.approx(2.0)
    assert floor["floor_ms"] == pytest.approx(11.0)
    assert floor["dequant_ms"] == pytest.approx(0.6)  # forward and backward, every layer
    assert floor["floor_with_dequant_tokens_per_s"] == pytest.approx(2048 / 11.6e-3)
    assert "floor_with_dequant_ms" not in sb.floors(d, 2048, prods, {"us": 200.0}, None)


def test_against_gives_the_step_time_one_and_a_half_unsloth_needs(
    sb: ModuleType, tmp_path: Path
) -> None:
    run = tmp_path / "train_scale.json"
    rows = [{"side": "aner", "tokens_per_s": 14000.0}, {"side": "unsloth", "tokens_per_s": 10240.0}]
    run.write_text(json.dumps([{"rows": []}, {"rows": rows}]))  # the last report is the run's
    floor = {"floor_ms": 100.0, "floor_with_dequant_ms": 110.0}
    aner, unsloth = sb.against(run, 2048, floor)
    assert aner == {"side": "aner", "tokens_per_s": 14000.0}
    assert unsloth["needed_ms_for_1_5x"] == pytest.approx(2048 / 15360 * 1000)  # 133.3 ms
    assert unsloth["left_beside_floor_ms"] == pytest.approx(2048 / 15360 * 1000 - 100)
    assert unsloth["left_beside_dequant_floor_ms"] == pytest.approx(2048 / 15360 * 1000 - 110)


def test_dry_run_writes_its_report(tmp_path: Path) -> None:
    out = tmp_path / "bound.json"
    proc = subprocess.run(
        [
            sys.executable,
            str(ROOT / "benchmarks" / "step_bound.py"),
            "--dry-run",
            "--out",
            str(out),
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    report = json.loads(out.read_text())
    assert report["shape"] == "tiny" and set(report["products"]) == {
        "qkv",
        "o",
        "gate_up",
        "down",
        "lm_head",
    }
    assert report["attention"]["backend"] == "MATH" and report["dequant_layer_us"] is None
