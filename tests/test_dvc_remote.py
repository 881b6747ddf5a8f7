"""The default DVC remote lives beside the checkout, not inside it, and round-trips outputs between clones: a fresh
clone pulls what another pushed and finds every stage up to date (nothing recomputed)."""
from __future__ import annotations

import configparser
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

DVC_YAML = """\
stages:
  make:
    cmd: python -c "import pathlib; pathlib.Path('out').mkdir(exist_ok=True); pathlib.Path('out/a.txt').write_text('a'); open('runs.log', 'a').write('make\\\\n')"
    outs: [out/a.txt]
  evaluate:
    cmd: python -c "import pathlib; pathlib.Path('out/b.txt').write_text(pathlib.Path('out/a.txt').read_text() * 2); open('runs.log', 'a').write('evaluate\\\\n')"
    deps: [out/a.txt]
    outs: [out/b.txt]
"""


def run(args, cwd: Path) -> str:
    done = subprocess.run(args, cwd=cwd, capture_output=True, text=True, timeout=300,
                          env={**os.environ, "DVC_NO_ANALYTICS": "1"})
    assert done.returncode == 0, f"{args}: {done.stdout}\n{done.stderr}"
    return done.stdout


def dvc(cwd: Path, *args: str) -> str:
    return run([sys.executable, "-m", "dvc", *args], cwd)


def project_remote_url() -> str:
    cfg = configparser.ConfigParser()
    cfg.read(ROOT / ".dvc" / "config")
    default = cfg["core"]["remote"]
    return cfg[f"'remote \"{default}\"'"]["url"]


def test_the_default_remote_resolves_outside_the_checkout():
    url = project_remote_url()
    resolved = (ROOT / ".dvc" / url).resolve()                 # DVC resolves a relative url from .dvc/
    assert not resolved.is_relative_to(ROOT), f"{url} -> {resolved} is inside the checkout"
    assert resolved.parent == ROOT.parent                       # beside it, where ../shared also lives


def test_push_from_one_clone_and_pull_into_a_fresh_one_recomputes_nothing(tmp_path):
    a = tmp_path / "a"
    a.mkdir()
    run(["git", "init", "-q", "-b", "main"], a)
    run(["git", "config", "user.email", "t@example.com"], a)
    run(["git", "config", "user.name", "t"], a)
    dvc(a, "init", "-q")
    (a / ".dvc" / "config").write_text((ROOT / ".dvc" / "config").read_text())   # the project's remote setting
    (a / "dvc.yaml").write_text(DVC_YAML)
    (a / ".gitignore").write_text("/runs.log\n")
    dvc(a, "repro")
    dvc(a, "push")
    run(["git", "add", "-A"], a)
    run(["git", "commit", "-q", "-m", "run"], a)
    assert (tmp_path / "ragteam-dvc-remote").is_dir()          # beside the checkouts, shared by both

    b = tmp_path / "b"
    run(["git", "clone", "-q", str(a), str(b)], tmp_path)
    dvc(b, "pull")
    assert (b / "out/b.txt").read_text() == "aa"
    assert "up to date" in dvc(b, "status").lower()
    dvc(b, "repro", "evaluate")
    assert not (b / "runs.log").exists()                       # nothing ran in the fresh clone
