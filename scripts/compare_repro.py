"""Compare two runs of the pipeline: the outputs two `dvc.lock` files record, and the scores of two `reports/eval.md`.

    python scripts/compare_repro.py OLD/dvc.lock NEW/dvc.lock [--report OLD/reports/eval.md NEW/reports/eval.md]

Outputs are compared by the md5 DVC recorded, for every stage both locks have run. Models and data (`models/`,
`data/`, `results/`) must be equal; run records (`metrics/`, `reports/`, figures) hold timings and are listed apart;
the Lucene index is listed apart too (its segment files differ from run to run with the same documents, a known
property of Lucene). Report tables are compared cell by cell, leaving out the columns that hold times. Exit status
1 when a model, a data output or a score differs, else 0; the differences are printed either way.
"""
from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

import yaml

RECORDS = ("metrics/", "reports/", "dvclive", "plots/")
NONDETERMINISTIC = ("data/indexes/bm25/lucene",)
TIME_COLUMN = re.compile(r"(?i)\b(time|seconds|s/q|min|wall)\b|\(s\)")


def lock_outs(path: Path) -> dict[tuple[str, str], str]:
    """(stage, out path) -> md5 for every out of every stage in a dvc.lock."""
    try:
        lock = yaml.safe_load(path.read_text())
    except (OSError, yaml.YAMLError) as e:
        raise SystemExit(f"compare_repro: cannot read {path}: {e}")
    if not isinstance(lock, dict) or not isinstance(lock.get("stages"), dict):
        raise SystemExit(f"compare_repro: {path} is not a dvc.lock (no 'stages' mapping)")
    return {(stage, out["path"]): out.get("md5", "") for stage, body in lock["stages"].items()
            for out in (body or {}).get("outs", [])}


def kind(path: str) -> str:
    if path.startswith(NONDETERMINISTIC):
        return "nondeterministic"
    if path.startswith(RECORDS) or path.endswith(".png"):
        return "record"
    return "artifact"


def compare_locks(old: Path, new: Path) -> tuple[list[str], list[str], int]:
    """(differing artifacts, other differences, artifacts compared)."""
    a, b = lock_outs(old), lock_outs(new)
    bad, other, same = [], [], 0
    for key in sorted(a.keys() & b.keys()):
        if a[key] == b[key]:
            same += kind(key[1]) == "artifact"
            continue
        line = f"{key[0]}: {key[1]} {a[key]} -> {b[key]}"
        (bad if kind(key[1]) == "artifact" else other).append(line + ("" if kind(key[1]) == "artifact"
                                                                       else f" ({kind(key[1])})"))
    for key in sorted(a.keys() ^ b.keys()):
        other.append(f"{key[0]}: {key[1]} only in {'the old' if key in a else 'the new'} lock")
    return bad, other, same


def tables(md: Path) -> dict[tuple[str, str, str], str]:
    """(table heading, row label, column) -> cell, for every markdown table, time columns left out."""
    out, heading, header = {}, "", None
    try:
        lines = md.read_text(encoding="utf-8").splitlines()
    except OSError as e:
        raise SystemExit(f"compare_repro: cannot read {md}: {e}")
    for line in lines:
        if line.startswith("#"):
            heading, header = line.strip("# "), None
        elif line.startswith("|"):
            cells = [c.strip() for c in line.strip().strip("|").split("|")]
            if header is None:
                header = cells
            elif all(set(c) <= set(":- ") for c in cells):
                continue
            else:
                for col, cell in zip(header[1:], cells[1:]):
                    if not TIME_COLUMN.search(col):
                        out[(heading, cells[0], col)] = cell
        else:
            header = None
    return out


def compare_reports(old: Path, new: Path) -> list[str]:
    a, b = tables(old), tables(new)
    diffs = [f"{h} / {row} / {col}: {a[(h, row, col)]} -> {b[(h, row, col)]}"
             for (h, row, col) in sorted(a.keys() & b.keys()) if a[(h, row, col)] != b[(h, row, col)]]
    diffs += [f"{h} / {row} / {col}: only in {'the old' if k in a else 'the new'} report"
              for k in sorted(a.keys() ^ b.keys()) for (h, row, col) in [k]]
    return diffs


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("old_lock", type=Path)
    ap.add_argument("new_lock", type=Path)
    ap.add_argument("--report", nargs=2, type=Path, metavar=("OLD", "NEW"))
    a = ap.parse_args(argv)
    bad, other, same = compare_locks(a.old_lock, a.new_lock)
    print(f"models and data: {same} equal, {len(bad)} differ")
    for line in bad:
        print("  DIFFERS", line)
    if other:
        print(f"run records and known nondeterministic outputs: {len(other)} differ (expected: timings, Lucene)")
        for line in other:
            print("  ", line)
    score_diffs = compare_reports(*a.report) if a.report else []
    if a.report:
        print(f"report scores: {len(score_diffs)} differ")
        for line in score_diffs:
            print("  DIFFERS", line)
    return 1 if bad or score_diffs else 0


if __name__ == "__main__":
    sys.exit(main())
