"""What goes wrong, said clearly: the runtime's error type (`errors`), the one registry of error
codes with their explanations (`error_codes`, rendered by `aner explain` and `error_reference`
into docs/errors.md), diagnostics as data with their terminal rendering (`diagnostics`), and how a failed rank of a
distributed run hands its rendered error to the launcher (`rank_errors`).
Imported from every layer; imports nothing heavy."""
