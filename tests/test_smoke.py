"""`make smoke` (scripts/smoke.sh): the whole DAG on profiles/smoke.yaml through the Prefect flow in a scratch copy
of the checkout, every stage run, a real reports/eval.md with a row of numbers for every system, the checkout's own
params.yaml and dvc.lock untouched; its wall time is recorded against the 5-minute budget on 2 cores."""
from __future__ import annotations

import hashlib
import os
import re
import subprocess
import sys
import time
import warnings
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[1]
# The budget (issue 76), on an idle 2-core machine. `make test` runs the worker suite beside this one, which stretches
# it, so the test records the wall time (a warning over budget, the junit property smoke_wall_s) and fails on it only
# where RAGTEAM_SMOKE_BUDGET_S is set (an idle runner: RAGTEAM_SMOKE_BUDGET_S=300)
BUDGET_S = float(os.environ.get("RAGTEAM_SMOKE_BUDGET_S") or 300)
ENFORCE_BUDGET = bool(os.environ.get("RAGTEAM_SMOKE_BUDGET_S"))


def _digest(path: Path) -> str | None:
    return hashlib.sha256(path.read_bytes()).hexdigest() if path.is_file() else None


def _first_table(md: str) -> tuple[list[str], dict[str, list[str]]]:
    """The report's first table: its header cells and each row's cells by method."""
    lines = [x for x in md.splitlines() if x.startswith("|")]
    header = [c.strip() for c in lines[0].strip("|").split("|")]
    rows = {}
    for line in lines[2:]:
        if line.startswith("|---"):
            break
        cells = [c.strip() for c in line.strip("|").split("|")]
        if len(cells) != len(header):
            break                                   # the next table
        rows[cells[0]] = cells
    return header, rows


def test_the_make_target_runs_the_script_after_setting_up_the_main_environment_only():
    make = (REPO / "Makefile").read_text()
    recipe = re.search(r"(?m)^smoke:.*##.*\n((?:\t.*\n)+)", make)
    assert recipe, "Makefile: no `smoke:` target with a ## help comment"
    lines = [x.strip() for x in recipe.group(1).splitlines()]
    assert lines == ["bash scripts/setup.sh", "bash scripts/smoke.sh"], lines
    smoke = yaml.safe_load((REPO / "profiles/smoke.yaml").read_text())
    assert set(smoke["llm"]["stages"].values()) == {"hf"}                # so .venv-worker is not needed
    default = yaml.safe_load((REPO / "params.yaml").read_text())
    assert set(smoke["llm"]["stages"]) == set(default["llm"]["stages"])   # every stage the default puts on vLLM


@pytest.mark.slow
def test_make_smoke_runs_every_stage_and_reports_every_system(tmp_path, record_property):
    from ragteam.lineage import load_stages
    from ragteam.profiles import merged_params

    before = {p: _digest(REPO / p) for p in ("params.yaml", "dvc.lock", "reports/eval.md")}
    bin_dir = Path(sys.executable).parent
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "SMOKE_DIR": str(tmp_path / "smoke")}
    env.pop("SMOKE_PROFILES", None)
    t0 = time.monotonic()
    done = subprocess.run(["bash", str(REPO / "scripts/smoke.sh")], cwd=REPO, env=env, capture_output=True,
                          text=True, timeout=3600)
    wall = time.monotonic() - t0
    out = done.stdout + done.stderr
    print(done.stdout[-4000:])                    # the scratch copy, each stage's seconds and time split, the report
    assert done.returncode == 0, out[-8000:]
    run = tmp_path / "smoke/run"
    assert f"smoke: the report is {run / 'reports/eval.md'}" in done.stdout

    # the whole DAG ran: every stage of dvc.yaml (foreach expanded) is in the scratch copy's lock
    lock = yaml.safe_load((run / "dvc.lock").read_text())["stages"]
    assert set(lock) == set(load_stages(run)), set(load_stages(run)) ^ set(lock)

    # a real report: a row of numbers for every system the profile evaluates (every default row)
    systems = merged_params(["smoke"], REPO / "params.yaml", REPO / "profiles")["eval"]["systems"]
    assert set(systems) == set(yaml.safe_load((REPO / "params.yaml").read_text())["eval"]["systems"])
    header, rows = _first_table((run / "reports/eval.md").read_text())
    assert set(rows) == set(systems), set(rows) ^ set(systems)
    for name, cells in rows.items():
        scores = {h: float(c) for h, c in zip(header, cells) if h in ("Avg EM", "Avg F1", "Avg Acc")}
        assert len(scores) == 3 and all(0.0 <= v <= 100.0 for v in scores.values()), (name, cells)
        assert float(cells[header.index("LLM calls/q")]) > 0, (name, cells)   # the system did run its agents
    assert "Questions per benchmark: Synthetic 2." in (run / "reports/eval.md").read_text()

    # the checkout's own run is untouched
    assert {p: _digest(REPO / p) for p in before} == before
    record_property("smoke_wall_s", round(wall))
    cpu = re.search(r"smoke: the flow took .*", done.stderr)
    load = os.getloadavg()
    note = (f"make smoke took {wall:.0f} s ({cpu.group(0) if cpu else 'no CPU time'}; load "
            f"{load[0]:.1f} {load[1]:.1f} {load[2]:.1f} on {os.cpu_count()} cores), budget {BUDGET_S:.0f} s")
    print(note)
    if ENFORCE_BUDGET:
        assert wall < BUDGET_S, f"{note}\n{out[-3000:]}"
    elif wall >= BUDGET_S:
        warnings.warn(note)
