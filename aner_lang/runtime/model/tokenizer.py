"""A model's tokenizer, built with the `tokenizers` library from a GGUF's metadata or read from a
Hugging Face folder's tokenizer.json, and its chat template.

GGUF vocabularies follow llama.cpp's reading of the same metadata:

* ``gpt2``: byte-level BPE from ``tokenizer.ggml.tokens``/``merges``. The pre-tokenizer named by
  ``tokenizer.ggml.pre`` is llama.cpp's list of regexes for that name (`PRE_TOKENIZERS`), applied
  in turn, each splitting the pieces the previous one left, with llama.cpp's ``ignore_merges``
  flag for the name (a piece that is itself a token is not merged further: Llama 3, Tekken).
  Decoding concatenates the tokens' texts, as llama.cpp's server and command line print them
  (its library's optional ``clean_spaces`` pass is not applied there either).
* ``llama``: SentencePiece-style BPE with byte fallback, merges derived from the token scores as
  llama.cpp's SPM tokenizer ranks them, "▁" for spaces and a leading "▁".

Control and user-defined tokens (token types 3 and 4) are special tokens matched in text, as
llama.cpp does with ``parse_special``. A Hugging Face folder's tokenizer.json is used as it is,
with tokenizer_config.json's special tokens and chat template (or chat_template.jinja). The chat
template is rendered with jinja2 in a sandbox, with the globals and filters HF transformers gives
templates (``raise_exception``, ``strftime_now``, a ``tojson`` that keeps non-ASCII text).
"""

from __future__ import annotations

import json
import math
import re
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tokenizers import AddedToken, Encoding, Regex, decoders, models, normalizers, pre_tokenizers
from tokenizers import Tokenizer as HFTokenizer

from aner_lang.host import files, json_text
from aner_lang.host.chat_template import extensions
from aner_lang.problems.errors import AnerRuntimeError

if TYPE_CHECKING:
    from aner_lang.runtime.io.gguf import GGUFFile

TOKEN_TYPE_CONTROL = 3
TOKEN_TYPE_USER_DEFINED = 4
GPT2_SPLIT = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)"
_CONTRACTIONS = r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])"
LLAMA3_SPLIT = (
    _CONTRACTIONS + r"|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+"
    r"|\s+(?!\S)|\s+"
)
QWEN2_SPLIT = (
    _CONTRACTIONS + r"|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+"
    r"|\s+(?!\S)|\s+"
)
TEKKEN_SPLIT = (
    r"[^\r\n\p{L}\p{N}]?((?=[\p{L}])([^a-z]))*((?=[\p{L}])([^A-Z]))+"
    r"|[^\r\n\p{L}\p{N}]?((?=[\p{L}])([^a-z]))+((?=[\p{L}])([^A-Z]))*"
    r"|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)


# The split regexes as Hugging Face tokenizer.json files write them, and the llama.cpp
# pre-tokenizer name llama.cpp's converter gives a vocabulary that uses them.
HF_SPLIT_NAMES = {
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+": "llama-bpe",
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+": "qwen2",
    r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+"
    r"|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*"
    r"|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+": "tekken",
}
TOKEN_TYPE_NORMAL, TOKEN_TYPE_UNUSED, TOKEN_TYPE_BYTE = 1, 5, 6
_BYTE_TOKEN = re.compile(r"<0x[0-9A-F]{2}>")


@dataclass(frozen=True)
class PreTokenizer:
    """llama.cpp's handling of one ``tokenizer.ggml.pre`` name (src/llama-vocab.cpp)."""

    splits: tuple[str, ...]
    ignore_merges: bool = False


_DEFAULT = PreTokenizer((r"[\p{P}\$\+<=>\^~\|]+", GPT2_SPLIT, r"\p{N}+", r"[0-9][0-9][0-9]"))
_GPT2 = PreTokenizer((GPT2_SPLIT,))
_LLAMA3 = PreTokenizer((LLAMA3_SPLIT,), ignore_merges=True)
_QWEN2 = PreTokenizer((QWEN2_SPLIT,))
_DIGITS_GPT2 = PreTokenizer((r"\p{N}", GPT2_SPLIT))

PRE_TOKENIZERS: dict[str, PreTokenizer] = {
    "default": _DEFAULT,
    # Llama 3, 3.1, 3.2 (llama.cpp's LLAMA3 group)
    "llama-bpe": _LLAMA3,
    "llama3": _LLAMA3,
    "llama-v3": _LLAMA3,
    "falcon3": _LLAMA3,
    "pixtral": _LLAMA3,
    "dbrx": PreTokenizer((LLAMA3_SPLIT,)),
    "smaug-bpe": PreTokenizer((LLAMA3_SPLIT,)),
    # Qwen2, Qwen2.5, Qwen3 and their distillations
    "qwen2": _QWEN2,
    "deepseek-r1-qwen": _QWEN2,
    "stablelm2": _QWEN2,
    "megrez": _QWEN2,
    # Mistral's Tekken vocabulary (Mistral Nemo, Small 3)
    "tekken": PreTokenizer((TEKKEN_SPLIT,), ignore_merges=True),
    # GPT-2's own split
    "gpt-2": _GPT2,
    "phi-2": _GPT2,
    "mpt": _GPT2,
    "olmo": _GPT2,
    "jais": _GPT2,
    # every digit isolated, then GPT-2's split (SmolLM, StarCoder, ...)
    "smollm": _DIGITS_GPT2,
    "starcoder": _DIGITS_GPT2,
    "refact": _DIGITS_GPT2,
    "codeshell": _DIGITS_GPT2,
    "command-r": _DIGITS_GPT2,
}


def _pre_tokenizer(pre: str, source: str) -> PreTokenizer:
    if pre not in PRE_TOKENIZERS:
        raise AnerRuntimeError(
            f"{source}: unsupported GGUF pre-tokenizer {pre!r} (tokenizer.ggml.pre)",
            code="E-TOKENIZER",
            notes=(f"Aner knows: {', '.join(sorted(PRE_TOKENIZERS))}",),
        )
    return PRE_TOKENIZERS[pre]


def _byte_level_pre_tokenizer(pre: PreTokenizer) -> pre_tokenizers.PreTokenizer:
    steps: list[pre_tokenizers.PreTokenizer] = [
        pre_tokenizers.Split(Regex(r), behavior="isolated") for r in pre.splits
    ]
    steps.append(pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False))
    return pre_tokenizers.Sequence(steps)


def spm_merges(tokens: Sequence[str], scores: Sequence[float]) -> list[tuple[str, str]]:
    """BPE merges that reproduce SentencePiece/llama.cpp SPM ranking: higher score merges first.

    Every split of a vocabulary piece into two vocabulary pieces is a merge, ranked by the
    piece's score (ties by token id), the order llama.cpp's bigram queue uses.
    """
    index = {t: i for i, t in enumerate(tokens)}
    ranked: list[tuple[float, int, str, str]] = []
    for piece, pid in index.items():
        for cut in range(1, len(piece)):
            left, right = piece[:cut], piece[cut:]
            if left in index and right in index:
                ranked.append((-scores[pid], pid, left, right))
    ranked.sort()
    return [(left, right) for _, _, left, right in ranked]


MAX_TOKEN_CHARS = 1024
HEAD_MARGIN = 64
"""Tokens encoded past a `limit` (`Tokenizer._head`), so those kept are far from the cut."""
HEAD_CHARS_PER_TOKEN = 8
"""Characters per token of the first prefix `Tokenizer._head` tries (text averages about 4)."""
HEAD_WORD_WINDOW = 1024
"""How far back from a prefix's planned end a word's end is looked for; in a longer word, the
prefix ends inside it."""
"""The longest vocabulary token: deriving SentencePiece merges costs the square of a token's
length, and real vocabularies stay far below (their longest tokens are runs of a few dozen
spaces)."""


def _check_vocabulary(meta: dict[str, Any], source: str) -> None:
    """The tokenizer metadata's shape, before any of it is used: lists of the right item types
    and lengths, tokens no longer than `MAX_TOKEN_CHARS`, finite scores, token ids that are
    integers in range, flags that are booleans."""

    def bad(what: str) -> AnerRuntimeError:
        return AnerRuntimeError(f"{source}: {what}", code="E-TOKENIZER")

    tokens = meta["tokenizer.ggml.tokens"]
    if not isinstance(tokens, list) or not all(isinstance(t, str) for t in tokens):
        raise bad("tokenizer.ggml.tokens is not a list of strings")
    longest = max(map(len, tokens))
    if longest > MAX_TOKEN_CHARS:
        raise bad(
            f"a vocabulary token has {longest:,} characters; the limit is {MAX_TOKEN_CHARS:,}"
        )
    for key, kinds in (
        ("tokenizer.ggml.scores", (int, float)),
        ("tokenizer.ggml.token_type", (int,)),
    ):
        values = meta.get(key)
        if values is None:
            continue
        if (
            not isinstance(values, list)
            or len(values) != len(tokens)
            or not all(isinstance(v, kinds) and math.isfinite(v) for v in values)
        ):
            raise bad(f"{key} is not a list of {len(tokens):,} finite numbers")
    merges = meta.get("tokenizer.ggml.merges", [])
    if not isinstance(merges, list) or not all(isinstance(m, str) and " " in m for m in merges):
        raise bad("tokenizer.ggml.merges is not a list of `left right` strings")
    for key in ("unknown_token_id", "bos_token_id", "eos_token_id", "padding_token_id"):
        value = meta.get(f"tokenizer.ggml.{key}")
        if value is not None and (type(value) is not int or not 0 <= value < len(tokens)):
            raise bad(f"tokenizer.ggml.{key} is {value!r}, not a token id")
    for key in ("add_bos_token", "add_space_prefix"):
        value = meta.get(f"tokenizer.ggml.{key}")
        if value is not None and type(value) is not bool:
            raise bad(f"tokenizer.ggml.{key} is {value!r}, not true or false")


def _build_backend(meta: dict[str, Any], source: str) -> HFTokenizer:
    """The tokenizer of GGUF metadata."""
    kind = meta.get("tokenizer.ggml.model")
    tokens = meta.get("tokenizer.ggml.tokens")
    if not tokens:
        raise AnerRuntimeError(
            f"{source}: GGUF has no tokenizer vocabulary (tokenizer.ggml.tokens)",
            code="E-TOKENIZER",
        )
    _check_vocabulary(meta, source)
    vocab = {t: i for i, t in enumerate(tokens)}
    unk_id = meta.get("tokenizer.ggml.unknown_token_id")
    unk = tokens[unk_id] if unk_id is not None and unk_id < len(tokens) else None
    if kind == "gpt2":
        pre = _pre_tokenizer(str(meta.get("tokenizer.ggml.pre", "default")), source)
        merges = [tuple(m.split(" ", 1)) for m in meta.get("tokenizer.ggml.merges", [])]
        tok = HFTokenizer(
            models.BPE(vocab, merges, fuse_unk=False, ignore_merges=pre.ignore_merges)
        )
        tok.pre_tokenizer = _byte_level_pre_tokenizer(pre)
        tok.decoder = decoders.ByteLevel()
    elif kind == "llama":
        scores = meta.get("tokenizer.ggml.scores") or [0.0] * len(tokens)
        tok = HFTokenizer(
            models.BPE(
                vocab, spm_merges(tokens, scores), unk_token=unk, fuse_unk=True, byte_fallback=True
            )
        )
        steps: list[normalizers.Normalizer] = [normalizers.Replace(" ", "\u2581")]
        if meta.get("tokenizer.ggml.add_space_prefix", True):
            steps.insert(0, normalizers.Prepend("\u2581"))
        tok.normalizer = normalizers.Sequence(steps)
        dec = [decoders.Replace("\u2581", " "), decoders.ByteFallback(), decoders.Fuse()]
        if meta.get("tokenizer.ggml.add_space_prefix", True):
            dec.append(decoders.Strip(" ", 1, 0))
        tok.decoder = decoders.Sequence(dec)
    else:
        raise AnerRuntimeError(
            f"{source}: unsupported tokenizer model {kind!r} (supported: gpt2, llama)",
            code="E-TOKENIZER",
        )
    # Both kinds are matched in text whole; only control tokens are left out of a decoded reply
    # and read as text where special-token text is not parsed (llama.cpp's rules), so Gemma's
    # user-defined "\n" and "\n\n" tokens stay in what `chat` prints.
    types = meta.get("tokenizer.ggml.token_type") or []
    tok.add_tokens(
        [
            AddedToken(tokens[i], special=ty == TOKEN_TYPE_CONTROL, normalized=False)
            for i, ty in enumerate(types)
            if ty in (TOKEN_TYPE_CONTROL, TOKEN_TYPE_USER_DEFINED)
        ]
    )
    return tok


def _tokens_by_id(spec: dict[str, Any], normal: int) -> list[tuple[str, int]]:
    """(text, GGUF token type) of every id of a tokenizer.json: vocabulary entries `normal`,
    added tokens control (special) or user-defined, holes ``[PAD{id}]`` unused."""
    by_id: dict[int, tuple[str, int]] = {
        i: (t, normal) for t, i in (spec.get("model") or {}).get("vocab", {}).items()
    }
    for added in spec.get("added_tokens", []):
        kind = TOKEN_TYPE_CONTROL if added.get("special") else TOKEN_TYPE_USER_DEFINED
        by_id[int(added["id"])] = (added["content"], kind)
    count = max(by_id) + 1 if by_id else 0
    return [by_id.get(i, (f"[PAD{i}]", TOKEN_TYPE_UNUSED)) for i in range(count)]


def _spm_vocabulary(spec: dict[str, Any]) -> dict[str, Any] | None:
    """A SentencePiece-style tokenizer.json (BPE with byte fallback, spaces replaced by "▁",
    optionally a "▁" prepended, no pre-tokenizer: Gemma's) as GGUF ``llama`` vocabulary keys;
    None when it is not of that form. A token's score is minus the rank of the first merge that
    makes it (tokens no merge makes score below all), so `spm_merges` ranks the merges in the
    tokenizer.json's order; ``<0xXX>`` tokens are byte tokens."""
    model, norm = spec.get("model") or {}, spec.get("normalizer") or {}
    if spec.get("pre_tokenizer") is not None or not model.get("byte_fallback"):
        return None
    steps = norm.get("normalizers", [norm]) if norm.get("type") == "Sequence" else [norm]
    replace = {"type": "Replace", "pattern": {"String": " "}, "content": "\u2581"}
    prepend = {"type": "Prepend", "prepend": "\u2581"}
    if steps not in ([replace], [prepend, replace]):
        return None
    tokens = _tokens_by_id(spec, TOKEN_TYPE_NORMAL)
    rank: dict[str, int] = {}
    for r, m in enumerate(model.get("merges", [])):
        left, right = m.split(" ", 1) if isinstance(m, str) else m
        rank.setdefault(left + right, r)
    unmade = len(rank)
    types = [
        TOKEN_TYPE_BYTE if k == TOKEN_TYPE_NORMAL and _BYTE_TOKEN.fullmatch(t) else k
        for t, k in tokens
    ]
    unk = model.get("unk_token")
    ids = {t: i for i, (t, _) in enumerate(tokens)}
    return {
        "tokenizer.ggml.model": "llama",
        "tokenizer.ggml.pre": "default",
        "tokenizer.ggml.tokens": [t for t, _ in tokens],
        "tokenizer.ggml.scores": [
            -float(rank[t]) if t in rank else -float(unmade + i) for i, (t, _) in enumerate(tokens)
        ],
        "tokenizer.ggml.token_type": types,
        "tokenizer.ggml.add_space_prefix": len(steps) == 2,
        **({"tokenizer.ggml.unknown_token_id": ids[unk]} if unk in ids else {}),
    }


def _gguf_vocabulary(spec: dict[str, Any]) -> dict[str, Any] | None:
    """A tokenizer.json as GGUF ``tokenizer.ggml.*`` vocabulary keys, as llama.cpp's converter
    writes them: byte-level BPE as ``gpt2``, SentencePiece-style BPE as ``llama``
    (`_spm_vocabulary`); None when it is another kind (a pre-tokenizer unknown to llama.cpp,
    ...)."""
    model, pre = spec.get("model") or {}, spec.get("pre_tokenizer") or {}
    if model.get("type") != "BPE":
        return None
    if model.get("byte_fallback"):
        return _spm_vocabulary(spec)
    steps = pre.get("pretokenizers", [pre]) if pre.get("type") == "Sequence" else [pre]
    kinds = [step.get("type") for step in steps]
    if kinds == ["ByteLevel"] and steps[0].get("use_regex", True):
        name: str | None = "gpt-2"
    elif kinds == ["Split", "ByteLevel"] and not steps[1].get("use_regex", True):
        name = HF_SPLIT_NAMES.get((steps[0].get("pattern") or {}).get("Regex", ""))
    else:
        name = None
    if name is None:
        return None
    tokens = _tokens_by_id(spec, TOKEN_TYPE_NORMAL)
    merges = [m if isinstance(m, str) else " ".join(m) for m in model.get("merges", [])]
    return {
        "tokenizer.ggml.model": "gpt2",
        "tokenizer.ggml.pre": name,
        "tokenizer.ggml.tokens": [t for t, _ in tokens],
        "tokenizer.ggml.token_type": [k for _, k in tokens],
        "tokenizer.ggml.merges": merges,
    }


def _token_text(value: Any) -> str | None:
    """A special token as tokenizer_config.json writes it: a string or an AddedToken object."""
    if isinstance(value, dict):
        value = value.get("content")
    return value if isinstance(value, str) else None


def _read_json(path: Path) -> Any:
    from aner_lang.runtime.io.source import read_json

    return read_json(path, "E-TOKENIZER") if path.is_file() else {}


@dataclass
class Tokenizer:
    """Encode/decode text and render chat prompts for one vocabulary."""

    backend: HFTokenizer
    vocab_size: int
    bos_id: int | None
    eos_id: int | None
    pad_id: int | None
    add_bos: bool
    chat_template: str | None
    stop_ids: frozenset[int] = field(default_factory=frozenset)
    gguf_vocabulary: dict[str, Any] | None = None
    """A Hugging Face tokenizer's GGUF ``tokenizer.ggml.*`` vocabulary keys, when it has a GGUF
    form (for exporting a folder's model to GGUF); None for a GGUF's own tokenizer (its file
    holds them) or a tokenizer GGUF cannot describe."""

    def __post_init__(self) -> None:
        for what in ("bos_id", "eos_id", "pad_id"):
            value = getattr(self, what)
            if value is not None and not 0 <= value < self.vocab_size:
                raise AnerRuntimeError(
                    f"the tokenizer's {what.removesuffix('_id')} token id {value} is outside its "
                    f"vocabulary of {self.vocab_size} tokens",
                    code="E-TOKENIZER",
                )
        bad = sorted(i for i in self.stop_ids if not 0 <= i < self.vocab_size)
        if bad:
            raise AnerRuntimeError(
                f"the tokenizer's end-of-generation token id {bad[0]} is outside its vocabulary "
                f"of {self.vocab_size} tokens",
                code="E-TOKENIZER",
            )

    @classmethod
    def from_metadata(cls, meta: dict[str, Any], source: str = "<gguf>") -> Tokenizer:
        backend = _build_backend(meta, source)
        eos = meta.get("tokenizer.ggml.eos_token_id")
        stops = {
            i
            for i in (
                eos,
                meta.get("tokenizer.ggml.eot_token_id"),
                meta.get("tokenizer.ggml.eom_token_id"),
            )
            if i is not None
        }
        kind = meta.get("tokenizer.ggml.model")
        pre = meta.get("tokenizer.ggml.pre")
        default_bos = kind == "llama" or (pre in PRE_TOKENIZERS and PRE_TOKENIZERS[pre] is _LLAMA3)
        try:
            return cls(
                backend=backend,
                vocab_size=len(meta["tokenizer.ggml.tokens"]),
                bos_id=meta.get("tokenizer.ggml.bos_token_id"),
                eos_id=eos,
                pad_id=meta.get("tokenizer.ggml.padding_token_id", eos),
                add_bos=bool(meta.get("tokenizer.ggml.add_bos_token", default_bos)),
                chat_template=meta.get("tokenizer.chat_template"),
                stop_ids=frozenset(int(i) for i in stops),
            )
        except AnerRuntimeError as e:
            raise AnerRuntimeError(f"{source}: {e.message}", code=e.code) from None

    @classmethod
    def from_gguf(cls, gguf: GGUFFile) -> Tokenizer:
        return cls.from_metadata(gguf.metadata, str(gguf.path))

    @classmethod
    def from_hf_folder(cls, folder: Path) -> Tokenizer:
        """tokenizer.json as it is, with tokenizer_config.json's special tokens and chat template
        (or chat_template.jinja) and the end-of-generation ids of generation_config.json."""
        path = folder / "tokenizer.json"
        if not path.is_file():
            raise AnerRuntimeError(
                f"{folder}: no tokenizer.json",
                code="E-TOKENIZER",
                notes=("a Hugging Face model folder holds its tokenizer as tokenizer.json",),
            )
        _read_json(path)  # bounded, with a clear error when it is not JSON
        try:
            backend = HFTokenizer.from_file(str(path))
        except Exception as exc:  # the tokenizers library raises plain Exception
            raise AnerRuntimeError(
                f"{path}: not a tokenizer the tokenizers library can read ({exc})",
                code="E-TOKENIZER",
            ) from None
        vocabulary = _gguf_vocabulary(json_text.loads(backend.to_str()))
        tc = _read_json(folder / "tokenizer_config.json")
        config = _read_json(folder / "config.json")
        generation = _read_json(folder / "generation_config.json")

        def token_id(key: str) -> int | None:
            text = _token_text(tc.get(key))
            found = backend.token_to_id(text) if text is not None else None
            if found is None and isinstance(config.get(f"{key}_id"), int):
                return int(config[f"{key}_id"])
            return found

        bos, eos, pad = token_id("bos_token"), token_id("eos_token"), token_id("pad_token")
        if "add_bos_token" in tc:
            add_bos = bool(tc["add_bos_token"])
        else:  # what tokenizer.json's post-processor adds
            plain = backend.encode("a", add_special_tokens=False).ids
            full = backend.encode("a", add_special_tokens=True).ids
            add_bos = bos is not None and full[:1] == [bos] and plain[:1] != [bos]
        template = tc.get("chat_template")
        if isinstance(template, list):  # named templates: the default one
            named = {t.get("name"): t.get("template") for t in template if isinstance(t, dict)}
            template = named.get("default")
        jinja = folder / "chat_template.jinja"
        if template is None and jinja.is_file():
            template = files.read_text(jinja, TEMPLATE_OUTPUT)
        stops = {eos} if eos is not None else set()
        for ids in (generation.get("eos_token_id"), config.get("eos_token_id")):
            stops |= {
                int(i) for i in (ids if isinstance(ids, list) else [ids]) if isinstance(i, int)
            }
        try:
            return cls(
                backend=backend,
                vocab_size=backend.get_vocab_size(with_added_tokens=True),
                bos_id=bos,
                eos_id=eos,
                pad_id=pad if pad is not None else eos,
                add_bos=add_bos,
                chat_template=template if isinstance(template, str) else None,
                stop_ids=frozenset(stops),
                gguf_vocabulary=vocabulary,
            )
        except AnerRuntimeError as e:
            raise AnerRuntimeError(f"{folder}: {e.message}", code=e.code) from None

    def with_chat_template(self, template: str) -> Tokenizer:
        """A copy of this tokenizer with `template` as its chat template (this one is shared by
        every model of its file and is never changed). The special token the template writes right
        after an assistant's reply (``<end_of_turn>``, ``<|im_end|>``, ``<|eot_id|>``) ends
        generation too, as llama.cpp's ``eot_token_id`` does: a base model's file, which has no
        template, names only its end-of-text token."""
        chat = replace(self, chat_template=template)
        end = chat._turn_end()
        return chat if end is None else replace(chat, stop_ids=self.stop_ids | {end})

    def _turn_end(self) -> int | None:
        """The special token the chat template renders right after an assistant's reply, if any
        (None when the template cannot render a user turn and a reply)."""
        reply = "\u2063Aner reply\u2063"
        try:
            text = self.apply_chat_template(
                [{"role": "user", "content": "Hello"}, {"role": "assistant", "content": reply}],
                add_generation_prompt=False,
            )
        except AnerRuntimeError:
            return None
        at = text.rfind(reply)
        if at < 0:
            return None
        ids, _ = self.encode_offsets(text[at + len(reply) :], limit=1)
        special = self.backend.get_added_tokens_decoder()
        return ids[0] if ids and ids[0] in special and special[ids[0]].special else None

    def encode(
        self,
        text: str,
        add_special: bool = True,
        parse_special: bool = True,
        limit: int | None = None,
    ) -> list[int]:
        """Token ids of `text`; `add_special` prepends BOS when the vocabulary asks for it,
        `parse_special` matches special-token text such as ``<|im_start|>`` as one token. With
        `limit`, only the first `limit` + 1 ids are kept, and of a long text only its start is
        tokenized (`_head`)."""
        self.backend.encode_special_tokens = not parse_special
        ids = self._head(text, limit).ids[: _kept(limit)]
        if add_special and self.add_bos and self.bos_id is not None:
            ids = [self.bos_id] + ids
        return ids

    def decode(self, ids: Sequence[int], skip_special: bool = False) -> str:
        bad = [i for i in ids if not 0 <= int(i) < self.vocab_size]
        if bad:
            raise AnerRuntimeError(
                f"token id {bad[0]} is outside the vocabulary (0..{self.vocab_size - 1})",
                code="E-TOKEN-ID",
            )
        return self.backend.decode([int(i) for i in ids], skip_special_tokens=skip_special)

    def gguf_metadata(self, vocab_size: int) -> dict[str, Any] | None:
        """Every ``tokenizer.*`` GGUF key of a Hugging Face tokenizer (vocabulary, special ids,
        chat template) for a model of `vocab_size` embedding rows; None when it has no GGUF form.
        Rows past the tokenizer's last token get ``[PAD{id}]`` tokens, as llama.cpp's converter
        writes them."""
        if self.gguf_vocabulary is None:
            return None
        meta = dict(self.gguf_vocabulary)
        tokens = meta["tokenizer.ggml.tokens"]
        pads = range(len(tokens), vocab_size)
        meta["tokenizer.ggml.tokens"] = tokens + [f"[PAD{i}]" for i in pads]
        meta["tokenizer.ggml.token_type"] = meta["tokenizer.ggml.token_type"] + [
            TOKEN_TYPE_USER_DEFINED for _ in pads
        ]
        for key, value in (
            ("bos_token_id", self.bos_id),
            ("eos_token_id", self.eos_id),
            ("padding_token_id", self.pad_id),
            ("add_bos_token", self.add_bos),
        ):
            if value is not None:
                meta["tokenizer.ggml." + key] = value
        if self.chat_template:
            meta["tokenizer.chat_template"] = self.chat_template
        return meta

    def token_text(self, token_id: int) -> str:
        return self.backend.id_to_token(token_id) or ""

    def encode_offsets(
        self, text: str, limit: int | None = None
    ) -> tuple[list[int], list[tuple[int, int]]]:
        """Token ids of `text` as a chat template renders it (special-token text matched, no BOS
        added: the template writes its own) and each token's character span in `text`; `limit`
        as for `encode`."""
        self.backend.encode_special_tokens = False
        enc = self._head(text, limit)
        kept = _kept(limit)
        return list(enc.ids[:kept]), [(int(a), int(b)) for a, b in enc.offsets[:kept]]

    def _head(self, text: str, limit: int | None) -> Encoding:
        """The encoding of `text`, or with `limit` possibly of a prefix of it that starts with
        the same tokens and has more than `limit` of them.

        A training example keeps the first `context` tokens of its text, so a text of millions of
        characters need not become millions of tokens (hundreds of bytes each in the `tokenizers`
        library: a 4 MB line cost 350-500 MB). Prefixes of about four times the length of the
        last are tried, starting at `HEAD_CHARS_PER_TOKEN` characters per token wanted, each cut
        just before a whitespace that follows a word (where the pre-tokenizers of every
        supported vocabulary split), until one has `HEAD_MARGIN` tokens more than `limit`: a
        cut can change only the tokens of the text just before it, far past those kept."""
        if limit is not None:
            chars = (limit + HEAD_MARGIN) * HEAD_CHARS_PER_TOKEN
            while chars < len(text):
                enc = self.backend.encode(text[: _word_end(text, chars)], add_special_tokens=False)
                if len(enc.ids) > limit + HEAD_MARGIN:
                    return enc
                chars *= 4
        return self.backend.encode(text, add_special_tokens=False)

    def apply_chat_template(
        self, messages: Sequence[Mapping[str, Any]], add_generation_prompt: bool = True
    ) -> str:
        """Render the model's chat template (jinja2, HF semantics) for `messages`."""
        return self.render_chat(messages, add_generation_prompt)[0]

    def render_chat(
        self, messages: Sequence[Mapping[str, Any]], add_generation_prompt: bool = True
    ) -> tuple[str, list[tuple[int, int]]]:
        """The rendered chat template and the character spans of its ``{% generation %}`` blocks
        (HF's marking of the assistant's text; none for a template without them)."""
        if not self.chat_template:
            raise AnerRuntimeError(
                "this model has no chat template (GGUF tokenizer.chat_template, or "
                "tokenizer_config.json's chat_template); use generate() with a prompt",
                code="E-CHAT-TEMPLATE",
            )
        from datetime import datetime

        from jinja2 import TemplateError
        from jinja2.sandbox import ImmutableSandboxedEnvironment

        def raise_exception(message: str) -> None:
            raise AnerRuntimeError(f"chat template: {message}", code="E-CHAT-TEMPLATE")

        def tojson(value: Any, indent: int | None = None) -> str:
            return json.dumps(value, ensure_ascii=False, indent=indent)

        env = _bounded_environment(ImmutableSandboxedEnvironment)(
            trim_blocks=True, lstrip_blocks=True, extensions=extensions()
        )
        env.filters["tojson"] = tojson
        env.globals["raise_exception"] = raise_exception
        env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
        token = self.token_text
        rendered: list[str] = []
        spans: list[tuple[int, int]] = []
        env.aner_generation = (rendered, spans)
        try:
            _render_bounded(
                env.from_string(self.chat_template),
                rendered,
                messages=list(messages),
                add_generation_prompt=add_generation_prompt,
                bos_token=token(self.bos_id) if self.bos_id is not None else "",
                eos_token=token(self.eos_id) if self.eos_id is not None else "",
            )
        except TemplateError as exc:
            raise AnerRuntimeError(
                f"chat template failed to render: {exc}", code="E-CHAT-TEMPLATE"
            ) from None
        return "".join(rendered), spans


TEMPLATE_SECONDS = 10.0
"""The longest a chat template may take to render."""
TEMPLATE_OUTPUT = 1 << 24
"""The most characters a rendered chat template (or any string it builds) may hold."""


def _template_limit(what: str) -> AnerRuntimeError:
    return AnerRuntimeError(
        f"chat template: {what}",
        code="E-CHAT-TEMPLATE",
        notes=(
            f"a template may render for {TEMPLATE_SECONDS:g} s and build strings of "
            f"{TEMPLATE_OUTPUT:,} characters at most",
        ),
    )


def _bounded_environment(base: type) -> type:
    """`base` (jinja2's sandbox) with `*`, `**` and `+` checked before they run: a template
    cannot build a string or a list beyond `TEMPLATE_OUTPUT`, or a number of more than a few
    thousand digits, in one operation."""

    class Bounded(base):
        intercepted_binops = frozenset({"*", "**", "+"})

        def call_binop(self, context: Any, operator: str, left: Any, right: Any) -> Any:
            if operator == "**" and isinstance(right, int) and abs(right) > 1024:
                raise _template_limit(f"the exponent {right} is too large")
            if operator == "*":
                n, seq = (right, left) if isinstance(right, int) else (left, right)
                if (
                    isinstance(n, int)
                    and hasattr(seq, "__len__")
                    and len(seq) * n > TEMPLATE_OUTPUT
                ):
                    raise _template_limit("a repeated string or list is too large")
            if (
                operator == "+"
                and hasattr(left, "__len__")
                and hasattr(right, "__len__")
                and len(left) + len(right) > TEMPLATE_OUTPUT
            ):
                raise _template_limit("a concatenated string or list is too large")
            return super().call_binop(context, operator, left, right)

    return Bounded


def _render_bounded(template: Any, out: list[str], **variables: Any) -> None:
    """`template.render(**variables)` into `out`, chunk by chunk (the generation tag reads the
    chunks so far), within `TEMPLATE_SECONDS` and `TEMPLATE_OUTPUT`: the template's own frames
    are traced (line by line, nothing else) so that a loop which outputs nothing is stopped too."""
    deadline = time.monotonic() + TEMPLATE_SECONDS

    def local(frame: Any, event: str, arg: Any) -> Any:
        if time.monotonic() > deadline:
            raise _template_limit(f"rendering took more than {TEMPLATE_SECONDS:g} s")
        return local

    def tracer(frame: Any, event: str, arg: Any) -> Any:
        return local if frame.f_code.co_filename == "<template>" else None

    size = 0
    previous = sys.gettrace()
    sys.settrace(tracer)
    try:
        for chunk in template.generate(**variables):
            size += len(chunk)
            if size > TEMPLATE_OUTPUT:
                raise _template_limit("the rendered text is too long")
            out.append(chunk)
    finally:
        sys.settrace(previous)


def _kept(limit: int | None) -> int | None:
    """How many leading tokens an encoding with `limit` keeps (all without one)."""
    return None if limit is None else limit + 1


def _word_end(text: str, at: int) -> int:
    """The last position at most `at`, and within `HEAD_WORD_WINDOW` of it, of a whitespace
    character after a non-whitespace one; `at` when there is none."""
    for i in range(at, max(at - HEAD_WORD_WINDOW, 1) - 1, -1):
        if text[i].isspace() and not text[i - 1].isspace():
            return i
    return at
