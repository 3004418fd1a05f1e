"""The Aner grammar and parser: `parse(source, path) -> (Module, diagnostics)`."""

from aner_lang.grammar.parser import parse, parse_expression

__all__ = ["parse", "parse_expression"]
