"""Errors that cross from the runtime into the interpreter.

The native runtime (torch side) raises `AnerRuntimeError` for anything a user did wrong or could
fix (bad file, wrong shapes, no CUDA); the interpreter turns it into a diagnostic with the Aner
source span and call stack. This module imports nothing heavy so that every layer may use it.
"""

from __future__ import annotations


class AnerRuntimeError(Exception):
    """A user-facing failure raised by a builtin implementation.

    `code` is a stable error code (e.g. ``"E-GGUF-TRUNCATED"``), registered with its explanation in
    `aner_lang.problems.error_codes`; it has no default, so that every failure names a registered code.
    `notes` are extra lines shown under the message (what was expected, how to fix it).
    """

    def __init__(self, message: str, *, code: str, notes: tuple[str, ...] = ()) -> None:
        super().__init__(message)
        self.message = message
        self.code = code
        self.notes = tuple(notes)


class NativeBackendUnavailable(AnerRuntimeError):
    """The native backend (torch, gguf, ...) is not installed, so a native builtin cannot run."""

    def __init__(self, builtin: str, package: str) -> None:
        super().__init__(
            f"native backend unavailable: `{builtin}` needs the Python package '{package}'",
            code="E-NATIVE-UNAVAILABLE",
            notes=("install it with: pip install 'aner[native]'",),
        )
        self.package = package


EXIT_STOPPED = 3
"""The `aner` command's exit status for a run that ended on a stop request (`RunStopped`)."""


class RunStopped(BaseException):
    """A run ended early because it was asked to stop (SIGTERM, SIGINT, `aner cancel`).

    A `BaseException`, so that no builtin's or the interpreter's error handling turns a requested
    stop into an error report: it travels straight to the `aner` command, which prints `message`
    (the last update done and the checkpoint written) and exits with its own status.
    """

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


class OutputClosed(BaseException):
    """The reader of a run's output went away (`aner run s.aner | head` after `head` exits).

    Not a failure of the script: the run stops where it printed, as a Unix filter stops on
    SIGPIPE. A `BaseException`, like `RunStopped`, so that it travels straight to the `aner`
    command, which ends quietly with `EXIT_OUTPUT_CLOSED`.
    """


EXIT_OUTPUT_CLOSED = 141
"""The `aner` command's exit status when its output was closed: 128 + SIGPIPE, the status a shell
reports for a filter that SIGPIPE ended (`set -o pipefail` sees it as such)."""
