"""The committed run's models registered together (`ragteam registry register-run`), so that `dvc artifacts get
<repo> <artifact>`, with no `--rev`, fetches the latest registered version through the project's kind of DVC remote
(a local directory beside the checkout), and `ragteam registry list` shows them."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from ragteam.registry import RegistryError, locked_outs, register_run, run_version
from test_dvc_remote import ROOT, dvc, run

DVC_BIN = Path(sys.executable).parent / "dvc"          # the real dvc CLI of the project's .venv

TRAIN_PY = """\
import pathlib, sys, yaml
agent = sys.argv[1]
w = yaml.safe_load(open("params.yaml"))["w"]
p = pathlib.Path("models/agents") / agent
p.mkdir(parents=True, exist_ok=True)
(p / "weights.bin").write_bytes(bytes([w, len(agent)]) * 64 + agent.encode())
(p / "config.json").write_text('{"agent": "%s", "w": %d}' % (agent, w))
"""
DVC_YAML = """\
stages:
  prepare:
    cmd: python -c "import pathlib; pathlib.Path('data').mkdir(exist_ok=True); pathlib.Path('data/qa.jsonl').write_text('{}')"
    outs: [data]
  train_answer:
    cmd: python train.py answer
    deps: [train.py, data]
    params: [w]
    outs: [models/agents/answer]
  train_judge:
    cmd: python train.py judge
    deps: [train.py, models/agents/answer]
    outs: [models/agents/judge]
artifacts:
  answer-agent: {path: models/agents/answer, type: model}
  judge-agent: {path: models/agents/judge, type: model}
  mask-agent: {path: models/agents/mask, type: model}
  qa-data: {path: data, type: dataset}
"""


def ragteam(cwd: Path, *args: str, ok: bool = True) -> subprocess.CompletedProcess:
    done = subprocess.run([sys.executable, "-m", "ragteam.cli", *args], cwd=cwd, capture_output=True, text=True,
                          timeout=300)
    if ok:
        assert done.returncode == 0, done.stderr
    else:
        lines = done.stderr.strip().splitlines()
        assert done.returncode == 1 and len(lines) == 1 and lines[0].startswith("ERROR "), done.stderr
    return done


def tags(repo: Path) -> list[str]:
    return run(["git", "tag", "--list"], repo).split()


def commit(repo: Path, message: str) -> str:
    run(["git", "add", "-A"], repo)
    run(["git", "commit", "-q", "-m", message], repo)
    return run(["git", "rev-parse", "HEAD"], repo).strip()


def artifacts_get(cwd: Path, repo: Path | str, artifact: str, *args: str) -> Path:
    """`dvc artifacts get` as a user runs it, from a directory outside the project; returns the fetched copy."""
    cwd.mkdir()
    done = subprocess.run([str(DVC_BIN), "artifacts", "get", str(repo), artifact, *args], cwd=cwd,
                          capture_output=True, text=True, timeout=300, env={**os.environ, "DVC_NO_ANALYTICS": "1"})
    assert done.returncode == 0, done.stderr
    [got] = cwd.iterdir()
    return got


def same_bytes(a: Path, b: Path) -> bool:
    files = sorted(p.relative_to(a) for p in a.rglob("*") if p.is_file())
    return files == sorted(p.relative_to(b) for p in b.rglob("*") if p.is_file()) and \
        all((a / f).read_bytes() == (b / f).read_bytes() for f in files)


@pytest.mark.slow
def test_register_run_tags_the_committed_runs_models_and_dvc_artifacts_get_fetches_the_latest(tmp_path):
    repo = tmp_path / "project"
    repo.mkdir()
    for args in (["init", "-q", "-b", "main"], ["config", "user.email", "t@example.com"], ["config", "user.name", "t"]):
        run(["git", *args], repo)
    dvc(repo, "init", "-q")
    (repo / ".dvc" / "config").write_text((ROOT / ".dvc" / "config").read_text())   # the project's remote setting
    remote = tmp_path / "ragteam-dvc-remote"                                        # beside the checkout
    (repo / "dvc.yaml").write_text(DVC_YAML)
    (repo / "train.py").write_text(TRAIN_PY)
    (repo / "params.yaml").write_text("w: 1\n")
    dvc(repo, "repro", "-q")
    first = commit(repo, "run w=1")

    listed = ragteam(tmp_path, "registry", "list", "--repo", str(repo)).stdout      # nothing registered: says so
    assert listed.splitlines() == [f"no registered versions in {repo}: register the committed run's models with "
                                   "`ragteam registry register-run` (one artifact: `ragteam registry register "
                                   "<artifact>`)"]

    # not pushed: `dvc artifacts get` could not fetch it from elsewhere, so nothing is tagged
    err = ragteam(tmp_path, "registry", "register-run", "--repo", str(repo), ok=False).stderr
    assert "answer-agent: models/agents/answer is not (all) in the DVC remote 'local': run `dvc push`" in err
    assert "judge-agent: models/agents/judge is not (all) in the DVC remote" in err and tags(repo) == []
    dvc(repo, "push", "-q")
    assert remote.is_dir()

    (repo / "params.yaml").write_text("w: 2\n")                                    # a dirty tree
    with pytest.raises(RegistryError, match=r"project: uncommitted changes \(params.yaml\): commit them first"):
        register_run(repo)
    assert tags(repo) == []
    (repo / "params.yaml").write_text("w: 1\n")

    dry = register_run(repo, dry_run=True)
    assert [(v.tag, v.commit) for v in dry.registered] == [("answer-agent@v0.1.0", first),
                                                           ("judge-agent@v0.1.0", first)] and tags(repo) == []

    out = ragteam(tmp_path, "registry", "register-run", "--repo", str(repo)).stdout.splitlines()
    assert out[:3] == [f"registered answer-agent@v0.1.0 -> {first[:12]}",
                       f"registered judge-agent@v0.1.0 -> {first[:12]}",
                       "skipped mask-agent: models/agents/mask is not an output in dvc.lock"]  # qa-data: no model
    assert tags(repo) == ["answer-agent@v0.1.0", "judge-agent@v0.1.0"]
    assert run(["git", "cat-file", "-t", "judge-agent@v0.1.0"], repo).strip() == "tag"            # annotated, GTO's
    assert ragteam(tmp_path, "registry", "list", "--repo", str(repo)).stdout.splitlines() == [
        f"answer-agent\tv0.1.0\t{first[:12]}", f"judge-agent\tv0.1.0\t{first[:12]}"]

    # another directory, the dvc CLI, no --rev: the latest registered version, byte for byte what the run wrote
    got = artifacts_get(tmp_path / "get1", repo, "judge-agent")
    assert same_bytes(got, repo / "models/agents/judge") and (got / "config.json").read_text() == \
        '{"agent": "judge", "w": 1}'

    again = register_run(repo)
    assert again.registered == [] and ("answer-agent", "already registered at this commit as v0.1.0") in again.skipped
    assert len(tags(repo)) == 2

    # a committed change the lock has not caught up with: dvc status names the stale stage, for both models
    (repo / "params.yaml").write_text("w: 2\n")
    commit(repo, "w=2, not rerun")
    with pytest.raises(RegistryError) as stale:
        register_run(repo)
    assert str(stale.value).startswith("nothing registered: answer-agent: `dvc status` finds the lock stale for it "
                                       "(train_answer: changed deps: params.yaml:w modified): run `dvc repro "
                                       "train_answer`")
    assert "; judge-agent: `dvc status` finds the lock stale for it (train_answer: changed deps" in str(stale.value)
    assert len(tags(repo)) == 2

    dvc(repo, "repro", "-q")
    dvc(repo, "push", "-q")
    second = commit(repo, "run w=2")
    register_run(repo)                                          # the next run: the next minor version
    assert tags(repo) == ["answer-agent@v0.1.0", "answer-agent@v0.2.0", "judge-agent@v0.1.0", "judge-agent@v0.2.0"]
    assert ragteam(tmp_path, "registry", "list", "judge-agent", "--repo", str(repo)).stdout.splitlines() == [
        f"judge-agent\tv0.1.0\t{first[:12]}", f"judge-agent\tv0.2.0\t{second[:12]}"]
    latest = artifacts_get(tmp_path / "get2", repo, "judge-agent")
    assert same_bytes(latest, repo / "models/agents/judge") and b"\x02" in (latest / "weights.bin").read_bytes()
    old = artifacts_get(tmp_path / "get3", repo, "judge-agent", "--rev", "v0.1.0")
    assert same_bytes(old, got)
    # through a git URL DVC clones to a temp dir, where the relative remote url no longer reaches: name the remote
    cloned = artifacts_get(tmp_path / "get4", f"file://{repo}", "answer-agent", "--remote-config", f"url={remote}")
    assert same_bytes(cloned, repo / "models/agents/answer")


def test_a_run_version_is_the_next_minor_above_every_version_of_the_runs_models():
    assert run_version([]) == "v0.1.0"
    assert run_version(["v0.1.0", "v0.1.3", "v0.0.9"]) == "v0.2.0"      # patches are single re-registrations
    assert run_version(["v0.10.0", "v0.9.0"]) == "v0.11.0"               # by number, not by string
    assert run_version(["v1.4.2"]) == "v1.5.0"


def test_register_run_refuses_a_malformed_version_and_a_project_without_models(tmp_path):
    repo = tmp_path / "p"
    repo.mkdir()
    for args in (["init", "-q", "-b", "main"], ["config", "user.email", "t@example.com"], ["config", "user.name", "t"]):
        run(["git", *args], repo)
    (repo / "dvc.yaml").write_text(DVC_YAML)
    commit(repo, "declared")
    with pytest.raises(RegistryError, match=r"version '1.0': expected v<major>.<minor>.<patch>"):
        register_run(repo, "1.0", dry_run=True)
    (repo / "dvc.yaml").write_text("stages: {}\nartifacts:\n  qa-data: {path: data, type: dataset}\n")
    commit(repo, "no models")
    with pytest.raises(RegistryError, match="dvc.yaml declares no artifact of type model"):
        register_run(repo, dry_run=True)


def test_every_model_of_the_projects_dvc_yaml_is_an_output_of_its_committed_lock():
    """So `register-run` on the default run's commit registers every model artifact, none skipped."""
    arts = yaml.safe_load((ROOT / "dvc.yaml").read_text())["artifacts"]
    outs = locked_outs(ROOT)
    models = {name: a["path"].rstrip("/") for name, a in arts.items() if a.get("type") == "model"}
    assert {"backbone-llm", "answer-agent", "query-agent", "judge-agent", "mask-agent", "jade-agent", "decor-agent",
            "qagent-agent"} <= set(models)
    assert {name: path for name, path in models.items() if path not in outs} == {}
