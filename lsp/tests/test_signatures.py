"""Signature views: a builtin's label is the registry's own signature text, and each parameter's
label offsets select that parameter's text."""

from __future__ import annotations

from aner_lang.builtins import registry
from aner_lang.builtins.reference import signature
from aner_lsp.signatures import builtin_signatures


def test_signature_labels_match_the_registry():
    for name, overloads in registry().functions.items():
        for b, view in zip(overloads, builtin_signatures(name), strict=True):
            label = view.label()
            assert label == signature(b)
            for p, (start, end) in zip(b.params, view.param_offsets(), strict=True):
                assert label[start:end].startswith(f"{p.name}: {p.type}"), (label, p.name)
