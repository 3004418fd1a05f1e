"""Model hyper-parameters are read with the types their meaning needs, from the file's own types:
a count stored as a float (a block count of 1.5, or even 2.0), as a string, an array, a boolean,
a negative or a too large number is an error naming the file and the key, never rounded or
converted; every integer type GGUF has is accepted for an exact count. Each case goes through
both readers of a model's header: `load_model` and `aner plan`'s `model_config`."""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest

from aner_lang.problems.errors import AnerRuntimeError
from aner_lang.runtime.load.loader import load_model
from aner_lang.runtime.train.plan import model_config
from aner_lang.testing.fixture import rewrite_gguf

gguf = pytest.importorskip("gguf")
T = gguf.GGUFValueType

READERS: dict[str, Callable[[Path], object]] = {
    "load_model": lambda path: load_model(path, device="cpu"),
    "plan": lambda path: model_config(str(path), Path("/")),
}


def _error(read: Callable[[Path], object], path: Path) -> AnerRuntimeError:
    with pytest.raises(AnerRuntimeError) as info:
        read(path)
    return info.value


@pytest.mark.parametrize("reader", READERS)
@pytest.mark.parametrize(
    "key, value, vtype, shown",
    [
        ("llama.block_count", 1.5, T.FLOAT32, "1.5"),
        ("llama.block_count", 2.0, T.FLOAT64, "2.0"),
        ("llama.block_count", "2", T.STRING, "'2'"),
        ("llama.block_count", True, T.BOOL, "True"),
        ("llama.block_count", [2], T.ARRAY, "[2]"),
        ("llama.embedding_length", -64, T.INT32, "-64"),
        ("llama.attention.head_count_kv", 0, T.UINT32, "0"),
        ("llama.context_length", 2**63, T.UINT64, str(2**63)),
        ("llama.feed_forward_length", 128.25, T.FLOAT32, "128.25"),
        ("llama.vocab_size", 49152.5, T.FLOAT64, "49152.5"),
        ("llama.attention.key_length", "16", T.STRING, "'16'"),
    ],
)
def test_a_gguf_count_of_another_type_is_refused_with_its_key(
    tiny_bytes_gguf, tmp_path, reader, key, value, vtype, shown
):
    bad = rewrite_gguf(tiny_bytes_gguf, tmp_path / "m.gguf", metadata={key: (value, vtype)})
    error = _error(READERS[reader], bad)
    assert error.code == "E-GGUF-METADATA"
    assert f"{key} is {shown}, not a positive integer" in error.message
    assert str(bad) in error.message


@pytest.mark.parametrize("reader", READERS)
@pytest.mark.parametrize(
    "key, value, vtype",
    [
        ("llama.rope.freq_base", "10000", T.STRING),
        ("llama.rope.freq_base", float("inf"), T.FLOAT32),
        ("llama.attention.layer_norm_rms_epsilon", float("nan"), T.FLOAT32),
        ("llama.attention.layer_norm_rms_epsilon", [1e-5], T.ARRAY),
    ],
)
def test_a_gguf_real_number_must_be_a_finite_number(
    tiny_bytes_gguf, tmp_path, reader, key, value, vtype
):
    bad = rewrite_gguf(tiny_bytes_gguf, tmp_path / "m.gguf", metadata={key: (value, vtype)})
    error = _error(READERS[reader], bad)
    assert error.code == "E-GGUF-METADATA" and f"{key} is " in error.message
    assert "not a finite number" in error.message


@pytest.mark.parametrize(
    "vtype", [T.UINT8, T.INT8, T.UINT16, T.INT16, T.UINT32, T.INT32, T.UINT64, T.INT64]
)
def test_every_gguf_integer_type_holds_a_count(tiny_bytes_gguf, tmp_path, vtype):
    path = rewrite_gguf(
        tiny_bytes_gguf, tmp_path / "m.gguf", metadata={"llama.block_count": (2, vtype)}
    )
    assert model_config(str(path), Path("/")).num_hidden_layers == 2
    assert load_model(path, device="cpu").config.num_hidden_layers == 2


@pytest.mark.parametrize(
    "key, value, vtype, code, words",
    [
        ("general.alignment", 32.5, T.FLOAT32, "E-GGUF-CORRUPT", "general.alignment 32.5"),
        ("general.alignment", "32", T.STRING, "E-GGUF-CORRUPT", "general.alignment '32'"),
        ("tokenizer.ggml.add_bos_token", "false", T.STRING, "E-TOKENIZER", "not true or false"),
        ("tokenizer.ggml.add_bos_token", 0, T.UINT8, "E-TOKENIZER", "not true or false"),
        ("tokenizer.ggml.bos_token_id", 1.0, T.FLOAT32, "E-TOKENIZER", "not a token id"),
    ],
)
def test_other_typed_gguf_fields(tiny_bytes_gguf, tmp_path, key, value, vtype, code, words):
    bad = rewrite_gguf(tiny_bytes_gguf, tmp_path / "m.gguf", metadata={key: (value, vtype)})
    error = _error(READERS["load_model"], bad)
    assert error.code == code and words in error.message and str(bad) in error.message


# ---- Hugging Face config.json --------------------------------------------------------------------

pytest.importorskip("transformers")


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from aner_lang.testing.hf_fixture import write_hf_model

    return write_hf_model(tmp_path_factory.mktemp("typed") / "llama", "llama3", seed=1)


def _edited(folder: Path, tmp_path: Path, edit: dict[str, object]) -> Path:
    out = tmp_path / "m"
    shutil.copytree(folder, out)
    config = json.loads((out / "config.json").read_text())
    (out / "config.json").write_text(json.dumps({**config, **edit}))
    return out


@pytest.mark.parametrize("reader", READERS)
@pytest.mark.parametrize(
    "edit, words",
    [
        ({"num_hidden_layers": 1.5}, "num_hidden_layers is 1.5, not a positive integer"),
        ({"num_hidden_layers": 2.0}, "num_hidden_layers is 2.0, not a positive integer"),
        ({"num_hidden_layers": "2"}, "num_hidden_layers is '2', not a positive integer"),
        ({"num_hidden_layers": [2]}, "num_hidden_layers is [2], not a positive integer"),
        ({"num_hidden_layers": True}, "num_hidden_layers is True, not a positive integer"),
        ({"hidden_size": -64}, "hidden_size is -64, not a positive integer"),
        ({"vocab_size": 2**63}, f"vocab_size is {2**63}, not a positive integer"),
        ({"head_dim": 16.5}, "head_dim is 16.5, not a positive integer"),
        ({"sliding_window": 4096.5}, "sliding_window is 4096.5, not a positive integer"),
        ({"hidden_size": None}, "missing key 'hidden_size'"),
        ({"rms_norm_eps": "1e-5"}, "rms_norm_eps is '1e-5', not a finite number"),
        ({"rope_theta": {"v": 1}}, "rope_theta is {'v': 1}, not a finite number"),
        (
            {"rope_parameters": None, "rope_scaling": {"rope_type": "llama3", "factor": "8"}},
            "rope_scaling.factor is '8', not a finite number",
        ),
        (
            {
                "rope_parameters": {
                    "rope_type": "llama3",
                    "factor": 8.0,
                    "original_max_position_embeddings": 8192.5,
                }
            },
            "rope_parameters.original_max_position_embeddings is 8192.5, not a positive integer",
        ),
    ],
)
def test_a_config_json_field_of_another_type_is_refused_with_its_key(
    folder, tmp_path, reader, edit, words
):
    error = _error(READERS[reader], _edited(folder, tmp_path, edit))
    assert error.code == "E-HF-CONFIG"
    assert words in error.message and "config.json" in error.message


@pytest.mark.parametrize("reader", READERS)
def test_a_config_json_that_is_not_an_object_is_refused(folder, tmp_path, reader):
    out = _edited(folder, tmp_path, {})
    (out / "config.json").write_text("[1, 2]")
    error = _error(READERS[reader], out)
    assert error.code == "E-HF-CONFIG" and "not a JSON object" in error.message
