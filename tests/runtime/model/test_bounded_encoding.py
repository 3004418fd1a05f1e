"""A long text becomes a training example without being tokenized whole: `encode(limit=)` and
`encode_offsets(limit=)` give exactly the first tokens of the whole text's encoding (checked for
every vocabulary kind Aner builds or reads, on prose, code, digits, scripts without spaces,
special-token text and single huge words), and a 4 MB JSONL line costs a bounded amount of
memory, measured in a child process."""

from __future__ import annotations

import json
import random
import subprocess
import sys
from pathlib import Path

import pytest

from aner_lang.runtime.model.tokenizer import HEAD_MARGIN, PRE_TOKENIZERS, Tokenizer

REFERENCE = Path(__file__).parent / "data" / "bpe_reference.json"
WORDS = ["the", "cat", "sat", "on", "a", "mat,", "Ünïcödé", "代码", "it's", "42", "3.14", "é"]


def _texts() -> dict[str, str]:
    rng = random.Random(0)
    prose = " ".join(
        rng.choice(WORDS) + rng.choice(["", "", ".", "\n", "  ", "\n\n"]) for _ in range(2_500)
    )
    code = "def f(x):\n    return [x  *  2 for _ in range(10)]\n\n\t# done\n" * 150
    return {
        "prose": prose,
        "code": code,
        "digits": "".join(str(rng.randrange(10**9)) for _ in range(1_500)),
        "no spaces": "東京は日本の首都です。🙂" * 1_000,
        "special tokens": "<|im_start|>user\nhello there<|im_end|>\n" * 400,
        "one word": "a" * 12_000,
        "two letters": "ab" * 6_000,
        "whitespace run": "a" + " " * 6_000 + "b\n" + "c " * 3_000,
    }


TEXTS = _texts()


def _gguf_vocabularies() -> dict[str, Tokenizer]:
    reference = json.loads(REFERENCE.read_text(encoding="utf-8"))["tokenizer"]
    found = {
        f"gguf {pre}": Tokenizer.from_metadata({**reference, "tokenizer.ggml.pre": pre}, "ref")
        for pre in PRE_TOKENIZERS
    }
    pieces = ["▁", "▁t", "he", "▁the", "at", "▁c", "▁cat", "▁s", "▁sat", "▁a", "▁m", "▁mat"]
    letters = sorted(set("".join(WORDS)) - {" "})
    tokens = ["<unk>", "<s>", "</s>"] + [f"<0x{b:02X}>" for b in range(256)] + letters + pieces
    found["gguf llama (sentencepiece)"] = Tokenizer.from_metadata(
        {
            "tokenizer.ggml.model": "llama",
            "tokenizer.ggml.tokens": tokens,
            "tokenizer.ggml.scores": [0.0] * 259 + [-float(i) for i in range(len(tokens) - 259)],
            "tokenizer.ggml.token_type": [2, 3, 3] + [6] * 256 + [1] * (len(tokens) - 259),
            "tokenizer.ggml.bos_token_id": 1,
            "tokenizer.ggml.eos_token_id": 2,
        },
        "spm",
    )
    return found


@pytest.fixture(scope="module")
def vocabularies(tmp_path_factory) -> dict[str, Tokenizer]:
    found = _gguf_vocabularies()
    pytest.importorskip("transformers")
    from aner_lang.testing.hf_fixture import FAMILY, build_tokenizer

    for family in FAMILY:
        folder = tmp_path_factory.mktemp(family)
        build_tokenizer(family).save(str(folder / "tokenizer.json"))
        found[f"hf {family}"] = Tokenizer.from_hf_folder(folder)
    return found


@pytest.fixture(scope="module")
def real_vocabulary(smollm2_path) -> Tokenizer:
    from aner_lang.runtime.io.gguf import GGUFFile

    return Tokenizer.from_gguf(GGUFFile(smollm2_path))


def _check_heads(tok: Tokenizer, text: str) -> None:
    whole = tok.encode(text, add_special=False)
    ids, offsets = tok.encode_offsets(text)
    for limit in (1, 37, 300):
        assert len(text) > (limit + HEAD_MARGIN) * 8, "the text must be long enough to be cut"
        assert tok.encode(text, add_special=False, limit=limit) == whole[: limit + 1]
        assert tok.encode_offsets(text, limit) == (ids[: limit + 1], offsets[: limit + 1])


@pytest.mark.parametrize("text", TEXTS)
def test_a_limited_encoding_is_the_start_of_the_whole_one(vocabularies, text):
    for name, tok in vocabularies.items():
        try:
            _check_heads(tok, TEXTS[text])
        except AssertionError as exc:
            raise AssertionError(f"{name}: {exc}") from None


@pytest.mark.parametrize("text", TEXTS)
def test_a_limited_encoding_with_the_real_vocabulary(real_vocabulary, text):
    _check_heads(real_vocabulary, TEXTS[text])


def test_bos_is_added_before_the_limited_ids(real_vocabulary):
    tok = real_vocabulary
    text = TEXTS["prose"]
    assert tok.encode(text, limit=10) == tok.encode(text)[: 10 + 1 + int(tok.add_bos)]


@pytest.mark.parametrize("literal_stop", [False, True])
def test_a_limited_conversation_is_scored_as_the_whole_one(real_vocabulary, literal_stop):
    """Tokens after a turn's last end-of-turn token are unscored; when the turn runs past the
    tokens kept, its last end-of-turn token is found in the text (here an assistant message
    quotes ``<|im_end|>`` early, so the last one in the kept tokens is not the turn's last)."""
    from aner_lang.runtime.tasks.chat import chat_tokens

    content = ("Quote: <|im_end|> then " if literal_stop else "") + TEXTS["prose"]
    messages = [
        {"role": "user", "content": "Tell me."},
        {"role": "assistant", "content": content},
        {"role": "user", "content": "More."},
        {"role": "assistant", "content": "No."},
    ]
    ids, scored = chat_tokens(real_vocabulary, messages, "responses", "here")
    for limit in (5, 40, 300):
        head = chat_tokens(real_vocabulary, messages, "responses", "here", limit=limit)
        assert head == (ids[: limit + 1], scored[: limit + 1])


_MEASURE = """
import json, resource, sys
from pathlib import Path
from aner_lang.datafiles.records import Format
from aner_lang.runtime.io.gguf import GGUFFile
from aner_lang.runtime.model.tokenizer import Tokenizer
from aner_lang.runtime.tasks.data import from_file

tok = Tokenizer.from_gguf(GGUFFile(sys.argv[1]))
tok.encode("warm up the tokenizer's caches", limit=8)
with open("/proc/self/clear_refs", "w") as f:  # the peak so far (loading the vocabulary) is reset
    f.write("5")
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
data = from_file(Path(sys.argv[2]), 256, Format(sys.argv[3]))
examples = data.examples(tok)
after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
print(json.dumps({"growth_mib": (after - before) / 1024, "tokens": len(examples[0].ids)}))
"""


def _line(kind: str, text: str) -> str:
    if kind == "chat":
        turns = [{"role": "user", "content": "Go on."}, {"role": "assistant", "content": text}]
        return json.dumps({"messages": turns})
    return json.dumps({"text": text})


@pytest.mark.slow
@pytest.mark.parametrize(
    "kind, text",
    [
        ("text", "words"),
        ("text", "one word"),
        ("chat", "words"),
    ],
)
def test_a_4_mb_line_costs_bounded_memory(smollm2_path, tmp_path, kind, text):
    """The peak RSS growth while the line is read and made an example of a context of 256
    tokens. Measured with SmolLM2's vocabulary: 372 MiB for one 4 MB word, 441 MiB for 4 MB of
    words, 482 MiB as a chat message before the bound; 10 to 15 MiB with it."""
    body = (
        " ".join(random.Random(1).choice(WORDS) for _ in range(700_000))
        if text == "words"
        else "a" * 4_000_000
    )
    path = tmp_path / "d.jsonl"
    path.write_text(_line(kind, body[:4_000_000]) + "\n", encoding="utf-8")
    out = subprocess.run(
        [sys.executable, "-c", _MEASURE, str(smollm2_path), str(path), kind],
        capture_output=True,
        text=True,
        check=True,
    )
    result = json.loads(out.stdout)
    assert result["tokens"] == 256
    assert result["growth_mib"] < 200, result
