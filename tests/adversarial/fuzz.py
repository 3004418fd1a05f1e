"""The adversarial fuzz suite: hostile input to every reader of user files, under a memory limit
and a time limit, with E-INTERNAL and any Python exception counted as a failure.

Targets (each a hypothesis search):

* ``lang``: scripts, random token soup and mutations of the repository's own scripts, parsed,
  checked and (when they check cleanly and call nothing native) run.
* ``gguf``: the tiny fixture GGUF with one part of one metadata field or tensor-info record (the
  key length, the key, the value type, the value, a dimension count, a dimension, a tensor type,
  an offset) replaced by an extreme or random value, then loaded.
* ``lsp``: one language server fed random frames (garbage, bodies shorter than their
  ``Content-Length``, bodies that are not JSON, requests of every method with random
  parameters), each example followed by a hover that must be answered.
* ``checkpoint``: a checkpoint whose pointer, manifest or state.json has one JSON value replaced
  and every hash recomputed (a forgery that passes the integrity checks), then loaded and turned
  back into a training state.

Run one target, or ``all``, as a script (the pytest wrapper `test_fuzz.py` does this with a few
examples each)::

    python tests/adversarial/fuzz.py all --examples 200
    python tests/adversarial/fuzz.py all --seconds 3600      # a long run: as many as fit

The process limits its own address space (`resource.RLIMIT_AS`, ``--memory-gib``) before
importing anything heavy, and every example gets ``--example-seconds``: running out of memory is a
failure reported with the input; running out of time ends the process with every thread's stack
(`faulthandler`), the input being in the ``last-input.txt`` file it names at the start.
"""

from __future__ import annotations

import argparse
import faulthandler
import io
import json
import os
import resource
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
TOKENS = (
    "let fn return if else for in while record enum import assert not and or true false none "
    "print len range str int float abs sqrt exp pow read_text write_json join x y s n f R E "
    '+ - * / % == != < <= > >= = ( ) [ ] { } , : . ? -> ${ } " \\ # \n \n\n \t 0 1 -1 2.5 1e308 '
    "1e999 9223372036854775807 9223372036854775808 99999999999999999999999 1.5 B 7 GiB "
    '"a" "${x}" "\\q" "\\$" \u2028 \u00e9 \x00 \ufeff'
).split(" ")


def _corpus() -> list[str]:
    """The repository's own scripts: the seeds the mutations start from."""
    found = sorted(ROOT.glob("tests/lang/cases/*.aner")) + sorted(ROOT.glob("examples/*.aner"))
    return [p.read_text(encoding="utf-8") for p in found]


# ---- lang ----------------------------------------------------------------------------------------


def _lang_strategy():  # type: ignore[no-untyped-def]
    from hypothesis import strategies as st

    soup = st.lists(st.sampled_from(TOKENS), max_size=60).map(" ".join)
    corpus = _corpus()

    @st.composite
    def mutated(draw):  # type: ignore[no-untyped-def]
        text = draw(st.sampled_from(corpus))
        for _ in range(draw(st.integers(1, 6))):
            i = draw(st.integers(0, len(text)))
            j = draw(st.integers(i, min(len(text), i + 40)))
            op = draw(st.sampled_from(["insert", "delete", "replace", "repeat"]))
            token = draw(st.sampled_from(TOKENS))
            if op == "insert":
                text = text[:i] + token + text[i:]
            elif op == "delete":
                text = text[:i] + text[j:]
            elif op == "replace":
                text = text[:i] + token + text[j:]
            else:
                text = text[:i] + text[i:j] * draw(st.integers(2, 300)) + text[j:]
        return text

    deep = st.tuples(st.sampled_from(["-", "not ", "(", "[", "abs(", "1 + "]), st.integers(1, 3000))
    return st.one_of(soup, mutated(), deep.map(lambda d: f"let v = {d[0] * d[1]}1\nprint(v)\n"))


def _lang_check(source: str) -> str:
    from aner_lang.builtins import registry
    from aner_lang.check import analyze
    from aner_lang.interp import AnerError, ExecContext, run

    with tempfile.TemporaryDirectory() as tmp:
        analysis = analyze(source, os.path.join(tmp, "fuzz.aner"))
        codes = [d.code for d in analysis.diagnostics]
        assert "E-INTERNAL" not in codes, analysis.diagnostics
        native = {n for n, bs in registry().functions.items() if any(b.native for b in bs)}
        if analysis.errors or any(name in source for name in native):
            return analysis.errors[0].code if analysis.errors else "not run"
        try:
            run(analysis, ExecContext(script_dir=Path(tmp), stdout=io.StringIO()))
        except AnerError as e:
            assert e.diagnostic.code != "E-INTERNAL", e.diagnostic
            return e.diagnostic.code
        return "ran"


# ---- gguf ----------------------------------------------------------------------------------------

EXTREMES = (0, 1, 2, 0x7F, 0xFF, 2**31 - 1, 2**31, 2**32 - 1, 2**63 - 1, 2**63, 2**64 - 1)


def _gguf_parts(path: Path) -> list[tuple[int, int]]:
    """(offset, size) of every part of every metadata field and tensor-info record of `path`."""
    import gguf
    from numpy.lib.array_utils import byte_bounds

    reader = gguf.GGUFReader(path)
    base = byte_bounds(reader.data)[0]
    fields = list(reader.fields.values()) + [t.field for t in reader.tensors]
    return [(byte_bounds(p)[0] - base, p.nbytes) for f in fields for p in f.parts if p.nbytes]


def _gguf_strategy(workdir: Path):  # type: ignore[no-untyped-def]
    from hypothesis import strategies as st

    from aner_lang.testing.fixture import embedded_tokenizer, write_fixture

    source = write_fixture(workdir / "base.gguf", "tiny", tokenizer=embedded_tokenizer())
    data = source.read_bytes()
    parts = _gguf_parts(source)

    @st.composite
    def mutation(draw):  # type: ignore[no-untyped-def]
        offset, size = draw(st.sampled_from(parts))
        if draw(st.booleans()):
            value = draw(st.sampled_from(EXTREMES)) % (1 << (8 * min(size, 8)))
            new = value.to_bytes(min(size, 8), "little").ljust(size, b"\0")
        else:
            new = draw(st.binary(min_size=size, max_size=size))
        return data[:offset] + new + data[offset + size :]

    return mutation()


def _gguf_check(workdir: Path) -> Callable[[bytes], str]:
    def check(blob: bytes) -> str:
        from aner_lang.problems.errors import AnerRuntimeError
        from aner_lang.runtime.load.loader import load_model

        path = workdir / "mutated.gguf"
        path.write_bytes(blob)
        try:
            load_model(path)
        except AnerRuntimeError as e:
            assert e.code != "E-INTERNAL", e
            return e.code
        return "loaded"

    return check


# ---- checkpoint ----------------------------------------------------------------------------------

ODD_VALUES = (None, "", "x", 0, -1, 1.5, float("nan"), 10**30, [], {}, [1], {"a": 1}, True)


def _checkpoint_strategy(workdir: Path):  # type: ignore[no-untyped-def]
    """A valid checkpoint of a real (tiny) training state, and forgeries of it."""
    from hypothesis import strategies as st

    from aner_lang.runtime.train import checkpoint
    from aner_lang.testing.fixture import embedded_tokenizer, write_fixture

    base = write_fixture(workdir / "base.gguf", "tiny", tokenizer=embedded_tokenizer())
    state = _tiny_state(base)
    folder = checkpoint.save(workdir / "ckpt", state)
    texts = {
        name: json.loads((folder / name).read_text())
        for name in (checkpoint.MANIFEST, checkpoint.STATE)
    }

    def paths(value: object, at: tuple[object, ...] = ()) -> list[tuple[object, ...]]:
        out = [at]
        if isinstance(value, dict):
            for k, v in value.items():
                out += paths(v, (*at, k))
        elif isinstance(value, list):
            for i, v in enumerate(value[:3]):
                out += paths(v, (*at, i))
        return out

    targets = [(name, p) for name, obj in texts.items() for p in paths(obj) if p]
    return st.tuples(
        st.sampled_from(targets), st.sampled_from(ODD_VALUES), st.just(texts), st.just(base)
    )


def _tiny_state(base: Path):  # type: ignore[no-untyped-def]
    from dataclasses import asdict

    import torch

    from aner_lang.runtime.adapters import lora
    from aner_lang.runtime.load.loader import load_model
    from aner_lang.runtime.train.loss_scale import LossScaleState
    from aner_lang.runtime.train.state import STATE_FORMAT, Counters, TrainState

    adapter = lora(load_model(base), rank=2)
    tensors = {f"adapter/{k}": v.detach() for k, v in adapter.tensors().items()}
    tensors["rng/generator"] = torch.Generator().get_state()
    meta = {
        "format": STATE_FORMAT,
        "adapter": adapter.config,
        "profile": {"precision": "float32"},
        "base": {"path": str(base), "storage": "float32"},
        "kernel_identity": "host",
        "loss_scale": asdict(LossScaleState("none")),
        "data": {"seed": 0, "epoch": 0, "position": 0, "accumulation_offset": 0},
        "counters": Counters(updates=1, applied=1, loss_history=[1.0]).to_json(),
        "options": {},
    }
    return TrainState(tensors, meta)


def _checkpoint_check(workdir: Path) -> Callable[[tuple], str]:  # type: ignore[type-arg]
    def check(forgery: tuple) -> str:  # type: ignore[type-arg]
        import hashlib
        import shutil

        from aner_lang.problems.errors import AnerRuntimeError
        from aner_lang.runtime.adapters import adapter_from_state
        from aner_lang.runtime.load.loader import load_model
        from aner_lang.runtime.train import checkpoint
        from aner_lang.runtime.train.state import TrainState

        (name, path), value, texts, base = forgery
        forged = json.loads(json.dumps(texts))
        target = forged[name]
        for key in path[:-1]:
            target = target[key]
        target[path[-1]] = value
        root = workdir / "forged"
        shutil.rmtree(root, ignore_errors=True)
        shutil.copytree(workdir / "ckpt", root)
        folder = root / json.loads((root / checkpoint.POINTER).read_text())["checkpoint"]
        state = json.dumps(forged[checkpoint.STATE]).encode()
        (folder / checkpoint.STATE).write_bytes(state)
        manifest = forged[checkpoint.MANIFEST]
        if name == checkpoint.STATE and isinstance(manifest.get("files"), dict):
            manifest["files"][checkpoint.STATE] = {
                "bytes": len(state),
                "sha256": hashlib.sha256(state).hexdigest(),
            }
        manifest_bytes = json.dumps(manifest).encode()
        (folder / checkpoint.MANIFEST).write_bytes(manifest_bytes)
        sha = hashlib.sha256(manifest_bytes).hexdigest()
        (root / checkpoint.POINTER).write_text(
            json.dumps({"checkpoint": folder.name, "manifest_sha256": sha})
        )
        try:
            ck = checkpoint.load(root, base_path=base)
            adapter_from_state(load_model(base), TrainState.from_parts(ck.tensors, ck.meta))
        except AnerRuntimeError as e:
            assert e.code != "E-INTERNAL", e
            return e.code
        return "resumed"

    return check


# ---- lsp -----------------------------------------------------------------------------------------

METHODS = (
    "textDocument/hover",
    "textDocument/completion",
    "textDocument/definition",
    "textDocument/references",
    "textDocument/rename",
    "textDocument/signatureHelp",
    "textDocument/documentSymbol",
    "textDocument/semanticTokens/full",
    "textDocument/formatting",
    "textDocument/codeAction",
    "textDocument/didChange",
    "textDocument/didOpen",
    "workspace/symbol",
    "no/such/method",
)


def _lsp_strategy():  # type: ignore[no-untyped-def]
    from hypothesis import strategies as st

    json_values = st.recursive(
        st.none() | st.booleans() | st.integers(-(2**70), 2**70) | st.text(max_size=20),
        lambda inner: (
            st.lists(inner, max_size=4)
            | st.dictionaries(
                st.sampled_from(
                    [
                        "textDocument",
                        "uri",
                        "position",
                        "line",
                        "character",
                        "text",
                        "newName",
                        "context",
                        "range",
                        "contentChanges",
                        "version",
                    ]
                )
                | st.text(max_size=5),
                inner,
                max_size=4,
            )
        ),
        max_leaves=12,
    )
    request = st.builds(
        lambda m, params, i: {"jsonrpc": "2.0", "id": i, "method": m, "params": params},
        st.sampled_from(METHODS),
        json_values,
        st.integers(1000, 10**6),
    )
    chunk = st.one_of(
        st.binary(max_size=200),
        request.map(lambda r: ("frame", json.dumps(r).encode())),
        st.binary(max_size=100).map(lambda b: ("frame", b)),
        st.tuples(request, st.integers(0, 50)).map(
            lambda t: ("short", json.dumps(t[0]).encode(), t[1])
        ),
    )
    return st.lists(chunk, max_size=8)


def _lsp_check(workdir: Path) -> Callable[[list], str]:  # type: ignore[type-arg]
    sys.path.insert(0, str(ROOT / "lsp" / "tests"))
    from wire import Wire, frame, notify, request

    server: list[Wire] = []
    uri = (workdir / "doc.aner").as_uri()
    counter = [0]

    def start() -> Wire:
        w = Wire()
        item = {"uri": uri, "languageId": "aner", "version": 1, "text": "let x = 1\nprint(x)\n"}
        w.send(frame(notify("textDocument/didOpen", {"textDocument": item})))
        return w

    def check(chunks: list) -> str:  # type: ignore[type-arg]
        if not server:
            server.append(start())
        w = server[0]
        for c in chunks:
            if isinstance(c, bytes):
                w.send(c)
            elif c[0] == "frame":
                w.send(frame(c[1]))
            else:  # a body shorter than its header says: the rest of it is garbage
                body = c[1]
                w.send(b"Content-Length: %d\r\n\r\n" % max(0, len(body) - c[2]) + body)
        counter[0] += 1
        sentinel = 10**7 + counter[0]
        position = {"line": 0, "character": 4}
        # a newline ends any garbage line; the blank lines end a header block left open
        w.send(
            b"\r\n\r\n"
            + frame(
                request(
                    sentinel,
                    "textDocument/hover",
                    {"textDocument": {"uri": uri}, "position": position},
                )
            )
        )
        try:
            assert w.proc.poll() is None, "the server exited"
            reply = w.reply(sentinel, timeout=15)
        except AssertionError as e:
            server.clear()
            raise AssertionError(f"{e}; the server's log ends: {w.close()[1][-3000:]}") from None
        assert "Traceback" not in json.dumps(reply), reply
        return "answered"

    return check


# ---- driver --------------------------------------------------------------------------------------


def fuzz(target: str, examples: int, seconds: float, example_seconds: int, workdir: Path) -> None:
    """Run one target's search; raise (with the failing input) on a failure."""
    from hypothesis import HealthCheck, given, settings

    if target == "lang":
        strategy, check = _lang_strategy(), _lang_check
    elif target == "lsp":
        strategy, check = _lsp_strategy(), _lsp_check(workdir)
    elif target == "gguf":
        strategy, check = _gguf_strategy(workdir), _gguf_check(workdir)
    else:
        strategy, check = _checkpoint_strategy(workdir), _checkpoint_check(workdir)

    deadline = time.monotonic() + seconds
    outcomes: Counter[str] = Counter()

    last_input = workdir / "last-input.txt"
    print(f"{target}: each input is written to {last_input} before it runs", flush=True)

    def bounded(value: object) -> None:
        last_input.write_text(repr(value)[:100_000])
        # past the bound: every thread's stack, then exit 1 (the input stays in `last_input`)
        faulthandler.dump_traceback_later(example_seconds, exit=True)
        try:
            outcomes[check(value)] += 1
        except MemoryError:
            raise AssertionError("ran out of the memory limit") from None
        finally:
            faulthandler.cancel_dump_traceback_later()

    search = given(strategy)(
        settings(
            max_examples=examples,
            deadline=None,
            database=None,
            suppress_health_check=list(HealthCheck),
            derandomize=seconds == 0,
        )(bounded)
    )
    runs = 0
    while True:
        search()  # each round draws new examples (unless derandomized: a single round)
        runs += examples
        if time.monotonic() >= deadline:
            print(f"{target}: {runs} examples, no failure; outcomes {dict(outcomes.most_common())}")
            return


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("target", choices=["lang", "gguf", "checkpoint", "lsp", "all"])
    p.add_argument("--examples", type=int, default=100, help="examples per round")
    p.add_argument("--seconds", type=float, default=0, help="repeat rounds for this long")
    p.add_argument("--example-seconds", type=int, default=20)
    p.add_argument("--memory-gib", type=float, default=6.0)
    args = p.parse_args()
    faulthandler.enable()  # a crash in native code shows where it was
    limit = int(args.memory_gib * (1 << 30))
    resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    sys.path[:0] = [str(ROOT)]
    from aner_lang.grammar.limits import ensure_recursion_limit

    ensure_recursion_limit()  # as `aner` runs (hypothesis warns when a test changes it)
    targets = ["lang", "gguf", "checkpoint", "lsp"] if args.target == "all" else [args.target]
    share = args.seconds / len(targets)
    for target in targets:
        with tempfile.TemporaryDirectory() as tmp:
            fuzz(target, args.examples, share, args.example_seconds, Path(tmp))
    return 0


if __name__ == "__main__":
    sys.exit(main())
