"""The native backend (torch), in rooms; each imports only the rooms listed before it:

`io` (files, GGUF, fingerprints) -> `model` (config, transformer, tokenizer) -> `nf4` (4-bit
storage and kernels) -> `load` (file -> model) -> `adapters` (methods, merge, adapter files) ->
`tasks` (data, generate, evaluate) -> `train` (trainer, profiles, optimizers, checkpoints) ->
`export` (GGUF writer).

Only builtin implementations import this package (lazily), so the front end starts without torch.
"""
