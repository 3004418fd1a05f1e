"""The job subcommands of `aner`: submit, jobs, logs, cancel, resume.

    aner submit FILE.aner [--checkpoint-every N]   start the script detached; prints the job id
    aner jobs [--json]                             every job: state, progress, loss, start, device
    aner logs ID [-f] [--json]                     the job's events (-f: follow until it ends)
    aner cancel ID [--wait]                        stop it cleanly (checkpoint written)
    aner resume ID [--wait]                        continue a failed, cancelled or interrupted job

Exit codes as for the rest of `aner`: 0 success, 1 an error (a script that does not check, an
unknown job, a job in the wrong state), 2 usage. None of these import torch.
"""

from __future__ import annotations

import argparse
import json
import sys
from datetime import datetime
from pathlib import Path
from typing import Any

from aner_lang.problems.diagnostics import render
from aner_lang.problems.errors import AnerRuntimeError
from aner_lang.runtime.jobs import events, manage
from aner_lang.runtime.jobs.store import JobRecord, JobStore

COMMANDS = ("submit", "jobs", "logs", "cancel", "resume")


def _when(t: float | None) -> str:
    return datetime.fromtimestamp(t).strftime("%Y-%m-%d %H:%M:%S") if t else "-"


def _progress(job: JobRecord) -> str:
    if job.updates is None:
        return "-"
    call = f" (train {job.train_call})" if job.train_call and job.train_call > 1 else ""
    return f"{job.updates}/{job.steps}{call}"


def as_json(job: JobRecord) -> dict[str, Any]:
    """What `aner jobs --json` shows of a job."""
    return {
        "id": job.id,
        "state": job.shown_state,
        "script": job.script,
        "attempt": job.attempt,
        "train_call": job.train_call,
        "updates": job.updates,
        "steps": job.steps,
        "loss": job.loss,
        "created": job.created,
        "started": job.started,
        "ended": job.ended,
        "device": job.device,
        "exit_code": job.exit_code,
        "error": job.error,
        "folder": job.folder,
    }


def _table(jobs: list[JobRecord]) -> str:
    rows = [("ID", "STATE", "PROGRESS", "LOSS", "STARTED", "DEVICE", "SCRIPT")]
    for j in jobs:
        loss = f"{j.loss:.4f}" if j.loss is not None else "-"
        rows.append(
            (
                str(j.id),
                j.shown_state,
                _progress(j),
                loss,
                _when(j.started),
                j.device or "-",
                j.script,
            )
        )
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]) - 1)]
    return "".join(
        "  ".join(cell.ljust(w) for cell, w in zip(r, widths)) + "  " + r[-1] + "\n" for r in rows
    )


def _submit(store: JobStore, args: argparse.Namespace) -> int:
    try:
        job = manage.submit(store, Path(args.file), checkpoint_every=args.checkpoint_every)
    except manage.ScriptRejected as e:
        for d in e.analysis.diagnostics:
            print(render(d, e.analysis.source), file=sys.stderr)
        print("aner submit: the script has errors; no job was started", file=sys.stderr)
        return 1
    print(job.id)
    print(f"aner: job {job.id} submitted; follow it with `aner logs -f {job.id}`", file=sys.stderr)
    return 0


def _jobs(store: JobStore, args: argparse.Namespace) -> int:
    jobs = store.all()
    if args.json:
        print(json.dumps([as_json(j) for j in jobs], indent=1))
    else:
        sys.stdout.write(_table(jobs))
    return 0


def _logs(store: JobStore, args: argparse.Namespace) -> int:
    job = store.get(args.id)
    folder = Path(job.folder)
    finished = (lambda: not store.get(args.id).active) if args.follow else (lambda: True)
    stream = events.follow(folder, finished)
    for event in stream:
        print(json.dumps(event) if args.json else events.describe(event), flush=True)
    return 0


def _cancel(store: JobStore, args: argparse.Namespace) -> int:
    job = manage.cancel(store, args.id)
    print(
        f"aner: cancelling job {job.id}: the update in progress finishes and a checkpoint is "
        "written",
        file=sys.stderr,
    )
    if args.wait:
        job = manage.wait(store, args.id)
        print(f"aner: job {job.id} is {job.shown_state}", file=sys.stderr)
    return 0


def _resume(store: JobStore, args: argparse.Namespace) -> int:
    job = manage.resume(store, args.id)
    print(f"aner: job {job.id} resumed (attempt {job.attempt})", file=sys.stderr)
    if args.wait:
        job = manage.wait(store, args.id)
        print(f"aner: job {job.id} is {job.shown_state}", file=sys.stderr)
        return 0 if job.state == "finished" else 1
    return 0


def _positive(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="aner")
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("submit", help="start a script as a background job")
    p.add_argument("file")
    p.add_argument(
        "--checkpoint-every",
        type=_positive,
        default=manage.DEFAULT_CHECKPOINT_EVERY,
        help="updates between checkpoints for train calls that do not set checkpoint_every",
    )
    p.set_defaults(fn=_submit)
    p = sub.add_parser("jobs", help="list jobs")
    p.add_argument("--json", action="store_true")
    p.set_defaults(fn=_jobs)
    p = sub.add_parser("logs", help="show a job's events")
    p.add_argument("id", type=int)
    p.add_argument("-f", "--follow", action="store_true", help="follow until the job ends")
    p.add_argument("--json", action="store_true", help="one JSON event a line")
    p.set_defaults(fn=_logs)
    for name, fn, what in (
        ("cancel", _cancel, "stop a job cleanly (its checkpoint is written)"),
        ("resume", _resume, "continue a failed, cancelled or interrupted job"),
    ):
        p = sub.add_parser(name, help=what)
        p.add_argument("id", type=int)
        p.add_argument("--wait", action="store_true", help="wait until the job ends")
        p.set_defaults(fn=fn)
    return parser


def main(argv: list[str]) -> int:
    try:
        args = _parser().parse_args(argv)
    except SystemExit as e:
        return int(e.code or 0) and 2
    try:
        store = JobStore()
        try:
            return int(args.fn(store, args))
        finally:
            store.close()
    except AnerRuntimeError as e:
        print(f"aner {args.command}: error[{e.code}]: {e.message}", file=sys.stderr)
        for note in e.notes:
            print(f"  note: {note}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:  # Ctrl-C while following logs or waiting
        return 130
