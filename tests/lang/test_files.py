"""The bounded reader every user file goes through: regular files only, limits, exact text."""

from __future__ import annotations

import os

import pytest

from aner_lang.host import files
from aner_lang.problems.errors import AnerRuntimeError


def _code(fn, *args, **kw) -> str:
    with pytest.raises(AnerRuntimeError) as err:
        fn(*args, **kw)
    return err.value.code


def test_text_is_exactly_what_the_file_holds(tmp_path):
    p = tmp_path / "t.txt"
    p.write_bytes("a\r\nb\rc\n\u00e9".encode())
    assert files.read_text(p) == "a\r\nb\rc\n\u00e9"


def test_devices_pipes_and_folders_are_refused_before_opening(tmp_path):
    assert _code(files.read_text, "/dev/zero") == "E-FILE-KIND"
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    assert _code(files.read_text, fifo) == "E-FILE-KIND"  # would block forever if opened
    link = tmp_path / "link"
    link.symlink_to("/dev/urandom")
    assert _code(files.read_bytes, link, 10) == "E-FILE-KIND"
    assert _code(files.read_text, tmp_path) == "E-FILE-KIND"
    assert _code(files.read_text, tmp_path / "nope") == "E-FILE-MISSING"


def test_limits_name_the_file_and_the_bound(tmp_path):
    p = tmp_path / "big.txt"
    p.write_bytes(b"x" * 101)
    with pytest.raises(AnerRuntimeError, match="101 bytes, more than the 100 bytes") as err:
        files.read_bytes(p, 100)
    assert err.value.code == "E-FILE-TOO-LARGE" and str(p) in err.value.message
    assert files.read_bytes(p, 101) == b"x" * 101


def test_bad_utf8_is_located(tmp_path):
    p = tmp_path / "latin1.txt"
    p.write_bytes(b"ok\nab\xe9c\n")
    with pytest.raises(AnerRuntimeError, match="line 2, column 3") as err:
        files.read_text(p)
    assert err.value.code == "E-FILE-ENCODING"


def test_lines_are_read_one_at_a_time_with_a_bound(tmp_path):
    p = tmp_path / "d.jsonl"
    p.write_bytes(b'{"a": 1}\r\n\n{"b": 2}')
    assert list(files.lines(p)) == [(1, '{"a": 1}'), (2, ""), (3, '{"b": 2}')]
    p.write_bytes(b"short\n" + b"y" * 50 + b"\n")
    with pytest.raises(AnerRuntimeError, match="line 2 is longer than 20 bytes"):
        list(files.lines(p, line_limit=20))
