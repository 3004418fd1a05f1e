"""Regenerate spm_reference.json: a small SentencePiece (llama-style) vocabulary and how llama.cpp
and SentencePiece itself tokenize a set of texts with it, for
tests/model/test_model_llamacpp_reference.py.

The vocabulary is trained here with `sentencepiece` (BPE, byte fallback, digits split) on the
corpus below and turned into GGUF metadata the way llama.cpp's converter does; llama.cpp runs from
the prebuilt `xllamacpp` wheel on a tiny fixture carrying that vocabulary. Neither package is a
project dependency; to regenerate:

    pip install --no-deps --target /tmp/xllamacpp xllamacpp==2026.10.11549
    PYTHONPATH=/tmp/xllamacpp python tests/model/data/make_spm_reference.py
"""

from __future__ import annotations

import io
import tempfile
from pathlib import Path

from make_llamacpp_reference import post, start_server, tokenize, write_reference

CORPUS = """\
Aner is a small, statically typed scripting language for adapting language models.
A user writes a script that declares a base model, adapters, a training profile and data.
The quiet mountain lake reflects the clear morning sky, and the old pine trees stand still.
In 1969, 3 astronauts flew 384,400 km to the Moon; the trip took about 76 hours.
Numbers like 2024, 3.14159 and 1,000,000 appear in text, as do e-mail@example.com and URLs.
Le café est très bon. Der Bär läuft schnell. Ça va? Naïve coöperation, déjà vu.
def train(model, steps=20):\n    return model.fit(steps)  # code has indentation
"""
CASES = [
    "The quiet mountain lake",
    " leading space and  double  spaces",
    "Numbers 12345 and 3.14",
    "Unicode café, 東京 🤗 Ω",
    "newline\nand\ttab",
    "<s>control text</s> stays text",
    "unseen zyxwvq words",
    "",
]


def spm_metadata(model_bytes: bytes) -> dict:
    """GGUF tokenizer metadata for a SentencePiece model, as llama.cpp's converter writes it."""
    import sentencepiece as spm

    sp = spm.SentencePieceProcessor(model_proto=model_bytes)
    tokens, scores, types = [], [], []
    for i in range(sp.vocab_size()):
        tokens.append(sp.id_to_piece(i))
        scores.append(float(sp.get_score(i)))
        types.append(
            2
            if sp.is_unknown(i)
            else 3
            if sp.is_control(i)
            else 6
            if sp.is_byte(i)
            else 5
            if sp.is_unused(i)
            else 1
        )
    return {
        "tokenizer.ggml.model": "llama",
        "tokenizer.ggml.tokens": tokens,
        "tokenizer.ggml.scores": scores,
        "tokenizer.ggml.token_type": types,
        "tokenizer.ggml.bos_token_id": sp.bos_id(),
        "tokenizer.ggml.eos_token_id": sp.eos_id(),
        "tokenizer.ggml.unknown_token_id": sp.unk_id(),
        "tokenizer.ggml.add_bos_token": True,
        "tokenizer.ggml.add_space_prefix": True,
    }


def main() -> None:
    import sentencepiece as spm

    from aner_lang.testing.fixture import write_fixture

    buf = io.BytesIO()
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(CORPUS.splitlines()),
        model_writer=buf,
        model_type="bpe",
        vocab_size=400,
        byte_fallback=True,
        split_digits=True,
        character_coverage=1.0,
        num_threads=1,
        minloglevel=2,
    )
    meta = spm_metadata(buf.getvalue())
    sp = spm.SentencePieceProcessor(model_proto=buf.getvalue())
    with tempfile.TemporaryDirectory() as tmp:
        path = write_fixture(Path(tmp) / "spm.gguf", "tiny", tokenizer=meta)
        server = start_server(path)
        base = server.listening_address
        cases = []
        for text in CASES:
            ids = tokenize(base, text)
            cases.append(
                {
                    "text": text,
                    "ids": ids,
                    "sentencepiece_ids": [sp.bos_id()] + sp.encode(text),
                    "decoded": post(base, "/detokenize", {"tokens": ids})["content"],
                }
            )
        del server
    from importlib.metadata import version

    write_reference(
        {"sentencepiece": version("sentencepiece"), "tokenizer": meta, "cases": cases},
        "spm_reference.json",
    )


if __name__ == "__main__":
    main()
