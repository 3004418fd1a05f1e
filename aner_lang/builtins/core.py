"""Declarations of the core builtins: output, lists and strings, math, files.

Their implementations are pure Python (`aner_lang.interp.corelib`), so they work without the native
backend. Overloads are separate entries with the same name (`len` of a list or of a string).
"""

from __future__ import annotations

from aner_lang.builtins.spec import Builtin, Constraint, Declarations, Param

_IMPL = "aner_lang.interp.corelib:"


def _math1(
    name: str,
    doc: str,
    returns: str = "Float",
    arg: str = "Float",
    constraints: tuple[Constraint, ...] = (),
) -> Builtin:
    return Builtin(
        name,
        (Param("x", arg),),
        returns,
        doc,
        _IMPL + name,
        category="math",
        constraints=constraints,
        examples=(f"{name}(2.0)",),
    )


BUILTINS = (
    Builtin(
        "print",
        (Param("value", "Any", doc="what to print; strings print as they are"),),
        "None",
        "Print a value on its own line.",
        _IMPL + "print_",
        needs_context=True,
        examples=('print("hello ${1 + 1}")',),
    ),
    Builtin(
        "len",
        (Param("items", "List[Any]"),),
        "Int",
        "Number of items in a list.",
        _IMPL + "len_",
        examples=("len([1, 2, 3])",),
    ),
    Builtin(
        "len",
        (Param("text", "String"),),
        "Int",
        "Number of characters in a string.",
        _IMPL + "len_",
        examples=('len("abc")',),
    ),
    Builtin(
        "range",
        (Param("stop", "Int"),),
        "List[Int]",
        "The integers 0, 1, ..., stop - 1.",
        _IMPL + "range_",
        examples=("range(3)",),
    ),
    Builtin(
        "range",
        (Param("start", "Int"), Param("stop", "Int"), Param("step", "Int", "1")),
        "List[Int]",
        "The integers from start up to (not including) stop, step apart.",
        _IMPL + "range_",
        constraints=(Constraint("step != 0", "step must not be 0"),),
        examples=("range(2, 10, step: 2)",),
    ),
    Builtin(
        "str",
        (Param("value", "Any"),),
        "String",
        "A value as text (as `print` shows it).",
        _IMPL + "str_",
        examples=("str(42)",),
    ),
    Builtin(
        "int",
        (Param("x", "Float"),),
        "Int",
        "A float truncated towards zero.",
        _IMPL + "int_",
        category="math",
        examples=("int(2.7)",),
    ),
    Builtin(
        "float",
        (Param("x", "Int"),),
        "Float",
        "An integer as a float.",
        _IMPL + "float_",
        category="math",
        examples=("float(2)",),
    ),
    Builtin(
        "join",
        (Param("items", "List[String]"), Param("sep", "String", '""')),
        "String",
        "The strings of a list, joined with `sep` between them.",
        _IMPL + "join",
        examples=('join(["a", "b"], ", ")',),
    ),
    Builtin(
        "split",
        (Param("text", "String"), Param("sep", "String?", "none")),
        "List[String]",
        "Split text at `sep` (at runs of whitespace when `sep` is none).",
        _IMPL + "split",
        constraints=(Constraint('sep != ""', "sep must not be empty"),),
        examples=('split("a,b", ",")',),
    ),
    Builtin(
        "min",
        (Param("a", "Int"), Param("b", "Int")),
        "Int",
        "The smaller of two integers.",
        _IMPL + "min_",
        category="math",
        examples=("min(2, 3)",),
    ),
    Builtin(
        "min",
        (Param("a", "Float"), Param("b", "Float")),
        "Float",
        "The smaller of two floats.",
        _IMPL + "min_",
        category="math",
    ),
    Builtin(
        "max",
        (Param("a", "Int"), Param("b", "Int")),
        "Int",
        "The larger of two integers.",
        _IMPL + "max_",
        category="math",
        examples=("max(2, 3)",),
    ),
    Builtin(
        "max",
        (Param("a", "Float"), Param("b", "Float")),
        "Float",
        "The larger of two floats.",
        _IMPL + "max_",
        category="math",
    ),
    Builtin(
        "abs",
        (Param("x", "Int"),),
        "Int",
        "The absolute value of an integer.",
        _IMPL + "abs_",
        category="math",
        examples=("abs(-3)",),
    ),
    Builtin(
        "abs",
        (Param("x", "Float"),),
        "Float",
        "The absolute value of a float.",
        _IMPL + "abs_",
        category="math",
    ),
    _math1("sqrt", "Square root.", constraints=(Constraint("x >= 0.0", "sqrt needs x >= 0"),)),
    _math1("exp", "e raised to the power x."),
    _math1("log", "Natural logarithm.", constraints=(Constraint("x > 0.0", "log needs x > 0"),)),
    _math1("floor", "The largest integer not greater than x.", returns="Int"),
    _math1("ceil", "The smallest integer not less than x.", returns="Int"),
    _math1("round", "x rounded to the nearest integer (halves to even).", returns="Int"),
    Builtin(
        "pow",
        (Param("base", "Float"), Param("exponent", "Float")),
        "Float",
        "base raised to the power exponent.",
        _IMPL + "pow_",
        category="math",
        examples=("pow(2.0, 10.0)",),
    ),
    Builtin(
        "read_text",
        (Param("path", "String", doc="relative to the script's directory", path="reads"),),
        "String",
        "The contents of a UTF-8 text file.",
        _IMPL + "read_text",
        needs_context=True,
        category="files",
        examples=('read_text("notes.txt")',),
        precheck="aner_lang.host.prechecks:read_text",
    ),
    Builtin(
        "write_json",
        (
            Param("path", "String", doc="relative to the script's directory", path="writes"),
            Param("value", "Any", doc="records become objects, enums their member name"),
            Param(
                "overwrite", "Bool", "false", doc="replace the file if it exists", keyword_only=True
            ),
        ),
        "None",
        "Write a value as a JSON file (parent directories are created). NaN and infinities are "
        "an error (JSON has no form for them); an existing file is replaced only with "
        "`overwrite: true`.",
        _IMPL + "write_json",
        needs_context=True,
        category="files",
        examples=('write_json("out/result.json", [1, 2, 3])',),
    ),
)

DECLARATIONS = Declarations(builtins=BUILTINS)
