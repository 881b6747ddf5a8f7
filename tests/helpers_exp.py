"""`dvc exp show --json` in DVC 3's layout for the seed-study tests (`python -m studies joint-summary` /
`team-summary`): a baseline commit with its experiments, each row carrying its params.yaml."""
from __future__ import annotations


def exp_row(rev: str, name: str | None, params: dict) -> dict:
    """One row: a commit (or "workspace") with its params and an empty declared-metrics file, as DVC lists it."""
    data = {"rev": rev, "timestamp": None, "params": {"params.yaml": {"data": params}},
            "metrics": {"metrics/summary/eval.json": {"data": {}}}, "deps": {}, "outs": {}, "meta": {}}
    return {"rev": rev, "name": name, "data": data, "error": None, "experiments": None}


def exp_show(workspace: dict, baseline: dict, experiments: list[dict]) -> list[dict]:
    """The workspace row, then the baseline with each experiment row under it."""
    baseline["experiments"] = [{"revs": [r], "executor": None, "name": r["name"]} for r in experiments]
    return [workspace, baseline]
