"""The joint trainer's policy samples from vLLM: the log-probs the trainer recomputes for them (its own forward pass,
`old_logp`) must match the engine's, else the PPO ratio silently trains on another distribution than the one that
sampled. Measured here through the trainer's own pieces: the actor it builds, the sync it does, its collate, its
forward, and `engine_mismatch`, which the trainer logs every step."""
from __future__ import annotations

import pytest
import torch

from ragteam.llm import SamplingConfig

from vllm_helpers import LORA_RANK

# fp32 on both sides, different kernels (vLLM's CPU attention and its LoRA path vs torch's SDPA + peft): measured
# here mean |Δ| 2.9e-6 and max 2.1e-5 (T = 1, 192 tokens), 2.9e-6 and 3.9e-5 (T = 0.7, 178 tokens); the tolerances
# leave room for other CPUs. A wrong temperature or the adapter missing on one side is far above them (asserted)
MEAN_TOL, MAX_TOL = 1e-3, 2e-2


def _actor(model_dir, seed: int):
    """The trainer's actor (`_build_actor_critic`, LoRA as params.yaml joint.ppo) with random adapter weights in
    place of a trained step's (peft initialises B to zero)."""
    from ragteam.train.joint.params import PPOParams
    from ragteam.train.joint.actor_critic import _build_actor_critic

    p = PPOParams(steps=1, questions_per_step=1, minibatch_size=4, micro_batch_size=4, actor_lr=1e-4, critic_lr=1e-4,
                  lora={"enabled": True, "rank": LORA_RANK, "alpha": 32, "top_layers": 4})
    ac = _build_actor_critic(str(model_dir), p, "cpu", torch.float32, with_critic=False)
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, t in ac.policy.named_parameters():
            if "lora_B" in name:
                t.copy_(torch.randn(t.shape, generator=g) * 0.02)
    return ac.eval()


@pytest.mark.parametrize("temperature,top_p", [(1.0, 1.0), (0.7, 1.0)])
def test_the_trainers_log_probs_of_vllm_samples_match_the_engines(vllm_engine, smollm2_dir, rag_prompts, tmp_path,
                                                                   temperature, top_p):
    from transformers import AutoTokenizer

    from ragteam.llm.vllm_backend import VLLMPolicy
    from ragteam.train.joint.batch import Sample, _collate, engine_mismatch

    tok = AutoTokenizer.from_pretrained(smollm2_dir)
    ac = _actor(smollm2_dir, seed=3)
    policy = VLLMPolicy(vllm_engine, tmp_path / "sync", base_loader=None, lora=True)
    try:
        policy.sync(ac.policy)
        outs = policy.generate(rag_prompts[:4], SamplingConfig(n=2, temperature=temperature, top_p=top_p,
                                                               max_new_tokens=24, seed=11))
        samples = [Sample(0, i, "r", list(c.prompt_ids), list(c.token_ids), 0.0, engine_logp=list(c.logprobs))
                   for i, c in enumerate(c for o in outs for c in o)]
        assert all(len(s.engine_logp) == len(s.response_ids) > 0 for s in samples)
        batch = _collate(samples, tok.pad_token_id or 0, "cpu")
        with torch.no_grad():
            logp, _ = ac(*batch[:4], temperature, values=False)
        for b, s in enumerate(samples):
            s.old_logp = logp[b, :len(s.response_ids)]
        m = engine_mismatch(samples)
        assert m["engine_logp_abs_diff"] < MEAN_TOL and m["engine_logp_max_abs_diff"] < MAX_TOL, m
        # the check can fail: the same samples scored at another temperature (the engine's raw log-probs, vLLM's
        # default logprobs_mode, would be this for T != 1) or by the base model are far off
        with torch.no_grad():
            other, _ = ac(*batch[:4], 1.0 if temperature != 1.0 else 0.5, values=False)
            with ac.policy.disable_adapter():
                base, _ = ac(*batch[:4], temperature, values=False)
        for wrong in (other, base):
            for b, s in enumerate(samples):
                s.old_logp = wrong[b, :len(s.response_ids)]
            assert engine_mismatch(samples)["engine_logp_abs_diff"] > 10 * MEAN_TOL
    finally:
        vllm_engine.unload_lora()
