"""scripts/setup.sh checks the Python version against pyproject.toml's requires-python before it installs anything,
and says what to do."""
from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def fake_python(tmp: Path, version: str) -> Path:
    """An 'interpreter' that reports VERSION for the check and fails at anything else (nothing gets installed)."""
    exe = tmp / f"python{version}"
    exe.write_text(f'#!/usr/bin/env bash\nif [[ "$1" == -c ]]; then echo {version}; exit 0; fi\nexit 97\n')
    exe.chmod(0o755)
    return exe


def run_setup(tmp: Path, version: str) -> subprocess.CompletedProcess:
    repo = tmp / "repo"
    (repo / "scripts").mkdir(parents=True)
    for script in ("setup.sh", "install_pinned.sh"):
        shutil.copy(ROOT / "scripts" / script, repo / "scripts" / script)
    shutil.copy(ROOT / "pyproject.toml", repo / "pyproject.toml")
    return subprocess.run(["bash", "scripts/setup.sh"], cwd=repo, capture_output=True, text=True, timeout=60,
                          env={"PATH": "/usr/bin:/bin", "PYTHON": str(fake_python(tmp, version))})


@pytest.mark.parametrize("version", ["3.10", "3.13", "2.7"])
def test_an_unsupported_python_stops_setup_with_the_fix(tmp_path, version):
    done = run_setup(tmp_path, version)
    assert done.returncode == 2
    assert f"Python {version} from" in done.stderr and "needs >=3.11,<3.13" in done.stderr
    assert "PYTHON=python3.11" in done.stderr
    assert not (tmp_path / "repo/.venv").exists()                       # nothing was created


@pytest.mark.parametrize("version", ["3.11", "3.12"])
def test_a_supported_python_passes_the_check(tmp_path, version):
    done = run_setup(tmp_path, version)
    assert "not supported" not in done.stderr
    assert done.returncode == 97                     # it went on to `python -m venv`, which the fake refuses


def test_the_check_reads_the_range_from_pyproject():
    text = (ROOT / "pyproject.toml").read_text()
    assert 'requires-python = ">=3.11,<3.13"' in text                    # the one line setup.sh parses
