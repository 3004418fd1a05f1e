"""This machine as a script meets it: bounded reads and safe writes of user files (`files`), the
bounded JSON parser (`json_text`), the GPUs the driver reports (`gpus`), where a model path points
(`model_paths`), the checks a builtin's arguments get against them before a run (`prechecks`),
and how `aner run` stops on SIGTERM (`sigterm`). No torch: the checker and the language server
use these."""
