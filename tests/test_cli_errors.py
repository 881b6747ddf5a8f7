"""Every CLI error a user can cause prints one `ERROR ...` line naming the problem, exits 1, and shows no traceback."""
from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from ragteam.cli import error_line

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("args, names", [
    (["profile", "flags", "nosuch"], "profile 'nosuch' not found"),
    (["profile", "apply", "nosuch", "--params", "{params}"], "profile 'nosuch' not found"),
    (["profile", "flags", "paper", "--params", "{tmp}/missing.yaml"], "missing.yaml: params file not found"),
    (["replicate", "summarize", "--metrics", "{tmp}/none.json", "--out-md", "{tmp}/r.md", "--out-json",
      "{tmp}/r.json"], "none.json: file not found"),
    (["lineage", "{tmp}/nothing.txt"], "no dvc.yaml in"),
    (["ask", "--params", "{tmp}/missing.yaml", "who?"], "missing.yaml: params file not found"),
    (["oracle-traces", "nosuch", "--params", "{params}"], "no oracle for system 'nosuch' (known: decor, jade, mask, qagent)"),
    (["oracle-traces", "mask", "--params", "{tmp}/missing.yaml"], "missing.yaml: params file not found"),
])
def test_a_user_error_is_one_line_and_exit_1(tmp_path, args, names):
    params = tmp_path / "params.yaml"
    shutil.copy(ROOT / "params.yaml", params)
    before = params.read_text()
    argv = [a.format(tmp=tmp_path, params=params) for a in args]
    done = subprocess.run([sys.executable, "-m", "ragteam.cli", *argv], cwd=ROOT, capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 1, (done.stdout, done.stderr)
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("ERROR "), done.stderr
    assert names in lines[0]
    assert "Traceback" not in done.stderr and "╭" not in done.stderr
    assert params.read_text() == before                      # a failed command changed nothing


def test_error_line_folds_whitespace_and_names_a_missing_file():
    assert error_line(ValueError("a\n  b\tc")) == "a b c"
    assert error_line(FileNotFoundError(2, "No such file or directory", "x/y.json")) == "x/y.json: file not found"
    assert error_line(ValueError()) == "ValueError"
