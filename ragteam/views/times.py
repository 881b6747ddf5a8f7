"""Where a run's time went (issue 73 §1): each stage's wall time split into engine start-up, generation, training,
retrieval and the rest, from the `time_split` its record carries (`metrics/<stage>.json`, written by
`ragteam.io.write_metrics` from `ragteam.timing`), largest first, with each phase's total and share.

`ragteam times` prints it in at most 120 columns for the checkout (the default run whose lock is committed) or any
run's folder (`--root .smoke/run`, what `make smoke` prints at its end); `--markdown` gives the table a study or a
benchmark commits. The stage-seconds total is not the run's wall time: the flow runs two stages at once.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

# the parts of a split, in the order ragteam.timing counts them (`other`: data, outputs, imports, set-up)
PHASES = ("engine_start", "generation", "training", "retrieval", "other")


class TimesError(ValueError):
    """A stage record that cannot be read: the message names the file and what is wrong."""


@dataclass(frozen=True)
class StageTime:
    record: str                       # metrics/<record>.json (train_joint_decor: the stage train_joint@decor)
    wall_s: float
    parts: dict[str, float] = field(default_factory=dict)    # phase -> seconds


def _split(path: Path) -> dict | None:
    try:
        rec = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise TimesError(f"{path}: not a readable JSON record ({e})") from e
    if not isinstance(rec, dict) or "time_split" not in rec:
        return None                   # a metrics file that is no stage record (eval.json, retrieval.json)
    split = rec["time_split"]
    if not isinstance(split, dict) or not all(isinstance(v, (int, float)) and not isinstance(v, bool)
                                              for v in split.values()):
        raise TimesError(f"{path}: time_split must map each phase to seconds, got {split!r:.120}")
    if "wall_s" not in split:
        raise TimesError(f"{path}: time_split has no wall_s (keys: {sorted(split)})")
    return split


def collect(metrics_dir: Path) -> list[StageTime]:
    """Every stage record directly under `metrics_dir` that has a time split, largest wall time first."""
    if not metrics_dir.is_dir():
        raise TimesError(f"{metrics_dir}: no such folder (a run's stage records are in its metrics/)")
    rows = []
    for path in sorted(metrics_dir.glob("*.json")):
        split = _split(path)
        if split is not None:
            rows.append(StageTime(path.stem, float(split["wall_s"]),
                                  {p: float(split.get(f"{p}_s", 0.0)) for p in PHASES}))
    if not rows:
        raise TimesError(f"{metrics_dir}: no stage record with a time_split (has the pipeline run here?)")
    return sorted(rows, key=lambda r: (-r.wall_s, r.record))


def totals(rows: list[StageTime]) -> dict[str, float]:
    """Stage-seconds per phase and in all (`wall_s`)."""
    out = {p: sum(r.parts.get(p, 0.0) for r in rows) for p in PHASES}
    out["wall_s"] = sum(r.wall_s for r in rows)
    return out


def _cells(rows: list[StageTime]) -> tuple[list[str], list[list[str]]]:
    header = ["stage record", "wall s", *(p.replace("_", " ") for p in PHASES)]
    body = [[r.record, f"{r.wall_s:.0f}", *(f"{r.parts[p]:.0f}" if r.parts[p] >= 0.5 else "" for p in PHASES)]
            for r in rows]
    t = totals(rows)
    body.append(["all stages", f"{t['wall_s']:.0f}", *(f"{t[p]:.0f}" for p in PHASES)])
    body.append(["share", "100 %", *(f"{100 * t[p] / t['wall_s']:.0f} %" if t["wall_s"] else "" for p in PHASES)])
    return header, body


def markdown(rows: list[StageTime]) -> str:
    header, body = _cells(rows)
    lines = ["| " + " | ".join(header) + " |", "|---" + "|---:" * (len(header) - 1) + "|"]
    for i, cells in enumerate(body):
        first = f"**{cells[0]}**" if i >= len(body) - 2 else cells[0]      # the totals
        lines.append("| " + " | ".join([first, *cells[1:]]) + " |")
    return "\n".join(lines) + "\n"


def as_json(rows: list[StageTime]) -> dict:
    return {"stages": {r.record: {"wall_s": r.wall_s, **{f"{p}_s": r.parts[p] for p in PHASES}} for r in rows},
            "totals": {("wall_s" if k == "wall_s" else f"{k}_s"): v for k, v in totals(rows).items()}}


def render(rows: list[StageTime], console) -> None:
    from rich.table import Table

    header, body = _cells(rows)
    table = Table(title="Where the time went (seconds per stage, ragteam.timing)", title_justify="left")
    for i, h in enumerate(header):
        table.add_column(h, justify="left" if i == 0 else "right", no_wrap=True)
    for i, cells in enumerate(body):
        table.add_row(*cells, end_section=i == len(body) - 3)
    console.print(table)
