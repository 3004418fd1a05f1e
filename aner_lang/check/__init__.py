"""Static checking and the analysis API the CLI, the interpreter and the LSP build on.

    analyze(source: str, path: str | None = None, *, resolver=None) -> Analysis

parses and checks one file (and, through `import "file.aner"`, the files it imports, with cycle
detection) and never raises for bad input. The returned `Analysis` (see `analysis.py`) holds:

* `module`: the AST (every statement that parsed, even when others did not);
* `diagnostics`: syntax, type and name errors and warnings, each with a span and a code;
* `definitions`: every `Definition` (name, kind, `type` as a string, `span`, `path`);
* `references`: every use of a name as `Reference(span, definition)`, also across imports;
* `scope_at(offset)`: the user names visible at an offset, with their definitions and types;
* `type_at(offset)`: the type (a string) of the innermost expression at an offset;
* `definition_at(offset)`, `references_to(definition)`: for go-to-definition and rename;
* `call_at(offset)`: the innermost call around an offset as a `CallInfo` (the builtin or
  function it resolved to, every overload candidate, and `active_parameter(offset)`);
* `calls`, `enum_values`, `imports`, `expr_types`: side tables keyed by `id(node)` that the
  interpreter runs from.

Offsets are 0-based character offsets into `source`; spans carry 1-based lines and columns too.
`resolver(path_as_written, importing_path) -> (resolved_path, source)` replaces file-system
imports (the LSP passes one that reads open editor buffers); it raises `AnerRuntimeError` (an
`E-FILE-*` code) for a file it cannot read.
"""

from __future__ import annotations

import gc
import os

from aner_lang.builtins import registry
from aner_lang.check.analysis import Analysis, CallInfo, Definition, Reference
from aner_lang.check.checker import Resolver, analyze_module
from aner_lang.grammar import ast, parse
from aner_lang.grammar.limits import ensure_recursion_limit
from aner_lang.host import files
from aner_lang.problems.diagnostics import Diagnostic, internal_error, out_of_memory


def file_resolver(path: str, importer: str | None) -> tuple[str, str]:
    """Resolve an import relative to the importing file's directory and read it (a regular file
    of at most `files.SCRIPT_LIMIT` bytes of UTF-8, like any script)."""
    base = os.path.dirname(importer) if importer else os.getcwd()
    resolved = os.path.normpath(os.path.join(base, path))
    return resolved, files.read_text(resolved, files.SCRIPT_LIMIT)


def analyze(source: str, path: str | None = None, *, resolver: Resolver | None = None) -> Analysis:
    """Parse and check `source` (the text of the file at `path`, if it has one)."""
    key = os.path.normpath(path) if path else "<input>"
    ensure_recursion_limit()
    # Parsing and checking build many long-lived acyclic objects (AST, types, side tables); the
    # cyclic GC rescanning them is pure overhead, so it is paused here (as in `parse`).
    gc_was_enabled = gc.isenabled()
    gc.disable()
    module = ast.Module(path, ())  # what the result shows should the parser itself fail
    syntax: list[Diagnostic] = []
    try:
        module, syntax = parse(source, path)
        return analyze_module(
            source,
            path,
            registry(),
            resolver or file_resolver,
            (key,),
            {},
            parsed=(module, syntax),
        )
    except Exception as exc:  # a bug in Aner (or no memory left): a diagnostic, never a traceback
        d = out_of_memory(None) if isinstance(exc, MemoryError) else internal_error(None, exc)
        return Analysis(path, source, module, diagnostics=syntax + [d.at(path)])
    finally:
        if gc_was_enabled:
            gc.enable()


__all__ = ["Analysis", "CallInfo", "Definition", "Reference", "analyze", "file_resolver"]
