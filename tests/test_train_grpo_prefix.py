"""The shared-prefix GRPO trainer: its log-probs equal a plain forward pass, sampling masks stop at EOS, and it
trains, checkpoints and resumes like the TRL path."""
import pytest

from ragteam.train.checkpoints import checkpoint_steps
from ragteam.rewards.maps import AnswerReward
from ragteam.train.grpo import GRPOParams, answer_reward_func
from ragteam.train.grpo_prefix import _group_logps, _sample_group, train_grpo_shared_prefix

SAMPLES = [{"id": f"q{i}", "golden_answers": [a],
            "prompt": [{"role": "user", "content": f"{doc}\nQuestion: {q}"}]}
           for i, (doc, q, a) in enumerate([("Paris is the capital of France.", "Capital of France?", "Paris"),
                                            ("Ottawa is the capital of Canada.", "Capital of Canada?", "Ottawa"),
                                            ("Lima is the capital of Peru.", "Capital of Peru?", "Lima")])]


@pytest.fixture(scope="module")
def tiny(tiny_llama):
    from transformers import AutoTokenizer

    return tiny_llama, AutoTokenizer.from_pretrained(tiny_llama)

def test_shared_prefix_logps_equal_a_full_forward_pass(tiny):
    import torch
    from transformers import AutoModelForCausalLM

    path, tok = tiny
    model = AutoModelForCausalLM.from_pretrained(path).eval()
    prompt = torch.tensor(tok.apply_chat_template(SAMPLES[0]["prompt"], add_generation_prompt=True,
                                                  return_dict=True)["input_ids"])
    torch.manual_seed(1)
    comp, mask = _sample_group(model, prompt, G=4, max_new=6, temperature=1.0, eos_id=tok.eos_token_id,
                               pad_id=tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id)
    assert comp.shape == (4, 6) or bool((comp == tok.eos_token_id).any(1).all())
    got = _group_logps(model, prompt, comp, temperature=0.7)
    for g in range(4):  # reference: each sequence on its own, prompt + completion in one pass
        ids = torch.cat([prompt, comp[g]])[None]
        logits = model(ids).logits[0, len(prompt) - 1:-1].float() / 0.7
        ref = torch.log_softmax(logits, -1).gather(-1, comp[g][:, None]).squeeze(-1)
        assert torch.allclose(got[g], ref, atol=1e-4)


def test_greedy_in_group_puts_the_greedy_output_first_among_the_samples(tiny):
    """greedy_in_group (issue 27): completion 0 of the group is transformers' greedy decoding of the prompt, the
    others are sampled; only the shared-prefix trainer can do it."""
    import torch
    from transformers import AutoModelForCausalLM

    path, tok = tiny
    model = AutoModelForCausalLM.from_pretrained(path).eval()
    prompt = torch.tensor(tok.apply_chat_template(SAMPLES[1]["prompt"], add_generation_prompt=True,
                                                  return_dict=True)["input_ids"])
    pad = tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id
    greedy = model.generate(prompt[None], max_new_tokens=6, do_sample=False, pad_token_id=pad)[0, len(prompt):]
    torch.manual_seed(3)
    comp, _ = _sample_group(model, prompt, G=4, max_new=6, temperature=1.0, eos_id=tok.eos_token_id, pad_id=pad,
                            greedy_first=True)
    assert comp[0, :len(greedy)].tolist() == greedy.tolist()
    assert any(comp[g].tolist() != comp[0].tolist() for g in range(1, 4))     # the rest are sampled
    with pytest.raises(ValueError, match="greedy_in_group needs trainer: shared_prefix"):
        GRPOParams(steps=1, prompts_per_step=1, num_generations=2, micro_batch_size=2, lr=1e-4,
                   max_completion_length=4, save_steps=1, trainer="trl", greedy_in_group=True)


def test_completion_mask_keeps_tokens_up_to_the_first_eos(tiny, monkeypatch):
    import torch
    from transformers import AutoModelForCausalLM

    path, tok = tiny
    model = AutoModelForCausalLM.from_pretrained(path).eval()
    eos = tok.eos_token_id
    pad = tok.pad_token_id if tok.pad_token_id is not None else eos   # older tokenizers have no pad token
    script = iter([torch.tensor([5, eos]), torch.tensor([6, 7]), torch.tensor([9, 8])])
    monkeypatch.setattr(torch, "multinomial", lambda probs, n: next(script)[:, None])
    comp, mask = _sample_group(model, torch.tensor([1, 2, 3]), G=2, max_new=3, temperature=1.0, eos_id=eos,
                               pad_id=pad)
    # row 0 never stops (truncated: all 3 tokens count); row 1 stops at once: its later samples become padding
    assert comp.tolist() == [[5, 6, 9], [eos, pad, pad]]
    assert mask.tolist() == [[True, True, True], [True, False, False]]
    script = iter([torch.tensor([5, eos]), torch.tensor([eos, 7])])
    comp, mask = _sample_group(model, torch.tensor([1, 2, 3]), G=2, max_new=5, temperature=1.0, eos_id=eos,
                               pad_id=pad)
    assert comp.tolist() == [[5, eos], [eos, pad]] and mask.tolist() == [[True, True], [True, False]]


def test_shared_prefix_trainer_learns_logs_and_resumes_after_a_kill(tiny, tmp_path):
    from transformers import TrainerCallback

    path, _ = tiny

    class Kill(TrainerCallback):
        def on_step_end(self, args, state, control, **kw):
            if state.global_step == 3:
                raise KeyboardInterrupt("killed")

    params = GRPOParams(steps=4, prompts_per_step=2, num_generations=4, micro_batch_size=8, lr=1e-3,
                        max_completion_length=4, save_steps=1, kl_beta=0.05, trainer="shared_prefix")
    reward = answer_reward_func(AnswerReward("stage1", 0.5, 2))
    with pytest.raises(KeyboardInterrupt):
        train_grpo_shared_prefix(SAMPLES, str(path), str(tmp_path / "ck"), params, reward, callbacks=[Kill()])
    assert checkpoint_steps(tmp_path / "ck") == [1, 2]
    res = train_grpo_shared_prefix(SAMPLES, str(path), str(tmp_path / "ck"), params, reward)
    assert res.resumed_from == 2 and res.global_step == 4
    assert [h["step"] for h in res.log_history] == [1, 2, 3, 4]
    assert all({"reward", "loss", "kl", "em", "grad_norm"} <= set(h) for h in res.log_history)
    assert res.log_history[-1]["kl"] >= 0


def test_shared_prefix_lora_uses_the_adapter_free_model_as_kl_reference(tiny, tmp_path):
    path, _ = tiny
    params = GRPOParams(steps=2, prompts_per_step=1, num_generations=8, micro_batch_size=8, lr=1e-2,
                        max_completion_length=4, save_steps=1, kl_beta=0.1, trainer="shared_prefix",
                        lora={"enabled": True, "rank": 2, "alpha": 4, "top_layers": 1})
    res = train_grpo_shared_prefix(SAMPLES, str(path), str(tmp_path / "ck"), params,
                                   answer_reward_func(AnswerReward("stage2", 0.5, 2, 1)))
    trainable = [n for n, p in res.model.named_parameters() if p.requires_grad]
    assert trainable and all("lora_" in n and ".layers.1." in n for n in trainable)
    # before the first update policy == reference (LoRA B = 0), so the k3 KL of step 1 is exactly 0; after it the
    # adapters moved and the adapter-free reference differs
    assert res.log_history[0]["reward_std"] > 0
    assert res.log_history[0]["kl"] == pytest.approx(0.0, abs=1e-6) and res.log_history[1]["kl"] > 1e-6


def test_bookkeeping_params_resume_and_model_params_restart(tiny, tmp_path):
    """save_steps / save_total_limit / micro-batch size do not change the model: a run resumes across them; a
    learning-rate change does, and restarts. Checkpoints load with torch.load(weights_only=True)."""
    import torch

    path, _ = tiny
    params = GRPOParams(steps=2, prompts_per_step=2, num_generations=4, micro_batch_size=8, lr=1e-3,
                        max_completion_length=4, save_steps=1, save_total_limit=2, trainer="shared_prefix")
    reward = answer_reward_func(AnswerReward("stage1", 0.5, 2))
    first = train_grpo_shared_prefix(SAMPLES, str(path), str(tmp_path / "ck"), params, reward)
    assert first.resumed_from is None and checkpoint_steps(tmp_path / "ck") == [1, 2]
    state = torch.load(tmp_path / "ck" / "checkpoint-2" / "state.pt", weights_only=True)
    assert {"trainable", "optimizer", "scheduler", "torch_rng", "py_rng"} <= set(state)
    moved = params.model_copy(update={"save_steps": 2, "save_total_limit": 3, "micro_batch_size": 4,
                                      "gradient_checkpointing": True})
    again = train_grpo_shared_prefix(SAMPLES, str(path), str(tmp_path / "ck"), moved, reward)
    assert again.resumed_from == 2 and again.global_step == 2 and checkpoint_steps(tmp_path / "ck") == [1, 2]
    assert again.extra["fingerprint"] == first.extra["fingerprint"]
    other = train_grpo_shared_prefix(SAMPLES, str(path), str(tmp_path / "ck"), params.model_copy(update={"lr": 2e-3}),
                                     reward)
    assert other.resumed_from is None and other.extra["fingerprint"] != first.extra["fingerprint"]


def test_sft_fingerprint_covers_the_optimiser_batch_not_its_split():
    from ragteam.train.common import model_params
    from ragteam.train.sft import SFTParams

    base = SFTParams(batch_size=4, grad_accum=1, lr=1e-3, max_length=64, save_steps=5)
    same = base.model_copy(update={"batch_size": 2, "grad_accum": 2, "save_steps": 1, "save_total_limit": 9})
    assert model_params(same) == model_params(base) and model_params(base)["effective_batch"] == 4
    assert model_params(base.model_copy(update={"grad_accum": 2})) != model_params(base)
    assert model_params(base.model_copy(update={"max_length": 128})) != model_params(base)


class _PolicyAsEngine:
    """A PolicyEngine (ragteam.llm.policy) that samples with the trainer's own synced policy, in this environment:
    the trainer's engine path (sync, seeded groups, the greedy completion, ids and log-probs handed back, close)
    runs without vLLM. `shift_prompt`: tokenise prompts differently from the trainer (a broken engine)."""

    def __init__(self, model_path, shift_prompt=False):
        from transformers import AutoTokenizer

        self.model_path, self.tok, self.shift = model_path, AutoTokenizer.from_pretrained(model_path), shift_prompt
        self.policy, self.syncs, self.calls, self.closed = None, 0, [], False
        self.cut = []           # per call: completions that ended at the budget (finish_reason "length")
        self.short = False      # answer one completion too few (a broken engine)

    def sync(self, policy):
        self.policy, self.syncs = policy, self.syncs + 1

    def generate(self, prompts, sampling):
        import torch

        from ragteam.llm import Completion

        self.calls.append(sampling)
        torch.manual_seed(sampling.seed or 0)
        out = []
        for msgs in prompts:
            ids = self.tok.apply_chat_template(msgs, add_generation_prompt=True, return_dict=True)["input_ids"]
            ids = ids[1:] if self.shift else ids
            p = torch.tensor(ids)
            greedy = sampling.temperature == 0
            comp, mask = _sample_group(self.policy, p, sampling.n, sampling.max_new_tokens,
                                       1.0 if greedy else sampling.temperature, self.tok.eos_token_id,
                                       self.tok.eos_token_id, greedy_first=greedy)
            with torch.no_grad():
                lp = _group_logps(self.policy, p, comp, 1.0 if greedy else sampling.temperature)
            ends = ["length" if int(m.sum()) == sampling.max_new_tokens and int(c[m][-1]) != self.tok.eos_token_id
                    else "stop" for c, m in zip(comp, mask)]
            out.append([Completion("", len(ids), int(m.sum()), e, prompt_ids=tuple(ids),
                                   token_ids=tuple(c[m].tolist()), logprobs=tuple(lp[j][m].tolist()))
                        for j, (c, m, e) in enumerate(zip(comp, mask, ends))][: sampling.n - self.short])
            self.cut.append(ends.count("length"))
        return out

    def close(self):
        self.closed = True


def _engine_params(**kw):
    return GRPOParams(steps=2, prompts_per_step=2, num_generations=4, micro_batch_size=8, lr=1e-3,
                      max_completion_length=4, save_steps=1, kl_beta=0.05, trainer="shared_prefix",
                      rollout_backend="vllm", greedy_in_group=True, **kw)


def test_engine_rollouts_sync_each_step_score_the_engines_ids_and_close_the_engine(tiny, tmp_path, monkeypatch):
    import ragteam.llm.policy as policy_mod
    from ragteam.llm import EngineConfig

    path, _ = tiny
    engine = _PolicyAsEngine(str(path))
    made = []
    monkeypatch.setattr(policy_mod, "policy_engine",
                        lambda backend, policy, tok, model_path, cfg, workdir: made.append((backend, cfg)) or engine)
    reward = answer_reward_func(AnswerReward("stage1", 0.5, 2))
    with pytest.raises(ValueError, match="engine settings"):
        train_grpo_shared_prefix(SAMPLES, str(path), str(tmp_path / "no_cfg"), _engine_params(), reward)
    res = train_grpo_shared_prefix(SAMPLES, str(path), str(tmp_path / "ck"), _engine_params(rollout_is_cap=2.0),
                                   reward, engine_cfg=EngineConfig(backend="hf", threads=1))
    assert made[-1][0] == "vllm" and made[-1][1].backend == "vllm"   # the engine is vLLM whatever llm.backend says
    assert made[-1][1].vllm.gpu_memory_utilization == 0.3   # its share of a GPU beside the trainer (GRPOParams')
    assert engine.syncs == 2 and engine.closed                      # the policy handed over before every step
    # per step: the sampled call (G - 1 samples, seeded per step) and the greedy one (completion 0 of each group)
    sampled = [c for c in engine.calls if c.temperature > 0]
    assert [c.n for c in sampled] == [3, 3] and len({c.seed for c in sampled}) == 2
    assert [c.n for c in engine.calls if c.temperature == 0] == [1, 1]
    for h in res.log_history:         # the trainer's recomputed log-probs of the engine's ids are the engine's own
        assert h["engine_logp_abs_diff"] < 1e-4 and h["is_weight_mean"] == pytest.approx(1.0, abs=1e-3)
        assert {"reward", "loss", "kl", "grad_norm"} <= set(h)
    # clipped: what the engine says it cut (per step: 2 prompts x (the sampled call + the greedy call))
    cut = [sum(engine.cut[k:k + 4]) for k in (0, 4)]
    assert [h["completions/clipped_ratio"] for h in res.log_history] == [c / 8 for c in cut]
    # a finished run resumes as a no-op and starts no engine
    made.clear()
    again = train_grpo_shared_prefix(SAMPLES, str(path), str(tmp_path / "ck"), _engine_params(rollout_is_cap=2.0),
                                     reward, engine_cfg=EngineConfig(threads=1))
    assert again.resumed_from == 2 and made == []


@pytest.mark.parametrize("broken,error", [("shift_prompt", "tokenised"), ("short", "completions for prompt 0")])
def test_a_broken_engine_fails_the_step_naming_why_and_is_closed(tiny, tmp_path, monkeypatch, broken, error):
    """An engine that tokenised a prompt otherwise, or returned too few completions, stops the run: the loss would
    score another context, or a row with no completion."""
    import ragteam.llm.policy as policy_mod
    from ragteam.llm import EngineConfig

    path, _ = tiny
    engine = _PolicyAsEngine(str(path), shift_prompt=broken == "shift_prompt")
    engine.short = broken == "short"
    monkeypatch.setattr(policy_mod, "policy_engine", lambda *a, **k: engine)
    with pytest.raises(RuntimeError, match=error):
        train_grpo_shared_prefix(SAMPLES, str(path), str(tmp_path / "ck"), _engine_params(),
                                 answer_reward_func(AnswerReward("stage1", 0.5, 2)),
                                 engine_cfg=EngineConfig(threads=1))
    assert engine.closed


def test_engine_rollout_params_are_checked():
    with pytest.raises(ValueError, match="shared_prefix"):
        GRPOParams(steps=1, prompts_per_step=1, num_generations=2, micro_batch_size=2, lr=1e-3,
                   max_completion_length=4, save_steps=1, rollout_backend="vllm")
    with pytest.raises(ValueError, match="rollout_is_cap"):
        GRPOParams(steps=1, prompts_per_step=1, num_generations=2, micro_batch_size=2, lr=1e-3,
                   max_completion_length=4, save_steps=1, trainer="shared_prefix", rollout_is_cap=2.0)



def test_the_on_policy_surrogate_is_the_policy_gradient_bit_for_bit():
    """The shared-prefix trainer's loss is pg.py's clipped surrogate with old = the policy itself (detached): r = 1,
    nothing clipped, and each token's gradient is exactly -A (× w_t) where the mask holds, as -A·log π gives."""
    import torch

    from ragteam.train.pg import surrogate

    torch.manual_seed(0)
    logp = torch.randn(3, 5, requires_grad=True)
    mask = torch.rand(3, 5) > 0.3
    adv, isw = torch.tensor([1.0, -2.0, 0.5]), torch.rand(3, 5)
    per_token, stats = surrogate(logp, logp.detach(), adv[:, None], mask, is_weights=isw)
    (per_token * mask).sum().backward()
    assert torch.equal(logp.grad, -adv[:, None] * mask * isw) and stats["clip_frac"] == 0.0
    plain = logp.detach().clone().requires_grad_(True)
    ((-adv[:, None] * plain * isw) * mask).sum().backward()
    assert torch.equal(logp.grad, plain.grad)
