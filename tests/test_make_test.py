"""`make test` runs the main suite and the worker suite side by side: both run, the worker suite's output is printed
after the main one's, and either failing fails the target (not only the last one to finish)."""
from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def fake_python(path: Path, name: str, rc: int, sleep: float) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(f'#!/usr/bin/env bash\nsleep {sleep}\necho "{name} suite ran: $*"\nexit {rc}\n')
    path.chmod(0o755)


@pytest.mark.parametrize("main_rc,worker_rc", [(0, 0), (0, 1), (1, 0), (1, 1)])
def test_both_suites_run_and_either_failing_fails_make_test(tmp_path, main_rc, worker_rc):
    # the worker suite ends last when it fails and first when it passes: the exit status is not the last one's
    fake_python(tmp_path / ".venv/bin/python", "main", main_rc, sleep=0.5)
    fake_python(tmp_path / ".venv-worker/bin/python", "worker", worker_rc, sleep=1.0 if worker_rc else 0.0)
    done = subprocess.run(["make", "-s", "-f", str(ROOT / "Makefile"), "test", "BOTH_ENVS=", "OPENRLHF_ENV="], cwd=tmp_path,
                          capture_output=True, text=True, timeout=60)
    out = done.stdout
    assert "main suite ran: -m pytest -q --durations=30" in out
    assert "worker suite ran: -m pytest -q --durations=15 --timeout=900 tests/worker" in out
    assert out.index("main suite ran") < out.index(f"tests/worker (.venv-worker), exit {worker_rc}") < \
        out.index("worker suite ran")
    assert (done.returncode == 0) == (main_rc == 0 and worker_rc == 0)
    assert ("the main suite failed" in done.stderr) == bool(main_rc)
    assert ("the worker suite failed" in done.stderr) == bool(worker_rc)
