"""Training data files as records: the file types Aner reads and the formats of their rows.

A dataset file is read as rows, each a mapping of field names to values with the place it came
from (`path:line`, or `path: row n` for tables):

* ``.jsonl`` / ``.ndjson``: one JSON object per line; blank lines are skipped. Lines are split at
  ``\\n`` only, so a U+2028 inside a JSON string is text, and a line is read on its own (memory is
  bounded by the longest line, `files.LINE_LIMIT`).
* ``.txt``: every non-blank line is a row ``{"text": line}`` (the line ending removed, nothing
  else: text reaches the tokenizer exactly as it is in the file).
* ``.csv`` and ``.parquet`` (through `pyarrow`, read a batch at a time): every row; CSV values are
  read as strings, never converted.

A format turns a row into a record (`TextRecord` or `ChatRecord`):

* ``text``: the string field `field` (default ``text``), every token scored.
* ``prompt_completion``: `prompt_field` (unscored) and `completion_field` (scored).
* ``chat``: a list of messages, OpenAI style (``messages``: ``role``/``content``; roles system,
  user, assistant, tool; an assistant message may carry ``tool_calls`` instead of content) or
  ShareGPT (``conversations``: ``from``/``value``, with human, gpt, system, tool, function_call
  and observation as `SHAREGPT_ROLES` maps them). Rendered later with the model's chat template.
* ``alpaca``: ``instruction``, optional ``input``, ``output``, rendered with an instruction
  template (Stanford Alpaca's two prompts unless `template` is given, where ``{instruction}`` and
  ``{input}`` are replaced); ``alpaca_chat``: the same fields as a user turn (instruction, a blank
  line, input) and an assistant turn, through the model's chat template.
* ``auto``: the first of chat, alpaca, prompt_completion, text whose fields the row has.

Everything here is torch-free: `aner check` reads every row of a literal data path with the
same rules the run uses (`check_records`). A bad row is an error naming the file and line.
"""

from __future__ import annotations

import csv
import json
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol, TypeVar

from aner_lang.host import files, json_text
from aner_lang.problems.errors import AnerRuntimeError

ROLES = ("system", "user", "assistant", "tool")
SHAREGPT_ROLES = {
    "system": "system",
    "human": "user",
    "user": "user",
    "gpt": "assistant",
    "assistant": "assistant",
    "function_call": "assistant",
    "tool": "tool",
    "function": "tool",
    "observation": "tool",
}
SUFFIXES = (".jsonl", ".ndjson", ".txt", ".csv", ".parquet")
TABLE_BATCH_ROWS = 1024

ALPACA_WITH_INPUT = (
    "Below is an instruction that describes a task, paired with an input that provides further "
    "context. Write a response that appropriately completes the request.\n\n"
    "### Instruction:\n{instruction}\n\n### Input:\n{input}\n\n### Response:\n"
)
ALPACA_NO_INPUT = (
    "Below is an instruction that describes a task. Write a response that appropriately "
    "completes the request.\n\n### Instruction:\n{instruction}\n\n### Response:\n"
)


@dataclass(frozen=True)
class Row:
    """One row of a data file and where it is (`path:line` or `path: row n`)."""

    where: str
    values: Mapping[str, Any]


@dataclass(frozen=True)
class TextRecord:
    """A text: an unscored `prompt` (may be empty) and a scored `completion`."""

    prompt: str
    completion: str
    where: str = ""


@dataclass(frozen=True)
class ChatRecord:
    """A conversation: messages with a ``role`` of `ROLES`, in the shape chat templates take."""

    messages: tuple[Mapping[str, Any], ...]
    where: str = ""
    scored_from: int = 0
    """The first message whose assistant turns are scored (a preference pair's responses follow
    its prompt messages; earlier assistant turns are context)."""


Record = TextRecord | ChatRecord


@dataclass(frozen=True)
class Format:
    """How rows become records: a format name and its field options."""

    name: str = "auto"
    field: str | None = None
    prompt_field: str | None = None
    completion_field: str | None = None
    template: str | None = None

    def record(self, row: Row) -> Record:
        """The record of `row`; an error naming its place when it lacks this format's fields."""
        name = self.name if self.name != "auto" else detect(row, self)
        if name == "text":
            return TextRecord("", _string(row, self.field or "text"), row.where)
        if name == "prompt_completion":
            return TextRecord(
                _string(row, self.prompt_field or "prompt"),
                _string(row, self.completion_field or "completion"),
                row.where,
            )
        if name == "chat":
            return ChatRecord(_messages(row, self.field), row.where)
        instruction, extra = _string(row, "instruction"), _optional_string(row, "input")
        output = _string(row, "output")
        if name == "alpaca_chat":
            user = instruction + ("\n\n" + extra if extra else "")
            return ChatRecord(
                ({"role": "user", "content": user}, {"role": "assistant", "content": output}),
                row.where,
            )
        template = self.template or (ALPACA_WITH_INPUT if extra else ALPACA_NO_INPUT)
        prompt = template.replace("{instruction}", instruction).replace("{input}", extra)
        return TextRecord(prompt, output, row.where)


def jsonl_format(field: str, prompt_field: str | None, completion_field: str | None) -> Format:
    """The format `load_jsonl` reads: `field` texts, or a prompt/completion pair (both given)."""
    if (prompt_field is None) != (completion_field is None):
        raise AnerRuntimeError(
            "load_jsonl: give both prompt_field and completion_field, or neither",
            code="E-DATA-FIELD",
        )
    if prompt_field is None:
        return Format("text", field=field)
    return Format("prompt_completion", None, prompt_field, completion_field)


def detect(row: Row, fmt: Format) -> str:
    """The format a row's fields say it is in (`Format.name == "auto"`)."""
    keys = row.values
    if any(isinstance(keys.get(k), list) for k in (fmt.field, "messages", "conversations") if k):
        return "chat"
    if "instruction" in keys and "output" in keys:
        return "alpaca"
    if (fmt.prompt_field or "prompt") in keys and (fmt.completion_field or "completion") in keys:
        return "prompt_completion"
    if (fmt.field or "text") in keys:
        return "text"
    raise _field_error(
        row,
        "fits no data format",
        "a row needs `messages` or `conversations` (chat), `instruction` and `output` (alpaca), "
        "`prompt` and `completion`, or `text` (or the fields named by field:, prompt_field:, "
        "completion_field:)",
    )


def _fields(row: Row) -> str:
    return ", ".join(sorted(map(str, row.values))) or "none"


def _field_error(row: Row, what: str, *notes: str) -> AnerRuntimeError:
    return AnerRuntimeError(
        f"{row.where}: {what} (fields: {_fields(row)})", code="E-DATA-FIELD", notes=notes
    )


def _string(row: Row, name: str) -> str:
    value = row.values.get(name)
    if not isinstance(value, str):
        what = "no field" if name not in row.values else f"a {type(value).__name__} in field"
        raise _field_error(row, f"{what} {name!r} where a string is needed")
    return value


def _optional_string(row: Row, name: str) -> str:
    return _string(row, name) if row.values.get(name) is not None else ""


def _messages(row: Row, field: str | None) -> tuple[Mapping[str, Any], ...]:
    """The conversation of a chat row, as role/content messages (ShareGPT's mapped)."""
    name = field or next((k for k in ("messages", "conversations") if k in row.values), "messages")
    turns = row.values.get(name)
    if not isinstance(turns, list) or not turns:
        raise _field_error(row, f"no list of messages in field {name!r}")
    out = []
    for i, turn in enumerate(turns, start=1):
        if not isinstance(turn, dict):
            raise _field_error(row, f"message {i} of {name!r} is not an object")
        out.append(_message(row, name, i, turn))
    if not any(m["role"] == "assistant" for m in out):
        raise _field_error(row, f"the conversation in {name!r} has no assistant message")
    return tuple(out)


def _message(row: Row, name: str, i: int, turn: dict[str, Any]) -> Mapping[str, Any]:
    where = f"message {i} of {name!r}"
    if "from" in turn and "role" not in turn:  # ShareGPT
        speaker = turn.get("from")
        role = SHAREGPT_ROLES.get(speaker) if isinstance(speaker, str) else None
        if role is None:
            raise _field_error(
                row,
                f"{where} is from {speaker!r}",
                f"ShareGPT speakers are {', '.join(SHAREGPT_ROLES)}",
            )
        content = turn.get("value")
        if not isinstance(content, str):
            raise _field_error(row, f"{where} has no string `value`")
        return {"role": role, "content": content}
    role = turn.get("role")
    if role not in ROLES:
        raise _field_error(
            row, f"{where} has role {role!r}", f"roles are {', '.join(ROLES)} (OpenAI messages)"
        )
    content = turn.get("content")
    if not isinstance(content, str) and not (role == "assistant" and turn.get("tool_calls")):
        raise _field_error(row, f"{where} has no string `content`")
    return dict(turn)


# ---- reading rows ---------------------------------------------------------------------------------


def rows(path: Path, limit: int | None = None) -> Iterator[Row]:
    """The rows of a data file (at most `limit`), by its suffix (see the module docstring)."""
    suffix = path.suffix.lower()
    if suffix in (".jsonl", ".ndjson"):
        reader: Iterator[Row] = _jsonl_rows(path)
    elif suffix == ".txt":
        reader = (
            Row(f"{path}:{n}", {"text": line}) for n, line in files.lines(path) if line.strip()
        )
    elif suffix in (".csv", ".parquet"):
        reader = _table_rows(path, suffix)
    else:
        raise AnerRuntimeError(
            f"{path}: not a data file Aner reads (by its suffix)",
            code="E-DATA-FORMAT",
            notes=(f"data files end in {', '.join(SUFFIXES)}",),
        )
    for count, row in enumerate(reader):
        if limit is not None and count >= limit:
            return
        yield row


def _jsonl_rows(path: Path) -> Iterator[Row]:
    for n, line in files.lines(path):
        if not line.strip():
            continue
        try:
            value = json_text.loads(line)
        except json.JSONDecodeError as exc:
            raise AnerRuntimeError(
                f"{path}:{n}: not valid JSON ({exc.msg}, column {exc.colno})", code="E-DATA-JSON"
            ) from None
        if not isinstance(value, dict):
            raise AnerRuntimeError(
                f"{path}:{n}: each line must be a JSON object, not a {type(value).__name__}",
                code="E-DATA-JSON",
            )
        yield Row(f"{path}:{n}", value)


def _table_rows(path: Path, suffix: str) -> Iterator[Row]:
    """CSV or Parquet rows through pyarrow, a batch at a time."""
    files.regular_size(path, files.DATA_LIMIT)
    try:
        import pyarrow as pa
        import pyarrow.csv as pacsv
        import pyarrow.parquet as pq
    except ImportError:
        raise AnerRuntimeError(
            f"{path}: reading {suffix} files needs pyarrow",
            code="E-NATIVE-UNAVAILABLE",
            notes=("install the native extra: pip install 'aner[native]'",),
        ) from None
    try:
        if suffix == ".parquet":
            batches = pq.ParquetFile(path).iter_batches(batch_size=TABLE_BATCH_ROWS)
        else:
            header = next((line for _, line in files.lines(path)), "")
            names = next(csv.reader([header]), [])
            batches = pacsv.open_csv(
                path,
                convert_options=pacsv.ConvertOptions(
                    column_types={n: pa.string() for n in names}, strings_can_be_null=False
                ),
            )
        n = 0
        for batch in batches:
            for values in batch.to_pylist():
                n += 1
                yield Row(f"{path}: row {n}", values)
    except (pa.ArrowException, OSError) as exc:
        raise AnerRuntimeError(
            f"{path}: cannot be read as {suffix[1:]} ({str(exc).strip()[:300]})",
            code="E-DATA-TABLE",
        ) from None


R = TypeVar("R", covariant=True)


class RowFormat(Protocol[R]):
    """Turns a row into a record (`Format`, and the preference formats)."""

    def record(self, row: Row) -> R: ...


def records(path: Path, fmt: RowFormat[R], limit: int | None = None) -> list[R]:
    """The records of a data file; E-DATA-EMPTY when it has none."""
    out = [fmt.record(row) for row in rows(path, limit)]
    if not out:
        raise _empty(path)
    return out


def check_records(path: Path, fmt: RowFormat[object]) -> int:
    """The number of records of a data file, every row checked as `records` checks it (the same
    errors, E-DATA-EMPTY included) but none kept: memory is bounded by a row, not the file."""
    count = 0
    for row in rows(path):
        fmt.record(row)
        count += 1
    if not count:
        raise _empty(path)
    return count


def _empty(path: Path) -> AnerRuntimeError:
    return AnerRuntimeError(f"{path}: the file has no examples", code="E-DATA-EMPTY")
