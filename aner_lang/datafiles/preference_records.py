"""Preference data files as records: pairs (a prompt, a chosen and a rejected response) for DPO
and ORPO, and unpaired feedback (a prompt, a completion, a desirable/undesirable label) for KTO.

Rows are read by `aner_lang.datafiles.records.rows` (JSONL, CSV, Parquet), so errors name the file and line
the same way. A pair row has ``chosen`` and ``rejected`` and, in most shapes, a ``prompt``:

* Strings with a string prompt: plain text, the prompt unscored, each response followed by EOS
  (like `prompt_completion` data).
* A message-list prompt (``[{"role": "user", ...}]``), and responses as message lists or strings
  (a string is one assistant message): TRL's conversational shape. The conversation is rendered
  with the model's chat template.
* UltraFeedback (``prompt`` a string, ``chosen``/``rejected`` whole conversations that start with
  that prompt as a user turn): the conversations as they are.
* Anthropic HH (``chosen``/``rejected`` strings of ``\\n\\nHuman: ...\\n\\nAssistant: ...`` turns,
  no prompt): the turns become user/assistant messages, rendered with the model's chat template.
* Message lists with no prompt: the prompt is the messages both conversations share.

In every chat shape the prompt is the longest run of messages the chosen and the rejected
conversation share; only the assistant's turns after it are scored (the responses compared), and
a pair whose conversations do not differ after the prompt is an error.

A feedback row has ``prompt``, ``completion`` (strings, or messages as above) and a boolean
``label`` (true: desirable). Nothing here imports torch: `aner check` reads the first rows of a
literal data path with these rules.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from aner_lang.datafiles.records import ChatRecord, Record, Row, TextRecord, _field_error, _message

HH_TURN = re.compile(r"\n\n(Human|Assistant): ")
"""A turn marker of the Anthropic HH format; the text between markers is the turn's content."""
HH_ROLES = {"Human": "user", "Assistant": "assistant"}


@dataclass(frozen=True)
class PairRecord:
    """A preference pair: the same prompt with the chosen and the rejected response."""

    chosen: Record
    rejected: Record
    where: str = ""


@dataclass(frozen=True)
class FeedbackRecord:
    """An unpaired completion with its label (`desirable`)."""

    example: Record
    desirable: bool
    where: str = ""


class PairFormat:
    """How a row becomes a `PairRecord` (see the module docstring)."""

    def record(self, row: Row) -> PairRecord:
        values = row.values
        for name in ("chosen", "rejected"):
            if name not in values:
                raise _field_error(
                    row,
                    f"no field {name!r}",
                    "a preference pair needs `chosen` and `rejected` (and usually `prompt`)",
                )
        prompt, chosen, rejected = values.get("prompt"), values["chosen"], values["rejected"]
        if isinstance(chosen, str) and isinstance(rejected, str) and isinstance(prompt, str):
            return PairRecord(
                TextRecord(prompt, chosen, row.where),
                TextRecord(prompt, rejected, row.where),
                row.where,
            )
        if prompt is None and isinstance(chosen, str) and isinstance(rejected, str):
            if not (HH_TURN.match(chosen) and HH_TURN.match(rejected)):
                raise _field_error(
                    row,
                    "no field 'prompt', and the responses are not Anthropic HH conversations",
                    "give a `prompt`, or write the responses as `\\n\\nHuman: ...\\n\\nAssistant: "
                    "...` turns",
                )
            chosen, rejected = _hh_messages(row, chosen), _hh_messages(row, rejected)
        return _chat_pair(row, _prompt_messages(row, prompt), chosen, rejected)


class FeedbackFormat:
    """How a row becomes a `FeedbackRecord` (see the module docstring)."""

    def record(self, row: Row) -> FeedbackRecord:
        label = row.values.get("label")
        if not isinstance(label, bool):
            what = "no field" if "label" not in row.values else f"a {type(label).__name__} in field"
            raise _field_error(
                row,
                f"{what} 'label' where true or false is needed",
                "label: true marks a desirable completion, false an undesirable one",
            )
        prompt, completion = row.values.get("prompt"), row.values.get("completion")
        if isinstance(prompt, str) and isinstance(completion, str):
            return FeedbackRecord(TextRecord(prompt, completion, row.where), label, row.where)
        if prompt is None or completion is None:
            name = "prompt" if prompt is None else "completion"
            raise _field_error(
                row, f"no field {name!r}", "feedback rows need prompt, completion, label"
            )
        head = _prompt_messages(row, prompt)
        conversation = head + _responses(row, "completion", completion)
        return FeedbackRecord(ChatRecord(conversation, row.where, len(head)), label, row.where)


def _prompt_messages(row: Row, prompt: Any) -> tuple[Mapping[str, Any], ...]:
    """The prompt as messages: a string is one user turn, a list is checked as chat messages."""
    if prompt is None:
        return ()
    if isinstance(prompt, str):
        return ({"role": "user", "content": prompt},)
    if isinstance(prompt, list):
        return _message_list(row, "prompt", prompt)
    raise _field_error(row, f"a {type(prompt).__name__} in field 'prompt'")


def _responses(row: Row, name: str, value: Any) -> tuple[Mapping[str, Any], ...]:
    """A response as messages: a string is one assistant turn."""
    if isinstance(value, str):
        return ({"role": "assistant", "content": value},)
    if isinstance(value, list):
        return _message_list(row, name, value)
    raise _field_error(row, f"a {type(value).__name__} in field {name!r}")


def _message_list(row: Row, name: str, value: list[Any]) -> tuple[Mapping[str, Any], ...]:
    """`value` checked message by message with the chat format's rules (`records._message`)."""
    if not value:
        raise _field_error(row, f"no messages in field {name!r}")
    out = []
    for i, turn in enumerate(value, start=1):
        if not isinstance(turn, dict):
            raise _field_error(row, f"message {i} of {name!r} is not an object")
        out.append(_message(row, name, i, turn))
    return tuple(out)


def _hh_messages(row: Row, text: str) -> list[dict[str, str]]:
    parts = HH_TURN.split(text)  # ["", role, content, role, content, ...]
    if parts[0].strip():
        raise _field_error(row, "text before the first Human/Assistant turn")
    return [
        {"role": HH_ROLES[role], "content": content.strip()}
        for role, content in zip(parts[1::2], parts[2::2])
    ]


def _chat_pair(
    row: Row, head: Sequence[Mapping[str, Any]], chosen: Any, rejected: Any
) -> PairRecord:
    """Both conversations (prompt messages, then each response), scored after what they share."""
    c = _conversation(row, head, "chosen", chosen)
    r = _conversation(row, head, "rejected", rejected)
    shared = 0
    while shared < min(len(c), len(r)) and c[shared] == r[shared]:
        shared += 1
    if shared == len(c) or shared == len(r) or shared < len(head):
        raise _field_error(
            row, "the chosen and rejected conversations do not differ after the prompt"
        )
    for conversation, name in ((c, "chosen"), (r, "rejected")):
        if not any(m["role"] == "assistant" for m in conversation[shared:]):
            raise _field_error(row, f"the {name} response has no assistant message")
    return PairRecord(ChatRecord(c, row.where, shared), ChatRecord(r, row.where, shared), row.where)


def _conversation(
    row: Row, head: Sequence[Mapping[str, Any]], name: str, value: Any
) -> tuple[Mapping[str, Any], ...]:
    """The whole conversation of one response; UltraFeedback's already starts with the prompt."""
    turns = _responses(row, name, value)
    if head and tuple(turns[: len(head)]) == tuple(head):
        return turns
    return tuple(head) + turns
