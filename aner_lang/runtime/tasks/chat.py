"""Conversations as training examples: rendered with the model's chat template, the assistant's
turns found exactly, token by token.

The whole conversation is rendered once and tokenized as it is (as HF's
`apply_chat_template(..., tokenize=True)` does: special-token text matched, no BOS added beyond
what the template writes), so the model trains on exactly the tokens it sees at inference. The
assistant's text is found in the rendered string:

* A template that marks it with ``{% generation %}`` blocks (HF's convention for
  `return_assistant_tokens_mask`) gives the spans itself.
* Otherwise each assistant message's span is what it adds to the conversation: from the end of the
  rendering of the messages before it with the generation prompt (``<|im_start|>assistant\\n``) to
  the end of the rendering through it. Both renderings must be prefixes of the whole one; a template
  that rewrites earlier turns (dropping past reasoning, say) cannot be split this way and is an
  error naming the example. Text after the turn's last end-of-turn token (the newline a template
  writes between turns) is not the assistant's: the model stops at that token.

A token is the assistant's when any character of it is (HF's rule), so a token that straddles the
prompt's end is scored.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from aner_lang.problems.errors import AnerRuntimeError

if TYPE_CHECKING:
    from aner_lang.runtime.model.tokenizer import Tokenizer

Span = tuple[int, int]


def chat_tokens(
    tokenizer: Tokenizer,
    messages: Sequence[Mapping[str, Any]],
    loss_on: str,
    where: str,
    scored_from: int = 0,
    limit: int | None = None,
) -> tuple[list[int], list[bool]]:
    """(token ids, scored flags) of a conversation; `loss_on` is ``responses`` (the assistant's
    turns from message `scored_from` on) or ``all``. With `limit`, only the first `limit` + 1
    tokens (`Tokenizer.encode_offsets`)."""
    text, marked = tokenizer.render_chat(messages, add_generation_prompt=False)
    ids, offsets = tokenizer.encode_offsets(text, limit)
    if loss_on == "all":
        return ids, [True] * len(ids)
    if marked:
        start = (
            len(tokenizer.apply_chat_template(messages[:scored_from], add_generation_prompt=True))
            if scored_from
            else 0
        )
        return ids, _covered(offsets, [(s, e) for s, e in marked if e > start])
    spans = _assistant_spans(tokenizer, messages, text, where, scored_from)
    scored = _covered(offsets, spans)
    # Where the ids stop short of the text, a turn running past them may have its last
    # end-of-turn token in the text not tokenized: found there by its text.
    tokenized = offsets[-1][1] if limit is not None and len(ids) > limit else len(text)
    stop_texts = [tokenizer.token_text(i) for i in tokenizer.stop_ids]
    for start, end in spans:  # the turn ends at its last end-of-turn token
        if end > tokenized and any(t and text.find(t, tokenized, end) >= 0 for t in stop_texts):
            continue
        inside = [i for i, (a, b) in enumerate(offsets) if b > start and a < end]
        stops = [i for i in inside if ids[i] in tokenizer.stop_ids]
        for i in inside:
            if stops and i > stops[-1]:
                scored[i] = False
    return ids, scored


def _covered(offsets: Sequence[tuple[int, int]], spans: Sequence[Span]) -> list[bool]:
    """Whether each token (character span) shares a character with a span."""
    return [any(b > s and a < e for s, e in spans) for a, b in offsets]


def _assistant_spans(
    tokenizer: Tokenizer,
    messages: Sequence[Mapping[str, Any]],
    text: str,
    where: str,
    scored_from: int,
) -> list[Span]:
    spans = []
    for i, message in enumerate(messages):
        if message.get("role") != "assistant" or i < scored_from:
            continue
        before = tokenizer.apply_chat_template(messages[:i], add_generation_prompt=True)
        through = tokenizer.apply_chat_template(messages[: i + 1], add_generation_prompt=False)
        if not (through.startswith(before) and text.startswith(through)):
            raise AnerRuntimeError(
                f"{where}: the chat template does not render message {i + 1} (assistant) as an "
                "addition to the conversation before it, so its tokens cannot be told apart",
                code="E-DATA-ASSISTANT-SPANS",
                notes=(
                    "mark the assistant's text in the template with {% generation %}...{% "
                    "endgeneration %}, or train on every token with loss_on: all",
                ),
            )
        spans.append((len(before), len(through)))
    return spans
