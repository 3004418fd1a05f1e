"""The environment variables through which a job's supervisor (`aner_lang.runtime.jobs`, above
this room) configures the `train` calls of the script it runs; `control` reads them. A module of
names only, so the supervisor sets them without importing torch."""

JOB_DIR = "ANER_JOB_DIR"
"""The job's folder; its presence marks a process as a job's script."""
JOB_RESUME = "ANER_JOB_RESUME"
"""``1`` when the job is resumed: `train` calls continue from their checkpoints."""
JOB_CHECKPOINT_EVERY = "ANER_JOB_CHECKPOINT_EVERY"
"""Updates between checkpoints for a `train` call that does not say."""
JOB_EVENTS_FD = "ANER_JOB_EVENTS_FD"
"""A file descriptor to write training events to, one JSON object a line."""
