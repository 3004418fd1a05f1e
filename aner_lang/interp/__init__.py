"""The interpreter: `run(analysis, ctx)` executes a checked script (see interpreter.py)."""

from aner_lang.interp.context import ExecContext
from aner_lang.interp.failures import AnerError
from aner_lang.interp.interpreter import run

__all__ = ["AnerError", "ExecContext", "run"]
