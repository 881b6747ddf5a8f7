"""scripts/install_pinned.sh: uv installs the pinned files of both environments (with pip's find-links, so the CPU
torch wheel of this machine's pip configuration is found), pip installs the same pins when uv cannot, and the CPU
torch's source is chosen by the script: a find-links directory that holds the pinned wheel, else PyTorch's CPU index."""
from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def fake_venv(tmp: Path, uv_rc: int, links: str = "/opt/wheels /srv/more wheels") -> Path:
    """A venv whose python and uv log their arguments: python answers `pip config list` as this machine's pip does
    and installs uv (the pinned wheel) into bin/; uv exits with `uv_rc`."""
    venv = tmp / "venv"
    (venv / "bin").mkdir(parents=True)
    log = tmp / "calls.log"
    uv = f'#!/usr/bin/env bash\necho "uv $*" >> {log}\nexit {uv_rc}\n'
    (venv / "bin/python").write_text(f"""#!/usr/bin/env bash
echo "python $*" >> {log}
if [[ "$*" == "-m pip config list" ]]; then
  echo "global.find-links='{links}'"; echo ":env:.find-links='{links.split()[0]}'"; exit 0
fi
if [[ "$*" == *"--require-hashes -r /"* ]]; then   # the uv pin, from its temporary requirements file
  cat "${{@: -1}}" >> {log}
  printf '%s' '{uv}' > {venv}/bin/uv; chmod +x {venv}/bin/uv
fi
exit 0
""")
    (venv / "bin/python").chmod(0o755)
    return venv


def install(tmp: Path, uv_rc: int, pins: str = "requirements.lock", links: str | None = None,
            **env) -> tuple[subprocess.CompletedProcess, list[str]]:
    if links is None:   # find-links directories that exist and hold no torch wheel (the test's own, not the machine's)
        links = " ".join(str(tmp / d) for d in ("opt-wheels", "srv-more", "wheels"))
        for d in links.split():
            Path(d).mkdir(parents=True, exist_ok=True)
    venv = fake_venv(tmp, uv_rc, links)
    done = subprocess.run(["bash", "-c", f"source {ROOT}/scripts/install_pinned.sh && "
                           f"install_pinned {venv} --require-hashes -r {pins}"],
                          capture_output=True, text=True, timeout=60, env={"PATH": "/usr/bin:/bin", **env})
    return done, (tmp / "calls.log").read_text().splitlines()


def test_uv_installs_the_pins_with_the_hashes_and_pips_find_links(tmp_path):
    (tmp_path / "srv-more").mkdir()
    (tmp_path / "srv-more/torch-2.13.0+cpu-cp311-cp311-manylinux_2_28_x86_64.whl").write_bytes(b"")
    done, calls = install(tmp_path, uv_rc=0, PIP_EXTRA_INDEX_URL="https://mirror.example/simple")
    assert done.returncode == 0, done.stderr
    assert any(c.startswith("uv==0.13.9 --hash=sha256:") for c in calls)        # uv itself is pinned and hashed
    # .pyc at install as pip writes them: with PYTHONDONTWRITEBYTECODE set nothing else would
    [uv] = [c for c in calls if c.startswith("uv ")]
    assert uv == (f"uv pip install -q --compile-bytecode --python {tmp_path}/venv/bin/python --no-deps "
                  f"--find-links {tmp_path}/opt-wheels --find-links {tmp_path}/srv-more --find-links {tmp_path}/wheels "
                  "--extra-index-url https://mirror.example/simple --index-strategy unsafe-best-match "
                  "--require-hashes -r requirements.lock")
    # the find-links directory that holds the pinned CPU wheel is the torch source: no index is added
    assert f"setup: torch 2.13.0+cpu from {tmp_path}/srv-more" in done.stdout
    assert not [c for c in calls if c.startswith("python -m pip install -q --no-deps --require-hashes -r requirements")]


@pytest.mark.parametrize("installer", ["uv", "pip"])
def test_pip_installs_the_same_pins_when_uv_fails_or_is_not_wanted(tmp_path, installer):
    done, calls = install(tmp_path, uv_rc=1 if installer == "uv" else 0, RAGTEAM_INSTALLER=installer)
    assert done.returncode == 0, done.stderr
    assert calls[-1] == ("python -m pip install -q --no-deps --extra-index-url https://download.pytorch.org/whl/cpu "
                         "--require-hashes -r requirements.lock")
    assert ("uv could not install --require-hashes -r requirements.lock" in done.stderr) == (installer == "uv")
    assert any(c.startswith("uv ") for c in calls) == (installer == "uv")


@pytest.mark.parametrize("pins", ["requirements.lock", "requirements-worker.txt"])
def test_without_the_wheel_at_hand_the_cpu_torch_comes_from_pytorchs_cpu_index(tmp_path, pins):
    """No find-links directory holds torch 2.13.0+cpu (PyPI has only its CUDA build): the script adds PyTorch's CPU
    index itself, for uv and for pip alike, and says so; RAGTEAM_TORCH_INDEX names another (a mirror)."""
    done, calls = install(tmp_path, uv_rc=0, pins=pins)
    assert done.returncode == 0, done.stderr
    assert "setup: torch 2.13.0+cpu from https://download.pytorch.org/whl/cpu" in done.stdout
    [uv] = [c for c in calls if c.startswith("uv ")]
    # uv takes each pin from whichever index has it (its default would stop at PyTorch's old numpy, jinja2, ...)
    assert (f"--extra-index-url https://download.pytorch.org/whl/cpu --index-strategy unsafe-best-match "
            f"--require-hashes -r {pins}") in uv
    done, calls = install(tmp_path / "mirror", uv_rc=1, pins=pins, RAGTEAM_TORCH_INDEX="https://mirror.example/cpu")
    assert "setup: torch 2.13.0+cpu from https://mirror.example/cpu" in done.stdout
    assert calls[-1] == ("python -m pip install -q --no-deps --extra-index-url https://mirror.example/cpu "
                         f"--require-hashes -r {pins}")


def test_a_file_without_a_cpu_torch_adds_no_index(tmp_path):
    pins = tmp_path / "pins.txt"
    pins.write_text("numpy==2.4.6 \\\n    --hash=sha256:" + "0" * 64 + "\n")
    done, calls = install(tmp_path, uv_rc=0, pins=str(pins))
    assert done.returncode == 0, done.stderr
    assert "setup: torch" not in done.stdout
    assert not [c for c in calls if "--extra-index-url" in c]


def test_an_empty_torch_index_leaves_the_cpu_torch_to_pips_configuration(tmp_path):
    done, calls = install(tmp_path, uv_rc=0, RAGTEAM_TORCH_INDEX="")
    assert done.returncode == 0, done.stderr
    assert "setup: torch 2.13.0+cpu from pip's configuration (RAGTEAM_TORCH_INDEX is empty)" in done.stdout
    assert not [c for c in calls if "--extra-index-url" in c or "--index-strategy" in c]
