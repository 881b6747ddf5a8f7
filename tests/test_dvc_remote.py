"""The default DVC remote lives beside the checkout, not inside it, and round-trips outputs between clones: a fresh
clone pulls what another pushed and finds every stage up to date (nothing recomputed)."""
from __future__ import annotations

import configparser
import os
import subprocess
import sys
from pathlib import Path

import pytest

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


@pytest.mark.slow                 # runs dvc repro in a subprocess
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


@pytest.mark.slow                 # runs dvc repro in a subprocess
def test_a_stage_record_waits_for_dvcs_repo_lock_instead_of_reading_a_lock_file_being_rewritten(tmp_path):
    """DVC rewrites dvc.lock in place while it holds its repo lock, so beside another stage's `dvc repro` an unlocked
    read can find the file empty and the stage that just ran with "no entry" (a smoke run failed so). The flow reads a
    stage's record under the lock (`flows.remote.locked_stage_record`): here another process holds the lock with
    dvc.lock emptied, and the record waits for it to be whole again."""
    import threading
    import time

    from flows.remote import locked_stage_record
    from ragteam import lineage as lin

    run(["git", "init", "-q", "-b", "main"], tmp_path)
    dvc(tmp_path, "init", "-q")
    (tmp_path / "dvc.yaml").write_text(DVC_YAML)
    dvc(tmp_path, "repro", "make")
    stages = lin.load_stages(tmp_path)
    whole = lin.stage_record(tmp_path, "make", stages)
    holder = subprocess.Popen(
        [sys.executable, "-c",
         "import pathlib, sys, time\n"
         "from flows.remote import dvc_repo_lock\n"
         "root = pathlib.Path(sys.argv[1]); lock = root / 'dvc.lock'; text = lock.read_text()\n"
         "with dvc_repo_lock(root):\n"
         "    lock.write_text('')                       # as DVC's write has just truncated it\n"
         "    (root / 'held').touch()\n"
         "    time.sleep(3)\n"
         "    lock.write_text(text)\n", str(tmp_path)],
        cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT), "DVC_NO_ANALYTICS": "1"}, text=True,
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 120
        while not (tmp_path / "held").exists():
            assert holder.poll() is None and time.monotonic() < deadline, holder.stdout.read()
            time.sleep(0.05)
        with pytest.raises(lin.LineageError, match="no entry for stage 'make'"):
            lin.stage_record(tmp_path, "make", stages)          # what the flow read before: the emptied file
        got: dict = {}
        reader = threading.Thread(target=lambda: got.update(record=locked_stage_record(tmp_path, "make", stages)))
        reader.start()
        time.sleep(1)
        assert reader.is_alive() and not got, "the record was read while another process held the repo lock"
        reader.join(120)
        assert got["record"]["outs"] == whole["outs"] and got["record"]["stage"] == "make"
    finally:
        holder.wait(60)
    assert holder.returncode == 0, holder.stdout.read()
