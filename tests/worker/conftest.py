"""The worker environment's suite: vLLM's CPU build run for real on SmolLM2 (`make test` runs it with
.venv-worker/bin/python beside the main suite). Engine start-ups dominate the time (~15-30 s each on 2 busy cores), so
one engine serves the whole session; only the crash test starts its own.
"""
from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest
from vllm_helpers import LORA_RANK, engine_config

REPO = Path(__file__).resolve().parents[2]
# vLLM's state goes in the checkout (git-ignored), fresh per session, never in ~/.cache (notes/stack.md §11)
VLLM_STATE = REPO / ".vllm-cache" / "tests"
shutil.rmtree(VLLM_STATE, ignore_errors=True)
for var, value in {"VLLM_CACHE_ROOT": VLLM_STATE / "cache", "VLLM_CONFIG_ROOT": VLLM_STATE / "config",
                   "VLLM_CPU_KVCACHE_SPACE": "1",      # GiB: a few short prompts at a time
                   "VLLM_LOGGING_LEVEL": "WARNING"}.items():
    os.environ.setdefault(var, str(value))

def pytest_configure(config):
    import importlib.util

    if importlib.util.find_spec("vllm") is None:
        raise pytest.UsageError("tests/worker needs the worker environment: `make setup-worker`, then "
                                ".venv-worker/bin/python -m pytest tests/worker")


@pytest.fixture(scope="session")
def vllm_engine(smollm2_dir):
    """One vLLM engine on SmolLM2 with LoRA slots (rank 16), shared by every test: a test that changes its weights or
    adapter puts them back."""
    from ragteam.llm.vllm_backend import VLLMEngine

    eng = VLLMEngine(str(smollm2_dir), engine_config(), max_lora_rank=LORA_RANK)
    yield eng
    eng.close()


@pytest.fixture(scope="session")
def hf_engine(smollm2_dir):
    """The reference: the project's HF engine on the same checkpoint, in this environment."""
    from ragteam.llm import EngineConfig
    from ragteam.llm.hf import HFEngine

    return HFEngine(str(smollm2_dir), EngineConfig(device="cpu", dtype="float32", threads=1, batch_size=8))


@pytest.fixture(scope="session")
def rag_prompts(shared_data):
    """Real RAG prompts: the project's RAG baseline prompt over HotpotQA dev questions and their gold passages from
    the shared mini-Wikipedia corpus."""
    import json

    from ragteam.agents.baselines import rag_messages
    from ragteam.retrieval.base import Hit

    corpus = {}
    for line in (shared_data / "corpus" / "mini_wiki.jsonl").read_text().splitlines():
        doc = json.loads(line)
        corpus.setdefault(doc["contents"].split("\n", 1)[0].strip('"'), doc)
    prompts = []
    for line in (shared_data / "benchmarks" / "hotpotqa" / "dev.jsonl").read_text().splitlines():
        q = json.loads(line)
        docs = [corpus[t] for t in q["metadata"].get("supporting_titles", []) if t in corpus]
        if docs:
            prompts.append(rag_messages(q["question"], [Hit(d["id"], d["contents"], 1.0) for d in docs],
                                        passage_words=60))
        if len(prompts) == 5:
            return prompts
    raise AssertionError("the shared HotpotQA sample has fewer than 5 questions with gold passages in the corpus")
