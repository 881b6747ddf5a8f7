"""JADE on the joint PPO trainer (Alg. 2): the system's rewards (Eq. 6-8) on rollouts of the replayed case studies,
GAE over the flattened call sequence (the terminal reward reaches the round-1 planner), one PPO step end to end on a
tiny random Llama, and the shipped params / pipeline entries."""
from __future__ import annotations

from pathlib import Path

import pytest
import torch
import yaml
from helpers_agents import KeywordRetriever, ScriptedEngine
from test_agents_jade import CASE1_Q, CASE2_Q, PASSAGES, REWRITE2, case_reply, case_rows

from ragteam.config import deep_merge
from ragteam.llm import Team
from ragteam.systems.registry import build_joint
from ragteam.systems.jade import roles as jade
from ragteam.systems.jade import REWARD_TEXT

REPO = Path(__file__).resolve().parents[1]
CASE1_ROLES = [jade.PLANNER, jade.QDS, jade.QR, jade.PLANNER, jade.AG, jade.QR, jade.PLANNER, jade.DS, jade.AG,
               jade.AS]
# α = .3, β = .6, M = 3, format penalty 2 (the official code's):
#   Case 1: 3 rounds, 2 retrievals -> R_global = 1 - .3·3/3 - .6·2/3 = 0.3
#   Case 2: 1 round, 1 retrieval   -> R_global = 1 - .3·1/3 - .6·1/3 = 0.7
REWARD = {"alpha": 0.3, "beta": 0.6, "cost_max": 3, "format_penalty": 2.0}
R1, R2 = 0.3, 0.7


def _system(reply=case_reply):
    params = {"jade": {"top_k": 5, "reward": REWARD}}
    system = build_joint("jade", params, KeywordRetriever(PASSAGES))
    return system, system.annotate(system.rollout(case_rows(), Team(ScriptedEngine(reply))))


def _malformed(role, m):
    """Case 1's Document Selector and Case 2's Answer Generator drop their tags (both still fall back)."""
    if role == jade.DS and f"Question: {REWRITE2}" in m[-1]["content"]:
        return "Document0, Document1"
    if role == jade.AG and f"Question: {CASE2_Q}" in m[-1]["content"]:
        return "1982"
    return case_reply(role, m)


def test_terminal_reward_only_on_the_last_call_of_each_episode():
    system, (c1, c2) = _system()
    assert system.name == "jade" and system.roles == jade.ROLES and "Eq. 6-8" in REWARD_TEXT
    assert [c.role for c in c1.calls] == CASE1_ROLES and [c.role for c in c2.calls] == [jade.PLANNER, jade.DS,
                                                                                          jade.AG]
    assert [c.reward for c in c1.calls] == pytest.approx([0.0] * 9 + [R1])      # AS: F1 1 minus the costs
    assert [c.reward for c in c2.calls] == pytest.approx([0.0, 0.0, R2])        # AG ends a Plan-Solve round
    # the trainer's per-step figures of JADE
    stats = {k: [f(ep) for ep in (c1, c2)] for k, f in system.stats.items()}
    assert stats["turns"] == [3.0, 1.0] and stats["searches"] == [2.0, 1.0] and stats["ds_calls"] == [1.0, 1.0]
    assert stats["decomposed"] == [1.0, 0.0] and stats["decompose_share"] == pytest.approx([1 / 3, 0.0])
    assert stats["ds_per_round"] == pytest.approx([1 / 3, 1.0]) and stats["max_rounds_hit"] == [0.0, 0.0]
    assert stats["r_global"] == pytest.approx([R1, R2])


def test_format_penalties_land_on_the_malformed_calls():
    _, (c1, c2) = _system(_malformed)
    bad1 = [i for i, c in enumerate(c1.calls) if c.format_error is not None]
    assert bad1 == [7] and c1.calls[7].role == jade.DS and c1.calls[7].meta["fallback"] == "all candidates"
    assert [c.reward for c in c1.calls] == pytest.approx([0.0] * 7 + [-2.0, 0.0, R1])
    # the terminal AG is malformed too: its penalty and R_global add (its fallback answer still scores F1 1)
    assert c2.calls[2].format_error is not None and c2.final_answer == "1982"
    assert [c.reward for c in c2.calls] == pytest.approx([0.0, 0.0, -2.0 + R2])


def _samples(episodes, tok):
    from ragteam.train.joint.batch import episode_samples

    samples = episode_samples(tok, episodes)
    for s in samples:
        s.values = torch.zeros(len(s.response_ids))                          # a zero critic
    return samples


def _per_call(samples, episode):
    return [s.advantages for s in samples if s.episode == episode], [s.returns for s in samples
                                                                      if s.episode == episode]


def test_gae_over_the_flattened_calls_gives_the_round1_planner_the_terminal_reward(smollm2_dir):
    from transformers import AutoTokenizer

    from ragteam.train.joint.params import PPOParams
    from ragteam.train.joint.update import assign_advantages

    tok = AutoTokenizer.from_pretrained(smollm2_dir)
    p = PPOParams(steps=1, questions_per_step=2, minibatch_size=8, actor_lr=1e-3, critic_lr=1e-3, gamma=1.0,
                  lam=1.0, normalize_advantages=False)
    # terminal reward only: with γ = λ = 1 and V = 0 every token of every call has advantage = return = R_global
    system, eps = _system()
    assert system.gae_scope == "episode"          # JADE's reward sits on the terminal call: GAE over the episode
    samples = _samples(eps, tok)
    assert len(samples) == 13 and len({len(s.response_ids) for s in samples}) > 1
    assign_advantages(samples, p, system.gae_scope)
    for ei, r in ((0, R1), (1, R2)):
        adv, ret = _per_call(samples, ei)
        assert len(adv) == (10 if ei == 0 else 3)
        for a, g in zip(adv, ret):
            assert a.tolist() == pytest.approx([r] * len(a)) and g.tolist() == pytest.approx([r] * len(g))
    planner = next(s for s in samples if s.episode == 0 and s.call == 0)
    assert planner.role == jade.PLANNER and planner.advantages.tolist() == pytest.approx(
        [R1] * len(planner.response_ids))
    # with format penalties each call's advantage is its reward-to-go: the calls before the bad DS carry it
    _, bad = _system(_malformed)
    samples = _samples(bad, tok)
    assign_advantages(samples, p, system.gae_scope)
    adv, _ = _per_call(samples, 0)
    assert [float(a[0]) for a in adv] == pytest.approx([-2.0 + R1] * 8 + [R1, R1])
    assert all(float(a.max() - a.min()) < 1e-6 for a in adv)                   # one value across a call's tokens
    assert [float(a[0]) for a in _per_call(samples, 1)[0]] == pytest.approx([-2.0 + R2] * 3)
    # scope "call" (the official code's per-response samples) would give the planner nothing
    samples = _samples(eps, tok)
    assign_advantages(samples, p, "call")
    assert float(samples[0].advantages.abs().max()) == 0.0 and float(samples[9].advantages[-1]) == pytest.approx(R1)


def test_one_jade_ppo_step_from_rollouts_to_a_checkpoint(tiny_llama, tmp_path):
    from ragteam.llm import EngineConfig, SamplingConfig
    from ragteam.train.joint.params import PPOParams
    from ragteam.train.joint.loop import train_joint_ppo

    params = {"jade": {"top_k": 2, "passage_words": 8, "reward": {"format_penalty": 1.0}}}
    system = build_joint("jade", params, KeywordRetriever(PASSAGES))
    rows = [{"id": "c1", "question": CASE1_Q, "golden_answers": ["American"]},
            {"id": "c2", "question": CASE2_Q, "golden_answers": ["1982"]}]
    p = PPOParams(steps=1, questions_per_step=2, minibatch_size=4, micro_batch_size=2, actor_lr=1e-2,
                  critic_lr=1e-2, lora={"enabled": True, "rank": 4, "alpha": 8, "top_layers": 1})
    res = train_joint_ppo(system, rows, str(tiny_llama), tmp_path / "ckpt", p,
                          EngineConfig(device="cpu", threads=1, batch_size=4),
                          {"default": SamplingConfig(max_new_tokens=5)})
    assert res.global_step == 1 and (tmp_path / "ckpt" / "checkpoint-1" / "state.pt").is_file()
    (e,) = res.log_history
    # a random model writes no tags: every plan falls back to R,AG and its planner call pays the penalty
    assert e["reward/jade_planner"] == -1.0 and e["calls_per_episode"] == 2.0
    assert e["turns"] == 1.0 and e["searches"] == 1.0 and e["decompose_share"] == 0.0 and e["ds_calls"] == 0.0
    assert e["format_error_rate"] == 1.0 and "reward/jade_ag" in e and "r_global" in e
    for key in ("policy_loss", "value_loss", "grad_norm/policy", "grad_norm/critic", "explained_variance",
                "clip_frac", "advantage_abs_raw", "advantage_abs"):
        assert key in e, key
    # the critic's values make every raw advantage R - V non-zero; whitened they keep a unit-scale magnitude
    assert e["advantage_abs_raw"] > 0 and 0 < e["advantage_abs"] <= 1.0 + 1e-6
    assert "reward_group_std" not in e          # one rollout a question: no group to spread in
    # 4 samples in minibatches of 4: one optimiser step moved the LoRA B matrices (zero at init) and the value head
    lora_b = [t for n, t in res.model.named_parameters() if "lora_B" in n]
    assert lora_b and any(float(t.detach().abs().max()) > 0 for t in lora_b)
    assert float(res.extra["value_head"]["bias"].abs().max()) > 0


# ---- the critic-free alternative: GRPO's outcome advantage over G rollouts of each question ---------------------

def _group_system(g=2, reply=case_reply):
    params = {"jade": {"top_k": 5, "reward": REWARD},
              "joint": {"jade": {"estimator": "group", "group_size": g}}}
    system = build_joint("jade", params, KeywordRetriever(PASSAGES))
    return system, system.annotate(system.rollout(case_rows(), Team(ScriptedEngine(reply))))


def test_group_estimator_by_hand_a_right_and_a_wrong_rollout_of_one_question():
    from ragteam.train.advantages import outcome_group_advantages

    # one question, two rollouts: right (R_global 0.7, 3 calls) and wrong with a malformed call (0 - 2, 2 calls).
    # μ = -0.65, sample σ = |0.7 + 1.3| / √2 = 1.41421; A = ±1.35 / (1.41421 + 1e-4) = ±0.70706 on every call
    adv = outcome_group_advantages([0.7, -1.3], ["q", "q"], [3, 2])
    assert adv[0] == pytest.approx([0.70706] * 3, abs=1e-5) and adv[1] == pytest.approx([-0.70706] * 2, abs=1e-5)
    # the right rollout's every call, the round-1 planner included, is pushed up; the wrong one's down
    # degenerate groups carry no signal: all equal (both empty answers, both stubs) or a rollout alone
    assert outcome_group_advantages([-1.0, -1.0], ["q", "q"], [1, 1]) == [[0.0], [0.0]]
    assert outcome_group_advantages([0.7], ["q"], [4]) == [[0.0] * 4]
    # groups do not mix: a hard question's rollouts are compared with each other only
    a = outcome_group_advantages([0.7, 0.0, 0.2, 0.1], ["easy", "easy", "hard", "hard"], [1, 1, 1, 1])
    assert a[0][0] > 0 > a[1][0] and a[2][0] > 0 > a[3][0] and a[2][0] == pytest.approx(a[0][0], abs=1e-3)
    with pytest.raises(ValueError, match="2 returns for 1 call counts"):
        outcome_group_advantages([0.1, 0.2], ["q", "q"], [1])


def test_group_estimator_rolls_out_each_question_g_times_and_credits_every_call_with_its_episode_return():
    system, eps = _group_system(g=2, reply=_malformed)
    assert not system.critic and system.requires == {"normalize_advantages": False}
    assert [ep.question_id for ep in eps] == [eps[0].question_id] * 2 + [eps[2].question_id] * 2
    adv = system.advantage(eps)
    assert [len(a) for a in adv] == [len(ep.calls) for ep in eps]
    # the scripted engine answers every rollout of a question alike: equal returns, no spread, A = 0 everywhere
    assert all(x == 0.0 for a in adv for x in a)
    # make the two rollouts of case 2 differ: the first right (R_global 0.7), the second malformed (0.7 - 2)
    replies = iter(range(10_000))

    def alternating(role, m):
        if role == jade.AG and f"Question: {CASE2_Q}" in m[-1]["content"] and next(replies) % 2:
            return "1982"                               # no tags: a format error, the fallback still answers
        return case_reply(role, m)

    system, eps = _group_system(g=2, reply=alternating)
    c2 = [i for i, ep in enumerate(eps) if ep.question == CASE2_Q]
    from ragteam.rewards.team import episode_return
    rets = [episode_return(eps[i]) for i in c2]
    assert sorted(rets) == pytest.approx([R2 - 2.0, R2])
    adv = system.advantage(eps)
    good, bad = (c2[0], c2[1]) if rets[0] > rets[1] else (c2[1], c2[0])
    assert all(x == pytest.approx(0.70707, abs=1e-4) for x in adv[good])      # ±(2 / 2) / (√2 + 1e-4)
    assert all(x == pytest.approx(-0.70707, abs=1e-4) for x in adv[bad])
    c1 = [i for i, ep in enumerate(eps) if ep.question == CASE1_Q]
    assert all(x == 0.0 for i in c1 for x in adv[i])     # case 1's two rollouts are equal: no signal


def test_group_estimator_params_are_checked():
    from ragteam.config import ParamsError

    for bad, match in (({"estimator": "group", "group_size": 1}, "group_size >= 2"),
                       ({"estimator": "gae", "group_size": 4}, "apply to estimator group only"),
                       ({"estimator": "critic"}, "estimator")):
        with pytest.raises(ParamsError, match=match):
            build_joint("jade", {"jade": {"reward": REWARD}, "joint": {"jade": bad}}, KeywordRetriever(PASSAGES))


def test_one_group_step_logs_the_spread_in_groups_and_the_advantage_magnitude(tiny_llama, tmp_path):
    from ragteam.llm import EngineConfig, SamplingConfig
    from ragteam.train.joint.params import PPOParams
    from ragteam.train.joint.loop import train_joint_ppo

    params = {"jade": {"top_k": 2, "passage_words": 8, "reward": {"format_penalty": 1.0}},
              "joint": {"jade": {"estimator": "group", "group_size": 3}}}
    system = build_joint("jade", params, KeywordRetriever(PASSAGES))
    rows = [{"id": "c1", "question": CASE1_Q, "golden_answers": ["American"]},
            {"id": "c2", "question": CASE2_Q, "golden_answers": ["1982"]}]
    p = PPOParams(steps=1, questions_per_step=2, minibatch_size=16, micro_batch_size=4, actor_lr=1e-2,
                  critic_lr=1e-2, normalize_advantages=False, temperature=1.0,
                  lora={"enabled": True, "rank": 4, "alpha": 8, "top_layers": 1})
    res = train_joint_ppo(system, rows, str(tiny_llama), tmp_path / "ckpt", p,
                          EngineConfig(device="cpu", threads=1, batch_size=4),
                          {"default": SamplingConfig(max_new_tokens=5)})
    (e,) = res.log_history
    assert e["calls_per_episode"] == 2.0 and "value_loss" not in e and "explained_variance" not in e
    # 2 questions x 3 rollouts; a random model fails every format alike: no spread, every advantage 0
    assert e["reward_group_std"] == 0.0 and e["groups_with_spread"] == 0.0
    assert e["advantage_abs_raw"] == e["advantage_abs"] == 0.0 and e["zero_advantage"] == 1.0
    # 12 calls in one minibatch of 16, one epoch: one on-policy optimiser step, where nothing can clip
    assert e["optimizer_steps"] == 1.0 and e["clip_frac"] == 0.0
    more = train_joint_ppo(system, rows, str(tiny_llama), tmp_path / "ckpt3",
                           p.model_copy(update={"ppo_epochs": 2, "minibatch_size": 5}),
                           EngineConfig(device="cpu", threads=1, batch_size=4),
                           {"default": SamplingConfig(max_new_tokens=5)})
    assert more.log_history[0]["optimizer_steps"] == 6.0        # 2 epochs x ceil(12 / 5) minibatches
    with pytest.raises(ValueError, match="normalize_advantages"):
        train_joint_ppo(system, rows, str(tiny_llama), tmp_path / "ckpt2", p.model_copy(
            update={"normalize_advantages": True}), EngineConfig(device="cpu", threads=1, batch_size=4),
            {"default": SamplingConfig(max_new_tokens=5)})


# ---- the shipped params and pipeline entries ----------------------------------------------------------------------

def test_shipped_params_train_jade_on_both_profiles():
    from ragteam.systems.params import load_joint
    from stages.train_joint import panels

    params = yaml.safe_load((REPO / "params.yaml").read_text())
    ppo, jp, sp = load_joint(params, "jade")
    assert "jade" in jp.systems and ppo.gamma == ppo.lam == 1.0
    assert ppo.lora.enabled and ppo.steps * ppo.questions_per_step <= 16 and sp.max_questions > 0
    paper = deep_merge(params, yaml.safe_load((REPO / "profiles" / "paper.yaml").read_text()))
    pp, _, psp = load_joint(paper, "jade")
    # JADE's official launch script (jade.md §12): actor lr 5e-7, critic 1e-5, batch 128, mini-batch 32, no KL
    assert (pp.actor_lr, pp.critic_lr, pp.questions_per_step, pp.minibatch_size, pp.kl_coef) == (
        5e-7, 1e-5, 128, 32, 0.0)
    assert pp.critic == "separate" and not pp.lora.enabled
    assert psp.max_questions == 0
    layout = panels(jade.ROLES, True, ["turns", "searches", "ds_calls", "r_global"])
    assert layout[0] == ("reward per role", [f"reward/{r}" for r in jade.ROLES])
    assert layout[-1] == ("system figures", ["ds_calls", "r_global"])


def test_pipeline_evaluates_and_registers_the_trained_jade_policy():
    from ragteam.config import parse_section
    from ragteam.eval.evaluate import EvalConfig

    params = yaml.safe_load((REPO / "params.yaml").read_text())
    ev = parse_section(params, "eval", EvalConfig)
    assert ev.systems["jade_trained"].workflow == "jade" and ev.systems["jade_trained"].model == "models/agents/jade"
    dvc = yaml.safe_load((REPO / "dvc.yaml").read_text())
    # evaluate depends on the checkpoints as a directory, so it waits for train_joint@jade (and would not, were jade
    # left out of joint.systems: tests/test_eval_joint_rows.py)
    from ragteam.lineage import build_graph, load_stages

    assert "models/agents" in dvc["stages"]["evaluate"]["deps"]
    assert "train_joint@jade" in build_graph(load_stages(REPO))["evaluate"]
    assert dvc["artifacts"]["jade-agent"]["path"] == "models/agents/jade"
