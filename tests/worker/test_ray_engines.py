"""vLLM engines as Ray actors (`ragteam.llm.ray_engines`), for real: a local Ray cluster started by this module (its
own temporary directory, stopped at the end; never `ray stop`, which would stop every Ray process of the user) with
2 CPU engines on SmolLM2, one core each, against the session's single engine on both cores.

What they must do: give the single engine's greedy ids and seeded samples (prompts spread over the engines, each
seeded by its index in the whole call), take a policy's LoRA adapter on every engine through the trainer's
`VLLMPolicy`, refuse a malformed adapter before any engine sees it, and fail with `EngineDead` when an actor dies.
The speed ratio against one 2-thread engine is `benchmarks/ray_engines.py`'s (printed here, never asserted)."""
from __future__ import annotations

import os
import shutil
import tempfile
import time

import pytest

from ragteam.llm import EngineDead, SamplingConfig

from vllm_helpers import LORA_RANK, engine_config, peft_policy

GREEDY = SamplingConfig(max_new_tokens=24)
SAMPLED = SamplingConfig(max_new_tokens=12, temperature=1.0, n=3, seed=11)


def ids(outs):
    return [[c.token_ids for c in o] for o in outs]


@pytest.fixture(scope="module")
def ray_engines(smollm2_dir):
    """2 engines on one local cluster; Ray's state in a short temporary directory (its socket paths must stay under
    107 characters, which pytest's tmp_path can exceed)."""
    import ray

    from ragteam.llm.ray_engines import RayEngines

    assert not ray.is_initialized()
    # Ray's own OOM killer stops workers once the node's memory passes 95 %, which another job on the machine (a
    # `make repro` beside CI, seen here) can cause; the kernel's OOM killer still guards. The test is about results.
    os.environ.setdefault("RAY_memory_monitor_refresh_ms", "0")
    temp = tempfile.mkdtemp(prefix="rt-ray-")
    from ragteam.llm import LLMConfig

    base = engine_config()
    ray_opts = base.vllm.ray.model_copy(update={"engines": 2, "threads_per_engine": 1, "temp_dir": temp})
    # a stage's LLMConfig, roles and all, as evaluate's EnginePool hands it over (the actors take its engine part)
    cfg = LLMConfig(**base.model_dump(), sampling={"default": {"max_new_tokens": 8}})
    cfg = cfg.model_copy(update={"vllm": base.vllm.model_copy(update={"ray": ray_opts})})
    t0 = time.perf_counter()
    engines = RayEngines(str(smollm2_dir), cfg, max_lora_rank=LORA_RANK)
    print(f"2 Ray engines started in {time.perf_counter() - t0:.1f} s")
    yield engines
    engines.close()
    assert not ray.is_initialized()              # the cluster this process started stopped with its engines
    shutil.rmtree(temp, ignore_errors=True)


def test_two_engines_on_their_own_cores_give_the_single_engines_greedy_ids_and_seeded_samples(
        ray_engines, vllm_engine, rag_prompts):
    prompts = rag_prompts + [rag_prompts[0] + [{"role": "assistant", "content": "The answer is"}]]
    assert ray_engines.metadata["engines"] == 2
    assert ray_engines.metadata["omp_threads_bind"] == ["0", "1"]     # one core each, not both on both
    t0 = time.perf_counter()
    got = ray_engines.generate(prompts, GREEDY)
    t_ray = time.perf_counter() - t0
    t0 = time.perf_counter()
    want = vllm_engine.generate(prompts, GREEDY)
    t_one = time.perf_counter() - t0
    assert ids(got) == ids(want)
    assert [o[0].text for o in got] == [o[0].text for o in want]
    print(f"greedy, {len(prompts)} prompts: 2 Ray engines x 1 core {t_ray:.2f} s, one engine x 2 cores "
          f"{t_one:.2f} s (ratio {t_one / t_ray:.2f})")
    # seeded samples: prompt i is seeded by its index in the call, whichever engine serves it
    s_ray, s_one = ray_engines.generate(prompts, SAMPLED), vllm_engine.generate(prompts, SAMPLED)
    assert ids(s_ray) == ids(s_one)
    assert all(len({c.token_ids for c in o}) > 1 for o in s_ray)     # n draws, not n copies
    assert ids(ray_engines.generate(prompts, SAMPLED)) == ids(s_ray)  # a rerun reproduces them
    assert ray_engines.generate([], GREEDY) == []


def test_a_policys_adapter_reaches_every_engine_through_the_trainers_sync(ray_engines, vllm_engine, smollm2_dir,
                                                                          rag_prompts, tmp_path):
    """`VLLMPolicy.sync` on the engine set: every engine generates with the adapter (the prompts land on both), as
    the single engine does with it; the base view and unloading give the base model back."""
    from ragteam.llm.vllm_backend import VLLMPolicy

    base = ids(ray_engines.generate(rag_prompts, GREEDY))
    import torch

    model = peft_policy(smollm2_dir, seed=5)
    with torch.no_grad():      # a strong adapter: it must change what each engine answers, whatever lora_A drew
        for name, t in model.named_parameters():
            if "lora_B" in name:
                t.mul_(10)
    ray_policy = VLLMPolicy(ray_engines, tmp_path / "ray_sync", base_loader=None, lora=True)
    one_policy = VLLMPolicy(vllm_engine, tmp_path / "one_sync", base_loader=None, lora=True)
    try:
        ray_policy.sync(model)
        one_policy.sync(model)
        tuned = ids(ray_policy.generate(rag_prompts, GREEDY))
        assert tuned == ids(one_policy.generate(rag_prompts, GREEDY))
        changed = [i for i, (a, b) in enumerate(zip(tuned, base)) if a != b]
        # prompt i is served by engine i mod 2: outputs changed on both engines' prompts
        assert {i % 2 for i in changed} == {0, 1}, changed
        assert ids(ray_policy.base().generate(rag_prompts, GREEDY)) == base
    finally:
        vllm_engine.unload_lora()
        ray_engines.unload_lora()
    assert ids(ray_engines.generate(rag_prompts, GREEDY)) == base


def test_a_malformed_adapter_is_refused_before_any_engine_sees_it(ray_engines, rag_prompts, tmp_path):
    bad = tmp_path / "bad_adapter"
    bad.mkdir()
    (bad / "adapter_config.json").write_text('{"r": 16}')          # no weights
    with pytest.raises(ValueError, match=f"LoRA adapter {bad}: no weights"):
        ray_engines.load_lora(bad)
    with pytest.raises(ValueError, match="weights .*: no \\*.safetensors file"):
        ray_engines.load_weights(bad)
    assert len(ray_engines.generate(rag_prompts[:2], GREEDY)) == 2           # still serving


def test_a_dead_actor_fails_the_call_with_engine_dead_naming_the_model(ray_engines, rag_prompts, smollm2_dir):
    """Runs last in this module: it kills one of the two actors."""
    import ray

    ray.kill(ray_engines._actors[1], no_restart=True)
    with pytest.raises(EngineDead, match=f"Ray actor of the vLLM engines on {smollm2_dir} has died"):
        ray_engines.generate(rag_prompts, GREEDY)
