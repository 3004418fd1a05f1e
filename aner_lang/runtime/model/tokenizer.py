"""The tokenizer a GGUF file describes, built with the `tokenizers` library.

Two vocabulary kinds are supported, following llama.cpp's reading of the same metadata:

* ``gpt2``: byte-level BPE from ``tokenizer.ggml.tokens``/``merges``, with the pre-tokenizer named
  by ``tokenizer.ggml.pre`` (llama.cpp's regex list for that name; ``smollm`` isolates every digit
  before the GPT-2 split).
* ``llama``: SentencePiece-style BPE with byte fallback, merges derived from the token scores as
  llama.cpp's SPM tokenizer ranks them, "▁" for spaces and a leading "▁".

Control and user-defined tokens (token types 3 and 4) are special tokens matched in text, as
llama.cpp does with ``parse_special``. The chat template is rendered with jinja2, as llama.cpp's
jinja mode and HF transformers do.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from tokenizers import AddedToken, Regex, decoders, models, normalizers, pre_tokenizers
from tokenizers import Tokenizer as HFTokenizer

from aner_lang.errors import AnerRuntimeError

if TYPE_CHECKING:
    from aner_lang.runtime.io.gguf import GGUFFile

TOKEN_TYPE_CONTROL = 3
TOKEN_TYPE_USER_DEFINED = 4
GPT2_SPLIT = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)"
# llama.cpp's pre-tokenizer regexes applied before the GPT-2 split, by `tokenizer.ggml.pre`.
_PRE_SPLITS: dict[str, tuple[str, ...]] = {
    "gpt2": (),
    "smollm": (r"\p{N}",),
    "starcoder": (r"\p{N}",),
    "refact": (r"\p{N}",),
}


def _gpt2_pre_tokenizer(pre: str) -> pre_tokenizers.PreTokenizer:
    if pre not in _PRE_SPLITS:
        raise AnerRuntimeError(
            f"unsupported GGUF pre-tokenizer {pre!r}; supported: {', '.join(sorted(_PRE_SPLITS))}",
            code="E-TOKENIZER",
        )
    steps: list[pre_tokenizers.PreTokenizer] = [
        pre_tokenizers.Split(Regex(r), behavior="isolated") for r in _PRE_SPLITS[pre]
    ]
    steps.append(pre_tokenizers.Split(Regex(GPT2_SPLIT), behavior="isolated"))
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


def _build_backend(meta: dict[str, Any], source: str) -> HFTokenizer:
    kind = meta.get("tokenizer.ggml.model")
    tokens = meta.get("tokenizer.ggml.tokens")
    if not tokens:
        raise AnerRuntimeError(
            f"{source}: GGUF has no tokenizer vocabulary (tokenizer.ggml.tokens)",
            code="E-TOKENIZER",
        )
    vocab = {t: i for i, t in enumerate(tokens)}
    unk_id = meta.get("tokenizer.ggml.unknown_token_id")
    unk = tokens[unk_id] if unk_id is not None and unk_id < len(tokens) else None
    if kind == "gpt2":
        merges = [tuple(m.split(" ", 1)) for m in meta.get("tokenizer.ggml.merges", [])]
        tok = HFTokenizer(models.BPE(vocab, merges, fuse_unk=False, ignore_merges=False))
        tok.pre_tokenizer = _gpt2_pre_tokenizer(str(meta.get("tokenizer.ggml.pre", "default")))
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
    types = meta.get("tokenizer.ggml.token_type") or []
    special = [
        AddedToken(tokens[i], special=True, normalized=False)
        for i, ty in enumerate(types)
        if ty in (TOKEN_TYPE_CONTROL, TOKEN_TYPE_USER_DEFINED)
    ]
    tok.add_special_tokens(special)
    return tok


@dataclass
class Tokenizer:
    """Encode/decode text and render chat prompts for one GGUF vocabulary."""

    backend: HFTokenizer
    vocab_size: int
    bos_id: int | None
    eos_id: int | None
    pad_id: int | None
    add_bos: bool
    chat_template: str | None
    stop_ids: frozenset[int] = field(default_factory=frozenset)

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
        return cls(
            backend=backend,
            vocab_size=len(meta["tokenizer.ggml.tokens"]),
            bos_id=meta.get("tokenizer.ggml.bos_token_id"),
            eos_id=eos,
            pad_id=meta.get("tokenizer.ggml.padding_token_id", eos),
            add_bos=bool(meta.get("tokenizer.ggml.add_bos_token", kind == "llama")),
            chat_template=meta.get("tokenizer.chat_template"),
            stop_ids=frozenset(int(i) for i in stops),
        )

    @classmethod
    def from_gguf(cls, gguf: GGUFFile) -> Tokenizer:
        return cls.from_metadata(gguf.metadata, str(gguf.path))

    def encode(self, text: str, add_special: bool = True, parse_special: bool = True) -> list[int]:
        """Token ids of `text`; `add_special` prepends BOS when the vocabulary asks for it,
        `parse_special` matches special-token text such as ``<|im_start|>`` as one token."""
        self.backend.encode_special_tokens = not parse_special
        ids = self.backend.encode(text, add_special_tokens=False).ids
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

    def token_text(self, token_id: int) -> str:
        return self.backend.id_to_token(token_id) or ""

    def apply_chat_template(
        self, messages: Sequence[dict[str, str]], add_generation_prompt: bool = True
    ) -> str:
        """Render the GGUF chat template (jinja2, HF semantics) for `messages`."""
        if not self.chat_template:
            raise AnerRuntimeError(
                "this model's GGUF has no chat template "
                "(tokenizer.chat_template); use generate() with a prompt",
                code="E-CHAT-TEMPLATE",
            )
        from jinja2 import TemplateError
        from jinja2.sandbox import ImmutableSandboxedEnvironment

        def raise_exception(message: str) -> None:
            raise AnerRuntimeError(f"chat template: {message}", code="E-CHAT-TEMPLATE")

        env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
        env.globals["raise_exception"] = raise_exception
        token = self.token_text
        try:
            return env.from_string(self.chat_template).render(
                messages=list(messages),
                add_generation_prompt=add_generation_prompt,
                bos_token=token(self.bos_id) if self.bos_id is not None else "",
                eos_token=token(self.eos_id) if self.eos_id is not None else "",
            )
        except TemplateError as exc:
            raise AnerRuntimeError(
                f"chat template failed to render: {exc}", code="E-CHAT-TEMPLATE"
            ) from None
