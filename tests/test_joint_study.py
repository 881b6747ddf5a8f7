"""The joint systems' seed study over fabricated experiments: `dvc exp show --json` in DVC 3's layout, each run's
records in its own git commit, as `python -m studies joint-summary` reads them. Figures worked out by hand."""
import json
import math
import subprocess

import pytest
from helpers_exp import exp_row, exp_show
from typer.testing import CliRunner

from studies.cli import app as study_app
from studies import joint_study as js

# per seed: F1 of mask / mask_warmup / mask_trained, and the paired intervals `evaluate` gave each difference
F1 = {0: (10.0, 20.0, 22.0), 1: (10.0, 18.0, 22.0), 2: (10.0, 22.0, 28.0)}   # RL over warm-up: +2, +4, +6


def _records(seed, *, drop_pair=False):
    base, warm, rl = F1[seed]
    row = lambda f1: {"synthetic": {}, "avg": {"n": 40.0, "em": f1 / 2, "f1": f1}}  # noqa: E731

    def pair(a, b, d):
        iv = {"diff": d, "lo": d - 3.0, "hi": d + 3.0, "n": 40, "significant": d - 3.0 > 0}
        return {"a": a, "b": b, "avg": {"em": {**iv, "diff": d / 2}, "f1": iv}}

    compare = {"mask_warmup vs mask": pair("mask_warmup", "mask", warm - base),
               "mask_trained vs mask_warmup": pair("mask_trained", "mask_warmup", rl - warm),
               "mask_trained vs mask": pair("mask_trained", "mask", rl - base)}
    if drop_pair:
        del compare["mask_trained vs mask_warmup"]
    return {js.EVAL_FILE: {"mask": row(base), "mask_warmup": row(warm), "mask_trained": row(rl)},
            js.COMPARE_FILE: compare,
            "metrics/train_joint_mask.json": {"reward_first": -0.5 + 0.1 * seed, "reward_last": -0.2,
                                              "format_error_rate_first": 0.3, "format_error_rate_last": 0.1},
            "metrics/warmup_joint_mask.json": {"format_error_rate_after": 0.05 * seed}}


def _params(seed, lr=5e-4):
    return {"joint": {"systems": ["mask"], "ppo": {"seed": seed, "actor_lr": lr}}, "warmup": {"sft": {"seed": seed}}}


def _row(rev, name, seed, lr=5e-4):
    return exp_row(rev, name, _params(seed, lr))


def _exp_show(revs, extra=()):
    return exp_show(_row("workspace", None, 2), _row(revs[0], "main", 0),
                    [_row(revs[s], f"joint-seed{s}", s) for s in (1, 2)] + list(extra))


REVS = ["a" * 40, "b" * 40, "c" * 40]
STORE = {rev: _records(s) for s, rev in enumerate(REVS)}


def _read(rev, path):
    return STORE.get(rev, {}).get(path)


def test_seed_flags_set_the_warm_up_and_rl_seeds():
    assert js.seed_flags(3) == ["-S warmup.sft.seed=3", "-S joint.ppo.seed=3"]


def test_summary_by_hand():
    runs, notes = js.load_runs(_exp_show(REVS), _read)
    assert notes == [] and [r.seeds for r in runs] == [
        {"warmup.sft.seed": s, "joint.ppo.seed": s} for s in (0, 1, 2)]
    s = js.summarize(runs, ["mask"])["mask"]
    assert s["questions"] == [40]
    assert s["rows"]["warm-up + RL"]["f1"] == {"n": 3, "mean": 24.0, "sd": 3.46, "lo": 15.39, "hi": 32.61}
    rl = s["pairs"]["RL over warm-up"]["f1"]
    # +2, +4, +6: mean 4, sd 2, t(0.975, 2) = 4.303 -> 4 ± 4.303 * 2 / sqrt(3) = 4 ± 4.97
    half = 4.302652729911275 * 2 / math.sqrt(3)
    assert (rl["mean"], rl["sd"], rl["lo"], rl["hi"]) == (4.0, 2.0, round(4 - half, 2), round(4 + half, 2))
    assert rl["signs"] == "+++" and rl["significant_seeds"] == 2   # [-1, 5] holds 0; [1, 7] and [3, 9] do not
    assert [p["lo"] for p in rl["per_seed"]] == [-1.0, 1.0, 3.0]
    assert s["pairs"]["RL over warm-up"]["em"]["mean"] == 2.0
    assert s["pairs"]["warm-up − base"]["f1"]["per_seed"][2]["diff"] == 12.0
    assert s["training"]["RL reward, first steps"]["per_seed"] == [-0.5, -0.4, -0.3]
    assert s["training"]["RL reward, first steps"]["mean"] == -0.4
    assert s["training"]["warm-up format errors (held out, at the stop)"]["sd"] == 0.05   # 4 decimals for rates
    assert s["training"]["warm-up format errors (held out, at the stop)"]["per_seed"] == [0.0, 0.05, 0.1]


def test_runs_must_differ_only_in_the_joint_seeds_and_hold_every_pair():
    entries = _exp_show(REVS, extra=[_row("d" * 40, "lr", 5, lr=1e-3)])
    store = dict(STORE, **{"d" * 40: _records(1)})
    read = lambda rev, path: store.get(rev, {}).get(path)  # noqa: E731
    with pytest.raises(ValueError, match=r"'main' and 'lr' differ in more than seeds: \['joint.ppo.actor_lr'\]"):
        js.load_runs(entries, read)
    runs, _ = js.load_runs(entries, read, select=["main", "joint-seed1"])
    assert [r.name for r in runs] == ["main", "joint-seed1"]
    broken = dict(STORE, **{REVS[2]: _records(2, drop_pair=True)})
    runs, _ = js.load_runs(_exp_show(REVS), lambda rev, path: broken.get(rev, {}).get(path))
    with pytest.raises(ValueError, match="joint-seed2: metrics/eval_compare.json has no 'mask_trained vs mask_warmup'"):
        js.summarize(runs, ["mask"])
    with pytest.raises(ValueError, match="main: metrics/eval.json has no jade.avg.em: add the row to eval.systems"):
        js.summarize(js.load_runs(_exp_show(REVS), _read)[0], ["jade"])
    no_compare = lambda rev, path: None if path == js.COMPARE_FILE and rev == REVS[1] else _read(rev, path)  # noqa
    with pytest.raises(ValueError, match="joint-seed1 \\(bbbbbbb\\): no metrics/eval_compare.json at that commit"):
        js.load_runs(_exp_show(REVS), no_compare)


def test_cli_reads_each_run_at_its_own_commit(tmp_path, monkeypatch):
    """The records come from the runs' git commits (`git show <rev>:<path>`), as DVC experiments keep them."""
    def git(*args):
        return subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@t", *args], cwd=tmp_path, check=True,
                              capture_output=True, text=True).stdout.strip()

    git("init", "-q")
    revs = []
    for seed in (0, 1, 2):
        for path, record in _records(seed).items():
            (tmp_path / path).parent.mkdir(parents=True, exist_ok=True)
            (tmp_path / path).write_text(json.dumps(record))
        git("add", "-A")
        git("commit", "-q", "-m", f"seed {seed}")
        revs.append(git("rev-parse", "HEAD"))
    (tmp_path / "exp.json").write_text(json.dumps(_exp_show(revs)))
    monkeypatch.chdir(tmp_path)
    result = CliRunner().invoke(study_app, ["joint-summary", "--exp-json", "exp.json"])
    assert result.exit_code == 0, result.output
    summary = json.loads((tmp_path / "metrics/joint_study.json").read_text())
    assert summary["mask"]["pairs"]["RL over warm-up"]["f1"]["mean"] == 4.0
    assert [r["rev"] for r in summary["runs"]] == revs
    md = (tmp_path / "reports/joint_study.md").read_text()
    assert "| RL over warm-up | F1 | 4.00 ± 2.00 |" in md and "+6.00 [3.00, 9.00] †" in md
    # a run whose commit this clone lacks (an experiment never kept): named, with the fix, not "no runs"
    lost = "f" * 40
    (tmp_path / "lost.json").write_text(json.dumps(_exp_show([revs[0], revs[1], lost])))
    gone = CliRunner().invoke(study_app, ["joint-summary", "--exp-json", "lost.json"])
    assert gone.exit_code == 1 and "Traceback" not in gone.output
    assert "commit fffffff (a run of the study) is not in this repository" in gone.output
    assert "python -m studies keep" in gone.output
    bad = CliRunner().invoke(study_app, ["flags", "1", "--kind", "nosuch"])
    assert bad.exit_code == 1 and "--kind 'nosuch': one of maps, joint" in bad.output
    assert CliRunner().invoke(study_app, ["flags", "2", "--kind", "joint"]).output.strip() == \
        "-S warmup.sft.seed=2 -S joint.ppo.seed=2"


def test_the_team_reward_joins_the_summary_only_where_every_run_has_it():
    """Runs from e76f5a8 on score JADE / DECOR / QAgent rows by their training reward x100 too; a study that mixes in
    an older run (no team_reward) keeps EM and F1 only, so no mean is taken over a subset of the seeds."""
    def with_reward(seed, missing=False):
        rec = _records(seed)
        for name, r in rec[js.EVAL_FILE].items():
            r["avg"]["team_reward"] = r["avg"]["f1"] - 50.0           # -40, -30 / -32 / -28, ...
        for p in rec[js.COMPARE_FILE].values():
            p["avg"]["team_reward"] = dict(p["avg"]["f1"])
        if missing:
            del rec[js.EVAL_FILE]["mask_trained"]["avg"]["team_reward"]
        return rec

    store = {rev: with_reward(s) for s, rev in enumerate(REVS)}
    runs, _ = js.load_runs(_exp_show(REVS), lambda rev, path: store.get(rev, {}).get(path))
    s = js.summarize(runs, ["mask"])
    m = s["mask"]
    assert m["metrics"] == ["em", "f1", "team_reward"]
    assert m["rows"]["base"]["team_reward"]["mean"] == -40.0
    assert m["pairs"]["RL over warm-up"]["team_reward"]["mean"] == 4.0       # +2, +4, +6 as for F1
    md = js.report_markdown(s, ["mask"])
    assert "| row | eval row | EM mean ± sd | F1 mean ± sd | team reward ×100 mean ± sd |" in md
    assert "| RL over warm-up | team reward ×100 | 4.00 ± 2.00 |" in md
    # the rerun lines name the runs as they were named, not a fixed `joint-seed`
    names = sorted(r["name"] for r in s["runs"])
    assert f"python -m studies joint-summary --exp {' --exp '.join(names)}" in md
    launch = js._launch([{"name": f"team-seed{k}", "seeds": {"warmup.sft.seed": k, "joint.ppo.seed": k}}
                         for k in (2, 0, 1)])
    assert launch == ["for s in 0 1 2; do dvc exp run --queue -n team-seed$s "
                      "$(python -m studies flags $s --kind joint); done"]
    odd = js._launch([{"name": "a", "seeds": {"warmup.sft.seed": 3}}, {"name": "b7", "seeds": {"warmup.sft.seed": 7}}])
    assert odd == ["dvc exp run --queue -n a $(python -m studies flags 3 --kind joint)",
                   "dvc exp run --queue -n b7 $(python -m studies flags 7 --kind joint)"]
    # runs that share the warm-up's seed and vary RL's alone (studies/mask_rl_seeds): the shared seed is a fixed
    # flag and only RL's follows the loop; `replicate flags` would set both and rerun a different study
    rl_only = [{"name": f"mask-rlseed{k}", "seeds": {"warmup.sft.seed": 0, "joint.ppo.seed": k}} for k in (1, 0, 2)]
    assert js._launch(rl_only) == ["for s in 0 1 2; do dvc exp run --queue -n mask-rlseed$s "
                                   "-S warmup.sft.seed=0 -S joint.ppo.seed=$s; done"]
    assert js._varied(rl_only) == "`joint.ppo.seed`"
    assert js._varied([{"seeds": {"warmup.sft.seed": k, "joint.ppo.seed": k}} for k in (0, 1)]) == \
        "`warmup.sft.seed`, `joint.ppo.seed`"
    # seeds that vary apart from each other: each run gets its own values, nothing shared is assumed
    mixed = js._launch([{"name": "b", "seeds": {"warmup.sft.seed": 2, "joint.ppo.seed": 5}},
                        {"name": "a", "seeds": {"warmup.sft.seed": 0, "joint.ppo.seed": 1}}])
    assert mixed == ["dvc exp run --queue -n a -S warmup.sft.seed=0 -S joint.ppo.seed=1",
                     "dvc exp run --queue -n b -S warmup.sft.seed=2 -S joint.ppo.seed=5"]
    store[REVS[1]] = with_reward(1, missing=True)
    runs, _ = js.load_runs(_exp_show(REVS), lambda rev, path: store.get(rev, {}).get(path))
    old = js.summarize(runs, ["mask"])["mask"]
    assert old["metrics"] == ["em", "f1"] and "team_reward" not in old["rows"]["base"]
    assert "team reward" not in js.report_markdown({**s, "mask": old}, ["mask"])
