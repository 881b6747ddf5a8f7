"""Issue 71, finding 5: VLLMEngine set VLLM_ALLOW_INSECURE_SERIALIZATION=1 in the whole process's environment (and
Ray engine actors were handed it), because load_weights sent a function to vLLM's workers, which vLLM pickles only
with that switch on, for every message. The function is now a method vLLM mixes into its worker class
(`worker_extension_cls`), called by name: the switch is not needed anywhere, and nothing sets it."""
from __future__ import annotations

import importlib
import os
import sys
import types
from pathlib import Path

import torch
from safetensors.torch import save_file

from ragteam.llm import EngineConfig

VAR = "VLLM_ALLOW_INSECURE_SERIALIZATION"


def _fake_vllm(monkeypatch, calls):
    class LLM:
        def __init__(self, **kw):
            calls["llm"] = kw

        def collective_rpc(self, method, args=(), kwargs=None):
            calls.setdefault("rpc", []).append(method)
            return [None]

        def reset_prefix_cache(self):
            return True

    monkeypatch.setitem(sys.modules, "vllm", types.SimpleNamespace(LLM=LLM, SamplingParams=lambda **kw: kw))


def test_building_a_vllm_engine_leaves_the_process_environment_alone(monkeypatch, tmp_path):
    monkeypatch.delenv(VAR, raising=False)
    before = dict(os.environ)
    calls: dict = {}
    _fake_vllm(monkeypatch, calls)
    from ragteam.llm import load_engine
    from ragteam.llm.vllm_backend import WORKER_EXTENSION, llm_kwargs

    assert llm_kwargs("m", EngineConfig(backend="vllm"))["worker_extension_cls"] == WORKER_EXTENSION
    eng = load_engine("m", EngineConfig(backend="vllm"))
    assert VAR not in os.environ
    assert {k: v for k, v in os.environ.items() if k.startswith("VLLM_") and k not in before} == {}
    assert calls["llm"]["worker_extension_cls"] == WORKER_EXTENSION
    weights = tmp_path / "w"
    weights.mkdir()
    save_file({"x": torch.zeros(2)}, str(weights / "model.safetensors"))
    eng.load_weights(weights)
    # every call into the workers names a method: nothing for vLLM to pickle
    assert calls["rpc"] == ["reload_weights", "ragteam_retie_output_embeddings"]
    assert VAR not in os.environ


def test_the_worker_extension_is_importable_by_name_and_reties_the_embeddings(monkeypatch):
    """vLLM imports WORKER_EXTENSION in its worker process and mixes the class into its worker's bases; its method
    must not clash with a worker attribute (vLLM asserts that), hence the ragteam_ prefix."""
    from ragteam.llm import vllm_backend
    from ragteam.llm.vllm_backend import WORKER_EXTENSION

    module, name = WORKER_EXTENSION.rsplit(".", 1)
    cls = getattr(importlib.import_module(module), name)
    methods = [a for a in dir(cls) if not a.startswith("__")]
    assert methods == ["ragteam_retie_output_embeddings"]
    seen = []
    monkeypatch.setattr(vllm_backend, "_retie_output_embeddings", seen.append)
    worker = type("Worker", (cls,), {"model_runner": None})()      # as vLLM appends it to its worker's bases
    worker.ragteam_retie_output_embeddings()
    assert seen == [worker]


def test_no_code_of_the_project_turns_on_vllms_pickle_serialization():
    root = Path(__file__).resolve().parents[1]
    quoted = (f'"{VAR}"', f"'{VAR}'")                     # as a string in code, not a word in a docstring
    hits = [str(p.relative_to(root)) for d in ("ragteam", "stages", "flows") for p in (root / d).rglob("*.py")
            if any(q in p.read_text(encoding="utf-8") for q in quoted)]
    assert hits == []
