"""The data model of the builtin registry.

Every builtin function and builtin type of Aner is declared exactly once, as data, with the
classes below. The checker, the interpreter, the LSP (completion, signature help, hover) and the
generated reference (`docs/builtins.md`) all read these declarations; nothing else declares a
builtin. This module must never import torch or cupy: the front end starts without them.

Conventions shared by every declaration module:

* Types are written as Aner type expressions in strings: ``"Int"``, ``"Float"``, ``"Bool"``,
  ``"String"``, ``"Bytes"``, ``"Any"``, ``"List[Target]"``, ``"Dataset?"``, or the name of a
  declared enum / opaque type.
* Defaults are Aner source expressions in strings (``"4.0"``, ``"8 MiB"``, ``"nf4_double_quant"``,
  ``"[q_proj, v_proj]"``, ``"none"``); a parameter whose ``default`` is ``None`` is required.
* Constraints are Aner boolean expressions over the parameter names (``"rank >= 1"``); the checker
  evaluates one statically when every name it mentions is bound to a literal argument, and the
  interpreter evaluates it again at run time before calling the implementation.
* ``impl`` is the dotted path ``"package.module:function"`` of the implementation. It is imported
  only when the builtin is first called, so declaring a native builtin costs nothing at start-up.

How the interpreter calls an implementation (the runtime's side of the contract):

* Every parameter is passed by keyword, defaults filled in: ``impl(rank=2, alpha=4.0, ...)``;
  when ``needs_context`` is true a first positional argument, the interpreter's ``ExecContext``
  (script directory for relative paths, output stream), is passed too.
* Values cross the boundary as plain Python: Int -> int, Float -> float, Bool -> bool,
  String -> str, Bytes -> int (a byte count), List[T] -> list, an absent optional -> None, an enum
  member -> its member name as a str (``"q_proj"``), an opaque value -> whatever Python object the
  runtime returned earlier. A builtin returning a declared type with fields returns an object whose
  attributes (or a Mapping whose keys) carry those fields.
* A user-facing failure is raised as ``aner_lang.problems.errors.AnerRuntimeError``; the interpreter adds
  the Aner source span and the Aner call stack. Any other exception escaping an implementation is
  a bug in Aner, and is reported as an internal error, still with the Aner span.
* ``x.f(a)`` in a script means ``f(x, a)``: method syntax needs no extra declaration.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

PathUse = Literal["", "reads", "writes", "writes_folder"]
"""What a call does with the file or folder a String parameter names (`Param.path`)."""
WRITES: tuple[PathUse, ...] = ("writes", "writes_folder")

NATIVE = ("torch", "gguf", "tokenizers")
"""The packages (of the `native` extra) most native builtins need: a builtin's `requires` names
them, plus any of its own."""


@dataclass(frozen=True)
class Constraint:
    """A condition on a call's arguments, with the message a user sees when it fails."""

    expr: str
    message: str


@dataclass(frozen=True)
class Param:
    """One parameter of a builtin signature."""

    name: str
    type: str
    default: str | None = None
    doc: str = ""
    keyword_only: bool = False
    path: PathUse = ""
    """For a path (relative to the script): the call "reads" that file or folder, "writes" a
    file, or "writes_folder" (creates a folder, or adds to it). The checks before a run use it:
    a path the script may write first is not known to be missing, and a write target is checked
    like the call checks it (`aner_lang.check.environment`). A call with an `overwrite`
    parameter refuses an existing target without it (`aner_lang.host.files`); the others write into
    what is there (train's checkpoints resume and its logs append; plot redraws its picture)."""

    @property
    def required(self) -> bool:
        return self.default is None


@dataclass(frozen=True)
class Builtin:
    """One builtin function signature. Several with the same name form an overload set."""

    name: str
    params: tuple[Param, ...]
    returns: str
    doc: str
    impl: str
    examples: tuple[str, ...] = ()
    constraints: tuple[Constraint, ...] = ()
    native: bool = False
    """True when the implementation needs the native backend (torch and friends)."""
    requires: tuple[str, ...] = ()
    """Python packages (import names) the implementation needs; named in the 'unavailable' error."""
    needs_context: bool = False
    lets_go: bool = True
    """Whether a call that needs torch first lets go of what other builtins hold on the GPU
    (`ExecContext.held`). False for those that allocate little or nothing there (a profile, a
    dataset's rows, a tokenization, an adapter's low-rank tensors, an adapter saved from its host
    copies), so that a sweep's next `train` call finds the graphs the last call kept
    (`train.kept`)."""
    category: str = "core"
    """Section of the generated reference this builtin appears in."""
    precheck: str = ""
    """``"package.module:function"`` of a torch-free check `aner check` runs before the script
    does: ``function(args, script_dir) -> list[(parameter name, AnerRuntimeError)]``, where
    `args` holds the arguments known before the run (literals, defaults; enum members as names)
    by parameter name. It reports what would certainly fail when the call runs (a data file that
    is not there, a JSONL row without the named field, `device: cuda` on a machine without CUDA),
    each at its parameter's argument."""


@dataclass(frozen=True)
class Member:
    """One member of a builtin enum."""

    name: str
    doc: str = ""


@dataclass(frozen=True)
class EnumDecl:
    """A builtin enum type (Storage, Precision, Optimizer, Kernel, Target, Format, ...)."""

    name: str
    members: tuple[Member, ...]
    doc: str = ""
    category: str = "core"


@dataclass(frozen=True)
class Field:
    """One readable field of a builtin type (``run.validation_loss``)."""

    name: str
    type: str
    doc: str = ""


@dataclass(frozen=True)
class TypeDecl:
    """A builtin opaque or record-like type (Model, Adapter, Profile, Run, MemoryReport, ...)."""

    name: str
    doc: str = ""
    fields: tuple[Field, ...] = ()
    category: str = "core"


@dataclass(frozen=True)
class Declarations:
    """What one declaration module contributes to the registry."""

    builtins: tuple[Builtin, ...] = ()
    enums: tuple[EnumDecl, ...] = ()
    types: tuple[TypeDecl, ...] = field(default_factory=tuple)
