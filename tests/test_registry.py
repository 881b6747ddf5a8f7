"""Trained agents get versions as DVC's model registry keeps them (GTO tags), and `dvc artifacts get` fetches a named
version from another directory through the remote."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from ragteam.registry import RegistryError, register, versions

DVC_YAML = """\
stages:
  train_answer:
    cmd: python -c "import pathlib, yaml; p = pathlib.Path('models/agents/answer'); p.mkdir(parents=True, exist_ok=True); (p / 'weights.txt').write_text(str(yaml.safe_load(open('params.yaml'))['w']))"
    params: [w]
    outs: [models/agents/answer]
artifacts:
  answer-agent:
    path: models/agents/answer
    type: model
  judge-agent:
    path: models/agents/judge
    type: model
"""


def run(args, cwd: Path) -> str:
    done = subprocess.run(args, cwd=cwd, capture_output=True, text=True, timeout=300,
                          env={**os.environ, "DVC_NO_ANALYTICS": "1"})
    assert done.returncode == 0, f"{args}: {done.stdout}\n{done.stderr}"
    return done.stdout


def dvc(cwd: Path, *args: str) -> str:
    return run([sys.executable, "-m", "dvc", *args], cwd)


def train(repo: Path, w: int) -> None:
    (repo / "params.yaml").write_text(f"w: {w}\n")
    dvc(repo, "repro", "-q")
    dvc(repo, "push", "-q")
    run(["git", "add", "-A"], repo)
    run(["git", "commit", "-q", "-m", f"train w={w}"], repo)


@pytest.fixture()
def repo(tmp_path) -> Path:
    r = tmp_path / "project"
    r.mkdir()
    for args in (["init", "-q", "-b", "main"], ["config", "user.email", "t@example.com"], ["config", "user.name", "t"]):
        run(["git", *args], r)
    dvc(r, "init", "-q")
    (r / ".dvc/config").write_text("[core]\n    remote = local\n['remote \"local\"']\n    url = ../../remote\n")
    (r / "dvc.yaml").write_text(DVC_YAML)
    return r


def test_registered_versions_are_gto_tags_that_dvc_artifacts_get_fetches(repo, tmp_path):
    train(repo, 1)
    out = run([sys.executable, "-m", "ragteam.cli", "registry", "register", "answer-agent", "--repo", str(repo)],
              tmp_path)
    assert "registered answer-agent@v0.0.1" in out
    first = run(["git", "rev-parse", "HEAD"], repo).strip()
    train(repo, 2)
    second = register(repo, "answer-agent")                     # the next patch version
    assert (second.version, second.tag) == ("v0.0.2", "answer-agent@v0.0.2")
    assert run(["git", "tag", "--list"], repo).split() == ["answer-agent@v0.0.1", "answer-agent@v0.0.2"]
    assert run(["git", "cat-file", "-t", "answer-agent@v0.0.1"], repo).strip() == "tag"      # annotated
    assert [(v.version, v.commit) for v in versions(repo, "answer-agent")] == [("v0.0.1", first),
                                                                                ("v0.0.2", second.commit)]
    listed = run([sys.executable, "-m", "ragteam.cli", "registry", "list", "--repo", str(repo)], tmp_path)
    assert listed.splitlines() == [f"answer-agent\tv0.0.1\t{first[:12]}", f"answer-agent\tv0.0.2\t{second.commit[:12]}"]

    for version, w in (("v0.0.1", "1"), ("v0.0.2", "2")):       # another directory fetches each version
        dest = tmp_path / f"got-{version}"
        dvc(tmp_path, "artifacts", "get", str(repo), "answer-agent", "--rev", version, "-o", str(dest))
        assert (dest / "weights.txt").read_text() == w


def test_register_refuses_what_is_not_a_produced_artifact_or_not_a_version(repo, tmp_path):
    train(repo, 1)
    with pytest.raises(RegistryError, match=r"'nosuch' is not in dvc.yaml's artifacts .*answer-agent, judge-agent"):
        register(repo, "nosuch")
    with pytest.raises(RegistryError, match="models/agents/judge is not an output in dvc.lock"):
        register(repo, "judge-agent")
    with pytest.raises(RegistryError, match="expected v<major>.<minor>.<patch>"):
        register(repo, "answer-agent", version="1.0")
    register(repo, "answer-agent", version="v1.0.0")
    with pytest.raises(RegistryError, match="already registered"):
        register(repo, "answer-agent", version="v1.0.1")          # one version per commit
    done = subprocess.run([sys.executable, "-m", "ragteam.cli", "registry", "register", "nosuch", "--repo",
                           str(repo)], capture_output=True, text=True, cwd=tmp_path)
    assert done.returncode == 1 and done.stderr.startswith("ERROR artifact 'nosuch'") and "Traceback" not in done.stderr
