"""Declared DVC metrics are the numbers runs are compared by: each stage writes its whole record to metrics/<name>.json
(a plain output: timings, counts, settings, the environment) and a selection of its numbers to
metrics/summary/<name>.json (`ragteam.io.write_metrics`), which is all `dvc metrics show` and `dvc exp show` list."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from ragteam.io import compared_numbers, summary_path, write_metrics

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from stages.common import COMPARED, compared_keys  # noqa: E402


def test_compared_numbers_keeps_the_matching_numbers_nested_as_in_the_record():
    record = {"reward_first": -1.0, "reward_last": 0.5, "steps": 4, "collapsed": False, "stopped_by": "threshold",
              "f1_ci": [1.0, 2.0], "environment": {"python": "3.11.7", "packages": {"torch": "2.13.0"}},
              "bm25s": {"hotpotqa": {"answer_recall@5": 0.6, "answer_recall@1": 0.4, "n": 100}},
              "stage1/reward_last": 0.2}
    keep = ("reward_*", "*.*.answer_recall@5", "stage*/reward_last", "collapsed", "stopped_by", "f1_ci", "environment.*")
    assert compared_numbers(record, keep) == {"reward_first": -1.0, "reward_last": 0.5, "stage1/reward_last": 0.2,
                                              "bm25s": {"hotpotqa": {"answer_recall@5": 0.6}}}
    assert compared_numbers(record, ()) == {}


def test_write_metrics_writes_the_record_and_its_summary_beside_it(tmp_path):
    path = tmp_path / "metrics" / "train_x.json"
    write_metrics(path, {"reward_last": 0.5, "seconds": 12.3, "environment": {"env": "main"}}, ("reward_*",))
    assert json.loads(path.read_text()) == {"reward_last": 0.5, "seconds": 12.3, "environment": {"env": "main"}}
    assert summary_path(path) == tmp_path / "metrics" / "summary" / "train_x.json"
    assert json.loads(summary_path(path).read_text()) == {"reward_last": 0.5}


def _stages():
    return yaml.safe_load((REPO / "dvc.yaml").read_text())["stages"]


def _files(entries):
    return [next(iter(e)) if isinstance(e, dict) else e for e in entries or []]


def test_dvc_yaml_declares_only_summaries_as_metrics_and_every_record_as_a_plain_output():
    for name, st in _stages().items():
        body = st.get("do", st)
        metrics, outs = _files(body.get("metrics")), _files(body.get("outs"))
        assert all(m.startswith("metrics/summary/") for m in metrics), (name, metrics)
        for m in metrics:      # the summary's record is a plain, uncached output of the same stage
            record = m.replace("metrics/summary/", "metrics/")
            assert record in outs, name
            entry = next(e for e in body["outs"] if isinstance(e, dict) and record in e)
            assert entry[record] == {"cache": False}


def test_every_training_stage_has_its_compared_keys():
    names = [n for n in _stages() if n.startswith(("train_", "warmup_"))]
    assert {"train_answer", "train_query", "train_judge", "train_joint"} <= set(names)
    for n in ("train_answer", "train_query", "train_judge", "train_joint_mask", "train_joint_qagent"):
        assert compared_keys(n) is COMPARED[n if n in COMPARED else "train_joint"]
    with pytest.raises(KeyError, match="no compared metrics for stage 'train_other'"):
        compared_keys("train_other")


def test_a_training_stage_without_compared_keys_fails_before_it_trains(tmp_path, monkeypatch):
    from stages.common import stage_main

    ran = []
    monkeypatch.chdir(tmp_path)
    with pytest.raises(KeyError, match="no compared metrics for stage 'train_new'"):
        stage_main("train_new", "x", lambda params: ran.append(params) or {})
    assert ran == [] and not (tmp_path / "metrics").exists()


def _declared(root: Path) -> dict[str, Path]:
    out = {}
    for name, st in _stages().items():
        body = st.get("do", st)
        items = (yaml.safe_load((REPO / "params.yaml").read_text())
                 if "foreach" in st else None)
        for m in _files(body.get("metrics")):
            if "${item}" in m:
                key = st["foreach"].strip("${} ").split(".")
                values = items
                for k in key:
                    values = values[k]
                for v in values:
                    out[m.replace("${item}", v)] = root / m.replace("${item}", v)
            else:
                out[m] = root / m
    return out


def test_the_committed_summaries_are_numbers_selected_from_their_records():
    """Each summary in the lock's outputs equals `compared_numbers` of its record with the stage's patterns, and
    holds at least one number: a renamed key would empty it."""
    from ragteam.eval.evaluate import COMPARED as EVAL_COMPARED
    from stages import eval_retrieval, evaluate_agents, label_judge, warmup_joint

    patterns = {"metrics/summary/retrieval.json": eval_retrieval.COMPARED,
                "metrics/summary/label_judge.json": label_judge.COMPARED,
                "metrics/summary/eval_agents.json": evaluate_agents.COMPARED}
    declared = _declared(REPO)
    assert len(declared) == 15
    for rel, path in declared.items():
        summary = json.loads(path.read_text())
        record_path = REPO / rel.replace("metrics/summary/", "metrics/")
        if rel == "metrics/summary/eval.json":
            record = {"systems": json.loads(record_path.read_text()),
                      "differences": json.loads((REPO / "metrics/eval_compare.json").read_text())}
            keep = EVAL_COMPARED
        else:
            record = json.loads(record_path.read_text())
            stem = Path(rel).stem
            keep = patterns.get(rel) or (warmup_joint.COMPARED if stem.startswith("warmup_joint_")
                                         else compared_keys(stem))
        assert summary and summary == compared_numbers(record, keep), rel


def test_dvc_metrics_show_lists_under_10000_characters_of_numbers_only():
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}", "DVC_NO_ANALYTICS": "1"}
    r = subprocess.run(["dvc", "metrics", "show", "--json"], cwd=REPO, capture_output=True, text=True, env=env)
    assert r.returncode == 0, r.stderr
    assert len(r.stdout) < 10_000, len(r.stdout)
    data = json.loads(r.stdout)
    files = {p: v["data"] for ws in data.values() for p, v in ws["data"].items()}
    assert set(files) == set(_declared(REPO))

    def leaves(x):
        return [w for v in x.values() for w in leaves(v)] if isinstance(x, dict) else [x]

    assert all(isinstance(v, (int, float)) and not isinstance(v, bool) for f in files.values() for v in leaves(f))
