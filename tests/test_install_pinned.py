"""scripts/install_pinned.sh: uv installs the pinned files of both environments (with pip's find-links, so the CPU
torch wheel of this machine's pip configuration is found), and pip installs the same pins when uv cannot."""
from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def fake_venv(tmp: Path, uv_rc: int) -> Path:
    """A venv whose python and uv log their arguments: python answers `pip config list` as this machine's pip does
    and installs uv (the pinned wheel) into bin/; uv exits with `uv_rc`."""
    venv = tmp / "venv"
    (venv / "bin").mkdir(parents=True)
    log = tmp / "calls.log"
    uv = f'#!/usr/bin/env bash\necho "uv $*" >> {log}\nexit {uv_rc}\n'
    (venv / "bin/python").write_text(f"""#!/usr/bin/env bash
echo "python $*" >> {log}
if [[ "$*" == "-m pip config list" ]]; then
  echo "global.find-links='/opt/wheels /srv/more wheels'"; echo ":env:.find-links='/opt/wheels'"; exit 0
fi
if [[ "$*" == *"--require-hashes -r /"* ]]; then   # the uv pin, from its temporary requirements file
  cat "${{@: -1}}" >> {log}
  printf '%s' '{uv}' > {venv}/bin/uv; chmod +x {venv}/bin/uv
fi
exit 0
""")
    (venv / "bin/python").chmod(0o755)
    return venv


def install(tmp: Path, uv_rc: int, **env) -> tuple[subprocess.CompletedProcess, list[str]]:
    venv = fake_venv(tmp, uv_rc)
    done = subprocess.run(["bash", "-c", f"source {ROOT}/scripts/install_pinned.sh && "
                           f"install_pinned {venv} --require-hashes -r requirements.lock"],
                          capture_output=True, text=True, timeout=60, env={"PATH": "/usr/bin:/bin", **env})
    return done, (tmp / "calls.log").read_text().splitlines()


def test_uv_installs_the_pins_with_the_hashes_and_pips_find_links(tmp_path):
    done, calls = install(tmp_path, uv_rc=0, PIP_EXTRA_INDEX_URL="https://download.pytorch.org/whl/cpu")
    assert done.returncode == 0, done.stderr
    assert any(c.startswith("uv==0.13.9 --hash=sha256:") for c in calls)        # uv itself is pinned and hashed
    # .pyc at install as pip writes them: with PYTHONDONTWRITEBYTECODE set nothing else would
    [uv] = [c for c in calls if c.startswith("uv ")]
    assert uv == (f"uv pip install -q --compile-bytecode --python {tmp_path}/venv/bin/python --no-deps --find-links /opt/wheels "
                  "--find-links /srv/more --find-links wheels "
                  "--extra-index-url https://download.pytorch.org/whl/cpu --require-hashes -r requirements.lock")
    assert not [c for c in calls if c.startswith("python -m pip install -q --no-deps --require-hashes -r requirements")]


@pytest.mark.parametrize("installer", ["uv", "pip"])
def test_pip_installs_the_same_pins_when_uv_fails_or_is_not_wanted(tmp_path, installer):
    done, calls = install(tmp_path, uv_rc=1 if installer == "uv" else 0, RAGTEAM_INSTALLER=installer)
    assert done.returncode == 0, done.stderr
    assert calls[-1] == "python -m pip install -q --no-deps --require-hashes -r requirements.lock"
    assert ("uv could not install --require-hashes -r requirements.lock" in done.stderr) == (installer == "uv")
    assert any(c.startswith("uv ") for c in calls) == (installer == "uv")
