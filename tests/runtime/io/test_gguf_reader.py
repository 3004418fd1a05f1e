"""GGUF reading: tensor types, HF layout, metadata, and clear errors for crafted bad files."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from aner_lang.problems.errors import AnerRuntimeError
from aner_lang.runtime.io.gguf import GGUFFile, permute_rows, unpermute_rows
from aner_lang.runtime.load.loader import load_model
from aner_lang.runtime.model.config import config_from_gguf
from aner_lang.testing.fixture import (
    SHAPES,
    embedded_tokenizer,
    hf_tensors,
    rewrite_gguf,
    write_fixture,
)

SMALL_VOCAB = embedded_tokenizer()


@pytest.fixture(scope="module")
def small_gguf(tmp_path_factory):
    """A 2-layer fixture with a 259-token vocabulary: small enough to corrupt byte by byte."""
    return write_fixture(
        tmp_path_factory.mktemp("g") / "small.gguf", "tiny", seed=5, tokenizer=SMALL_VOCAB
    )


def test_weights_are_hf_layout_with_qk_unpermuted(small_gguf):
    expected = hf_tensors(SHAPES["tiny"], len(SMALL_VOCAB["tokenizer.ggml.tokens"]), 5, True)
    model = load_model(small_gguf, device="cpu").module
    attn = model.layers[1].self_attn
    for proj, name in (
        (attn.q_proj, "attn_q"),
        (attn.k_proj, "attn_k"),
        (attn.v_proj, "attn_v"),
        (attn.o_proj, "attn_output"),
    ):
        assert torch.equal(proj.dense_weight(), torch.from_numpy(expected[f"blk.1.{name}.weight"]))
    assert model.lm_head is model.embed_tokens


def test_permutation_round_trip():
    w = torch.arange(4 * 8 * 3, dtype=torch.float32).reshape(32, 3)
    assert torch.equal(unpermute_rows(permute_rows(w, 4), 4), w)
    # GGUF row h*D + 2i + j holds HF row h*D + j*D/2 + i (D = 8)
    g = permute_rows(w, 4)
    assert torch.equal(g[8 + 2 * 1 + 1], w[8 + 4 + 1])


def test_hyperparams_read_from_metadata(real_model):
    c = real_model.config
    assert (c.num_hidden_layers, c.hidden_size, c.intermediate_size) == (30, 576, 1536)
    assert (c.num_attention_heads, c.num_key_value_heads, c.head_dim) == (9, 3, 64)
    assert (c.vocab_size, c.max_position_embeddings) == (49152, 8192)
    assert c.rope_theta == 100000.0 and abs(c.rms_norm_eps - 1e-5) < 1e-9
    assert c.tie_word_embeddings and real_model.parameter_count() == 134_515_008


@pytest.mark.parametrize(
    "tensor_type,tol",
    [
        ("f16", 2e-3),
        ("bf16", 2e-2),
        ("q8_0", 3e-2),
        ("q4_0", 0.5),
        ("q4_1", 0.5),
        ("q5_0", 0.3),
        ("q5_1", 0.3),
    ],
)
def test_quantized_tensor_types_dequantize(tmp_path, tensor_type, tol):
    path = write_fixture(
        tmp_path / "q.gguf",
        "tiny",
        seed=5,
        tensor_type=tensor_type,
        tokenizer=SMALL_VOCAB,
        tied=False,
    )
    g = GGUFFile(path)
    assert g.tensor_type("blk.0.ffn_up.weight") == tensor_type.upper()
    expected = hf_tensors(SHAPES["tiny"], 259, 5, False)["blk.0.ffn_up.weight"]
    got = g.tensor("blk.0.ffn_up.weight", (128, 64)).numpy()
    assert np.abs(got - expected).max() <= tol
    assert not config_from_gguf(g).tie_word_embeddings


def test_k_quant_tensor_dequantizes(tmp_path):
    """K-quants (no quantizer in gguf-py): crafted Q4_K blocks with sane scales."""
    import gguf

    rng = np.random.default_rng(0)
    blocks = rng.integers(0, 256, size=(8, 2, 144), dtype=np.uint8)  # 8 rows x 512 values
    blocks[..., 0:2] = np.frombuffer(np.float16(0.01).tobytes(), np.uint8)
    blocks[..., 2:4] = np.frombuffer(np.float16(0.002).tobytes(), np.uint8)
    raw = blocks.reshape(8, 288)
    w = gguf.GGUFWriter(str(tmp_path / "k.gguf"), "llama")
    w.add_tensor("x.weight", raw, raw_dtype=gguf.GGMLQuantizationType.Q4_K)
    w.write_header_to_file(), w.write_kv_data_to_file(), w.write_tensors_to_file(), w.close()
    got = GGUFFile(tmp_path / "k.gguf").tensor("x.weight", (8, 512))
    want = gguf.quants.dequantize(raw, gguf.GGMLQuantizationType.Q4_K)
    assert got.shape == (8, 512) and np.array_equal(got.numpy(), want)
    assert float(got.abs().max()) > 0


def _error(path) -> AnerRuntimeError:
    with pytest.raises(AnerRuntimeError) as info:
        load_model(path, device="cpu")
    assert str(path) in info.value.message
    return info.value


def test_truncated_file(small_gguf, tmp_path):
    data = small_gguf.read_bytes()
    for cut in (10, 2000, len(data) - 100):
        bad = tmp_path / f"cut{cut}.gguf"
        bad.write_bytes(data[:cut])
        err = _error(bad)
        assert err.code in ("E-GGUF-TRUNCATED", "E-GGUF-CORRUPT"), err.message


def test_flipped_magic(small_gguf, tmp_path):
    bad = tmp_path / "magic.gguf"
    bad.write_bytes(b"GGUX" + small_gguf.read_bytes()[4:])
    assert _error(bad).code == "E-GGUF-MAGIC"


def test_huge_counts_rejected_before_reading(small_gguf, tmp_path):
    data = bytearray(small_gguf.read_bytes())
    data[8:16] = (2**62).to_bytes(8, "little")  # tensor count
    bad = tmp_path / "count.gguf"
    bad.write_bytes(bytes(data))
    err = _error(bad)
    assert err.code == "E-GGUF-TRUNCATED" and "cannot fit" in err.message


def test_non_llama_architecture(small_gguf, tmp_path):
    data = small_gguf.read_bytes()
    bad = tmp_path / "arch.gguf"
    bad.write_bytes(
        data.replace(b"llama.", b"gemma.").replace(
            b"\x05\x00\x00\x00\x00\x00\x00\x00llama", b"\x05\x00\x00\x00\x00\x00\x00\x00gemma"
        )
    )
    err = _error(bad)
    assert err.code == "E-GGUF-ARCH" and "'gemma'" in err.message


def test_tensor_shape_mismatch(small_gguf, tmp_path):
    bad = rewrite_gguf(
        small_gguf,
        tmp_path / "shape.gguf",
        tensors=lambda t: t.__setitem__("blk.1.ffn_up.weight", t["blk.1.ffn_up.weight"][:100]),
    )
    err = _error(bad)
    assert err.code == "E-GGUF-SHAPE" and "blk.1.ffn_up.weight" in err.message


def test_missing_tensor(small_gguf, tmp_path):
    bad = rewrite_gguf(
        small_gguf, tmp_path / "missing.gguf", tensors=lambda t: t.pop("blk.0.attn_v.weight")
    )
    err = _error(bad)
    assert err.code == "E-GGUF-TENSOR" and "blk.0.attn_v.weight" in err.message


def test_missing_file(tmp_path):
    assert _error(tmp_path / "nope.gguf").code == "E-GGUF-NOT-FOUND"


def test_string_arrays_read_exactly_and_every_cut_or_bad_length_is_a_clear_error(tmp_path):
    """A header's string arrays (a vocabulary's tokens and merges) come back as written, and a
    file cut anywhere inside one, or one of whose string lengths runs past the end, or whose
    bytes are not UTF-8, is refused with a GGUF error, never a crash."""
    import gguf

    words = ["a", "", "ünï", "spaced words", "x" * 300]
    path = tmp_path / "words.gguf"
    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_array("test.words", words)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.close()
    assert GGUFFile(path).metadata["test.words"] == words
    data = path.read_bytes()
    start = data.index(b"test.words") + len(b"test.words") + 4 + 4 + 8  # type, item, count
    for cut in range(start, len(data)):
        bad = tmp_path / "cut.gguf"
        bad.write_bytes(data[:cut])
        with pytest.raises(AnerRuntimeError) as info:
            GGUFFile(bad)
        assert info.value.code == "E-GGUF-TRUNCATED", (cut, info.value.message)
    long = bytearray(data)
    long[start : start + 8] = (2**40).to_bytes(8, "little")  # the first string's length
    (tmp_path / "long.gguf").write_bytes(bytes(long))
    with pytest.raises(AnerRuntimeError) as info:
        GGUFFile(tmp_path / "long.gguf")
    assert info.value.code == "E-GGUF-TRUNCATED"
    second = start + 8 + 1 + 8  # "" after "a": no bytes; "ünï" follows
    latin = bytearray(data)
    latin[second + 8] = 0xFF  # not UTF-8
    (tmp_path / "latin.gguf").write_bytes(bytes(latin))
    with pytest.raises(AnerRuntimeError) as info:
        GGUFFile(tmp_path / "latin.gguf")
    assert info.value.code == "E-GGUF-CORRUPT"


def test_the_checks_and_the_load_read_one_header_until_the_file_changes(tmp_path, monkeypatch):
    """`aner run`'s tokenizer check and its `load_model` (through `open_gguf`) parse a GGUF's
    header once; a file rewritten since, or another file, is parsed again."""
    import os

    from aner_lang.runtime.io import gguf as reader
    from aner_lang.runtime.io.source import open_source
    from aner_lang.runtime.load import model_header

    path = write_fixture(tmp_path / "m.gguf", "tiny", seed=1)
    parses = 0
    parse = reader.GGUFFile._parse

    def counted(self):  # type: ignore[no-untyped-def]
        nonlocal parses
        parses += 1
        return parse(self)

    monkeypatch.setattr(reader.GGUFFile, "_parse", counted)
    monkeypatch.setattr(model_header, "_tokenizers", {})
    model_header.model_tokenizer(path)
    _, opened = open_source(path)
    assert parses == 1 and opened is reader.open_gguf(path)
    stat = path.stat()
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns + 1_000_000))
    open_source(path)
    other = write_fixture(tmp_path / "n.gguf", "tiny", seed=2)
    open_source(other)
    assert parses == 3
