"""Seed-replicate summary over fabricated experiments: `dvc exp show --json` in DVC 3's layout, per-question scores
in git commits, as `python -m studies summarize` reads them."""
import json
import subprocess

import pytest
from typer.testing import CliRunner

from studies.cli import app as study_app
from studies import replicate as rep
from ragteam.eval.agents import summarize_agents
from ragteam.eval.stats import BootstrapConfig

CFG = BootstrapConfig(resamples=2000, seed=0)
N = 10
GAINS = {0: 3, 1: 4, 2: 2}  # trained answer agent: right on the first 3 / 4 / 2 of 10 questions per benchmark
QUERY = {0: -1, 1: 1, 2: 0}  # trained query agent: ΔF1 sum over 10 questions per benchmark


def _questions(seed):
    def q_answer(k):
        em = [1.0] * k + [0.0] * (N - k)
        return {"em": em, "f1": em, "acc": em, "words": [2.0] * N}

    def q_query(total):
        d = [float(total)] + [0.0] * (N - 1)
        return {"delta_f1": d, "malformed": [0.0] * N, "f1_after": [0.0] * N, "no_new_chunks": 0.0}

    gain = GAINS.get(seed, 1)                 # seeds beyond 0-2 (duplicates, bad runs): any values
    ref = [1.0] * gain + [0.0] * (N - gain)
    judge = lambda right: {"right": right, "sufficient": [0.0] * N, "malformed": [0.0] * N, "reference": ref}  # noqa
    bench = lambda name: {  # noqa: E731
        "ids": [f"{name}{i}" for i in range(N)],
        "answer": {"base": q_answer(0), "trained": q_answer(gain)},
        "query": {"base": q_query(0), "trained": q_query(QUERY.get(seed, 0))},
        "judge": {"base": judge([0.0] * N), "trained": judge([1.0 - r for r in ref])}}   # says Insufficient always
    return {"settings": {}, "benchmarks": {"hotpotqa": bench("hotpotqa"), "bamboogle": bench("bamboogle")}}


def _params(seed, lr=5e-4):
    return {"train_answer": {"stage1": {"seed": seed, "lr": lr}, "stage2": {"seed": seed}},
            "train_query": {"grpo": {"seed": seed}}, "label_judge": {"seed": seed},
            "train_judge": {"sft": {"seed": seed}}, "synthesize": {"seed": 0}}


def _row(rev, name, seed, metrics=True, lr=5e-4):
    data = {"rev": rev, "timestamp": None, "params": {"params.yaml": {"data": _params(seed, lr)}},
            "metrics": {rep.METRICS_FILE: {"data": summarize_agents(_questions(seed)["benchmarks"], CFG)}}
            if metrics else {}, "deps": {}, "outs": {}, "meta": {}}
    return {"rev": rev, "name": name, "data": data, "error": None, "experiments": None}


def _exp_show(revs, extra=()):
    """DVC 3's `dvc exp show --json`: the workspace, then the baseline commit with its experiments."""
    base = _row(revs[0], "main", 0)
    base["experiments"] = [{"revs": [_row(revs[s], f"seed{s}", s)], "executor": None, "name": f"seed{s}"}
                           for s in (1, 2)] + [{"revs": [r], "executor": None, "name": r["name"]} for r in extra]
    return [_row("workspace", None, 2), base]


def test_runs_from_exp_show_skip_the_workspace_and_runs_without_metrics():
    entries = _exp_show(["a" * 40, "b" * 40, "c" * 40], extra=[_row("d" * 40, "broken", 3, metrics=False)])
    runs, notes = rep.runs_from_exp_show(entries, lambda rev: {"rev": rev})
    assert [r.name for r in runs] == ["main", "seed1", "seed2"] and notes == [f"broken: no {rep.METRICS_FILE}"]
    assert runs[1].seeds["train_query.grpo.seed"] == 1 and runs[1].questions == {"rev": "b" * 40}
    only, _ = rep.runs_from_exp_show(entries, select=["seed2", "a" * 7])
    assert [r.name for r in only] == ["main", "seed2"] and only[0].questions is None


def test_runs_must_differ_only_in_seeds():
    entries = _exp_show(["a" * 40, "b" * 40, "c" * 40], extra=[_row("e" * 40, "lr", 5, lr=1e-3)])
    runs, _ = rep.runs_from_exp_show(entries)
    with pytest.raises(ValueError, match=r"'main' and 'lr' differ in more than seeds: \['train_answer.stage1.lr'\]"):
        rep.check_runs(runs)
    dup, _ = rep.runs_from_exp_show(_exp_show(["a" * 40, "b" * 40, "c" * 40], extra=[_row("f" * 40, "again", 1)]))
    assert rep.check_runs(dup) == ["again: same seeds as seed1, left out"] and len(dup) == 3
    with pytest.raises(ValueError, match="no runs"):
        rep.check_runs([])


def test_summary_mean_sd_t_interval_signs_and_pooled_bootstrap():
    runs, _ = rep.runs_from_exp_show(_exp_show(["a" * 40, "b" * 40, "c" * 40]),
                                     {"a" * 40: _questions(0), "b" * 40: _questions(1), "c" * 40: _questions(2)}.get)
    s = rep.summarize_replicates(runs, CFG)
    em = s["hotpotqa"]["answer"]["em"]
    # gains 30, 40, 20: mean 30, sd 10, t_{0.975,2} = 4.303: 30 ± 24.84
    assert em["per_seed"] == [30.0, 40.0, 20.0] and em["signs"] == "+++"
    assert em["gain"] == {"n": 3, "mean": 30.0, "sd": 10.0, "lo": 5.16, "hi": 54.84}
    assert em["base"]["mean"] == 0.0 and em["base"]["sd"] == 0.0 and em["trained"]["mean"] == 30.0
    assert em["pooled"]["diff"] == 30.0 and em["pooled"]["significant"] and em["pooled"]["n"] == 10
    # alone, only seed 1 (4 of 10) excludes 0: P(no right answer in a resample) = 0.6^10 = 0.6 %, but 0.7^10 = 2.8 %
    # and 0.8^10 = 11 % for seeds 0 and 2 -- pooling the three seeds' questions is what makes the gain clear
    assert em["significant_seeds"] == 1
    assert s["avg"]["answer"]["em"]["pooled"]["n"] == 20 and s["avg"]["answer"]["em"]["gain"]["mean"] == 30.0
    dq = s["hotpotqa"]["query"]["mean_delta_f1"]
    assert dq["per_seed"] == [-10.0, 10.0, 0.0] and dq["signs"] == "-+0" and dq["gain"]["mean"] == 0.0
    assert dq["pooled"]["diff"] == 0.0 and not dq["pooled"]["significant"]
    ba = s["hotpotqa"]["judge"]["balanced_accuracy"]               # always Insufficient: 50 vs malformed 0
    assert ba["per_seed"] == [50.0, 50.0, 50.0] and ba["gain"]["sd"] == 0.0 and ba["pooled"]["diff"] == 50.0
    md = rep.report_markdown(s, ["broken: no metrics"], CFG)
    assert "| EM | HotpotQA | 0.00 ± 0.00 | 30.00 ± 10.00 | 30.00 ± 10.00 | [5.16, 54.84] | +++ | 1/3 |" in md
    assert "**+30.00 [" in md and "- broken: no metrics" in md and "python -m studies flags $s" in md
    assert "main (train_answer.stage1.seed=0, " in md


def test_pooled_needs_the_same_questions_in_every_run():
    q1 = _questions(1)
    q1["benchmarks"]["hotpotqa"]["ids"][0] = "other"
    runs, _ = rep.runs_from_exp_show(_exp_show(["a" * 40, "b" * 40, "c" * 40]),
                                     {"a" * 40: _questions(0), "b" * 40: q1, "c" * 40: _questions(2)}.get)
    with pytest.raises(ValueError, match=r"different questions \(hotpotqa\)"):
        rep.summarize_replicates(runs, CFG)


def test_seed_flags_set_every_training_seed():
    assert rep.seed_flags(2) == ["-S train_answer.stage1.seed=2", "-S train_answer.stage2.seed=2",
                                 "-S train_query.grpo.seed=2", "-S label_judge.seed=2", "-S train_judge.sft.seed=2"]
    res = CliRunner().invoke(study_app, ["flags", "1"])
    assert res.exit_code == 0 and res.output.split() == " ".join(rep.seed_flags(1)).split()


def _git(cwd, *args):
    return subprocess.run(["git", *args], cwd=cwd, check=True, capture_output=True, text=True).stdout.strip()


def test_cli_reads_each_experiment_commit_for_its_questions(tmp_path, monkeypatch):
    """Each replicate's per-question file comes from its own git revision, as DVC commits experiments."""
    _git(tmp_path, "init", "-q")
    revs = []
    for seed in (0, 1, 2):
        path = tmp_path / rep.QUESTIONS_FILE
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(_questions(seed)))
        record = tmp_path / rep.METRICS_FILE     # the whole record: a plain output, not in `dvc exp show`
        record.parent.mkdir(parents=True, exist_ok=True)
        record.write_text(json.dumps(summarize_agents(_questions(seed)["benchmarks"], CFG)))
        _git(tmp_path, "add", "-A")
        _git(tmp_path, "-c", "user.email=t@t", "-c", "user.name=t", "commit", "-qm", f"seed {seed}")
        revs.append(_git(tmp_path, "rev-parse", "HEAD"))
    exps = _exp_show(revs)
    for row in [exps[1], *(e["revs"][0] for e in exps[1]["experiments"])]:   # exp show lists the summary only
        row["data"]["metrics"] = {"metrics/summary/eval_agents.json": {"data": {"avg": {}}}}
    (tmp_path / "exps.json").write_text(json.dumps(exps))
    monkeypatch.chdir(tmp_path)
    res = CliRunner().invoke(study_app, ["summarize", "--exp-json", "exps.json", "--resamples", "500"])
    assert res.exit_code == 0, res.output
    out = json.loads((tmp_path / "metrics" / "replicate.json").read_text())
    assert [r["name"] for r in out["runs"]] == ["main", "seed1", "seed2"]
    assert out["bamboogle"]["answer"]["f1"]["pooled"]["diff"] == 30.0               # read from the commits
    assert out["hotpotqa"]["answer"]["em"]["per_seed"] == [30.0, 40.0, 20.0]        # each commit's own record
    assert (tmp_path / "reports" / "replicate.md").read_text() in res.output
    bad = CliRunner().invoke(study_app, ["summarize", "--exp-json", "exps.json", "--exp", "nothing"])
    assert bad.exit_code == 1 and "no runs" in bad.output


def test_cli_on_metrics_files(tmp_path):
    files = []
    for seed in (0, 1):
        m = tmp_path / f"run{seed}.json"
        m.write_text(json.dumps(summarize_agents(_questions(seed)["benchmarks"], CFG)))
        files += ["--metrics", str(m)]
    (tmp_path / "run0.questions.json").write_text(json.dumps(_questions(0)))
    res = CliRunner().invoke(study_app, ["summarize", *files, "--out-md", str(tmp_path / "r.md"),
                                   "--out-json", str(tmp_path / "r.json")])
    assert res.exit_code == 0, res.output
    out = json.loads((tmp_path / "r.json").read_text())
    em = out["hotpotqa"]["answer"]["em"]
    assert em["per_seed"] == [30.0, 40.0] and em["pooled"] is None      # one run lacks per-question scores
    assert "| – |" in (tmp_path / "r.md").read_text()
