"""How the ranks of `aner run --nproc N` hand their errors to the launcher, which prints one.

The ranks of a script usually meet the same error; printed by each and followed by torchrun's
report of its failed children, it would show N times under a traceback. So the launcher names a
folder in `FOLDER_VARIABLE`, and a rank that fails writes its rendered diagnostic there
(`rank-R.txt`) instead of printing it. The launcher prints the error of the rank that failed first
(the errors of later ranks may be consequences of it: a peer gone from a collective, the stop the
launcher sent), once, with a note naming the rank unless rank 0 failed with the same error and no
rank with another (the launcher stops the other ranks at the first failure, often before they
write theirs). A rank other than 0 that fails waits a few seconds for rank 0's error before it ends
(`MAIN_RANK_WAIT`): the ranks run the same statements, so rank 0 usually meets the same error a
moment later, and the user then sees everything rank 0 printed before it, as in a run of one
process, instead of losing it to the stop the launcher sends at the first failure.

A rank started some other way (torchrun by hand, one process) finds no folder and prints its error
itself. Nothing here imports torch: the ranks' side runs in `aner run`.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from pathlib import Path

from aner_lang.host import files
from aner_lang.problems.errors import AnerRuntimeError

FOLDER_VARIABLE = "ANER_RANK_ERRORS"
"""The environment variable naming the folder the launcher reads the ranks' errors from."""
ERROR_LIMIT = 1024 * 1024
"""The most bytes of a rank's error the launcher reads (a diagnostic is a few lines)."""
MAIN_RANK_WAIT = 10.0
"""The most seconds a failed rank other than 0 waits for rank 0's error before it ends (rank 0
may be behind by its start-up; a rank 0 that fails otherwise or not at all is not waited longer)."""


def record(text: str) -> bool:
    """Write this rank's error `text` for the launcher; False when no launcher asked for it (the
    caller prints it then)."""
    folder = os.environ.get(FOLDER_VARIABLE)
    if not folder:
        return False
    rank = os.environ.get("RANK", "0")
    files.write_file(Path(folder) / f"rank-{rank}.txt", text.encode("utf-8"), overwrite=True)
    main = Path(folder) / "rank-0.txt"
    deadline = time.monotonic() + MAIN_RANK_WAIT
    while rank != "0" and not main.exists() and time.monotonic() < deadline:
        time.sleep(0.02)
    return True


@dataclass(frozen=True)
class RankError:
    """A rank's error as its rank rendered it."""

    rank: int
    text: str


def first(folder: Path) -> tuple[RankError, list[RankError]] | None:
    """The error of the rank that failed first and every rank's error (by the time each was
    written), or None when no rank wrote one."""
    found: list[tuple[int, RankError]] = []
    for path in folder.glob("rank-*.txt"):
        rank = path.stem.removeprefix("rank-")
        if not rank.isdigit():
            continue
        try:
            text = files.read_text(path, ERROR_LIMIT)
        except AnerRuntimeError:
            continue
        found.append((path.stat().st_mtime_ns, RankError(int(rank), text)))
    if not found:
        return None
    errors = [e for _, e in sorted(found, key=lambda f: (f[0], f[1].rank))]
    return errors[0], errors


def report(folder: Path, size: int) -> str | None:
    """What the launcher prints for the ranks' errors in `folder` (a run of `size` ranks): the
    first rank's error, noting its rank unless rank 0 (the one that prints) failed with it too
    and no rank failed otherwise (ranks stopped before writing theirs are taken to agree)."""
    found = first(folder)
    if found is None:
        return None
    error, errors = found
    if any(e.rank == 0 for e in errors) and all(e.text == error.text for e in errors):
        return error.text
    return f"{error.text}\n  = note: on rank {error.rank} of {size}, the first to fail"
