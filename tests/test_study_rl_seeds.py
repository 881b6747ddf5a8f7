"""studies/rl_seeds.sh: the RL-seed studies' runner (studies/<system>_rl_seeds for M-ASK, JADE, DECOR and QAgent) runs
each seed as one DVC experiment that varies `joint.ppo.seed` alone, on top of its profile's flags, over the system's
own stages; bad arguments stop it before anything runs. dvc, git and ragteam are fakes that log their arguments."""
from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
FAKE = """#!/bin/bash
echo "{name} $*" >> "$LOG"
{body}
"""


def _fakes(tmp_path: Path) -> dict:
    bin_ = tmp_path / ".venv" / "bin"
    bin_.mkdir(parents=True, exist_ok=True)
    bodies = {"dvc": "", "git": "",
              "ragteam": """[ "$3" = nosuch ] && { echo "ERROR profile 'nosuch' not found" >&2; exit 1; }
echo "-S 'joint.systems=[$3]' -S joint.x.ppo.steps=8" """}
    for name, body in bodies.items():
        (bin_ / name).write_text(FAKE.format(name=name, body=body))
        (bin_ / name).chmod(0o755)
    return {**os.environ, "LOG": str(tmp_path / "calls.log"), "PATH": f"{bin_}:{os.environ['PATH']}"}


def _run(tmp_path: Path, script: str, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", str(ROOT / script), *args], cwd=tmp_path, env=_fakes(tmp_path),
                          capture_output=True, text=True, timeout=60)


def test_each_seed_is_one_experiment_that_varies_rl_seed_alone(tmp_path):
    r = _run(tmp_path, "studies/jade_rl_seeds/run.sh", "0", "2")
    assert r.returncode == 0, r.stderr
    calls = (tmp_path / "calls.log").read_text().splitlines()
    runs = [c for c in calls if c.startswith("dvc exp run")]
    stages = ("-s prepare_models prepare_data index_bm25@bm25s oracle_traces@jade warmup_joint@jade "
              "train_joint@jade evaluate")
    assert runs == [f"dvc exp run -n jade-rlseed{s} -S joint.systems=[jade_rl_recipe] -S joint.x.ppo.steps=8 "
                    f"-S joint.ppo.seed={s} {stages}" for s in (0, 2)]
    assert not any("warmup.sft.seed" in c for c in calls)          # the warm-up's seed stays params.yaml's
    # params.yaml is restored before every run and after the last, so no run inherits another's flags
    assert [c for c in calls if c.startswith("git")] == ["git checkout -- params.yaml"] * 3
    assert calls[0] == "ragteam profile flags jade_rl_recipe"
    assert calls[1] == "dvc pull -q prepare_models prepare_data index_bm25@bm25s oracle_traces@jade"


@pytest.mark.parametrize("system,profile", [("mask", "mask_rl_recipe"), ("jade", "jade_rl_recipe"),
                                            ("decor", "decor_rl_recipe"), ("qagent", "qagent_t07")])
def test_each_systems_study_runs_its_recipe_under_its_names(tmp_path, system, profile):
    assert (ROOT / "profiles" / f"{profile}.yaml").is_file()
    r = _run(tmp_path, f"studies/{system}_rl_seeds/run.sh", "3")
    assert r.returncode == 0, r.stderr
    run = [c for c in (tmp_path / "calls.log").read_text().splitlines() if c.startswith("dvc exp run")]
    assert run == [f"dvc exp run -n {system}-rlseed3 -S joint.systems=[{profile}] -S joint.x.ppo.steps=8 "
                   f"-S joint.ppo.seed=3 -s prepare_models prepare_data index_bm25@bm25s oracle_traces@{system} "
                   f"warmup_joint@{system} train_joint@{system} evaluate"]


def test_bad_arguments_stop_before_anything_runs(tmp_path):
    r = _run(tmp_path, "studies/rl_seeds.sh", "mask", "mask_rl_recipe")
    assert r.returncode == 2 and "usage: bash studies/rl_seeds.sh SYSTEM PROFILE NAME_PREFIX SEED" in r.stderr
    r = _run(tmp_path, "studies/rl_seeds.sh", "mask", "mask_rl_recipe", "p-", "1", "x")
    assert r.returncode == 2 and "seed 'x' is not a non-negative integer" in r.stderr
    assert not (tmp_path / "calls.log").exists()
    r = _run(tmp_path, "studies/rl_seeds.sh", "mask", "nosuch", "p-", "1")
    assert r.returncode == 1 and "profile 'nosuch' not found" in r.stderr
    assert (tmp_path / "calls.log").read_text().splitlines() == ["ragteam profile flags nosuch"]
