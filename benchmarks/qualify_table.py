"""The `comparison` sections of one or more `aner qualify` reports as one Markdown table: each
figure the reference V100 report has, with each of our machines' figure and its ratio to the V100's.

Usage: python benchmarks/qualify_table.py benchmarks/results/qualification-*.json [--out FILE.md]

Each report's column is named for its machine (the GPU's name, else ``cpu``). A figure a report
lacks (a GPU-only one in a CPU report) is left empty.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any


def _machine(report: dict[str, Any]) -> str:
    return str(report["gpu"].get("name", "cpu"))


def _cell(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, float):
        return f"{value:.4g}"
    return str(value)


def _summary(report: dict[str, Any]) -> list[str]:
    suites = [s for s in report["unit_suites"] if "name" in s]
    skipped = [s["skipped"] for s in report["unit_suites"] if "skipped" in s]
    failed = sum(s["failed"] for s in suites)
    methods = report["real_model"].get("qualification", [])
    passed = sum(q["status"] == "pass" for q in methods)
    source = report["source"]
    commit = str(source["commit"])[:10]
    if source.get("uncommitted_changes"):
        commit += f" with changes; package tree sha256 {source['package_tree_sha256'][:12]}"
    tests = (
        f"test suites skipped ({'; '.join(skipped)})"
        if skipped and not suites
        else f"{report['unit_check_total']} tests passed and {failed} failed in "
        f"{len(suites)} suites"
    )
    status = report["status"]
    if status == "pass" and skipped and not suites:  # a report from before `left_out` existed
        status = "partial"
    return [
        f"- {_machine(report)}: {status} on {report['qualification_date_utc']} "
        f"(commit {commit}); {tests}; {passed} of {len(methods)} adapter methods qualified"
    ]


def table(reports: list[dict[str, Any]]) -> str:
    """Markdown: a line per report, then a row per figure (reference, then ours and ratio)."""
    rows: dict[tuple[str, str], dict[str, Any]] = {}
    for i, report in enumerate(reports):
        for r in report["comparison"]:
            key = (r["figure"], str(r.get("method", r.get("shape", ""))))
            row = rows.setdefault(key, {"reference": r["reference_v100"]})
            row[i] = (r["ours"], r.get("ours_over_reference"))
    names = [_machine(r) for r in reports]
    lines = [line for r in reports for line in _summary(r)] + [""]
    header = ["figure", "method / shape", "V100"]
    header += [part for name in names for part in (name, f"{name} / V100")]
    lines += ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for (figure, where), row in rows.items():
        cells = [figure, where, _cell(row["reference"])]
        for i in range(len(reports)):
            ours, ratio = row.get(i, (None, None))
            cells += [_cell(ours), _cell(ratio)]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("reports", nargs="+", type=Path)
    parser.add_argument("--out", type=Path, help="write here (default: stdout)")
    args = parser.parse_args()
    text = table([json.loads(p.read_text(encoding="utf-8")) for p in args.reports])
    if args.out:
        args.out.write_text(text, encoding="utf-8")
    else:
        print(text, end="")


if __name__ == "__main__":
    main()
