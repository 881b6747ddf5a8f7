"""The OpenRLHF environment's locks (scripts/setup_openrlhf.sh): every file hashed, requirements-openrlhf.in's exact
pins held, none of OpenRLHF's CUDA-only requirements, deepspeed alone in the source-build lock; `make test` builds it
and the built environment is the lock."""
from __future__ import annotations

import re
from importlib.metadata import PathDistribution
from pathlib import Path

from conftest import require_openrlhf_env
from packaging.utils import canonicalize_name

from tests.test_env_lock import locked

ROOT = Path(__file__).resolve().parents[1]


def _in_pins() -> dict[str, str]:
    out = {}
    for line in (ROOT / "requirements-openrlhf.in").read_text().splitlines():
        m = re.match(r"^([A-Za-z0-9][A-Za-z0-9._\-]*)==(\S+)", line.split("#")[0].strip())
        if m:
            out[canonicalize_name(m.group(1))] = m.group(2)
    return out


def test_the_openrlhf_locks_hash_every_file_and_hold_the_in_files_pins():
    wheels, built = locked(ROOT / "requirements-openrlhf.lock"), locked(ROOT / "requirements-openrlhf-built.lock")
    assert set(built) == {"deepspeed"} and not wheels.keys() & built.keys()
    both = wheels | built
    assert not [n for n, (_, hashes) in both.items() if not hashes], "rerun scripts/setup_openrlhf.sh --lock"
    pins = _in_pins()
    assert pins["openrlhf"] == "0.11.2" and pins["deepspeed"] == "0.19.6" and pins["transformers"] == "5.15.0"
    assert {n: both[n][0] for n in pins} == pins, "requirements-openrlhf.in moved: rerun setup_openrlhf.sh --lock"
    assert both["torch"][0].endswith("+cpu")
    # OpenRLHF's hard requirements that are CUDA builds or not on the SFT path stay out (it is installed --no-deps)
    assert not {"flash-attn", "vllm", "bitsandbytes", "optimum", "ray", "wandb", "liger-kernel"} & both.keys()


def test_make_builds_the_environment_only_when_asked_and_before_the_tests():
    make = (ROOT / "Makefile").read_text()
    setup = make.split("\nsetup:", 1)[1].split("\n\n", 1)[0]
    assert "setup_openrlhf" not in setup                      # `make setup` stays light
    assert "bash scripts/setup_openrlhf.sh" in make.split("\nsetup-openrlhf:", 1)[1].split("\n\n", 1)[0]
    test = make.split("\ntest:", 1)[1].split("\n\n", 1)[0]
    assert "\nOPENRLHF_ENV = bash scripts/setup_openrlhf.sh\n" in make  # overridable, as BOTH_ENVS (test_make_test)
    assert test.index("$(OPENRLHF_ENV)") < test.index("python -m pytest")
    assert "/.venv-openrlhf/" in (ROOT / ".gitignore").read_text().splitlines()
    script = (ROOT / "scripts/setup_openrlhf.sh").read_text()
    assert "--require-hashes -r \"$LOCK\"" in script and "DS_BUILD_OPS=0" in script


def test_the_built_environment_is_the_lock():
    venv = require_openrlhf_env().parents[1]
    site = next(venv.glob("lib/python3*/site-packages"))
    have = {canonicalize_name(d.metadata["Name"]): d.version
            for d in (PathDistribution(p) for p in site.glob("*.dist-info"))}
    want = {n: v for n, (v, _) in (locked(ROOT / "requirements-openrlhf.lock")
                                   | locked(ROOT / "requirements-openrlhf-built.lock")).items()}
    extra = set(have) - set(want) - {"pip", "uv"}
    assert not extra and {n: have.get(n) for n in want} == want, (extra, {n: (have.get(n), v) for n, v in
                                                                          want.items() if have.get(n) != v})
