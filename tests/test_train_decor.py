"""train_joint@decor on the one policy-gradient core: the sequence-level ratio of Eq. 5 with clip-higher against hand
values, the DECOR system adapter (G rollouts per question, frozen summarizer, dynamic sampling on the role returns
with refills), one step end to end to a checkpoint with the Eq. 6 advantages, and a step whose groups are all dropped
(a clear skip, no NaN).
The policy is a tiny random Llama with the SmolLM2 tokenizer: the machinery, not the model, is under test."""
from __future__ import annotations

import json
import math
import re
from dataclasses import replace
from functools import partial

import pytest
import torch
from helpers_agents import KeywordRetriever, ScriptedEngine

from ragteam.llm import EngineConfig, SamplingConfig, Team
from ragteam.records import AgentCall, Episode
from ragteam.systems.decor import roles as D
from ragteam.train.pg import policy_loss

# ---- Eq. 5: sequence-level ratio, clip-higher, each sequence weighing the same (Eq. 4) ---------------------------


def _two_sequences():
    # sequence A: 2 tokens, log-ratios .1, .3 (a padded 3rd token with junk); sequence B: 3 tokens, -.4, -.2, -.3
    old = torch.zeros(2, 3)
    logp = torch.tensor([[0.1, 0.3, 5.0], [-0.4, -0.2, -0.3]], requires_grad=True)
    adv = torch.tensor([[1.0, 1.0, 50.0], [-1.0, -1.0, -1.0]])
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 1.0, 1.0]])
    return logp, old, adv, mask


def test_sequence_ratio_with_clip_higher_by_hand():
    logp, old, adv, mask = _two_sequences()
    ra, rb = math.exp(0.2), math.exp(-0.3)          # exp(mean log-ratio): 1.2214, 0.7408
    # ε_low .2, ε_high .28: A's ratio 1.2214 lies inside [.8, 1.28] -> -1.2214; B (A = -1): max(.7408, .8) = .8
    loss, st = policy_loss(logp, old, adv, mask, eps_low=0.2, eps_high=0.28, ratio_level="sequence",
                           agg="seq_mean_token_mean")
    assert float(loss.detach()) == pytest.approx((-ra + 0.8) / 2, rel=1e-6)
    assert st["clip_frac"] == pytest.approx(3 / 5)                  # B's 3 tokens of 5 are clipped
    # symmetric ε = .2 clips A at 1.2 as well
    sym, _ = policy_loss(logp, old, adv, mask, eps_low=0.2, ratio_level="sequence", agg="seq_mean_token_mean")
    assert float(sym.detach()) == pytest.approx((-1.2 + 0.8) / 2, rel=1e-6)
    # token_mean weighs B's 3 tokens against A's 2
    tok, _ = policy_loss(logp, old, adv, mask, eps_low=0.2, eps_high=0.28, ratio_level="sequence")
    assert float(tok.detach()) == pytest.approx((2 * -ra + 3 * 0.8) / 5, rel=1e-6)
    # gradient: d/d logp_A,t of -(1/2)·exp(mean_A) = -(1/2)·ra·(1/2) on each of A's tokens; B is clipped: 0
    loss.backward()
    g = logp.grad
    assert g[0, :2].tolist() == pytest.approx([-ra / 4] * 2, rel=1e-6) and float(g[0, 2]) == 0.0
    assert g[1].abs().sum() == 0.0


def test_paper_clip_range_3e4_4e4_by_hand():
    logp, old, adv, mask = _two_sequences()
    loss, st = policy_loss(logp.detach(), old, adv, mask, eps_low=3e-4, eps_high=4e-4, ratio_level="sequence",
                           agg="seq_mean_token_mean")
    # A: 1.2214 -> 1 + 4e-4 (A > 0: -min(r, 1.0004)); B: 0.7408 -> 1 - 3e-4 (A < 0: max(r, 0.9997))
    assert float(loss) == pytest.approx((-(1 + 4e-4) + (1 - 3e-4)) / 2, abs=1e-7)   # float32
    assert st["clip_frac"] == 1.0
    # inside the range nothing is clipped: a sequence ratio exp(2e-4)
    small = torch.tensor([[1e-4, 3e-4, 0.0]])
    l2, st2 = policy_loss(small, torch.zeros(1, 3), torch.ones(1, 3), torch.tensor([[1.0, 1.0, 0.0]]),
                          eps_low=3e-4, eps_high=4e-4, ratio_level="sequence", agg="seq_mean_token_mean")
    assert float(l2) == pytest.approx(-math.exp(2e-4), abs=1e-7) and st2["clip_frac"] == 0.0


# ---- the system adapter ----------------------------------------------------------------------------------------

PASSAGES = [("Beta City", "Beta City is the capital of Gamma."),
            ("Red Sky", "Red Sky is a song written by Dana Low.")]
ROWS = [{"id": "gamma", "question": "What is the capital of Gamma?", "golden_answers": ["Beta City"]},
        {"id": "sky", "question": "Who wrote Red Sky?", "golden_answers": ["Dana Low"]}]
# the Answerer's reply to the k-th trajectory of each question: Gamma all right (R_team 1), Red Sky half right
ANSWERS = {"What is the capital of Gamma?": ["Beta City"] * 4,
           "Who wrote Red Sky?": ["Dana Low", "Omega", "Dana Low", "Gamma"]}


def scripted_team() -> tuple[Team, ScriptedEngine]:
    seen: dict[str, int] = {}

    def reply(role, m):
        text = m[0]["content"]
        if role == "decor_planner":
            if "Search 1:" in text:
                return "<think>enough</think>\n<search>None</search>"
            q = re.search(r"^query: (.*)$", text, re.MULTILINE).group(1)
            return f"<think>need the fact</think>\n<search>{q}</search>"
        if role == "decor_filter":
            return "<think>keep it</think>\n<filter>Beta City is the capital of Gamma; Dana Low wrote Red Sky.</filter>"
        if role == "decor_answerer":
            q = re.search(r"^- User's query: (.*)$", text, re.MULTILINE).group(1)
            k = seen.get(q, 0)
            seen[q] = k + 1
            return f"<think>from memory</think>\n<answer>{ANSWERS[q][k]}</answer>"
        raise AssertionError(role)

    engine = ScriptedEngine(reply)
    return Team(engine), engine


def decor_params(**decor):
    return {"decor": {"t_max": 2, "top_k": 1, "passage_words": 12, "l_max": 256, "group_size": 4, **decor}}


def test_decor_system_rolls_out_g_per_question_and_filters_on_role_returns():
    from ragteam.systems.decor import REWARD_TEXT, decor_system

    system = decor_system(decor_params(), KeywordRetriever(PASSAGES))
    assert system.roles == ("decor_planner", "decor_filter", "decor_answerer") and not system.critic
    assert system.frozen_roles == {"decor_summarizer": None}            # judge: rules needs no model
    assert system.requires["ratio_level"] == "sequence" and "Eq. 6" in REWARD_TEXT
    team, engine = scripted_team()
    eps = system.annotate(system.rollout(ROWS, team))
    assert [e.question_id for e in eps] == ["gamma"] * 4 + ["sky"] * 4
    assert engine.steps("decor_answerer") == [8]                        # all 2 x G episodes in one batched call
    assert [e.meta["reward"]["team"] for e in eps] == [1.0] * 4 + [1.0, 0.0, 1.0, 0.0]
    kept = system.select(eps)
    assert [e.question_id for e in kept] == ["sky"] * 4     # Gamma: all right, every role's return equal: dropped
    # what decides is the role returns, not R_team: equal returns drop the group whatever its R_team; an LLM judge
    # is a frozen role as well; dynamic sampling off keeps everything
    for e in eps[4:]:
        for c in e.calls:
            c.reward = -1.0 if c.reward is not None else None
    assert system.select(eps) == [] and system.max_rollout_rounds == 10      # DecorConfig's default (DAPO's 10)
    llm = decor_system(decor_params(judge="llm", dynamic_sampling={"enabled": False}), KeywordRetriever(PASSAGES))
    assert llm.frozen_roles == {"decor_summarizer": None, "decor_judge": None} and llm.select is None


def test_system_requirements_are_checked_against_the_params(tmp_path):
    from ragteam.config import ParamsError
    from ragteam.train.joint.params import PPOParams
    from ragteam.train.joint.loop import train_joint_ppo
    from ragteam.systems.decor import decor_system

    system = decor_system(decor_params(), KeywordRetriever(PASSAGES))
    p = PPOParams(**{**PPO, "ratio_level": "token"})
    with pytest.raises(ParamsError, match="ratio_level is 'token' but decor's estimator needs 'sequence'"):
        train_joint_ppo(system, ROWS, "unused", tmp_path, p, EngineConfig(device="cpu"))


def test_params_profile_and_eval_wiring():
    from pathlib import Path

    from ragteam.systems.decor.workflow import DecorConfig
    from ragteam.config import deep_merge, load_params, parse_section
    from ragteam.eval.evaluate import EvalConfig, role_models
    from ragteam.profiles import check_keys, load_profile
    from ragteam.systems.params import load_joint

    repo = Path(__file__).resolve().parents[1]
    params = load_params(repo / "params.yaml")
    ppo, jp, sp = load_joint(params, "decor")
    assert "decor" in jp.systems and ppo.ratio_level == "sequence" and not ppo.normalize_advantages
    assert ppo.clip_eps_high > ppo.clip_eps and ppo.loss_agg == "seq_mean_token_mean"
    profile = load_profile("paper", repo / "profiles")
    check_keys(params, profile)                       # every key of the profile exists in params.yaml
    paper = deep_merge(params, profile)
    pp, _, _ = load_joint(paper, "decor")
    assert (pp.actor_lr, pp.lr_scheduler, pp.adam_betas, pp.steps, pp.clip_eps, pp.clip_eps_high, pp.kl_coef) == (
        2e-6, "cosine", (0.9, 0.95), 200, 3e-4, 4e-4, 0.0)
    assert pp.questions_per_step == 64 and pp.ratio_level == "sequence"
    assert parse_section(paper, "decor", DecorConfig).group_size == 8
    ev = parse_section(params, "eval", EvalConfig)
    models = role_models(ev.systems["decor_trained"], ev.agents)
    assert models == {r: "models/agents/decor" for r in ("decor_planner", "decor_filter", "decor_answerer")}


# ---- the loop on a tiny random Llama ----------------------------------------------------------------------------

PPO = {"steps": 1, "questions_per_step": 2, "minibatch_size": 8, "micro_batch_size": 4, "actor_lr": 5e-2,
       "critic_lr": 1e-3, "save_steps": 1, "ratio_level": "sequence", "clip_eps": 3e-4, "clip_eps_high": 4e-4,
       "loss_agg": "seq_mean_token_mean", "normalize_advantages": False, "adam_betas": (0.9, 0.95),
       "lora": {"enabled": True, "rank": 4, "alpha": 8, "top_layers": 1}}


def _train(tmp_path, model_dir, system, **ppo):
    from ragteam.train.joint.params import PPOParams
    from ragteam.train.joint.loop import train_joint_ppo

    p = PPOParams(**{**PPO, **ppo})
    sampling = {"default": SamplingConfig(max_new_tokens=4)}
    return train_joint_ppo(system, ROWS, str(model_dir), tmp_path / "ckpt", p,
                           EngineConfig(device="cpu", threads=1, batch_size=8), sampling)


def test_one_decor_step_end_to_end_to_a_checkpoint(tmp_path, tiny_llama, monkeypatch):
    """Scripted rollouts (well-formed, one group all right, one half right), the real trainer on the tiny policy:
    only the half-right group trains, every call with its Eq. 6 advantage, two optimiser steps (the second one
    off-policy, so the sequence ratio moves), a checkpoint."""
    import ragteam.train.joint.update as ppo_mod
    from ragteam.train.decor_adv import decor_advantages
    from ragteam.systems.decor import decor_system

    base = decor_system(decor_params(), KeywordRetriever(PASSAGES))
    team, _ = scripted_team()
    system = replace(base, rollout=lambda rows, _policy_team: base.rollout(rows, team))
    seen = {}
    real_update = ppo_mod.ppo_update

    def spy(model, opt, samples, p, *a, **kw):
        seen["samples"] = list(samples)
        seen["critic"] = kw["critic"]
        return real_update(model, opt, samples, p, *a, **kw)

    monkeypatch.setattr(ppo_mod, "ppo_update", spy)
    res = _train(tmp_path, tiny_llama, system)
    e = res.log_history[0]
    assert (e["groups"], e["groups_trained"], e["episodes_trained"], e["skipped_update"]) == (2, 1, 4, 0)
    assert seen["critic"] is False
    samples = seen["samples"]
    # the Red Sky group: per trajectory Planner (search, stop), Filter, Answerer = 4 calls x 4 trajectories
    assert len(samples) == 16 and {s.role for s in samples} == {"decor_planner", "decor_filter", "decor_answerer"}
    # each call's advantage is Eq. 6 on the kept group, the same on every token
    eps = {}
    for s in samples:
        eps.setdefault(s.episode, []).append(s)
    # rebuild the episodes' rewards from the samples (annotated by the system) and compare with decor_advantages
    fake = []
    for k in sorted(eps):
        ep = Episode(question_id="sky", question="q", golden_answers=["x"])
        for s in eps[k]:
            ep.add_call(AgentCall(role=s.role, prompt=[], reward=s.reward))
        fake.append(ep)
    expect = decor_advantages(fake, D.POLICY_ROLES)
    for k, ep_adv in zip(sorted(eps), expect):
        for s, a in zip(eps[k], ep_adv):
            assert s.advantages.tolist() == pytest.approx([a] * len(s.response_ids))
    answers = [s for s in samples if s.role == "decor_answerer"]
    assert [float(s.advantages[0]) > 0 for s in answers] == [True, False, True, False]
    assert all(math.isfinite(e[k]) for k in ("policy_loss", "clip_frac", "grad_norm/policy", "ratio_mean"))
    assert "value_loss" not in e and "explained_variance" not in e
    assert 0 < e["clip_frac"]                       # the second minibatch is off-policy: ε 3e-4 / 4e-4 clips
    ck = tmp_path / "ckpt" / "checkpoint-1"
    assert (ck / "state.pt").exists()
    state = torch.load(ck / "state.pt", weights_only=False)
    assert state["trainable"] and not any(k.startswith("value_head") for k in state["trainable"])
    assert state["optimizer"]["param_groups"][0]["betas"] == (0.9, 0.95)
    assert len(state["optimizer"]["param_groups"]) == 1                 # no critic parameters
    assert json.loads((ck / "trainer_state.json").read_text())["global_step"] == 1


def test_a_step_whose_groups_are_all_dropped_is_skipped_cleanly(tmp_path, tiny_llama):
    """Live rollouts of the random policy: nothing is well formed, every trajectory is truncated (R_team 0 in
    every group), dynamic sampling keeps nothing: no optimiser step, no NaN, the step still logs and checkpoints;
    the frozen summarizer never becomes a sample."""
    from ragteam.systems.decor import decor_system

    system = decor_system(decor_params(), KeywordRetriever(PASSAGES))
    res = _train(tmp_path, tiny_llama, system, steps=2)
    assert res.global_step == 2 and len(res.log_history) == 2
    for e in res.log_history:
        assert (e["skipped_update"], e["groups_trained"], e["episodes_trained"]) == (1, 0, 0)
        assert e["reward"] == -1.0 and e["format_error_rate"] == 1.0
        assert "policy_loss" not in e and "grad_norm/policy" not in e
        assert all(not isinstance(v, float) or math.isfinite(v) for v in e.values())
    state = torch.load(tmp_path / "ckpt" / "checkpoint-2" / "state.pt", weights_only=False)
    assert state["optimizer"]["state"] == {}                            # AdamW never stepped
    lora_b = [t for k, t in state["trainable"].items() if "lora_B" in k]
    assert lora_b and all(float(t.abs().sum()) == 0.0 for t in lora_b)  # LoRA B is still its zero init


def test_decor_trained_keeps_the_summarizer_frozen():
    """`model: models/agents/decor` moves the three policy roles; the summarizer stays on the base model, or on
    decor.summarizer_model (DecorConfig.frozen_roles)."""
    from ragteam.systems.decor.workflow import DecorConfig
    from ragteam.eval.evaluate import SystemSpec, make_team
    from ragteam.llm import EnginePool

    spec = SystemSpec(workflow="decor", model="models/agents/decor")
    for cfg, summarizer in ((DecorConfig(), "models/llm"), (DecorConfig(summarizer_model="models/sum"), "models/sum")):
        pool = EnginePool(EngineConfig(), loader=lambda p, c: ScriptedEngine(lambda r, m: ""))
        team = make_team(pool, spec, {}, "models/llm", {}, cfg.frozen_roles())
        for role in ("decor_planner", "decor_filter", "decor_answerer"):
            assert team.engine(role) is pool.get("models/agents/decor")
        assert team.engine("decor_summarizer") is pool.get(summarizer)
        assert sorted(pool.loaded) == sorted({"models/agents/decor", summarizer})


def test_frozen_role_generates_with_the_adapter_off(tiny_llama):
    """In training, the summarizer (a frozen role, checkpoint None) runs on the base weights: the policy's LoRA
    adapter is switched off for its calls only."""
    from ragteam.llm import load_engine
    from ragteam.llm.policy import Rollouts, policy_engine
    from ragteam.train.joint.params import PPOParams
    from ragteam.train.joint.actor_critic import _build_actor_critic

    p = PPOParams(**PPO)
    ac = _build_actor_critic(str(tiny_llama), p, "cpu", torch.float32, with_critic=False)
    with torch.no_grad():                    # a trained-looking adapter: LoRA B far from its zero init
        for n, t in ac.policy.named_parameters():
            if "lora_B" in n:
                t.normal_(0, 5.0)
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_llama)
    greedy = {"default": SamplingConfig(max_new_tokens=6, temperature=0.0)}
    cfg = EngineConfig(device="cpu", threads=1, batch_size=4)
    r = Rollouts(policy_engine("live", ac.policy, tok, str(tiny_llama), cfg, tiny_llama / "sync"), greedy,
                 ("decor_planner",), {"decor_summarizer": None}, cfg, temperature=p.temperature, top_p=p.top_p,
                 seed=p.seed)
    team = r.team(0, ac.policy)
    msgs = [[{"role": "user", "content": "Summarize: Beta City is the capital of Gamma."}]]
    frozen = team.engine("decor_summarizer").generate(msgs, greedy["default"])[0][0].text
    base = load_engine(str(tiny_llama), cfg).generate(msgs, greedy["default"])[0][0].text
    policy = r.engine.generate(msgs, greedy["default"])[0][0].text
    assert frozen == base and policy != base
    assert team.sampling_for("decor_summarizer").temperature == 0.0   # its own settings, not the rollout's T = 1


# ---- issue 23 §3: dynamic sampling keeps role-reward signal and refills the step; Eq. 6 where a role is absent ------

def _fake_system(signal: dict[str, bool], max_rounds: int, log: list):
    """A select system without a model: each question's G = 2 trajectories get Answerer returns that differ
    (signal True) or are equal; `log` records every rollout's question ids."""
    from ragteam.train.decor_adv import dynamic_sampling, role_returns
    from ragteam.train.joint.system import JointSystem

    def rollout(rows, _team):
        log.append([r["id"] for r in rows])
        out = []
        for r in rows:
            for k in range(2):
                e = Episode(question_id=r["id"], question=r["question"], golden_answers=r["golden_answers"])
                e.add_call(AgentCall(role="decor_answerer", prompt=[], reward=float(k) if signal[r["id"]] else 0.5))
                out.append(e)
        return out

    from ragteam.train.decor_adv import decor_advantages

    return JointSystem(name="fake", roles=("decor_answerer",), rollout=rollout, annotate=lambda eps: eps,
                       describe={}, advantage=partial(decor_advantages, roles=("decor_answerer",)),
                       select=partial(dynamic_sampling, returns_of=partial(role_returns, roles=("decor_answerer",))),
                       max_rollout_rounds=max_rounds)


def test_refill_rolls_out_further_questions_until_the_step_is_full_or_the_cap():
    from ragteam.train.joint.batch import _refill_order, _select_with_refill

    rows = [{"id": f"q{i}", "question": f"Q{i}?", "golden_answers": ["a"]} for i in range(8)]
    signal = {f"q{i}": i % 3 != 0 for i in range(8)}           # q0, q3, q6 carry no signal
    step, seed = 1, 0
    qs = [r for r in rows if not signal[r["id"]]][:2]            # a step that drew two no-signal questions
    log: list = []
    system = _fake_system(signal, 5, log)
    eps, chosen, sel = _select_with_refill(system, rows, qs, system.rollout(qs, None), None, step, seed)
    # the refills are the next questions of the (seed, step) refill order not drawn yet, as many as are missing
    order = [rows[i]["id"] for i in _refill_order(len(rows), step, seed) if rows[i]["id"] not in ("q0", "q3")]
    expect, kept = [], []
    for qid in order:                                            # replay: one round per missing batch
        if len(kept) == 2:
            break
        expect.append(qid)
        kept += [qid] if signal[qid] else []
    assert [q for batch in log[1:] for q in batch] == expect
    assert all(len(b) <= 2 for b in log[1:]) and log[1] == order[:2]
    assert sorted({e.question_id for e in chosen}) == sorted(kept) and len(chosen) == 4
    assert sel == {"groups": 2.0 + len(expect), "groups_kept": 2.0, "groups_dropped": float(len(expect)),
                   "groups_refilled": float(len(expect)), "groups_trained": 2.0, "episodes_trained": 4.0,
                   "rollout_rounds": float(len(log))}
    assert {e.question_id for e in eps} == {"q0", "q3", *expect}
    # deterministic in (seed, step): the same draws again, and another step draws others; refills come from their
    # own order, so the epoch order of `_questions` (the later steps' questions) is never consumed by them
    log2: list = []
    s2 = _fake_system(signal, 5, log2)
    _select_with_refill(s2, rows, qs, s2.rollout(qs, None), None, step, seed)
    assert log2 == log
    log2.clear()
    _select_with_refill(s2, rows, qs, s2.rollout(qs, None), None, step + 1, seed)
    assert log2[1:] != log[1:] and _refill_order(8, step + 1, seed) != _refill_order(8, step, seed)
    # the cap: one round only -> no refill, the step trains on nothing
    log3: list = []
    s1 = _fake_system(signal, 1, log3)
    _, chosen1, sel1 = _select_with_refill(s1, rows, qs, s1.rollout(qs, None), None, step, seed)
    assert chosen1 == [] and len(log3) == 1 and sel1["groups_refilled"] == 0 and sel1["rollout_rounds"] == 1
    # no signal anywhere: the cap stops it, every group dropped; a pool drawn to the end stops it too
    none = {k: False for k in signal}
    log4: list = []
    s4 = _fake_system(none, 3, log4)
    _, chosen4, sel4 = _select_with_refill(s4, rows, qs, s4.rollout(qs, None), None, step, seed)
    assert chosen4 == [] and len(log4) == 3 and sel4["groups_dropped"] == sel4["groups"] == 6
    log5: list = []
    s5 = _fake_system(none, 50, log5)
    _, _, sel5 = _select_with_refill(s5, rows, qs, s5.rollout(qs, None), None, step, seed)
    assert sel5["groups"] == 8 and sum(len(b) for b in log5) == 8          # each question at most once a step
    # a system without `select` is never refilled
    plain = replace(s5, select=None)
    log5.clear()
    eps6, chosen6, sel6 = _select_with_refill(plain, rows, qs, plain.rollout(qs, None), None, step, seed)
    assert chosen6 == eps6 and len(log5) == 1 and sel6["groups_trained"] == 2 and sel6["groups_dropped"] == 0


def test_the_loop_refills_a_step_whose_group_carries_no_signal(tmp_path, tiny_llama, monkeypatch):
    """The Gamma group (every trajectory right, every role reward equal) is dropped; the step rolls out the third
    question (Blue Moon, half right) and trains on two groups."""
    from ragteam.train.joint.batch import _questions
    from ragteam.systems.decor import decor_system

    rows = ROWS + [{"id": "moon", "question": "Who wrote Blue Moon?", "golden_answers": ["Ray Mond"]}]
    monkeypatch.setitem(ANSWERS, "Who wrote Blue Moon?", ["Ray Mond", "Omega", "Omega", "Ray Mond"])
    passages = PASSAGES + [("Blue Moon", "Blue Moon is a song written by Ray Mond.")]
    seed = next(s for s in range(50) if {r["id"] for r in _questions(rows, 0, 2, s)} == {"gamma", "sky"})
    base = decor_system(decor_params(dynamic_sampling={"max_rounds": 2}), KeywordRetriever(passages))
    assert base.max_rollout_rounds == 2
    team, engine = scripted_team()
    system = replace(base, rollout=lambda rs, _policy_team: base.rollout(rs, team))
    from ragteam.train.joint.params import PPOParams
    from ragteam.train.joint.loop import train_joint_ppo

    p = PPOParams(**{**PPO, "seed": seed, "minibatch_size": 64, "micro_batch_size": 8})
    res = train_joint_ppo(system, rows, str(tiny_llama), tmp_path / "ckpt", p,
                          EngineConfig(device="cpu", threads=1, batch_size=8),
                          {"default": SamplingConfig(max_new_tokens=4)})
    e = res.log_history[0]
    assert engine.steps("decor_answerer") == [8, 4]              # the step's 2 x G, then the refill's G
    assert (e["groups"], e["groups_kept"], e["groups_dropped"], e["groups_refilled"]) == (3, 2, 1, 1)
    assert (e["groups_trained"], e["episodes_trained"], e["skipped_update"], e["rollout_rounds"]) == (2, 8, 0, 2)
    assert math.isfinite(e["policy_loss"])


def test_a_trajectory_without_a_filter_call_trains_and_eq6_skips_it_for_the_filter(tmp_path, tiny_llama,
                                                                                     monkeypatch):
    """Issue 23 §3: in the Red Sky group, trajectory 2's Planner stops at once (no search, no Filter call). Its
    Planner and Answerer calls train with their Eq. 6 advantages over all four trajectories; the Filter's advantages
    are normalised over the three trajectories that have a Filter call."""
    import ragteam.train.joint.update as ppo_mod
    from ragteam.train.decor_adv import role_group_normalize, role_returns
    from ragteam.systems.decor import decor_system

    base = decor_system(decor_params(), KeywordRetriever(PASSAGES))
    team, _ = scripted_team()
    first: dict[str, int] = {}
    real_reply = team.engine("decor_planner").reply

    def reply(role, m):
        text = m[0]["content"]
        if role == "decor_planner" and "Red Sky" in text and "Search 1:" not in text:
            k = first.get("n", 0)
            first["n"] = k + 1
            if k == 2:
                return "<think>I know it</think>\n<search>None</search>"
        return real_reply(role, m)

    team.engine("decor_planner").reply = reply
    system = replace(base, rollout=lambda rows, _policy_team: base.rollout(rows, team))
    seen = {}
    real_update = ppo_mod.ppo_update
    monkeypatch.setattr(ppo_mod, "ppo_update", lambda model, opt, samples, p, *a, **kw: seen.update(
        samples=list(samples)) or real_update(model, opt, samples, p, *a, **kw))
    res = _train(tmp_path, tiny_llama, system)
    e = res.log_history[0]
    assert (e["groups_trained"], e["episodes_trained"], e["skipped_update"]) == (1, 4, 0)
    by_ep: dict[int, list] = {}
    for s in seen["samples"]:
        by_ep.setdefault(s.episode, []).append(s)
    trajs = [by_ep[k] for k in sorted(by_ep)]
    assert [[s.role.removeprefix("decor_")[0] for s in t] for t in trajs] == [["p", "f", "p", "a"]] * 2 + [
        ["p", "a"]] + [["p", "f", "p", "a"]]
    # Eq. 6 by role over the trajectories where the role acted, from the rewards the samples carry
    rets = []
    for t in trajs:
        ep = Episode(question_id="sky", question="q", golden_answers=["x"])
        for s in t:
            ep.add_call(AgentCall(role=s.role, prompt=[], reward=s.reward))
        rets.append(role_returns(ep, D.POLICY_ROLES))
    assert "decor_filter" not in rets[2]
    want = role_group_normalize(rets, ["sky"] * 4)
    for t, w in zip(trajs, want):
        for s in t:
            assert s.advantages.tolist() == pytest.approx([w[s.role]] * len(s.response_ids))
    filt = [rets[i]["decor_filter"] for i in (0, 1, 3)]
    mu = sum(filt) / 3
    assert sum(float(t[1].advantages[0]) for t in (trajs[0], trajs[1], trajs[3])) == pytest.approx(0.0, abs=1e-5)
    assert float(trajs[0][1].advantages[0]) == pytest.approx(
        (filt[0] - mu) / (math.sqrt(sum((x - mu) ** 2 for x in filt) / 2) + 1e-4), rel=1e-5)
