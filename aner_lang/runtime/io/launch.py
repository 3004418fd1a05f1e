"""The ranks of `aner run --nproc N FILE`: torchrun's elastic agent started in this process, and
one report of how they failed.

`aner run` checks the script first and starts this module (so that it never imports torch
itself): `python -m aner_lang.runtime.io.launch N FILE` is `torchrun --standalone
--nproc-per-node N -m aner_lang.cli run FILE` (docs/distributed.md), run through torchrun's own
`run` so that a failed rank is an exception here, not torchrun's traceback. The ranks write their
errors to a folder of this launch (`aner_lang.problems.rank_errors`), and the error of the rank that failed
first is printed once. A rank that ended without writing one (killed, a crash of the interpreter)
is reported by its exit status; a rank stopped on request passes its status on (3 or 130: the
rank printed how to continue).

Exit codes are `aner run`'s: 0, 1 for a failure, 3 or 130 for a stop, 128 + the signal for a
launcher ended by a signal (its agent stops the ranks first).
"""

from __future__ import annotations

import logging
import os
import signal
import sys
import tempfile
from pathlib import Path

from torch.distributed.elastic.multiprocessing.api import SignalException
from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
from torch.distributed.run import parse_args, run

from aner_lang.problems import rank_errors
from aner_lang.problems.errors import EXIT_STOPPED

STOPPED = (EXIT_STOPPED, 130)
"""Exit statuses of a rank stopped on request (SIGTERM or a job's cancel; Ctrl-C)."""


def torchrun_arguments(nproc: int, file: str) -> list[str]:
    """The torchrun command line (after `torchrun`) that runs `file` on `nproc` ranks here."""
    return ["--standalone", "--nproc-per-node", str(nproc), "-m", "aner_lang.cli", "run", file]


def launch(nproc: int, file: str) -> int:
    """Run `file` on `nproc` ranks of this host; the exit code, after printing any failure."""
    logging.getLogger("torch.distributed").setLevel(logging.CRITICAL)  # failures: reported here
    with tempfile.TemporaryDirectory(prefix="aner-ranks-") as folder:
        os.environ[rank_errors.FOLDER_VARIABLE] = folder
        try:
            run(parse_args(torchrun_arguments(nproc, file)))
        except ChildFailedError as e:
            return _failed(e, Path(folder), nproc)
        except SignalException as e:
            return 128 + int(e.sigval)
    return 0


def _failed(e: ChildFailedError, folder: Path, nproc: int) -> int:
    """Print the first failure of the ranks; the exit code."""
    text = rank_errors.report(folder, nproc)
    if text is not None:
        print(text, file=sys.stderr)
        return 1
    rank, failure = e.get_first_failure()
    status = failure.exitcode
    if status in STOPPED:
        return status
    if status < 0:
        name = signal.Signals(-status).name if -status in signal.valid_signals() else -status
        print(f"aner run: rank {rank} of {nproc} was killed by signal {name}", file=sys.stderr)
    else:
        print(f"aner run: rank {rank} of {nproc} exited with status {status}", file=sys.stderr)
    return 1


def main(argv: list[str] | None = None) -> int:
    """`python -m aner_lang.runtime.io.launch NPROC FILE`."""
    nproc, file = argv if argv is not None else sys.argv[1:]
    return launch(int(nproc), file)


if __name__ == "__main__":
    sys.exit(main())
