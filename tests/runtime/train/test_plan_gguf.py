"""`aner plan` of a `storage: gguf` base: its weights are the file's own tensor bytes (what the
loader keeps and `memory()` reports), for every tensor type and the real SmolLM2 Q4_1, with the
bounded dequantization tile it computes through (the fused kernels' buffer on CUDA); a folder is
refused as `load_model` refuses it."""

from __future__ import annotations

from pathlib import Path

import pytest

from aner_lang.check import analyze
from aner_lang.runtime.ggml.linear import GGUFLinear
from aner_lang.runtime.load.loader import load_model
from aner_lang.runtime.model.chunking import row_slices
from aner_lang.runtime.nf4.host_tiled import DEFAULT_TILE_BYTES
from aner_lang.runtime.train.memory import memory_report
from aner_lang.runtime.train.plan import main, plan_calls
from aner_lang.testing.fixture import TENSOR_TYPES, write_fixture

SCRIPT = """let base = load_model("{model}", storage: {storage}, device: {device})
let a = lora(base, rank: 4, targets: [q_proj, v_proj])
let _run = train(a, texts(["one", "two"], context: 32), steps: 3)
"""


def _peak(model: Path, storage: str, device: str = "cpu") -> int:
    script = model.parent / f"{storage}-{device}.aner"
    script.write_text(SCRIPT.format(model=model.name, storage=storage, device=device))
    analysis = analyze(script.read_text(), str(script))
    assert not analysis.errors
    (info,) = [i for i in analysis.calls.values() if i.name == "train"]
    (planned,) = plan_calls(analysis, info, model.parent)
    assert planned.peak is not None, planned.lines
    return planned.peak


def _check(model: Path) -> None:
    """The plan of a gguf base differs from the float32 plan of the same file by exactly what the
    two loaded bases weigh apart, plus the dequantization tile (float32 needs none)."""
    gguf = memory_report(load_model(model, "gguf", "cpu")).weights
    dense = memory_report(load_model(model, "float32", "cpu")).weights
    assert _peak(model, "gguf") - _peak(model, "float32") == gguf - dense + DEFAULT_TILE_BYTES


@pytest.mark.parametrize("tensor_type", TENSOR_TYPES)
def test_a_gguf_base_is_planned_at_its_files_tensor_bytes(tmp_path: Path, tensor_type: str) -> None:
    _check(write_fixture(tmp_path / "m.gguf", "tiny", seed=2, tensor_type=tensor_type))


@pytest.mark.slow
def test_the_real_smollm2_q4_1_is_planned_at_its_blocks(smollm2_path: Path, tmp_path: Path) -> None:
    model = tmp_path / smollm2_path.name
    model.symlink_to(smollm2_path)
    _check(model)
    # and not as NF4: the plan of the file's Q4_1 blocks is not the NF4 estimate
    assert _peak(model, "gguf") != _peak(model, "nf4_double_quant")


def test_a_gguf_base_on_cuda_is_planned_with_the_fused_kernels_buffer(tmp_path: Path) -> None:
    """On CUDA the fused GGUF kernels decode each weight (in row slices past the limit) into one
    buffer of the compute dtype, as NF4's do: the largest slice of any
    block-quantized weight, the tied embedding's here, instead of the host tile (fp32 under the
    default float32 profile)."""
    model = write_fixture(tmp_path / "m.gguf", "tiny", seed=2, tensor_type="q8_0")
    kept = load_model(model, "gguf", "cpu")
    gguf = memory_report(kept).weights
    dense = memory_report(load_model(model, "float32", "cpu")).weights
    largest = max(
        row_slices(m.out_features, m.in_features)[0][1] * m.in_features
        for m in kept.module.modules()
        if isinstance(m, GGUFLinear)
    )
    assert largest == kept.config.vocab_size * kept.config.hidden_size
    assert _peak(model, "gguf", "cuda") - _peak(model, "float32", "cuda") == (
        gguf - dense + 4 * largest
    )


def test_storage_gguf_of_a_folder_is_refused_by_the_plan(tmp_path: Path, capsys) -> None:  # type: ignore[no-untyped-def]
    folder = tmp_path / "model"
    folder.mkdir()
    script = tmp_path / "s.aner"
    script.write_text(SCRIPT.format(model="model", storage="gguf", device="cpu"))
    assert main([str(script), "--gpu-memory", "24GB"]) == 1
    err = capsys.readouterr().err
    assert "error[E-GGUF-STORAGE]" in err and "model: storage: gguf" in err
