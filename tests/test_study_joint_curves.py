"""studies/joint_curves.py: a joint seed study's RL curves read at each run's commit, the seeds' mean per step
and the step where the reward stops rising (issue 25 §3). Figures worked out by hand."""
import importlib.util
import json
import subprocess
from pathlib import Path

import pytest
from test_joint_study import _exp_show, _records

REPO = Path(__file__).resolve().parents[1]
SPEC = importlib.util.spec_from_file_location("joint_curves", REPO / "studies" / "joint_curves.py")
jc = importlib.util.module_from_spec(SPEC)
SPEC.loader.exec_module(jc)

D = "reports/training/train_joint_mask/plots/metrics"


def _tsv(name, values):
    return f"step\t{name}\n" + "".join(f"{i}\t{v}\n" for i, v in enumerate(values, 1))


def test_plateau_is_the_last_step_of_the_best_three_step_mean():
    # means of steps 1-3, 2-4, 3-5, 4-6: 0.1, 0.2, 0.3, 0.2 -> the window 3-5 ends at step 5
    assert jc.plateau_step({1: 0.0, 2: 0.1, 3: 0.2, 4: 0.3, 5: 0.4, 6: -0.1}) == 5
    assert jc.plateau_step({1: 0.5, 2: 0.5, 3: 0.5, 4: 0.5}) == 3      # flat: the first window
    assert jc.plateau_step({1: 0.0, 2: 1.0}) is None                   # fewer steps than the window


def test_study_curves_reads_each_run_at_its_commit_and_averages_per_step(tmp_path, monkeypatch):
    """Runs as `joint-summary` reads them (`dvc exp show` layout, the seed check), curves at each run's commit."""
    def git(*args):
        return subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@t", *args], cwd=tmp_path,
                              check=True, capture_output=True, text=True).stdout.strip()

    git("init", "-q")
    revs = []
    for seed, rewards in ((0, [0.0, 0.2, 0.4, 0.1]), (1, [0.2, 0.0, 0.2, 0.5]), (2, [0.1, 0.1, 0.1, 0.1])):
        for path, record in _records(seed).items():          # the evaluate and training records of the run
            (tmp_path / path).parent.mkdir(parents=True, exist_ok=True)
            (tmp_path / path).write_text(json.dumps(record))
        d = tmp_path / D
        d.mkdir(parents=True, exist_ok=True)
        (d / "reward.tsv").write_text(_tsv("reward", rewards))
        (d / "kl_start.tsv").write_text(_tsv("kl_start", [0.0, 0.01 * (seed + 1), 0.02, 0.03]))
        (d / "grad_norm.policy.tsv").write_text(_tsv("grad_norm/policy", [1, 2, 3, 4]))
        git("add", "-A")
        git("commit", "-q", "-m", f"seed {seed}")
        revs.append(git("rev-parse", "HEAD"))
    (tmp_path / "exp.json").write_text(json.dumps(_exp_show(revs)))     # main = seed 0, joint-seed1, joint-seed2
    monkeypatch.chdir(tmp_path)
    assert jc.main(["--exp-json", "exp.json", "--exp", "main", "--exp", "joint-seed1", "--system", "mask",
                    "--out-md", "c.md", "--out-json", "c.json"]) == 0
    study = json.loads((tmp_path / "c.json").read_text())
    assert [r["name"] for r in study["runs"]] == ["main", "joint-seed1"] and study["runs"][0]["rev"] == revs[0]
    # seed 0: windows 0.2, 0.2333 -> step 4; seed 1: 0.1333, 0.2333 -> step 4; mean curve 0.1, 0.1, 0.3, 0.3
    assert [r["plateau_step"] for r in study["runs"]] == [4, 4]
    assert study["mean"]["reward"] == pytest.approx({"1": 0.1, "2": 0.1, "3": 0.3, "4": 0.3})
    assert study["mean"]["KL to start"]["2"] == pytest.approx(0.015)
    assert study["mean_plateau_step"] == 4 and "clip fraction" not in study["mean"]   # no such curve kept
    md = (tmp_path / "c.md").read_text()
    assert "Reward stops rising at step: main 4, joint-seed1 4" in md
    assert "| 2 | 0.1000 | 2.0000 | 0.0150 |" in md                   # mean: reward, policy grad norm, KL

    assert jc.main(["--exp-json", "exp.json", "--exp", "joint-seed9", "--system", "mask", "--out-md", "x.md",
                    "--out-json", "x.json"]) == 2
    assert not (tmp_path / "x.json").exists()
    lost = _exp_show([revs[0], revs[1], "f" * 40])                     # a run whose commit was never kept
    with pytest.raises(ValueError, match="commit fffffff \\(a run of the study\\) is not in this repository"):
        jc.study_runs(lost, ["joint-seed2"])
    with pytest.raises(ValueError, match=r":3: not 'step<TAB>value'"):
        jc.parse_tsv("step\treward\n1\t0.5\nx\ty\n", "r.tsv")
