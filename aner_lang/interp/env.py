"""Scopes at run time: the variables of a block (`Env`) and a running module (`Module`)."""

from __future__ import annotations

from dataclasses import dataclass

from aner_lang.check import Analysis
from aner_lang.interp.values import Value


class Env:
    """The variables of one block, in front of those of the blocks around it. The checker has
    resolved every name, so a lookup always finds its variable."""

    __slots__ = ("parent", "vars")

    def __init__(self, parent: Env | None, vars: dict[str, Value] | None = None) -> None:
        self.vars: dict[str, Value] = {} if vars is None else vars
        self.parent = parent

    def get(self, name: str) -> Value:
        env: Env | None = self
        while env is not None:
            if name in env.vars:
                return env.vars[name]
            env = env.parent
        raise KeyError(name)

    def set_existing(self, name: str, value: Value) -> None:
        env: Env | None = self
        while env is not None:
            if name in env.vars:
                env.vars[name] = value
                return
            env = env.parent
        raise KeyError(name)


@dataclass(frozen=True, slots=True)
class Module:
    """A file being run: its analysis (the side tables its expressions are evaluated with) and its
    top-level variables. A `fn` body and the defaults of its parameters and of a `record`'s fields
    run in the module that declares them, whichever module calls them."""

    analysis: Analysis
    env: Env
