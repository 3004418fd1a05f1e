"""Background jobs: scripts that run detached and survive the client that started them.

`store` (the SQLite job database, GPU slots), `processes` (identity and liveness of the
processes it watches), `manage` (submit, cancel, resume, wait), `supervisor` (the process that
runs one job's script and records its outcome), `events` (a job's event log), `commands` (the
`aner submit | jobs | logs | cancel | resume` subcommands) and `script` (the `submit`, `wait`,
`cancel` builtins and the `Job` value). Nothing here imports torch; the script's own `aner run`
process does, and its `train` calls meet the job through `runtime.train.control`.
"""
