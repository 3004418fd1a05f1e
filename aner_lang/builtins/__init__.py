"""The one registry of Aner builtins.

Declaration modules (listed in `_MODULES`) each export `DECLARATIONS: Declarations`. This package
collects them; it never imports torch or cupy (implementations are dotted paths, loaded lazily).
The checker, interpreter, LSP and docs generator all read `registry()`.
"""

from __future__ import annotations

import importlib
from functools import lru_cache

from aner_lang.builtins.spec import Builtin, Declarations, EnumDecl, TypeDecl

# Each module below owns the declarations of one area; add a module here to add an area.
_MODULES: tuple[str, ...] = (
    "aner_lang.builtins.core",
    "aner_lang.builtins.model",
    "aner_lang.builtins.data",
    "aner_lang.builtins.train",
    "aner_lang.builtins.artifacts",
    "aner_lang.builtins.memory",
    "aner_lang.builtins.jobs",
    "aner_lang.builtins.deploy",
    "aner_lang.builtins.services",
    "aner_lang.builtins.preference",
)


class Registry:
    """All builtin functions (grouped into overload sets), enums and types, by name."""

    def __init__(self, decls: list[Declarations]) -> None:
        self.functions: dict[str, tuple[Builtin, ...]] = {}
        self.enums: dict[str, EnumDecl] = {}
        self.types: dict[str, TypeDecl] = {}
        for d in decls:
            for b in d.builtins:
                self.functions[b.name] = self.functions.get(b.name, ()) + (b,)
            for e in d.enums:
                if e.name in self.enums or e.name in self.types:
                    raise ValueError(f"builtin type {e.name} declared twice")
                self.enums[e.name] = e
            for t in d.types:
                if t.name in self.enums or t.name in self.types:
                    raise ValueError(f"builtin type {t.name} declared twice")
                self.types[t.name] = t


@lru_cache(maxsize=1)
def registry() -> Registry:
    """The process-wide registry, built once from every declaration module."""
    return Registry([importlib.import_module(m).DECLARATIONS for m in _MODULES])


def members(enum: str) -> tuple[str, ...]:
    """The member names of builtin enum `enum`: the runtime validates Python-API arguments
    (storage, precision, kernel, ...) against these, so each enum is spelled once."""
    return tuple(m.name for m in registry().enums[enum].members)
