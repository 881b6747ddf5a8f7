"""The MAPS team's seed study over fabricated experiments (`dvc exp show --json` in DVC 3's layout, each run's records
in its own git commit) and over episodes read through DVC at a commit, as `python -m studies team-summary` reads them.
Figures worked out by hand."""
import json
import math
import subprocess
import sys

import pytest
from helpers_exp import exp_row, exp_show
from typer.testing import CliRunner

from studies.cli import _episode_scores
from studies.cli import app as study_app
from studies import team_study as ts
from ragteam.eval.stats import BootstrapConfig
from ragteam.records import Episode

# per seed: F1 of maps_untrained / maps on HotpotQA and 2Wiki; the untrained team is the same base model every run
F1 = {0: ((10.0, 20.0), (12.0, 40.0)), 1: ((10.0, 20.0), (14.0, 26.0)), 2: ((10.0, 20.0), (10.0, 30.0))}
SEEDS = ("train_answer.stage1.seed", "train_answer.stage2.seed", "train_query.grpo.seed", "label_judge.seed",
         "train_judge.sft.seed")


def _records(seed, *, drop_pair=False):
    (bh, bw), (ah, aw) = F1[seed]

    def row(h, w):
        return {"hotpotqa": {"n": 50.0, "em": h / 2, "f1": h}, "2wikimultihopqa": {"n": 50.0, "em": w / 2, "f1": w},
                "avg": {"n": 100.0, "em": (h + w) / 4, "f1": (h + w) / 2}}

    def iv(d):
        return {"diff": d, "lo": d - 5.0, "hi": d + 5.0, "n": 50, "significant": d - 5.0 > 0}

    pair = {"a": "maps", "b": "maps_untrained", "hotpotqa": {"n": 50, "em": iv((ah - bh) / 2), "f1": iv(ah - bh)},
            "2wikimultihopqa": {"n": 50, "em": iv((aw - bw) / 2), "f1": iv(aw - bw)},
            "avg": {"n": 100, "em": iv((ah - bh + aw - bw) / 4), "f1": iv((ah - bh + aw - bw) / 2)}}
    compare = {} if drop_pair else {"maps vs maps_untrained": pair}
    return {ts.EVAL_FILE: {"maps_untrained": row(bh, bw), "maps": row(ah, aw)}, ts.COMPARE_FILE: compare}


def _row(rev, name, seed, judge=0):
    params = {"train_answer": {"stage1": {"seed": seed}, "stage2": {"seed": seed}},
              "train_query": {"grpo": {"seed": seed}}, "label_judge": {"seed": seed, "extra_candidates": judge},
              "train_judge": {"sft": {"seed": seed}}}
    return exp_row(rev, name, params)


def _exp_show(revs, extra=()):
    return exp_show(_row("workspace", None, 2), _row(revs[0], "maps-mirror-seed0", 0),
                    [_row(revs[s], f"maps-mirror-seed{s}", s) for s in range(1, len(revs))] + list(extra))


REVS = ["a" * 40, "b" * 40, "c" * 40]
STORE = {rev: _records(s) for s, rev in enumerate(REVS)}


def _read(rev, path):
    return STORE.get(rev, {}).get(path)


def test_summary_by_hand():
    runs, notes = ts.load_runs(_exp_show(REVS), _read)
    assert notes == [] and [r.seeds for r in runs] == [{k: s for k in SEEDS} for s in (0, 1, 2)]
    s = ts.summarize(runs)
    assert s["questions"] == {"hotpotqa": [50], "2wikimultihopqa": [50], "avg": [100]}
    # 2Wiki F1 gain per seed +20, +6, +10: mean 12, sd sqrt(52) = 7.21; t(0.975, 2) = 4.303
    w = s["2wikimultihopqa"]["f1"]
    half = 4.302652729911275 * math.sqrt(52) / math.sqrt(3)
    assert (w["diff"]["mean"], w["diff"]["sd"]) == (12.0, 7.21)
    assert (w["diff"]["lo"], w["diff"]["hi"]) == (round(12 - half, 2), round(12 + half, 2))
    assert w["signs"] == "+++" and w["significant_seeds"] == 3          # [15, 25], [1, 11], [5, 15]
    assert w["b"]["mean"] == 20.0 and w["b"]["sd"] == 0.0 and w["a"]["mean"] == 32.0
    h = s["hotpotqa"]["f1"]
    assert h["signs"] == "++0" and h["significant_seeds"] == 0 and h["diff"]["mean"] == 2.0
    # Avg: (2 + 20) / 2, (4 + 6) / 2, (0 + 10) / 2 = 11, 5, 5
    assert [p["diff"] for p in s["avg"]["f1"]["per_seed"]] == [11.0, 5.0, 5.0]
    assert s["avg"]["em"]["diff"]["mean"] == 3.5
    assert s["avg"]["f1"]["pooled"] is None and "--no-pooled" in s["pooled_note"]
    md = ts.report_markdown(s)
    assert "| F1 | 2Wiki | 20.00 ± 0.00 | 32.00 ± 7.21 | 12.00 ± 7.21 |" in md
    assert "+20.00 [15.00, 25.00] †" in md
    assert "python -m studies team-summary --exp maps-mirror-seed0 --exp maps-mirror-seed1 --exp " \
           "maps-mirror-seed2" in md


def test_runs_must_differ_only_in_seeds_and_hold_the_pair():
    entries = _exp_show(REVS, extra=[_row("d" * 40, "judge128", 5, judge=128)])
    store = dict(STORE, **{"d" * 40: _records(1)})
    read = lambda rev, path: store.get(rev, {}).get(path)  # noqa: E731
    with pytest.raises(ValueError, match=r"differ in more than seeds: \['label_judge.extra_candidates'\]"):
        ts.load_runs(entries, read)
    runs, _ = ts.load_runs(entries, read, select=["maps-mirror-seed0", "maps-mirror-seed1"])
    assert [r.name for r in runs] == ["maps-mirror-seed0", "maps-mirror-seed1"]
    broken = dict(STORE, **{REVS[2]: _records(2, drop_pair=True)})
    with pytest.raises(ValueError, match="maps-mirror-seed2 \\(ccccccc\\): metrics/eval_compare.json has no "
                                         "'maps vs maps_untrained'"):
        ts.load_runs(_exp_show(REVS), lambda rev, path: broken.get(rev, {}).get(path))
    with pytest.raises(ValueError, match="no 'maps vs maps_base_query'"):
        ts.load_runs(_exp_show(REVS), _read, pair=("maps", "maps_base_query"))


def _scores(per_question):
    """A fake episode reader: {(rev, system, bench): (ids, f1 scores)}."""
    def read(rev, system, bench):
        got = per_question.get((rev, system, bench))
        return None if got is None else (got[0], {"em": got[1], "f1": got[1], "no_answer": [0.0] * len(got[1]),
                                                  "format_error_questions": [0.0] * len(got[1])})
    return read


def test_pooled_bootstrap_over_seeds_by_hand():
    """Pooled = the seed-mean of a − b with questions resampled jointly: where every question's difference is the
    same in a run, every resample gives the same value, so the interval is the point: here (0.5 + 0.1) / 2 = 30 %.
    Avg is the unweighted mean of the benchmarks' means, not the mean over all questions."""
    runs, _ = ts.load_runs(_exp_show(REVS[:2]), _read)
    h, w = ["h1", "h2"], ["w1", "w2", "w3", "w4"]
    q = {}
    for rev, gain in zip(REVS[:2], (0.5, 0.1)):
        q[(rev, "maps_untrained", "hotpotqa")] = (h, [0.2, 0.4])
        q[(rev, "maps", "hotpotqa")] = (h, [0.2 + gain, 0.4 + gain])
        q[(rev, "maps_untrained", "2wikimultihopqa")] = (w, [0.0] * 4)
        q[(rev, "maps", "2wikimultihopqa")] = (w, [0.0] * 4)
    s = ts.summarize(runs, read_scores=_scores(q), cfg=BootstrapConfig(resamples=500))
    assert s["hotpotqa"]["f1"]["pooled"] == {"diff": 30.0, "lo": 30.0, "hi": 30.0, "n": 2, "significant": True}
    assert s["2wikimultihopqa"]["f1"]["pooled"]["diff"] == 0.0
    assert s["avg"]["f1"]["pooled"]["diff"] == 15.0 and s["avg"]["f1"]["pooled"]["n"] == 6  # (30 + 0) / 2, not 10
    assert s["pooled_note"] is None
    md = ts.report_markdown(s, cfg=BootstrapConfig(resamples=500))
    assert "**+30.00 [30.00, 30.00]** †" in md
    # other questions in another run: refused, naming the run, row and benchmark
    q[(REVS[1], "maps", "2wikimultihopqa")] = (["w1", "w2", "x3", "w4"], [0.0] * 4)
    with pytest.raises(ValueError, match="maps-mirror-seed1: maps on 2wikimultihopqa answered other questions"):
        ts.summarize(runs, read_scores=_scores(q))
    # a run whose episodes no DVC cache or remote holds: no pooled interval, and the report says why
    del q[(REVS[1], "maps", "2wikimultihopqa")]
    s = ts.summarize(runs, read_scores=_scores(q))
    assert s["avg"]["f1"]["pooled"] is None and "maps-mirror-seed1 (bbbbbbb)" in s["pooled_note"]
    assert "dvc pull" in ts.report_markdown(s)


def test_cli_reads_records_at_each_commit_and_episodes_through_dvc(tmp_path, monkeypatch):
    """The records come from the runs' git commits, the episodes from DVC's cache at each commit (`dvc.api`), as
    experiments keep them: each seed's commit tracks its own results/eval."""
    def run(*args):
        return subprocess.run(args, cwd=tmp_path, check=True, capture_output=True, text=True).stdout.strip()

    def git(*args):
        return run("git", "-c", "user.name=t", "-c", "user.email=t@t", *args)

    git("init", "-q")
    run(sys.executable, "-m", "dvc", "init", "-q")
    run(sys.executable, "-m", "dvc", "config", "core.analytics", "false")
    revs = []
    for seed in (0, 1, 2):
        for path, record in _records(seed).items():
            (tmp_path / path).parent.mkdir(parents=True, exist_ok=True)
            (tmp_path / path).write_text(json.dumps(record))
        for system, bench in [(s, b) for s in ("maps", "maps_untrained") for b in ("hotpotqa", "2wikimultihopqa")]:
            right = system == "maps" and seed != 2          # seed 2's trained team no better than the base
            eps = [Episode(question_id=f"{bench}-{i}", question="q?", golden_answers=["x"],
                           final_answer="x" if right and i == 0 else "y",
                           metrics={"em": float(right and i == 0), "f1": float(right and i == 0), "acc": 0.0})
                   for i in range(2)]
            p = tmp_path / ts.EPISODES.format(system=system, benchmark=bench)
            p.parent.mkdir(parents=True, exist_ok=True)
            p.write_text("".join(e.model_dump_json() + "\n" for e in eps))
        run(sys.executable, "-m", "dvc", "add", "-q", "results/eval")
        git("add", "-A")
        git("commit", "-q", "-m", f"seed {seed}")
        revs.append(git("rev-parse", "HEAD"))
    (tmp_path / "exp.json").write_text(json.dumps(_exp_show(revs)))
    monkeypatch.chdir(tmp_path)
    ids, sc = _episode_scores(revs[0], "maps", "hotpotqa")
    assert ids == ["hotpotqa-0", "hotpotqa-1"] and sc["f1"] == [1.0, 0.0] and sc["no_answer"] == [0.0, 0.0]
    assert _episode_scores(revs[0], "maps", "musique") is None          # no such output at that commit
    result = CliRunner().invoke(study_app, ["team-summary", "--exp-json", "exp.json", "--resamples", "200"])
    assert result.exit_code == 0, result.output
    summary = json.loads((tmp_path / "metrics/team_study.json").read_text())
    assert [r["rev"] for r in summary["runs"]] == revs
    # per run the F1 gain over 2 questions is +50 (seeds 0, 1) and 0 (seed 2) on each benchmark: mean 33.33
    assert summary["avg"]["f1"]["pooled"]["diff"] == 33.33
    assert summary["2wikimultihopqa"]["f1"]["diff"]["mean"] == 12.0           # the records' own figures
    assert "| F1 | Avg |" in (tmp_path / "reports/team_study.md").read_text()
    # a clone without the episodes (no DVC cache, no remote): the per-seed and seed-level figures, no pooled interval,
    # and the report says why and what fetches them
    import shutil

    shutil.rmtree(tmp_path / ".dvc" / "cache")
    shutil.rmtree(tmp_path / ".dvc" / "tmp", ignore_errors=True)
    shutil.rmtree(tmp_path / "results")
    assert _episode_scores(revs[0], "maps", "hotpotqa") is None
    again = CliRunner().invoke(study_app, ["team-summary", "--exp-json", "exp.json", "--resamples", "200"])
    assert again.exit_code == 0, again.output
    summary = json.loads((tmp_path / "metrics/team_study.json").read_text())
    assert summary["avg"]["f1"]["pooled"] is None and summary["avg"]["f1"]["diff"]["mean"] == 7.0
    assert "neither in this checkout's DVC cache nor in its remote (`dvc pull` at that commit)" in again.output
    # a user's mistake: a pair the runs did not compare -> one line, no traceback
    bad = CliRunner().invoke(study_app, ["team-summary", "--exp-json", "exp.json", "--pair", "maps", "drag"])
    assert bad.exit_code == 1 and "Traceback" not in bad.output and "no 'maps vs drag'" in bad.output
