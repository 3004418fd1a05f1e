"""JSON text from files and servers, parsed under bounds: every JSON Aner reads goes through `loads`.

Python's `json.loads` has two failures that are no `json.JSONDecodeError` and carry no position:
nesting deeper than the recursion limit is a `RecursionError`, and an integer longer than
Python's integer-conversion limit is a plain `ValueError`. Here both are bounds, checked the same
way for a data row, a model folder's config, a tokenizer, an adapter, a checkpoint, a job's
events and a server's reply, and reported as a `json.JSONDecodeError` at the offending character
(so each caller's message names the file, line and column it already names for bad JSON):

* `MAX_DEPTH` levels of arrays and objects. Real documents nest a handful of levels (a chat row
  with tool calls, a tokenizer, a model config); the bound keeps the parser and every recursive
  walk after it (templates, copies, `json.dumps`) far inside the recursion limit. The depth is
  measured before parsing, and only when the text holds more than `MAX_DEPTH` brackets at all
  (a C-speed count), so ordinary rows cost nothing.
* `MAX_INTEGER_DIGITS` digits of an integer: Python's own default limit (converting digits to an
  int is quadratic in their number), enforced by this module when the process runs without one.

Text is given as `str`, or as `bytes` in UTF-8 (or UTF-16/32 with its byte order mark, as `json`
accepts).
"""

from __future__ import annotations

import json
import re
import sys
from collections.abc import Callable
from itertools import accumulate
from typing import Any

MAX_DEPTH = 100
"""Levels of nested arrays and objects in one JSON document."""
MAX_INTEGER_DIGITS = 4300
"""Digits of one JSON integer: CPython's default `sys.get_int_max_str_digits()`."""

# A JSON string is matched whole, so the brackets and digits inside it are skipped.
_STRING = re.compile(r'"[^"\\]*(?:\\.[^"\\]*)*"', re.DOTALL)
_OTHER_BYTES = bytes(b for b in range(256) if b not in b"[]{}")
_STEP = tuple(1 if b in b"[{" else -1 if b in b"]}" else 0 for b in range(256))
_BRACKETS = re.compile(_STRING.pattern + r"|[\[\]{}]", re.DOTALL)
_DIGITS = re.compile(_STRING.pattern + r"|\d+", re.DOTALL)


def loads(text: str | bytes, *, object_hook: Callable[[dict[str, Any]], Any] | None = None) -> Any:
    """The value of a JSON document; `json.JSONDecodeError` (a `ValueError`) for text that is not
    JSON, nests deeper than `MAX_DEPTH` or holds an integer of more than `MAX_INTEGER_DIGITS`
    digits. `object_hook` is `json.loads`'s: what each object becomes, innermost first."""
    if isinstance(text, (bytes, bytearray)):
        try:
            text = text.decode(json.detect_encoding(text), "surrogatepass")
        except UnicodeDecodeError as exc:
            raise json.JSONDecodeError(f"not UTF-8 text ({exc.reason})", "", 0) from None
    if text.count("[") + text.count("{") > MAX_DEPTH:
        _check_depth(text)
    limit = sys.get_int_max_str_digits()
    parse_int = _bounded_int if limit == 0 or limit > MAX_INTEGER_DIGITS else None
    try:
        return json.loads(text, parse_int=parse_int, object_hook=object_hook)
    except json.JSONDecodeError:
        raise
    except ValueError:  # an integer past Python's conversion limit, or `_bounded_int`'s
        raise _long_integer(text, min(limit or MAX_INTEGER_DIGITS, MAX_INTEGER_DIGITS)) from None


def _check_depth(text: str) -> None:
    """Raise at the first bracket past `MAX_DEPTH` levels. The depth is the largest running sum
    of +1 per opening and -1 per closing bracket outside strings, computed with C-speed string
    operations and iterators; only a document that is too deep is walked bracket by bracket to
    find where."""
    brackets = _STRING.sub("", text).encode("utf-8", "surrogatepass").translate(None, _OTHER_BYTES)
    if max(accumulate(map(_STEP.__getitem__, brackets)), default=0) <= MAX_DEPTH:
        return
    depth = 0
    for m in _BRACKETS.finditer(text):
        c = text[m.start()]
        if c in "[{":
            depth += 1
            if depth > MAX_DEPTH:
                raise json.JSONDecodeError(
                    f"arrays and objects nested more than {MAX_DEPTH} levels deep",
                    text,
                    m.start(),
                )
        elif c in "]}":
            depth -= 1


def _bounded_int(digits: str) -> int:
    if len(digits.lstrip("-")) > MAX_INTEGER_DIGITS:
        raise ValueError(digits)
    return int(digits)


def _long_integer(text: str, limit: int) -> json.JSONDecodeError:
    """The error at the first integer of more than `limit` digits (not in a string, not the
    fraction or exponent of a number)."""
    for m in _DIGITS.finditer(text):
        start, length = m.start(), m.end() - m.start()
        if (
            length > limit
            and text[start] != '"'
            and text[start - 1 : start] not in (".", "e", "E", "+")
        ):
            return json.JSONDecodeError(
                f"an integer of {length:,} digits, more than the {limit:,} read", text, start
            )
    return json.JSONDecodeError(f"an integer of more than {limit:,} digits", text, 0)
