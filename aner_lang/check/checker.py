"""The static checker: one pass over a module, in source order, after hoisting its declarations.

Rules:

* Imports are resolved first (`import "file.aner"`): the imported file is analysed once per
  `analyze` call (with the same resolver), its top-level names join this file's top scope, and an
  import cycle or an imported file with errors is reported at the import.
* Top-level `fn`, `record` and `enum` declarations are hoisted, so functions may call each other
  and use records declared further down: first every name is defined, then every record's fields
  and every function's signature are resolved, then record field defaults are checked; then
  every statement is checked in order.
* Every problem becomes a Diagnostic and checking goes on after an error. When the parser could
  not parse some chunks of the file (`Module.broken`), other errors inside those chunks are
  dropped (they are cascades), and so are unused-name warnings (noise until the file parses).

The checker is assembled in layers (see `core.py`); this module adds the module level and is the
entry point, `analyze_module`. It also exports `Resolver` and `registry_expr` (the registry's
defaults and constraints, parsed once: the interpreter evaluates them too).
"""

from __future__ import annotations

from aner_lang.builtins import Registry
from aner_lang.check import types as T
from aner_lang.check.analysis import Analysis
from aner_lang.check.core import Param, Resolver, registry_expr
from aner_lang.check.scopes import Scope
from aner_lang.check.statements import StatementChecker
from aner_lang.grammar import ast, parse
from aner_lang.problems import diagnostics as msg
from aner_lang.problems.diagnostics import Diagnostic
from aner_lang.problems.errors import AnerRuntimeError

__all__ = ["Checker", "Resolver", "analyze_module", "registry_expr"]


class Checker(StatementChecker):
    def check_module(self, module: ast.Module) -> None:
        top = Scope(None, None, None)
        self.a.scopes.append(top.info)
        decls = [
            s for s in module.body if isinstance(s, (ast.FnDecl, ast.RecordDecl, ast.EnumDecl))
        ]
        for s in module.body:
            if isinstance(s, ast.Import):
                self.check_import(s, top)
        for s in decls:  # hoist: names first, then their types
            if isinstance(s, ast.EnumDecl):
                ty = T.EnumT(s.name, tuple(m.name for m in s.members))
                self.define(top, s.name, "enum", ty, s.name_span, s)
                seen: set[str] = set()
                for m in s.members:
                    if m.name in seen:
                        self.report(msg.duplicate_definition(m.span, m.name, None))
                    seen.add(m.name)
            elif isinstance(s, ast.RecordDecl):
                self.fields[s.name] = {}
                self.define(top, s.name, "record", T.NamedT(s.name), s.name_span, s)
                self.a.record_fields[s.name] = s.fields
            else:
                self.define(top, s.name, "fn", T.ANY, s.name_span, s)
        for s in decls:
            if isinstance(s, ast.RecordDecl):
                params = []
                for f in s.fields:
                    fty = self.resolve_type(f.type, top)
                    if f.name in self.fields[s.name]:
                        self.report(msg.duplicate_definition(f.name_span, f.name, None))
                    self.fields[s.name][f.name] = fty
                    params.append(Param(f.name, fty, f.default, f.default is None))
                self.record_params[s.name] = params
                self.a.signatures[id(s)] = (params, T.NamedT(s.name))
                self.a.field_types[s.name] = self.fields[s.name]
            elif isinstance(s, ast.FnDecl):
                self.fn_params[id(s)] = [
                    Param(p.name, self.resolve_type(p.type, top), p.default, p.default is None)
                    for p in s.params
                ]
                ret = self.resolve_type(s.returns, top) if s.returns is not None else T.NONE
                self.fn_returns[id(s)] = ret
                self.a.signatures[id(s)] = (self.fn_params[id(s)], ret)
                top.names[s.name].ty = ret
        for s in decls:
            if isinstance(s, ast.RecordDecl):
                for f, p in zip(s.fields, self.record_params[s.name]):
                    if f.default is not None:
                        self.expect(f.default, p.ty, top, f"default of field `{f.name}`")
        for s in module.body:
            self.stmt(s, top)
        self.close_scope(top)

    def check_import(self, s: ast.Import, scope: Scope) -> None:
        try:
            resolved, source = self.resolver(s.path, self.path)
        except AnerRuntimeError as e:
            self.report(msg.import_not_found(s.path_span, s.path, e.message))
            return
        if resolved in self.import_stack:
            chain = list(self.import_stack[self.import_stack.index(resolved) :]) + [resolved]
            self.report(msg.import_cycle(s.path_span, chain))
            return
        sub = self.cache.get(resolved)
        if sub is None:
            sub = analyze_module(
                source,
                resolved,
                self.reg,
                self.resolver,
                self.import_stack + (resolved,),
                self.cache,
                warn_unused_top=False,
            )
            self.cache[resolved] = sub
        self.a.imports[id(s)] = sub
        cycle = next((d for d in sub.errors if d.code == "E-IMPORT-CYCLE"), None)
        if cycle is not None:
            self.report(Diagnostic(cycle.code, s.path_span, cycle.message))
        elif sub.errors:
            first = sub.errors[0]
            self.report(
                msg.import_not_found(
                    s.path_span,
                    s.path,
                    f"it has {len(sub.errors)} error(s), the first: {first.message}",
                )
            )
        self.fields.update(sub.field_types)
        self.a.field_types.update(sub.field_types)
        self.a.record_fields.update(sub.record_fields)
        self.a.signatures.update(sub.signatures)
        for name, d in sub.scopes[0].names.items():
            if name in scope.names:
                self.report(msg.duplicate_definition(s.span, name, None))
            scope.names[name] = d
            d.used = True


def analyze_module(
    source: str,
    path: str | None,
    registry: Registry,
    resolver: Resolver,
    import_stack: tuple[str, ...],
    cache: dict[str, Analysis],
    warn_unused_top: bool = True,
    parsed: tuple[ast.Module, list[Diagnostic]] | None = None,
) -> Analysis:
    """Parse (unless `parsed` is the parse of `source` already) and check one file, its imports
    included (through `resolver`)."""
    module, syntax = parse(source, path) if parsed is None else parsed
    analysis = Analysis(path, source, module, diagnostics=list(syntax))
    checker = Checker(registry, analysis, resolver, import_stack, cache, warn_unused_top)
    checker.check_module(module)
    if module.broken:
        # inside a broken chunk other errors are cascades; unused warnings are noise until it parses
        analysis.diagnostics[len(syntax) :] = [
            d
            for d in analysis.diagnostics[len(syntax) :]
            if d.code != "W-UNUSED"
            and (d.span is None or not any(b.start <= d.span.start < b.end for b in module.broken))
        ]
    return analysis
