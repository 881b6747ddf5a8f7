"""Credit assignment and update hygiene of the joint trainer (issue 23 §1, §4): M-ASK's per-call returns under every
profile, the critic kept off the policy's gradient, fp32 master weights under a bf16 engine, NaN/inf gradients
skipped and counted (joint PPO and shared-prefix GRPO), and a resume across bookkeeping-only params."""
from __future__ import annotations

import json
import math
from dataclasses import replace
from pathlib import Path

import pytest
import torch
import yaml
from helpers_agents import KeywordRetriever, ScriptedEngine
from test_mask_agents import PASSAGES
from test_mask_agents import reply as mask_reply

from ragteam.config import deep_merge
from ragteam.llm import Team
from ragteam.systems.mask import roles as M

REPO = Path(__file__).resolve().parents[1]


def _profiles() -> dict[str, dict]:
    params = yaml.safe_load((REPO / "params.yaml").read_text())
    return {"default": params, "paper": deep_merge(params, yaml.safe_load((REPO / "profiles" / "paper.yaml")
                                                                       .read_text()))}


# ---- M-ASK: a call's return rises with its own answer ------------------------------------------------------------

RIGHT_Q, WRONG_Q = "What is the capital of Xland?", "Name the capital of Xland."


def _answer_turn1_right_or_wrong(role: str, messages) -> str:
    """Both episodes: Planning a_0 = Paris (F1 0), turn 2 and the final answer Xville (F1 1). Turn 1's answer a_1
    (its prompt's trajectory does not hold turn 2's river evidence yet) is Xville for RIGHT_Q, Paris for WRONG_Q."""
    user = messages[-1]["content"]
    if role == M.ANSWER:
        wrong = WRONG_Q in user and "Long river" not in user
        return f"<predicted_answer>{'Paris' if wrong else 'Xville'}</predicted_answer>"
    return mask_reply(role, messages)


@pytest.mark.parametrize("profile", ["default", "paper"])
def test_mask_answer_of_turn1_earns_more_when_its_own_answer_is_right(profile, smollm2_dir):
    """Rewards (Eq. 2-3, `annotate_mask`), y = Xville, a_0 = Paris:
        right a_1:  Plan 0 | turn 1 Search/Summary/Update 1 - 0 = 1, Answer F1(a_1) = 1 | turn 2 ΔF1 0, Answer 1
        wrong a_1:  Plan 0 | turn 1 ΔF1 0, Answer 0                                    | turn 2 ΔF1 1, Answer 1
    (the paper profile's max_turns 5 adds a Search <end> (0) and the final Answer (1) to both).
    Episode-wide GAE with γ = λ = 1 and V = 0 gives the turn-1 Answer its reward-to-go: right 1 + 0·3 + 1 (+ 1) = 2
    (3), wrong 0 + 1·3 + 1 (+ 1) = 4 (5): the wrong answer would earn more. Per-call GAE gives it its own reward:
    right 1, wrong 0; whitening over the batch keeps the order."""
    from transformers import AutoTokenizer

    from ragteam.train.joint.update import assign_advantages
    from ragteam.train.joint.batch import episode_samples
    from ragteam.systems.mask import mask_system
    from ragteam.systems.params import load_joint

    params = _profiles()[profile]
    ppo, _, _ = load_joint(params, "mask")
    system = mask_system(params, KeywordRetriever(PASSAGES))
    rows = [{"id": "right", "question": RIGHT_Q, "golden_answers": ["Xville"]},
            {"id": "wrong", "question": WRONG_Q, "golden_answers": ["Xville"]}]
    right, wrong = system.annotate(system.rollout(rows, Team(ScriptedEngine(_answer_turn1_right_or_wrong))))
    answers = [[c for c in ep.calls if c.role == M.ANSWER] for ep in (right, wrong)]
    assert [c.meta["answer"] for c in answers[0][:2]] == ["Xville", "Xville"]
    assert [c.meta["answer"] for c in answers[1][:2]] == ["Paris", "Xville"]
    assert [c.reward for c in right.calls[:9]] == [0.0, 1.0, 1.0, 1.0, 1.0, 0.0, 0.0, 0.0, 1.0]
    assert [c.reward for c in wrong.calls[:9]] == [0.0, 0.0, 0.0, 0.0, 0.0, 1.0, 1.0, 1.0, 1.0]

    tok = AutoTokenizer.from_pretrained(smollm2_dir)
    samples = episode_samples(tok, [right, wrong], system.roles)
    for s in samples:
        s.values = torch.zeros(len(s.response_ids))
    assign_advantages(samples, ppo, system.gae_scope)
    ans1 = [next(s for s in samples if s.episode == e and s.call == 4) for e in (0, 1)]    # Plan, S, Sum, Upd, Ans
    assert all(s.role == M.ANSWER and ep.calls[4].meta["turn"] == 1 for s, ep in zip(ans1, (right, wrong)))
    assert ans1[0].returns.tolist() == pytest.approx([1.0] * len(ans1[0].response_ids))
    assert ans1[1].returns.tolist() == pytest.approx([0.0] * len(ans1[1].response_ids))
    assert float(ans1[0].advantages.min()) > float(ans1[1].advantages.max())
    # Planning's return is its own F1(a_0) = 0 in both: a wrong a_0 earns nothing from the later turns' gains
    plans = [s for s in samples if s.role == M.PLANNING]
    assert all(float(s.returns.abs().max()) == 0.0 for s in plans)


def test_gae_scope_is_the_systems_not_a_param():
    from ragteam.config import ParamsError
    from ragteam.train.joint.system import JointSystem
    from ragteam.systems.jade import jade_system
    from ragteam.systems.mask import mask_system
    from ragteam.systems.params import load_joint

    retr = KeywordRetriever(PASSAGES)
    params = _profiles()["default"]
    assert mask_system(params, retr).gae_scope == "call" and jade_system(params, retr).gae_scope == "episode"
    params["joint"]["mask"]["ppo"] = {"gae_scope": "episode"}        # a profile cannot set the inverted form back
    with pytest.raises(ParamsError, match=r"joint\.mask\.ppo\.gae_scope"):
        load_joint(params, "mask")
    with pytest.raises(ValueError, match="'nope': GAE with a critic needs gae_scope"):
        JointSystem(name="nope", roles=("r",), rollout=None, annotate=None, describe={})


# ---- the critic does not move the policy -------------------------------------------------------------------------

def _samples(tok, advantages=(1.0, -1.0), ret=8.0):
    from ragteam.train.joint.batch import Sample

    msgs = [{"role": "user", "content": "Name a colour."}]
    prompt = tok(tok.apply_chat_template(msgs, add_generation_prompt=True, tokenize=False),
                 add_special_tokens=False).input_ids
    out = []
    for i, (text, a) in enumerate(zip((" Blue", " Seven"), advantages)):
        resp = tok(text, add_special_tokens=False).input_ids + [tok.eos_token_id]
        s = Sample(0, i, "r", prompt, resp, a)
        s.advantages, s.returns = torch.full((len(resp),), a), torch.full((len(resp),), ret)
        out.append(s)
    return out


def _old_pass(ac, samples, tok):
    from ragteam.train.joint.batch import _collate

    with torch.no_grad():
        lp, v = ac(*_collate(samples, tok.eos_token_id, "cpu")[:4])
    for b, s in enumerate(samples):
        n = len(s.response_ids)
        s.old_logp, s.values = lp[b, :n].float(), v[b, :n].float()


def _critic_update(tiny_llama, tok, **kw):
    from ragteam.train.joint.params import PPOParams
    from ragteam.train.joint.actor_critic import _build_actor_critic, actor_critic_params, make_optimizer
    from ragteam.train.joint.update import ppo_update

    p = PPOParams(steps=1, questions_per_step=1, minibatch_size=2, micro_batch_size=2, actor_lr=1e-3, critic_lr=1e-3,
                  max_grad_norm=0.05, lora={"enabled": True, "rank": 4, "alpha": 8}, **kw)
    torch.manual_seed(0)
    ac = _build_actor_critic(str(tiny_llama), p, "cpu", torch.float32)
    with torch.no_grad():     # a value head that has learnt something: its gradient reaches what it reads
        ac.value_head.weight.normal_(0, 1.0)
    samples = _samples(tok)
    _old_pass(ac, samples, tok)
    stats = ppo_update(ac, make_optimizer(ac, p), samples, p, tok.eos_token_id, "cpu")
    actor, critic = actor_critic_params(ac)
    return [t.grad.clone() for t in actor], [t.grad.clone() for t in critic], stats


def test_value_loss_leaves_the_policys_lora_gradient_alone(tiny_llama):
    """Shared backbone: the actor's (clipped) LoRA gradient is the same with vf_coef 0 and 0.5; the critic's norm is
    clipped and logged on its own."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_llama)
    a0, c0, st0 = _critic_update(tiny_llama, tok, vf_coef=0.0)
    a5, c5, st5 = _critic_update(tiny_llama, tok, vf_coef=0.5)
    assert len(a0) > 2 and any(float(g.abs().max()) > 0 for g in a0)
    for g0, g5 in zip(a0, a5):
        assert torch.equal(g0, g5)
    assert st0["grad_norm/policy"] == st5["grad_norm/policy"] and st0["grad_norm/policy"][0] > 0.05  # clipped
    assert st0["grad_norm/critic"] == [0.0] and st5["grad_norm/critic"][0] > 0.05   # value loss 0.5·8²: clipped too
    assert any(float(g.abs().max()) > 0 for g in c5) and st5["nonfinite_grad"] == [0.0]
    # value_grad_to_backbone: the value loss reaches the shared LoRA weights again
    ab, _, _ = _critic_update(tiny_llama, tok, vf_coef=0.5, value_grad_to_backbone=True)
    assert any(not torch.equal(g0, gb) for g0, gb in zip(a0, ab))


# ---- fp32 master weights under a bf16 engine ---------------------------------------------------------------------

def test_paper_profile_step_moves_the_weights_under_bf16(tiny_llama):
    """The paper profile's M-ASK actor (full fine-tuning, lr 2e-7, separate critic, lr 1e-5) in bfloat16: one optimiser
    step changes the trainable weights. In bf16 a weight of 0.02 has a spacing of 1.2e-4: AdamW's ~2e-7 step
    rounds to nothing."""
    from transformers import AutoTokenizer

    from ragteam.train.joint.actor_critic import _build_actor_critic, actor_critic_params, make_optimizer
    from ragteam.train.joint.update import ppo_update
    from ragteam.systems.params import load_joint

    pp, _, _ = load_joint(_profiles()["paper"], "mask")
    assert not pp.lora.enabled and pp.actor_lr == 2e-7 and pp.critic == "separate"
    tok = AutoTokenizer.from_pretrained(tiny_llama)
    torch.manual_seed(0)
    ac = _build_actor_critic(str(tiny_llama), pp, "cpu", torch.bfloat16)
    actor, critic = actor_critic_params(ac)
    assert all(t.dtype == torch.float32 for t in actor + critic)
    samples = _samples(tok, ret=1.0)
    _old_pass(ac, samples, tok)
    with torch.no_grad():     # the forward computes in the engine dtype (autocast), the weights stay fp32
        assert ac.policy(torch.tensor([[1, 2]])).logits.dtype == torch.float32
        with ac.autocast():
            assert ac.policy(torch.tensor([[1, 2]])).logits.dtype == torch.bfloat16
    before = [t.detach().clone() for t in actor + critic]
    opt = make_optimizer(ac, pp)
    assert [g["lr"] for g in opt.param_groups] == [2e-7, 1e-5]
    ppo_update(ac, opt, samples, pp, tok.eos_token_id, "cpu")
    for name, group, old in (("actor", actor, before[:len(actor)]), ("critic", critic, before[len(actor):])):
        moved = sum(int(((t != o) & (t.grad != 0)).sum()) for t, o in zip(group, old))
        stepped = sum(int((t.grad != 0).sum()) for t in group)
        assert stepped > 0 and moved / stepped > 0.99, (name, moved, stepped)
    # LoRA under bf16: the frozen base stays bf16 (memory), the adapters and the value head are fp32
    lp = pp.model_copy(update={"lora": pp.lora.model_copy(update={"enabled": True}), "critic": "shared_backbone"})
    lac = _build_actor_critic(str(tiny_llama), lp, "cpu", torch.bfloat16)
    la, lc = actor_critic_params(lac)
    assert la and all(t.dtype == torch.float32 for t in la + lc)
    assert all(t.dtype == torch.bfloat16 for n, t in lac.named_parameters() if not t.requires_grad)


# ---- NaN / inf gradients: skipped, counted, and a run of them stops training -------------------------------------

ROWS = [{"id": "q1", "question": "What is the capital of Xland?", "golden_answers": ["Xville"]},
        {"id": "q2", "question": "Which country is Yville in?", "golden_answers": ["Yland"]}]
PPO = {"steps": 4, "questions_per_step": 1, "minibatch_size": 16, "micro_batch_size": 4, "actor_lr": 1e-2,
       "critic_lr": 1e-2, "save_steps": 1, "lora": {"enabled": True, "rank": 4, "alpha": 8, "top_layers": 1}}


def _mask(**overrides):
    from ragteam.systems.mask import mask_system

    retr = KeywordRetriever([("Xland", "Xville is the capital of Xland."), ("Yland", "Yville is in Yland.")])
    system = mask_system({"mask": {"max_turns": 1, "top_k": 1, "passage_words": 8}}, retr)
    return replace(system, **overrides)


def _train(tmp_path, tiny_llama, system, on_step=None, **p):
    from ragteam.llm import EngineConfig, SamplingConfig
    from ragteam.train.joint.params import PPOParams
    from ragteam.train.joint.loop import train_joint_ppo

    return train_joint_ppo(system, ROWS, str(tiny_llama), tmp_path / "ckpt", PPOParams(**{**PPO, **p}),
                           EngineConfig(device="cpu", threads=1, batch_size=4),
                           {"default": SamplingConfig(max_new_tokens=4)}, on_step=on_step)


def _state(tmp_path, step):
    return torch.load(tmp_path / "ckpt" / f"checkpoint-{step}" / "state.pt", weights_only=False)


def test_nan_gradients_skip_the_step_and_two_in_a_row_stop_the_joint_run(tmp_path, tiny_llama, monkeypatch):
    import ragteam.train.joint.loop as ppo
    from ragteam.train.checkpoints import TrainingDiverged

    poison = {"on": False}
    build = ppo._build_actor_critic

    def build_with_hook(*a, **kw):     # a NaN in the policy's gradient from step 2 on, the loss itself finite
        ac = build(*a, **kw)
        for n, t in ac.named_parameters():
            if t.requires_grad and "lora_B" in n:
                t.register_hook(lambda g: g * float("nan") if poison["on"] else g)
        return ac

    monkeypatch.setattr(ppo, "_build_actor_critic", build_with_hook)
    base = _mask()
    calls = {"n": 0}

    def annotate(eps):
        calls["n"] += 1
        poison["on"] = calls["n"] >= 2
        return base.annotate(eps)

    with pytest.raises(TrainingDiverged,
                       match=r"non-finite gradients in 2 optimiser steps in a row \(up to step 3.*checkpoint-2"):
        _train(tmp_path, tiny_llama, replace(base, annotate=annotate), max_nonfinite_grad_steps=2)
    assert not (tmp_path / "ckpt" / "checkpoint-3").exists()
    s1, s2 = _state(tmp_path, 1), _state(tmp_path, 2)
    for k, t in s1["trainable"].items():            # the skipped step 2 wrote nothing into the weights
        assert torch.equal(t, s2["trainable"][k]) and bool(torch.isfinite(t).all())
    assert [st["step"] for st in s2["optimizer"]["state"].values()][0] == 1   # AdamW stepped once (step 1)
    hist = json.loads((tmp_path / "ckpt" / "checkpoint-2" / "trainer_state.json").read_text())["log_history"]
    assert [h["nonfinite_grad_steps"] for h in hist] == [0.0, 1.0]
    assert math.isfinite(hist[0]["grad_norm/policy"]) and not math.isfinite(hist[1]["grad_norm/policy"])


def test_nan_gradients_in_shared_prefix_grpo_skip_the_step_and_stop_the_run(tiny_llama, tmp_path, monkeypatch):
    import ragteam.train.grpo_prefix as G
    from ragteam.train.checkpoints import TrainingDiverged
    from ragteam.train.common import GRPOParams

    conventions = []
    real = G.group_normalized

    def spy(rewards, groups, *, std, eps):
        conventions.append((std, eps))
        return real(rewards, groups, std=std, eps=eps)

    monkeypatch.setattr(G, "group_normalized", spy)

    def reward(completions, trainer_state, **_):    # distinct rewards at step 1, NaN from step 2 on
        if trainer_state.global_step >= 1:
            return [float("nan")] * len(completions)
        return [float(i) for i in range(len(completions))]

    samples = [{"id": "q", "golden_answers": ["Paris"],
                "prompt": [{"role": "user", "content": "Capital of France?"}]}]
    params = GRPOParams(steps=4, prompts_per_step=1, num_generations=4, micro_batch_size=4, lr=1e-2,
                        max_completion_length=3, save_steps=1, trainer="shared_prefix", max_nonfinite_grad_steps=2)
    with pytest.raises(TrainingDiverged, match=r"non-finite gradients in 2 optimiser steps in a row.*checkpoint-2"):
        G.train_grpo_shared_prefix(samples, str(tiny_llama), str(tmp_path / "ck"), params, reward)
    assert set(conventions) == {("sample", 1e-4)}        # TRL's scale_rewards="group"
    s1, s2 = (torch.load(tmp_path / "ck" / f"checkpoint-{i}" / "state.pt", weights_only=False) for i in (1, 2))
    assert not (tmp_path / "ck" / "checkpoint-3").exists()
    for k, t in s1["trainable"].items():
        assert torch.equal(t, s2["trainable"][k]) and bool(torch.isfinite(t).all())
    hist = json.loads((tmp_path / "ck" / "checkpoint-2" / "trainer_state.json").read_text())["log_history"]
    assert [h["nonfinite_grad_steps"] for h in hist] == [0.0, 1.0]
    assert math.isfinite(hist[0]["grad_norm"]) and not math.isfinite(hist[1]["grad_norm"])


# ---- resume across bookkeeping-only params -----------------------------------------------------------------------

def test_joint_run_resumes_across_save_steps_and_micro_batch_size(tmp_path, tiny_llama):
    def kill_at_2(step, entry):
        if step == 2:
            raise KeyboardInterrupt("killed at step 2")

    with pytest.raises(KeyboardInterrupt):
        _train(tmp_path, tiny_llama, _mask(), on_step=kill_at_2, steps=2)
    assert (tmp_path / "ckpt" / "checkpoint-1").is_dir() and not (tmp_path / "ckpt" / "checkpoint-2").exists()
    # gradient accumulation, checkpoint cadence and the collapse flag's window do not change the maths: resume
    res = _train(tmp_path, tiny_llama, _mask(), steps=2, save_steps=5, micro_batch_size=2, collapse_window=1)
    assert res.resumed_from == 1 and res.global_step == 2 and len(res.log_history) == 2
    # what does change it starts over
    res = _train(tmp_path, tiny_llama, _mask(), steps=2, actor_lr=2e-2)
    assert res.resumed_from is None and res.global_step == 2


def test_kl_to_the_start_model_is_zero_before_the_first_update_and_grows_once_rl_moves_the_policy(tmp_path,
                                                                                                 tiny_llama):
    """`kl_start` (issue 25 §3's "KL to the start model"): LoRA's B starts at 0, so at step 1 the policy is its
    start model and the estimate is exactly 0; after updates at a large lr it is positive. Off, nothing is logged."""
    res = _train(tmp_path / "on", tiny_llama, _mask(), steps=3)
    kl = [h["kl_start"] for h in res.log_history]
    assert len(kl) == 3 and kl[0] == 0.0 and all(k >= 0 for k in kl) and max(kl[1:]) > 0, kl
    assert "kl_ref" not in res.log_history[0]           # kl_coef 0: a curve only, no KL term in the loss
    off = _train(tmp_path / "off", tiny_llama, _mask(), steps=1, log_kl_to_start=False)
    assert "kl_start" not in off.log_history[0]


# ---- M-ASK without a critic: each call's own reward within its question's rollouts (joint.mask.estimator: group) --

MASK_GROUP = {"mask": {"max_turns": 2, "top_k": 2}, "joint": {"mask": {"estimator": "group", "group_size": 2}}}


def _mask_group_rollouts(turn1_answer: str):
    """One question, 2 rollouts (the group): a_0 = Paris, turn 2 and the final answer Xville, as above; turn 1's
    answer a_1 is Xville in the first rollout and `turn1_answer` in the second (the prompts are equal, so the
    scripted engine alternates by call)."""
    from ragteam.systems.registry import build_joint

    seen = iter(range(10_000))

    def reply(role, messages):
        user = messages[-1]["content"]
        if role == M.ANSWER and "Long river" not in user:
            return turn1_answer if next(seen) % 2 else "<predicted_answer>Xville</predicted_answer>"
        return mask_reply(role, messages)

    system = build_joint("mask", MASK_GROUP, KeywordRetriever(PASSAGES))
    rows = [{"id": "q", "question": RIGHT_Q, "golden_answers": ["Xville"]}]
    return system, system.annotate(system.rollout(rows, Team(ScriptedEngine(reply))))


def test_mask_group_estimator_by_hand_a_right_and_a_wrong_turn1_answer():
    """Rewards (Eq. 2-3), right a_1 [0 | 1 1 1 1 | 0 0 0 1], wrong a_1 [0 | 0 0 0 0 | 1 1 1 1]. Pools of 2 calls
    (same role, same turn): {1, 0} -> μ = .5, sample σ = .70711, A = ±.5 / (.70711 + 1e-4) = ±.70701; {0, 0} and
    {1, 1} -> 0. The right turn-1 Answer (and the turn-1 Search, Summary and Update that led to it) gets +.707, the
    wrong one −.707; turn 2's calls of the wrong rollout, whose search fixed the answer, get +.707 (Eq. 3's ΔF1);
    Planning, equal in both, gets nothing."""
    system, (right, wrong) = _mask_group_rollouts("<predicted_answer>Paris</predicted_answer>")
    assert not system.critic and system.requires == {"normalize_advantages": False}
    assert right.question_id == wrong.question_id == "q"
    assert [c.reward for c in right.calls] == [0.0, 1.0, 1.0, 1.0, 1.0, 0.0, 0.0, 0.0, 1.0]
    assert [c.reward for c in wrong.calls] == [0.0, 0.0, 0.0, 0.0, 0.0, 1.0, 1.0, 1.0, 1.0]
    a = 0.70701
    right_adv, wrong_adv = system.advantage([right, wrong])
    assert right_adv == pytest.approx([0.0, a, a, a, a, -a, -a, -a, 0.0], abs=1e-5)
    assert wrong_adv == pytest.approx([0.0, -a, -a, -a, -a, a, a, a, 0.0], abs=1e-5)
    # the turn-1 Answer's advantage depends on its own answer only: the same pools with the rollouts swapped
    assert system.advantage([wrong, right]) == [wrong_adv, right_adv]


def test_mask_group_estimator_on_degenerate_outputs():
    from ragteam.systems.mask import mask_group_advantages

    # an empty answer tag at turn 1 scores below the right answer, never above it (F1 0, or the format penalty)
    system, (right, empty) = _mask_group_rollouts("<predicted_answer></predicted_answer>")
    ans1 = [next(i for i, c in enumerate(ep.calls) if c.role == M.ANSWER and c.meta["turn"] == 1)
            for ep in (right, empty)]
    r_adv, e_adv = system.advantage([right, empty])
    assert empty.calls[ans1[1]].reward < right.calls[ans1[0]].reward
    assert e_adv[ans1[1]] < 0 < r_adv[ans1[0]]
    # every call malformed in both rollouts (stubs): equal rewards -1 in every pool, no signal anywhere
    eps, _, _ = _garbled_pair()
    assert all(c.reward == -1.0 for ep in eps for c in ep.calls)
    assert all(x == 0.0 for adv in mask_group_advantages(eps) for x in adv)
    # a rollout alone (no other rollout of its question) has no group: 0; a call without a reward is refused
    assert all(x == 0.0 for x in mask_group_advantages([right])[0])
    right.calls[0].reward = None
    with pytest.raises(ValueError, match="without a reward"):
        mask_group_advantages([right, empty])


def _garbled_pair():
    from ragteam.systems.registry import build_joint

    system = build_joint("mask", MASK_GROUP, KeywordRetriever(PASSAGES))
    rows = [{"id": "g", "question": "garbled question about Xland?", "golden_answers": ["Xville"]}]
    eps = system.annotate(system.rollout(rows, Team(ScriptedEngine(mask_reply))))
    return eps, system, rows


def test_mask_group_estimator_params_and_rollouts():
    from ragteam.config import ParamsError
    from ragteam.systems.registry import build_joint

    eps, system, _ = _garbled_pair()
    assert [ep.question_id for ep in eps] == ["g", "g"]          # G = 2 consecutive rollouts of the one question
    assert "mask_group_advantages" in system.describe["advantage"]
    gae = build_joint("mask", {"mask": MASK_GROUP["mask"]}, KeywordRetriever(PASSAGES))
    assert gae.critic and gae.gae_scope == "call"                 # the default: the paper's critic
    for bad, match in (({"estimator": "group", "group_size": 1}, "group_size >= 2"),
                       ({"estimator": "gae", "group_size": 4}, "apply to estimator group only"),
                       ({"estimator": "critic"}, "estimator")):
        with pytest.raises(ParamsError, match=match):
            build_joint("mask", {"mask": MASK_GROUP["mask"], "joint": {"mask": bad}}, KeywordRetriever(PASSAGES))


def test_one_mask_group_step_trains_without_a_critic(tmp_path, tiny_llama):
    from ragteam.systems.registry import build_joint

    retr = KeywordRetriever([("Xland", "Xville is the capital of Xland."), ("Yland", "Yville is in Yland.")])
    system = build_joint("mask", {"mask": {"max_turns": 1, "top_k": 1, "passage_words": 8},
                                   "joint": {"mask": {"estimator": "group", "group_size": 2}}}, retr)
    res = _train(tmp_path, tiny_llama, system, steps=1, questions_per_step=2, normalize_advantages=False)
    (e,) = res.log_history
    assert "value_loss" not in e and "explained_variance" not in e
    # the value head is never trained (it stays at its zero init; a GAE step moves it: tests/test_train_jade.py)
    assert all(float(t.abs().max()) == 0.0 for t in res.extra["value_head"].values())
    assert e["groups"] == 2.0 and "reward_group_std" in e and e["optimizer_steps"] >= 1.0
