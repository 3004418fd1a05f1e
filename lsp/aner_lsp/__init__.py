"""The Aner language server. `server` creates it and registers the features (`features/`, one
module per LSP feature) on a `documents.AnerServer`, which keeps one analysis per open buffer;
the features read the cursor's context from the live text (`cursor`, `lexer`), callables from
`signatures` and types from `types_at`, and send UTF-16 positions (`positions`). Never imports
torch or cupy."""

__version__ = "0.1.0"
