"""Issue 71, finding 5: scripts/setup.sh installed `pip==26.3` without a hash, and `pip install -e .` fetched its build
tools (setuptools, wheel: pyproject.toml's [build-system]) from the index unpinned, in an isolated build env. Now pip
and setuptools come from requirements-build.txt, checked against their sha256, and the editable installs build with
--no-build-isolation (nothing fetched). Run here with a recording stand-in for Python: nothing is installed."""
from __future__ import annotations

import re
import shlex
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PIN = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._\-]*)==([^\s;\\]+)")

# `python -m venv DIR` makes DIR/bin/python this recorder: it logs each call (and keeps a copy of each -r file,
# which install_pinned deletes after use) and succeeds; `-c` answers the version check
RECORDER = r'''#!/usr/bin/env bash
if [[ "$1" == -c ]]; then echo 3.11; exit 0; fi
if [[ "$1 $2" == "-m venv" ]]; then mkdir -p "$3/bin"; cp "$0" "$3/bin/python"; exit 0; fi
n=$(wc -l < "$LOG" 2>/dev/null || echo 0)
printf '%q ' "$@" >> "$LOG"; echo >> "$LOG"
prev=""
for a in "$@"; do [[ "$prev" == -r ]] && cp "$a" "$LOGDIR/req-$n.txt"; prev=$a; done
exit 0
'''


def pins(text: str) -> dict[str, tuple[str, list[str]]]:
    out, name = {}, None
    for line in text.splitlines():
        if m := PIN.match(line):
            name = m.group(1).lower()
            out[name] = (m.group(2), [])
        if name:        # a pin's hashes: on its own line or on the lines after it
            out[name][1].extend(re.findall(r"--hash=sha256:([0-9a-f]{64})", line))
    return out


def run_setup(tmp: Path, **env) -> list[tuple[list[str], str | None]]:
    """The pip calls scripts/setup.sh makes: (argv, the text of its -r file)."""
    repo = tmp / "repo"
    (repo / "scripts").mkdir(parents=True)
    for f in ("scripts/setup.sh", "scripts/install_pinned.sh", "pyproject.toml", "requirements.lock",
              "requirements-build.txt"):
        shutil.copy(ROOT / f, repo / f)
    fake = tmp / "python3.11"
    fake.write_text(RECORDER)
    fake.chmod(0o755)
    log = tmp / "calls.log"
    done = subprocess.run(["bash", "scripts/setup.sh"], cwd=repo, capture_output=True, text=True, timeout=120,
                          env={"PATH": "/usr/bin:/bin", "PYTHON": str(fake), "LOG": str(log), "LOGDIR": str(tmp),
                               "HOME": str(tmp), **env})
    assert done.returncode == 0, done.stderr
    calls = []
    for i, line in enumerate(log.read_text().splitlines()):
        req = tmp / f"req-{i}.txt"
        calls.append((shlex.split(line), req.read_text() if req.exists() else None))
    return [(argv, req) for argv, req in calls if argv[:3] == ["-m", "pip", "install"]]


@pytest.mark.parametrize("torch", ["cpu", "cuda"])
def test_setup_installs_pip_and_build_tools_only_from_hash_pinned_requirements(tmp_path, torch):
    installs = run_setup(tmp_path, RAGTEAM_TORCH=torch)
    first, req = installs[0]
    assert first == ["-m", "pip", "install", "-q", "--no-deps", "--require-hashes", "-r", "requirements-build.txt"]
    assert set(pins(req)) == {"pip", "setuptools"}
    bare = [a for argv, _ in installs for a in argv if re.match(r"(pip|setuptools|wheel)\s*[=<>~!]", a)]
    assert not bare                                  # no requirement of a build tool given on the command line
    editable = [argv for argv, _ in installs if "-e" in argv]
    assert editable and all("--no-build-isolation" in argv for argv in editable)
    if torch == "cpu":      # the locked path: every install hash-checked, the editable one excepted (no index)
        for argv, req in installs:
            if "-e" not in argv:
                assert "--require-hashes" in argv and req is not None, argv
                assert all(hashes for _, hashes in pins(req).values()), argv


def test_the_build_requirements_are_hashed_and_setuptools_is_the_locks():
    build = pins((ROOT / "requirements-build.txt").read_text())
    assert set(build) == {"pip", "setuptools"}
    assert all(hashes for _, hashes in build.values())
    lock = pins((ROOT / "requirements.lock").read_text())
    assert build["setuptools"] == lock["setuptools"]           # the editable install builds with the lock's own
    for script in ("setup.sh", "setup_worker.sh"):
        text = (ROOT / "scripts" / script).read_text()
        assert "--require-hashes -r requirements-build.txt" in text
        assert not re.search(r'pip install[^\n]*"pip==', text)
        editable = [line for line in text.splitlines() if re.search(r"pip install .*-e ", line)]
        assert editable and all("--no-build-isolation" in line for line in editable)
