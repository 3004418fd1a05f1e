"""The boundary between the interpreter and builtin implementations (the contract is in
`aner_lang.builtins.spec`): importing an implementation on first use, and converting values each
way across the boundary.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable

from aner_lang.builtins.spec import Builtin
from aner_lang.check.types import EnumT, ListT, OptionalT, Type
from aner_lang.host.process_clock import timed
from aner_lang.interp.values import EnumValue, Value
from aner_lang.problems.errors import NativeBackendUnavailable

Impl = Callable[..., object]
"""A builtin implementation: every parameter by keyword (after the `ExecContext` when the builtin
`needs_context`); each builtin has its own parameters, so only the call shape is fixed here."""

_impl_cache: dict[str, Impl] = {}


def load_impl(b: Builtin) -> Impl:
    """Import a builtin's implementation on first use; a missing package means the native backend
    is unavailable (named in the error), not a crash."""
    cached = _impl_cache.get(b.impl)
    if cached is not None:
        return cached
    module_name, _, attr = b.impl.partition(":")
    try:
        with timed("imports"):
            module = importlib.import_module(module_name)
    except ImportError as e:
        missing = (e.name or module_name).split(".")[0]
        wanted = next((p for p in b.requires if p.split(".")[0] == missing), None)
        raise NativeBackendUnavailable(b.name, wanted or e.name or module_name) from None
    fn: Impl | None = getattr(module, attr, None)
    if fn is None:
        raise NativeBackendUnavailable(b.name, module_name)
    _impl_cache[b.impl] = fn
    return fn


def to_native(value: Value) -> object:
    """An Aner value as a builtin implementation receives it (enum members as names; lists are
    copied, so an implementation never shares a list with the script or with a default)."""
    if isinstance(value, EnumValue):
        return value.member
    if isinstance(value, list):
        return [to_native(v) for v in value]
    return value


def from_native(value: object, ty: Type) -> Value:
    """A value returned by a builtin, typed by its declaration (names become enum members)."""
    if isinstance(ty, OptionalT):
        return None if value is None else from_native(value, ty.inner)
    if isinstance(ty, EnumT) and isinstance(value, str):
        return EnumValue(ty.name, value)
    if isinstance(ty, ListT) and isinstance(value, (list, tuple)):
        return [from_native(v, ty.elem) for v in value]
    return value
