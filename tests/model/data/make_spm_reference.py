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
import json
import re
import tempfile
import urllib.request
from pathlib import Path

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


def post(base: str, route: str, body: dict) -> dict:
    req = urllib.request.Request(base + route, json.dumps(body).encode(),
                                 {"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=120) as resp:
        return json.loads(resp.read())


def spm_metadata(model_bytes: bytes) -> dict:
    """GGUF tokenizer metadata for a SentencePiece model, as llama.cpp's converter writes it."""
    import sentencepiece as spm

    sp = spm.SentencePieceProcessor(model_proto=model_bytes)
    tokens, scores, types = [], [], []
    for i in range(sp.vocab_size()):
        tokens.append(sp.id_to_piece(i))
        scores.append(float(sp.get_score(i)))
        types.append(2 if sp.is_unknown(i) else 3 if sp.is_control(i) else
                     6 if sp.is_byte(i) else 5 if sp.is_unused(i) else 1)
    return {"tokenizer.ggml.model": "llama", "tokenizer.ggml.tokens": tokens,
            "tokenizer.ggml.scores": scores, "tokenizer.ggml.token_type": types,
            "tokenizer.ggml.bos_token_id": sp.bos_id(), "tokenizer.ggml.eos_token_id": sp.eos_id(),
            "tokenizer.ggml.unknown_token_id": sp.unk_id(),
            "tokenizer.ggml.add_bos_token": True, "tokenizer.ggml.add_space_prefix": True}


def main() -> None:
    import sentencepiece as spm
    import xllamacpp

    from aner_lang.runtime.fixture import write_fixture

    buf = io.BytesIO()
    spm.SentencePieceTrainer.train(sentence_iterator=iter(CORPUS.splitlines()), model_writer=buf,
                                   model_type="bpe", vocab_size=400, byte_fallback=True,
                                   split_digits=True, character_coverage=1.0,
                                   num_threads=1, minloglevel=2)
    meta = spm_metadata(buf.getvalue())
    sp = spm.SentencePieceProcessor(model_proto=buf.getvalue())
    with tempfile.TemporaryDirectory() as tmp:
        path = write_fixture(Path(tmp) / "spm.gguf", "tiny", tokenizer=meta)
        params = xllamacpp.CommonParams()
        params.model.path = str(path)
        params.n_ctx = 256
        params.cpuparams.n_threads = 1
        server = xllamacpp.Server(params)
        base = server.listening_address
        cases = []
        for text in CASES:
            ids = post(base, "/tokenize", {"content": text, "add_special": True,
                                           "parse_special": True})["tokens"]
            cases.append({"text": text, "ids": ids,
                          "sentencepiece_ids": [sp.bos_id()] + sp.encode(text),
                          "decoded": post(base, "/detokenize", {"tokens": ids})["content"]})
        del server
    from importlib.metadata import version

    out = {"llama_cpp": f"xllamacpp {version('xllamacpp')}",
           "sentencepiece": version("sentencepiece"), "tokenizer": meta, "cases": cases}
    text = json.dumps(out, indent=1, ensure_ascii=False)
    text = re.sub(r"\[\n\s+([^\[\]{}]*?)\n\s+\]", lambda m: "[" + " ".join(m[1].split()) + "]",
                  text)
    dst = Path(__file__).with_name("spm_reference.json")
    dst.write_text(text + "\n", encoding="utf-8")
    print(f"wrote {dst}")


if __name__ == "__main__":
    main()
