"""Damaged or unsupported models fail with a clear error naming the file, before any tensor data
is read: configs checked against themselves and against tensor shapes, special token ids in
range, shards present, weights finite."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest

from aner_lang.problems.errors import AnerRuntimeError
from aner_lang.runtime.load.loader import load_model
from aner_lang.testing.fixture import embedded_tokenizer, write_fixture

pytest.importorskip("transformers")

from aner_lang.testing.hf_fixture import write_hf_model


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return write_hf_model(tmp_path_factory.mktemp("bad") / "qwen", "qwen2", seed=1)


def _copy(folder, tmp_path, edit_config=None):
    out = tmp_path / "m"
    shutil.copytree(folder, out)
    if edit_config:
        cfg = json.loads((out / "config.json").read_text())
        edit_config(cfg)
        (out / "config.json").write_text(json.dumps(cfg))
    return out


def _error(path) -> AnerRuntimeError:
    with pytest.raises(AnerRuntimeError) as info:
        load_model(path, device="cpu")
    return info.value


@pytest.mark.parametrize(
    ("edit", "words"),
    [
        (lambda c: c.update(model_type="gemma"), "unsupported model architecture 'gemma'"),
        (lambda c: c.update(num_key_value_heads=3), "KV head count must divide"),
        (lambda c: c.update(hidden_act="gelu"), "hidden_act = 'gelu' is not implemented"),
        (lambda c: c.update(rms_norm_eps=-1.0), "rms_norm_eps is -1.0"),
        (lambda c: c.update(num_hidden_layers=0), "num_hidden_layers is 0"),
        (lambda c: c.update(rope_parameters={"rope_type": "yarn", "factor": 4.0}), "'yarn'"),
        (lambda c: c.update(vocab_size="many"), "vocab_size is 'many'"),
    ],
)
def test_bad_config_is_refused_with_its_key(folder, tmp_path, edit, words):
    err = _error(_copy(folder, tmp_path, edit))
    assert err.code == "E-HF-CONFIG" and words in err.message and "config.json" in err.message


def test_config_disagreeing_with_tensors(folder, tmp_path):
    err = _error(_copy(folder, tmp_path, lambda c: c.update(intermediate_size=100)))
    assert err.code == "E-HF-SHAPE" and "mlp.gate_proj.weight" in err.message


def test_more_layers_than_tensors(folder, tmp_path):
    err = _error(_copy(folder, tmp_path, lambda c: c.update(num_hidden_layers=3)))
    assert err.code == "E-HF-WEIGHTS" and "model.layers.2." in err.message


def test_vocabulary_larger_than_the_embedding(folder, tmp_path):
    err = _error(_copy(folder, tmp_path, lambda c: c.update(vocab_size=100)))
    assert err.code == "E-TOKENIZER" and "embedding" in err.message


def test_missing_shard(folder, tmp_path):
    out = _copy(folder, tmp_path)
    index = {"weight_map": {"model.embed_tokens.weight": "model-00002-of-00002.safetensors"}}
    (out / "model.safetensors.index.json").write_text(json.dumps(index))
    err = _error(out)
    assert err.code == "E-HF-WEIGHTS" and "model-00002-of-00002.safetensors" in err.message


def test_folder_without_weights_or_config(tmp_path):
    (tmp_path / "empty").mkdir()
    assert _error(tmp_path / "empty").code == "E-HF-CONFIG"


def test_special_token_id_outside_the_vocabulary(tmp_path):
    vocab = {**embedded_tokenizer(), "tokenizer.ggml.eos_token_id": 5000}
    err = _error(write_fixture(tmp_path / "t.gguf", "tiny", tokenizer=vocab))
    assert err.code == "E-TOKENIZER" and "5000" in err.message and "t.gguf" in err.message


def test_non_finite_norm_weight(tmp_path):
    import gguf

    path = write_fixture(tmp_path / "n.gguf", "tiny", tokenizer=embedded_tokenizer())
    reader = gguf.GGUFReader(str(path))
    offset = next(t for t in reader.tensors if t.name == "blk.1.ffn_norm.weight").data_offset
    data = bytearray(path.read_bytes())
    data[offset : offset + 4] = np.float32("nan").tobytes()
    path.write_bytes(bytes(data))
    err = _error(path)
    assert err.code == "E-MODEL-WEIGHTS" and "layers.1.post_attention_layernorm" in err.message


def test_non_finite_linear_weight(tmp_path):
    """A NaN projection weight is refused at load (training would skip every update)."""
    import gguf

    path = write_fixture(tmp_path / "q.gguf", "tiny", tokenizer=embedded_tokenizer())
    reader = gguf.GGUFReader(str(path))
    offset = next(t for t in reader.tensors if t.name == "blk.0.attn_q.weight").data_offset
    data = bytearray(path.read_bytes())
    data[offset : offset + 4] = np.float32("nan").tobytes()
    path.write_bytes(bytes(data))
    err = _error(path)
    assert err.code == "E-MODEL-WEIGHTS" and "layers.0.self_attn.q_proj" in err.message


def test_infinite_quantized_scale_is_refused_without_a_numpy_warning(tmp_path, recwarn):
    """A Q8_0 block whose fp16 scale is infinite (times a zero quant: NaN): the weight check
    names the tensor; numpy's 'invalid value' warning from the dequantization stays out of the
    user's terminal."""
    import gguf

    path = write_fixture(
        tmp_path / "q8.gguf", "tiny", tensor_type="q8_0", tokenizer=embedded_tokenizer()
    )
    reader = gguf.GGUFReader(str(path))
    offset = next(t for t in reader.tensors if t.name == "blk.0.ffn_up.weight").data_offset
    data = bytearray(path.read_bytes())
    data[offset : offset + 3] = np.float16("inf").tobytes() + b"\x00"
    path.write_bytes(bytes(data))
    err = _error(path)
    assert err.code == "E-MODEL-WEIGHTS" and "layers.0.mlp.up_proj" in err.message
    assert not [w for w in recwarn if issubclass(w.category, RuntimeWarning)]
