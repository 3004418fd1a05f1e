"""Declarations of the job builtins: run a script in the background from a script, wait for it,
cancel it. Implementations live in `aner_lang.runtime.jobs.script` (no torch: a script that only
orchestrates jobs runs without the native backend)."""

from __future__ import annotations

from aner_lang.builtins.spec import Builtin, Constraint, Declarations, Field, Param, TypeDecl

_CATEGORY = "jobs"
_IMPL = "aner_lang.runtime.jobs.script:"

JOB = TypeDecl(
    "Job",
    "A script running in the background (as `aner submit` starts it); every field is read "
    "from the job database when it is read, so it shows the job as it is now.",
    fields=(
        Field("id", "Int", "the job id `aner jobs`, `aner logs` and `aner resume` take"),
        Field(
            "state",
            "String",
            "queued, waiting (for a GPU), running, cancelling, finished, failed, cancelled or "
            "interrupted",
        ),
        Field("script", "String", "the script's absolute path"),
        Field("updates", "Int?", "updates done by the train call in progress or last finished"),
        Field("steps", "Int?", "the steps that train call runs to"),
        Field("loss", "Float?", "the loss of its last update"),
        Field("device", "String?", 'where the script runs: "cpu" or "cuda:N"'),
        Field("error", "String?", "why it failed or was interrupted"),
    ),
    category=_CATEGORY,
)

_JOB = Param("job", "Job", doc="a job from submit()")

DECLARATIONS = Declarations(
    builtins=(
        Builtin(
            "submit",
            (
                Param(
                    "script", "String", doc="an .aner file, relative to this script", path="reads"
                ),
                Param(
                    "checkpoint_every",
                    "Int",
                    "10",
                    "updates between checkpoints for its train calls that do not say",
                    keyword_only=True,
                ),
            ),
            "Job",
            "Check `script` and start it as a background job (like `aner submit`): it outlives "
            "this script, waits for a free GPU when it needs one, checkpoints every train call, "
            "and `aner resume` continues it after a crash.",
            _IMPL + "submit_builtin",
            examples=('let job = submit("train.aner")\nprint("job ${job.id}: ${job.state}")',),
            constraints=(Constraint("checkpoint_every >= 1", "checkpoint_every must be >= 1"),),
            needs_context=True,
            category=_CATEGORY,
        ),
        Builtin(
            "wait",
            (
                _JOB,
                Param(
                    "timeout",
                    "Float?",
                    "none",
                    "seconds to wait at most (an error after that); none waits as long as it runs",
                    keyword_only=True,
                ),
            ),
            "Job",
            "Wait until the job has ended (finished, failed, cancelled or interrupted) and "
            "return it.",
            _IMPL + "wait_builtin",
            examples=('let done = wait(submit("train.aner"))\nprint(done.state)',),
            category=_CATEGORY,
        ),
        Builtin(
            "cancel",
            (_JOB,),
            "Job",
            "Ask the job to stop: the update in progress finishes and a checkpoint is written "
            "(`aner resume` continues it later).",
            _IMPL + "cancel_builtin",
            examples=('let job = submit("train.aner")\ncancel(job)',),
            category=_CATEGORY,
        ),
    ),
    types=(JOB,),
)
