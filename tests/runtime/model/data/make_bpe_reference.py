"""Regenerate bpe_reference.json: llama.cpp's own tokenization and detokenization of a set of
texts for every byte-level BPE pre-tokenizer Aner supports, the reference
tests/runtime/model/test_pre_tokenizers.py checks our GGUF tokenizer against.

One small byte-level BPE vocabulary (trained with the `tokenizers` library, with Llama 3's special
tokens) is written into a tiny GGUF fixture once per pre-tokenizer name (`tokenizer.ggml.pre`),
and llama.cpp (the prebuilt `xllamacpp` wheel, its server in-process) tokenizes every text with
it. xllamacpp is not a project dependency; to regenerate:

    pip install --no-deps --target /tmp/xllamacpp xllamacpp==2026.10.11549
    PYTHONPATH=/tmp/xllamacpp:. python tests/runtime/model/data/make_bpe_reference.py
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from make_llamacpp_reference import post, start_server, tokenize, write_reference

CASES = [
    "The quiet mountain lake reflects the clear morning sky.",
    "Hello, world! 1234567 numbers: 3.14159 and 2,718",
    "  leading and  double  spaces\n\nnew lines\ttabs   ",
    "DON'T won't I'll they've we'd it's CAN'T She'S",
    "Unicode: café, naïve, 東京, emoji 🤗, Ünïcödé, Ω≈ç√",
    "def f(x):\n    return x ** 2  # code\n\tindent\r\nwindows",
    "<|begin_of_text|>text after a special<|eot_id|> and <|start_header_id|>",
    "a . b , c ! d ? e ' f 's g 're h 've i 'm j 'll k 't",
    "1990s 2024-01-15 $1,000.50 100% ...!!! ???",
    "camelCaseWords and HTTPServer and McDonald's",
    "   ",
    "\n",
    "",
]
PRE = [
    "default",
    "llama-bpe",
    "llama3",
    "llama-v3",
    "falcon3",
    "pixtral",
    "dbrx",
    "smaug-bpe",
    "qwen2",
    "deepseek-r1-qwen",
    "stablelm2",
    "megrez",
    "tekken",
    "gpt-2",
    "phi-2",
    "mpt",
    "olmo",
    "jais",
    "smollm",
    "starcoder",
    "refact",
    "codeshell",
    "command-r",
]


def vocabulary() -> dict:
    """The shared vocabulary as GGUF tokenizer metadata."""
    import json

    from aner_lang.runtime.model.tokenizer import _gguf_vocabulary
    from aner_lang.testing.hf_fixture import build_tokenizer

    tok = build_tokenizer("llama3", vocab_size=400)
    meta = _gguf_vocabulary(json.loads(tok.to_str()))
    meta.pop("tokenizer.ggml.pre")
    meta["tokenizer.ggml.bos_token_id"] = tok.token_to_id("<|begin_of_text|>")
    meta["tokenizer.ggml.eos_token_id"] = tok.token_to_id("<|eot_id|>")
    meta["tokenizer.ggml.add_bos_token"] = True
    return meta


def main() -> None:
    from aner_lang.testing.fixture import write_fixture

    vocab = vocabulary()
    results = {}
    with tempfile.TemporaryDirectory() as tmp:
        for pre in PRE:
            path = write_fixture(
                Path(tmp) / f"{pre}.gguf", "tiny", tokenizer={**vocab, "tokenizer.ggml.pre": pre}
            )
            server = start_server(path)
            base = server.listening_address
            cases = []
            for text in CASES:
                ids = tokenize(base, text)
                decoded = post(base, "/detokenize", {"tokens": ids})["content"]
                cases.append({"text": text, "ids": ids, "decoded": decoded})
            results[pre] = cases
            del server
    write_reference({"tokenizer": vocab, "pre_tokenizers": results}, "bpe_reference.json")


if __name__ == "__main__":
    main()
