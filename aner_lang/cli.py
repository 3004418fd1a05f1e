"""The `aner` command: check, run, plan, check-docs, builtins, explain, lsp, fixture, qualify, and
the job commands submit, jobs, logs, cancel, resume.

Exit codes: 0 success, 1 diagnostics (errors in a script, a failed run), 2 usage errors, 3 a run
stopped on request (SIGTERM, `aner cancel`; a training run after writing its checkpoint), 141 the
output was closed by its reader (`aner plan f.aner | head`).
Diagnostics go to stderr as `file:line:col: severity[code]: message` with a caret excerpt.
Only `run` (through native builtins), `fixture` and `plan` (a GGUF header) may import the
runtime; `check` never does.
Subcommands with arguments of their own are delegated to the module that implements them.
"""

from __future__ import annotations

import argparse
import importlib
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from aner_lang.problems import rank_errors
from aner_lang.problems.diagnostics import Diagnostic, file_error, render
from aner_lang.problems.errors import (
    EXIT_OUTPUT_CLOSED,
    EXIT_STOPPED,
    AnerRuntimeError,
    OutputClosed,
    RunStopped,
)

if TYPE_CHECKING:
    from aner_lang.check import Analysis

Command = Callable[[argparse.Namespace], int]
"""A subcommand: the parsed arguments -> the exit code."""
DATA_PRECHECK = "aner_lang.runtime.train.data_precheck"
"""The check before a run that reads the model's tokenizer (training data without a scored
token): `aner run` and its launcher run it after the other checks, `aner check` does not."""


def _print(diags: list[Diagnostic], source: str | None) -> None:
    for d in diags:
        print(render(d, source), file=sys.stderr)


def _read(path: str) -> str | None:
    """A script's text (bounded: `files.SCRIPT_LIMIT`), or None after printing why not."""
    from aner_lang.host import files

    try:
        return files.read_text(path, files.SCRIPT_LIMIT)
    except AnerRuntimeError as e:
        _print([file_error(path, e)], None)
        return None


def _write(text: str, output: str) -> None:
    """`text` to stdout (`-`) or to the file `output` (replaced), creating its folder; a path of
    the wrong kind is an `AnerRuntimeError` (`files.check_target`)."""
    from aner_lang.host import files

    if output == "-":
        sys.stdout.write(text)
    else:
        files.write_file(output, text.encode("utf-8"), overwrite=True)


def _analyze(path: str, source: str, *, before_running: bool, printed: bool = True) -> Analysis:
    """`check_before_run` (every check before a run: the text, the files and the machine, the
    installed packages); every diagnostic is printed unless `printed` is False (the ranks other
    than 0 of a distributed run)."""
    from aner_lang.check.before_run import check_before_run

    analysis = check_before_run(source, path, running=before_running)
    if printed:
        _print(analysis.diagnostics, source)
    return analysis


def _scoreless_data(analysis: Analysis, source: str, *, printed: bool) -> bool:
    """Whether a `train` call certainly meets data without a scored token (printing the errors):
    the check before a run that needs the model's tokenizer (`DATA_PRECHECK`), skipped where the
    runtime's packages are not installed (the run then says what is missing)."""
    try:
        module = importlib.import_module(DATA_PRECHECK)
    except ImportError:
        return False
    found: list[Diagnostic] = module.scoreless_data(analysis)
    if printed:
        _print(found, source)
    return bool(found)


def cmd_check(args: argparse.Namespace) -> int:
    failed = False
    for path in args.files:
        source = _read(path)
        if source is None:
            failed = True
            continue
        failed |= bool(_analyze(path, source, before_running=False).errors)
    return 1 if failed else 0


def _launch(file: str, nproc: int) -> int:
    """`aner run FILE` on `nproc` ranks of this host (docs/distributed.md): the script is checked
    here once, as `aner run` checks it, and only a script without errors starts the ranks, in a
    child process (`aner_lang.runtime.io.launch`: torchrun's agent, one report of a failed rank),
    so this command never imports torch itself."""
    if "WORLD_SIZE" in os.environ:
        print("aner run: --nproc inside a distributed run (WORLD_SIZE is set)", file=sys.stderr)
        return 2
    source = _read(file)
    if source is None:
        return 1
    analysis = _analyze(file, source, before_running=True)
    if analysis.errors or _scoreless_data(analysis, source, printed=True):
        return 1
    cmd = [sys.executable, "-m", "aner_lang.runtime.io.launch", str(nproc), file]
    return subprocess.run(cmd, check=False).returncode


def cmd_run(args: argparse.Namespace) -> int:
    """Check and run a script. Ctrl-C ends it with status 130 and no traceback (a training run
    saves its checkpoint and says how to resume before it stops); SIGTERM (a job's stop request,
    `timeout`, CI) ends it with EXIT_STOPPED, a training run after it checkpointed
    (`aner_lang.host.sigterm`)."""
    from aner_lang.host.process_clock import timed
    from aner_lang.host.sigterm import stopping_on_sigterm
    from aner_lang.interp import AnerError, ExecContext, run

    if args.nproc < 1:
        print("aner run: --nproc must be at least 1", file=sys.stderr)
        return 2
    if args.nproc > 1:
        return _launch(args.file, args.nproc)
    source = _read(args.file)
    if source is None:
        return 1
    main_rank = os.environ.get("RANK", "0") == "0"  # torchrun's; only rank 0 prints
    with timed("checks"):
        analysis = _analyze(args.file, source, before_running=True, printed=main_rank)
        if analysis.errors or _scoreless_data(analysis, source, printed=main_rank):
            return 1
    path = Path(args.file).resolve()
    with open(os.devnull, "w", encoding="utf-8") as devnull:
        out = sys.stdout if main_rank else devnull
        try:
            with stopping_on_sigterm():
                run(analysis, ExecContext(path.parent, out, path, writes_files=main_rank))
        except AnerError as e:
            d = e.diagnostic
            text = render(d, source if d.path == args.file else _read(d.path) if d.path else None)
            if not rank_errors.record(text):  # a rank of `aner run --nproc N` leaves it to it
                print(text, file=sys.stderr)
            return 1
        except RunStopped as e:
            if main_rank:
                print(f"aner: {e.message}", file=sys.stderr)
            return EXIT_STOPPED
        except KeyboardInterrupt as e:  # its message, when it has one, says how to continue
            if main_rank:
                print(str(e) or "aner: interrupted", file=sys.stderr)
            return 130
    return 0


def cmd_plot(args: argparse.Namespace) -> int:
    """Draw a run's loss curves from its event log (default picture: the log's name, .png)."""
    from aner_lang.datafiles.plot import plot

    log = Path(args.log)
    out = Path(args.output) if args.output else log.with_suffix(".png")
    try:
        curves = plot(log, out, overwrite=args.overwrite)
    except AnerRuntimeError as e:
        print(f"error[{e.code}]: {e.message}", file=sys.stderr)
        for note in e.notes:
            print(f"  = note: {note}", file=sys.stderr)
        return 1
    print(
        f"{out}: {len(curves.train)} updates, {len(curves.validation)} validations",
        file=sys.stderr,
    )
    return 0


def cmd_check_docs(args: argparse.Namespace) -> int:
    from aner_lang.check.docs_check import check_markdown, markdown_files

    failed = False
    total = 0
    for path in markdown_files(args.paths):
        diags, n = check_markdown(path)
        total += n
        _print(diags, None)
        failed |= bool(diags)
    print(f"checked {total} aner block(s)", file=sys.stderr)
    return 1 if failed else 0


def cmd_builtins(args: argparse.Namespace) -> int:
    from aner_lang.builtins import registry
    from aner_lang.builtins.reference import render_reference

    _write(render_reference(registry()), args.output)
    return 0


def cmd_explain(args: argparse.Namespace) -> int:
    """One code's explanation, the list of codes, or (`--markdown`) the whole reference.

    Codes match exactly or in any letter case (`e-syntax`); an unknown code is a usage error (2)
    with the closest known code suggested."""
    from aner_lang.problems.diagnostics import did_you_mean
    from aner_lang.problems.error_codes import ERROR_CODES, lookup
    from aner_lang.problems.error_reference import explain, listing, render_markdown

    if args.markdown:
        if args.code is not None:
            print("aner explain: give a CODE or --markdown, not both", file=sys.stderr)
            return 2
        _write(render_markdown(), args.output)
        return 0
    if args.output != "-":
        print("aner explain: -o/--output only goes with --markdown", file=sys.stderr)
        return 2
    if args.code is None:
        sys.stdout.write(listing())
        return 0
    entry = lookup(args.code)
    if entry is None:
        best = did_you_mean(args.code.strip().upper(), ERROR_CODES)
        hint = f"; did you mean {best}?" if best else ""
        print(f"aner explain: unknown error code {args.code!r}{hint}", file=sys.stderr)
        print("run `aner explain` to list every code", file=sys.stderr)
        return 2
    sys.stdout.write(explain(entry))
    return 0


# Subcommands that parse their own arguments: name -> (module with `main(argv)`, what it is,
# help line, whether `argv` starts with the subcommand's name).
_DELEGATED: dict[str, tuple[str, str, str, bool]] = {
    "fixture": (
        "aner_lang.testing.fixture",
        "the fixture writer",
        "write a tiny deterministic GGUF model (for tests)",
        False,
    ),
    "qualify": (
        "aner_lang.runtime.qualify.report",
        "the qualifier",
        "run this machine's qualification report (tests, benchmarks, every method on SmolLM2)",
        False,
    ),
    "plan": (
        "aner_lang.runtime.train.plan",
        "the planner",
        "predict each train() call's peak GPU memory from the model's header (nothing loads)",
        False,
    ),
    "submit": (
        "aner_lang.runtime.jobs.commands",
        "the job runner",
        "start a script as a background job (prints its id)",
        True,
    ),
    "jobs": ("aner_lang.runtime.jobs.commands", "the job runner", "list background jobs", True),
    "logs": ("aner_lang.runtime.jobs.commands", "the job runner", "show a job's events", True),
    "cancel": (
        "aner_lang.runtime.jobs.commands",
        "the job runner",
        "stop a job cleanly (its checkpoint is written)",
        True,
    ),
    "resume": (
        "aner_lang.runtime.jobs.commands",
        "the job runner",
        "continue a failed, cancelled or interrupted job from its checkpoints",
        True,
    ),
}


def _delegate(module: str, what: str, argv: list[str] | None) -> int:
    try:
        mod = importlib.import_module(module)
    except ImportError as e:
        print(f"aner: {what} is not available: {e}", file=sys.stderr)
        return 2
    try:
        result = mod.main(argv) if argv is not None else mod.main()
    except SystemExit as e:  # its argparse's `--help` or usage error: the output is still flushed
        if isinstance(e.code, str):
            print(e.code, file=sys.stderr)
            return 1
        return e.code or 0
    return int(result or 0)


def main(argv: list[str] | None = None) -> int:
    """Run one `aner` command; its exit status.

    A closed output (`aner plan f.aner | head` once `head` has exited) ends any command quietly
    with `EXIT_OUTPUT_CLOSED`, never a traceback: stdout is flushed here, inside the handler,
    rather than at interpreter exit, and then pointed at the null device so that the exit's own
    flush of what is left has nowhere to fail."""
    try:
        status = _command(argv)
        sys.stdout.flush()
    except (BrokenPipeError, OutputClosed):
        _discard_stdout()
        return EXIT_OUTPUT_CLOSED
    return status


def _discard_stdout() -> None:
    """Point the process's stdout at the null device (a stand-in stdout without a file
    descriptor, as under a test's capture, is left alone)."""
    try:
        fd = sys.stdout.fileno()
    except (AttributeError, OSError, ValueError):
        return
    null = os.open(os.devnull, os.O_WRONLY)
    os.dup2(null, fd)
    os.close(null)


def command_line() -> argparse.ArgumentParser:
    """The `aner` command line: every subcommand, delegated ones included (by name only)."""
    parser = argparse.ArgumentParser(prog="aner", description="The Aner language.")
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("check", help="type-check scripts without running them")
    p.add_argument("files", nargs="+")
    p.set_defaults(fn=cmd_check)
    p = sub.add_parser("run", help="check and run a script")
    p.add_argument("file")
    p.add_argument(
        "--nproc",
        type=int,
        default=1,
        help="run the script on this many ranks of this host (torchrun; one GPU each)",
    )
    p.set_defaults(fn=cmd_run)
    p = sub.add_parser("plot", help="draw a run's training and validation loss from its log")
    p.add_argument("log", help="the JSON-lines event log train() wrote")
    p.add_argument("-o", "--output", help="a .png or .svg file (default: the log's name, .png)")
    p.add_argument("--overwrite", action="store_true", help="replace an existing picture")
    p.set_defaults(fn=cmd_plot)
    p = sub.add_parser("check-docs", help="check the ```aner blocks of Markdown files or folders")
    p.add_argument("paths", nargs="+")
    p.set_defaults(fn=cmd_check_docs)
    p = sub.add_parser("builtins", help="print the builtins reference generated from the registry")
    p.add_argument(
        "-o",
        "--output",
        default="-",
        help="file to write (docs/builtins.md in a checkout), or - for stdout (the default)",
    )
    p.set_defaults(fn=cmd_builtins)
    p = sub.add_parser("explain", help="explain an error code, or list them all")
    p.add_argument("code", nargs="?", help="an error code such as E-SYNTAX (any letter case)")
    p.add_argument(
        "--markdown",
        action="store_true",
        help="write the whole reference as Markdown (docs/errors.md)",
    )
    p.add_argument(
        "-o", "--output", default="-", help="with --markdown: file to write, or - for stdout"
    )
    p.set_defaults(fn=cmd_explain)
    p = sub.add_parser("lsp", help="run the language server on stdio")
    p.set_defaults(fn=lambda a: _delegate("aner_lsp.server", "the language server", None))
    for name, (_, _, what, _) in _DELEGATED.items():
        sub.add_parser(name, help=what, add_help=False)
    return parser


def _command(argv: list[str] | None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] and argv[0] in _DELEGATED:  # everything after the name belongs to its module
        module, what, _, with_name = _DELEGATED[argv[0]]
        return _delegate(module, what, argv if with_name else argv[1:])
    try:
        args = command_line().parse_args(argv)
    except SystemExit as e:
        return int(e.code or 0) and 2
    command: Command = args.fn
    try:
        return command(args)
    except AnerRuntimeError as e:  # a file a command reads or writes: the path and why
        print(f"error[{e.code}]: {e.message}", file=sys.stderr)
        for note in e.notes:
            print(f"  = note: {note}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:  # Ctrl-C: a line, not a traceback (checkpoints are atomic)
        print("aner: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
