"""What goes wrong, said clearly: the runtime's error type (`errors`), the one registry of error
codes with their explanations (`error_codes`, rendered by `aner explain` and `error_reference`
into docs/errors.md), and diagnostics as data with their terminal rendering (`diagnostics`).
Imported from every layer; imports nothing heavy."""
