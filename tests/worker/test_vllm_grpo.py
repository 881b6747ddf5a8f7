"""The GRPO trainers' groups sampled by vLLM (`rollout_backend: vllm`, the shared-prefix trainer): the engine gets
the policy's LoRA adapter before every step, the trainer scores the engine's own token ids, its recomputed
log-probs match the engine's, completion 0 of a group is the greedy output, and a rerun draws the same groups."""
from __future__ import annotations

import pytest

from vllm_helpers import LORA_RANK, engine_config

MEAN_TOL = 1e-3   # as tests/worker/test_vllm_logprobs.py: measured ~3e-6 (fp32 on both sides, other kernels)


def _params(**kw):
    from ragteam.train.common import GRPOParams

    return GRPOParams(steps=2, prompts_per_step=2, num_generations=4, micro_batch_size=8, lr=5e-3,
                      max_completion_length=12, temperature=0.8, save_steps=1, kl_beta=0.05,
                      trainer="shared_prefix", rollout_backend="vllm", greedy_in_group=True, rollout_is_cap=2.0,
                      lora={"enabled": True, "rank": LORA_RANK, "alpha": 32, "top_layers": 4}, **kw)


def _run(smollm2_dir, rag_prompts, ckpt, seen):
    """Two steps on two real RAG prompts; `seen` collects each group's completion texts per step. The reward (the
    completion's length in characters) differs within groups, so every step has a gradient."""
    from ragteam.train.grpo import completion_text
    from ragteam.train.grpo_prefix import train_grpo_shared_prefix

    samples = [{"id": f"q{i}", "prompt": p, "golden_answers": ["x"]} for i, p in enumerate(rag_prompts[:2])]

    def reward(completions, trainer_state, **_):
        texts = [completion_text(c) for c in completions]
        seen.append((trainer_state.global_step, texts))
        return [len(t) / 50 for t in texts]

    return train_grpo_shared_prefix(samples, str(smollm2_dir), str(ckpt), _params(), reward,
                                    engine_cfg=engine_config())


def test_grpo_groups_sampled_by_vllm_train_on_the_engines_ids_and_reproduce(smollm2_dir, rag_prompts, vllm_engine,
                                                                            tmp_path):
    from ragteam.llm import SamplingConfig

    seen: list = []
    res = _run(smollm2_dir, rag_prompts, tmp_path / "a", seen)
    assert [h["step"] for h in res.log_history] == [1, 2]
    for h in res.log_history:
        assert h["engine_logp_abs_diff"] < MEAN_TOL, h
        assert h["is_weight_mean"] == pytest.approx(1.0, abs=0.05), h
        assert h["grad_norm"] > 0 and h["reward_std"] > 0, h
    # step 0's policy is the base model (peft starts B at zero): completion 0 of each group is the greedy output
    greedy = vllm_engine.generate(rag_prompts[:2], SamplingConfig(max_new_tokens=12, temperature=0.0))
    firsts = sorted(texts[0] for step, texts in seen if step == 0)
    assert firsts == sorted(g[0].text.strip() for g in greedy)
    assert not (tmp_path / "a" / "rollout_sync").exists()           # the synced adapters go with the engine
    # a rerun in a fresh directory draws the same groups (seeded per step) and trains the same steps
    again: list = []
    res2 = _run(smollm2_dir, rag_prompts, tmp_path / "b", again)
    assert again == seen
    assert [h["reward"] for h in res2.log_history] == [h["reward"] for h in res.log_history]
