"""Real DVC experiments outside the workspace: `dvc exp run --temp` and `--queue` (+ `dvc queue start`) run a stage
in a copy of the checkout under .dvc/tmp/exps, where a relative `mirror:../<dir>` would point into .dvc/tmp. A toy
stage reads its data the way prepare_data does (`ragteam.data.sources.resolve_mirror_dir`), so these check DVC's
real layout, not a directory made to look like it (tests/test_prepare_data.py covers the function itself)."""
from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

import pytest
from test_flow import dvc, make_repo

READ_PY = """\
import json, pathlib, yaml
from ragteam.data.sources import resolve_mirror_dir
p = yaml.safe_load(open("params.yaml"))["toy"]
kind, _, spec = p["source"].partition(":")
assert kind == "mirror", p
rows = (resolve_mirror_dir(spec) / "rows.txt").read_text().split()
pathlib.Path("metrics").mkdir(exist_ok=True)
json.dump({"rows": len(rows), "scaled": len(rows) * p["scale"]}, open("metrics/read.json", "w"))
"""

DVC_YAML = """\
stages:
  read:
    cmd: python read.py
    deps: [read.py]
    params: [toy]
    metrics:
      - metrics/read.json:
          cache: false
"""


@pytest.fixture(autouse=True)
def this_python_first(monkeypatch):
    """The stage's `python` is this environment's (the one with ragteam), as under `make test`."""
    monkeypatch.setenv("PATH", f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}")


def project(tmp_path: Path) -> Path:
    """A committed git+dvc checkout whose stage reads `mirror:../mirror`: the directory beside the checkout."""
    (tmp_path / "mirror").mkdir()
    (tmp_path / "mirror/rows.txt").write_text("a b c\n")
    return make_repo(tmp_path / "project", DVC_YAML, {"read.py": READ_PY},
                     {"toy": {"source": "mirror:../mirror", "scale": 1}})


def exp_metrics(root: Path) -> dict[str, dict]:
    """name -> metrics/read.json of every experiment `dvc exp show` lists."""
    out = {}
    for commit in json.loads(dvc(root, "exp", "show", "--json")):
        for exp in commit.get("experiments") or []:
            for rev in exp.get("revs") or []:
                data = (rev.get("data") or {}).get("metrics", {}).get("metrics/read.json", {}).get("data")
                if data is not None:
                    out[rev.get("name") or exp.get("name")] = data
    return out


def test_a_temporary_experiment_reads_the_relative_mirror_beside_the_checkout(tmp_path):
    root = project(tmp_path)
    dvc(root, "exp", "run", "--temp", "-n", "temp-scale2", "-S", "toy.scale=2")
    assert exp_metrics(root)["temp-scale2"] == {"rows": 3, "scaled": 6}
    assert not (root / "metrics").exists()         # it ran in .dvc/tmp/exps, not in the workspace


@pytest.mark.slow
def test_queued_experiments_run_by_a_queue_worker_read_it_too(tmp_path):
    root = project(tmp_path)
    for scale in (3, 4):
        dvc(root, "exp", "run", "--queue", "-n", f"queued-scale{scale}", "-S", f"toy.scale={scale}")
    dvc(root, "queue", "start", "-j", "1")
    deadline = time.time() + 240
    while time.time() < deadline:
        status = dvc(root, "queue", "status")
        if "Queued" not in status and "Running" not in status:
            break
        time.sleep(2)
    else:
        raise AssertionError(f"the queue did not finish in 240 s:\n{status}")
    dvc(root, "queue", "stop", "--kill")
    assert "Failed" not in status, dvc(root, "queue", "logs", "queued-scale3")
    got = exp_metrics(root)
    assert got["queued-scale3"] == {"rows": 3, "scaled": 9} and got["queued-scale4"] == {"rows": 3, "scaled": 12}
