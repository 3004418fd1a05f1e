"""Conversations as plain question/answer texts, for benchmarks that compare models of which some
have no chat template (the Gemma 3 270M GGUF carries none): every model reads the same text."""

from __future__ import annotations

from pathlib import Path

from aner_lang.datafiles.records import ChatRecord, Format, TextRecord
from aner_lang.runtime.tasks.data import Dataset, from_file


def question_answer(path: Path, context: int) -> Dataset:
    """The conversations of a chat JSONL file, in file order: each one's user turn (the last, if
    several) as the unscored prompt, with a newline, and its assistant turn as the completion."""
    chats = from_file(path, context, Format("chat", None, None, None, None), "responses")
    records = []
    for chat in chats.records:
        assert isinstance(chat, ChatRecord)
        turns = {m["role"]: str(m["content"]) for m in chat.messages}
        records.append(TextRecord(turns["user"] + "\n", turns["assistant"], chat.where))
    return Dataset(tuple(records), context)
