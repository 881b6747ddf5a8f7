"""The team-reward probe of joint RL (ragteam.train.probe, issue 25): its schedule, its questions (the pool's tail,
clear of RL's and the warm-up's), its figures by hand, and that it only reads the policy: training with and without
it gives the same weights, and its step-0 value is the start model's own greedy team reward."""
from __future__ import annotations

import json

import pytest
import torch

from ragteam.config import ParamsError
from ragteam.records import AgentCall, Episode
from ragteam.eval.probe import summarize_probe
from ragteam.train.probe import probe_questions, probe_schedule, probe_summary, stage_probe_steps


def test_the_schedule_probes_the_start_and_the_end_and_every_nth_step_between():
    assert probe_schedule(4, 0) == {0, 4}
    assert probe_schedule(4, 2) == {0, 2, 4}
    assert probe_schedule(5, 2) == {0, 2, 4, 5}
    # QAgent: stage 1 runs global steps 1-2, stage 2 steps 3-4 (its local 1-2); 0 belongs to stage 1 alone
    assert stage_probe_steps({0, 4}, 0, 2) == {0}
    assert stage_probe_steps({0, 4}, 2, 2) == {2}
    every = probe_schedule(4, 1)
    assert stage_probe_steps(every, 0, 2) == {0, 1, 2} and stage_probe_steps(every, 2, 2) == {1, 2}


def _pool(n: int) -> list[dict]:
    return [{"id": f"q{i}", "question": f"question {i}?", "golden_answers": [f"a{i}"]} for i in range(n)]


def test_the_probe_questions_are_the_pools_tail_and_never_what_rl_or_the_warmup_use():
    pool = _pool(20)
    rows = probe_questions(pool, 4, {"joint.mask.max_questions": 10, "warmup.questions": 16})
    assert [r["id"] for r in rows] == ["q16", "q17", "q18", "q19"]
    with pytest.raises(ParamsError, match=r"overlap warmup.questions, which uses its first 17 of the 20"):
        probe_questions(pool, 4, {"joint.mask.max_questions": 10, "warmup.questions": 17})
    with pytest.raises(ParamsError, match=r"overlap joint.jade.max_questions, which uses every question"):
        probe_questions(pool, 4, {"joint.jade.max_questions": 0})
    with pytest.raises(ParamsError, match=r"joint.probe.questions is 25 but the training pool has 20"):
        probe_questions(pool, 25, {})


def _episode(qid: str, reward: float, f1: float, em: float, answer: str, bad: bool = False,
             gold: bool = True) -> Episode:
    ep = Episode(question_id=qid, question="q?", golden_answers=["x"] if gold else [], final_answer=answer)
    ep.add_call(AgentCall(role="r", prompt=[], response="…", format_error="no tag" if bad else None))
    ep.metrics = {"team_reward": reward, "f1": f1, "em": em}
    return ep


def test_the_probe_figures_by_hand():
    eps = [_episode("a", 1.0, 1.0, 1.0, "x"), _episode("b", -1.0, 0.0, 0.0, "", bad=True),
           _episode("c", 0.5, 0.5, 0.0, "x y"), _episode("d", 0.0, 0.0, 0.0, "", bad=True),
           _episode("u", 9.0, 9.0, 9.0, "z", gold=False)]        # no golds: not scored, not counted
    assert summarize_probe(eps) == {"probe/team_reward": 0.125, "probe/f1": 0.375, "probe/em": 0.25,
                                    "probe/format_error_rate": 0.5, "probe/no_answer": 0.5}
    eps[0].metrics.pop("team_reward")
    with pytest.raises(ValueError, match=r"without a team reward: \['a'\]"):
        summarize_probe(eps)
    # the run's first and last probe (not quarter means): the start model and the trained agent
    curve = [{"step": 0, "probe/team_reward": -0.5}, {"step": 1, "reward": 0.3},
             {"step": 2, "reward": 0.1, "probe/team_reward": 0.25}]
    assert probe_summary(curve) == {"probe/team_reward_first": -0.5, "probe/team_reward_last": 0.25}


# ---- in the loop: it reads the policy and changes nothing a step learns -------------------------------------------

PPO = {"steps": 2, "questions_per_step": 1, "minibatch_size": 8, "micro_batch_size": 4, "actor_lr": 1e-2,
       "critic_lr": 1e-3, "save_steps": 1, "temperature": 1.0,
       "lora": {"enabled": True, "rank": 8, "alpha": 16, "top_layers": 2}}
PARAMS = {"mask": {"max_turns": 1, "top_k": 1, "passage_words": 8, "format_penalty": 1.0}}
TRAIN = [{"id": "q1", "question": "What is the capital of Xland?", "golden_answers": ["Xville"]},
         {"id": "q2", "question": "Which country is Yville in?", "golden_answers": ["Yland"]}]
HELD = [{"id": "h1", "question": "Where is Yville?", "golden_answers": ["Yland"]},
        {"id": "h2", "question": "Name the capital of Xland.", "golden_answers": ["Xville"]}]


def _retriever():
    from helpers_agents import KeywordRetriever

    return KeywordRetriever([("Xland", "Xville is the capital of Xland."), ("Yland", "Yville is in Yland.")])


def _train(path, model, probe=None, steps=()):
    from ragteam.llm import EngineConfig, SamplingConfig
    from ragteam.train.joint.params import PPOParams
    from ragteam.train.joint.loop import train_joint_ppo
    from ragteam.systems.mask import mask_system

    return train_joint_ppo(mask_system(PARAMS, _retriever()), TRAIN, str(model), path, PPOParams(**PPO),
                           EngineConfig(device="cpu", threads=1, batch_size=4),
                           {"default": SamplingConfig(max_new_tokens=6)}, probe=probe, probe_steps=steps)


def test_the_probe_changes_no_weight_and_logs_the_start_models_own_team_reward(tmp_path, tiny_llama):
    from ragteam.llm import EngineConfig, SamplingConfig, Team
    from ragteam.llm.hf import HFEngine
    from ragteam.eval.probe import team_reward_probe

    probe = team_reward_probe("mask", HELD, _retriever(), PARAMS)
    seen: list[Team] = []
    sums: list[float] = []

    def logit_sum(model) -> float:        # a fingerprint of the weights a model generates with
        with torch.no_grad():
            return model(input_ids=torch.tensor([[1, 2, 3, 4]])).logits.double().sum().item()

    def recording(team: Team) -> dict[str, float]:
        seen.append(team)
        sums.append(logit_sum(team.engine("mask_answer").engine.model))
        return probe(team)

    with_probe = _train(tmp_path / "a", tiny_llama, recording, {0, 2})
    without = _train(tmp_path / "b", tiny_llama)
    a, b = dict(with_probe.model.named_parameters()), dict(without.model.named_parameters())
    trained = [n for n, t in a.items() if t.requires_grad]
    assert trained and all(torch.equal(a[n], b[n]) for n in trained)          # the same update, bit for bit
    assert any(not torch.equal(a[n], torch.zeros_like(a[n])) for n in trained if "lora_B" in n)   # and it moved
    # the log: a step-0 entry of its own, the last step's entry with the probe merged in, nothing at step 1
    h = with_probe.log_history
    assert [e["step"] for e in h] == [0, 1, 2] and [e["step"] for e in without.log_history] == [1, 2]
    keys = {"probe/team_reward", "probe/f1", "probe/em", "probe/format_error_rate", "probe/no_answer"}
    assert keys <= set(h[0]) and keys <= set(h[2]) and not keys & set(h[1]) and "reward" not in h[0]
    same = lambda e: json.dumps({k: v for k, v in e.items() if not k.endswith("_seconds")}, sort_keys=True)  # noqa
    assert same(h[1]) == same(without.log_history[0]) and same(h[2]) != same(without.log_history[1])
    # every probe decodes greedily on the trained roles
    assert len(seen) == 2 and all(s.temperature == 0 for t in seen for r, s in t.sampling.items())
    # step 0 is the start model: its greedy team reward on the same questions from a plain engine, no trainer
    start = Team(HFEngine(str(tiny_llama), EngineConfig(device="cpu", threads=1, batch_size=4)),
                 {r: SamplingConfig(max_new_tokens=6) for r in seen[0].sampling})
    assert probe(start) == {k: h[0][k] for k in keys}
    # the first probe generated with the start weights, the last with the trained ones (adapters on), not stale ones
    assert sums[0] == logit_sum(start.engine("mask_answer").model)
    assert sums[1] == logit_sum(with_probe.model.get_base_model()) != sums[0]


def test_qagent_probes_at_the_global_steps_whichever_stage_they_fall_in(tmp_path, monkeypatch):
    import ragteam.systems.qagent.train as Q
    from ragteam.train.checkpoints import TrainResult
    from ragteam.train.joint.params import PPOParams

    calls = []

    def fake(system, rows, model, path, p, cfg, sampling, *, run_tag, on_step, probe, probe_steps):
        calls.append((run_tag["stage"], probe_steps))
        return TrainResult(model=None, tokenizer=None, log_history=[], global_step=p.steps, seconds=0.0,
                           resumed_from=None, extra={"fingerprint": "f"})

    monkeypatch.setattr(Q, "train_joint_ppo", fake)
    monkeypatch.setattr(Q, "save_agent", lambda result, path: path)
    p = PPOParams(**{**PPO, "steps": 2})
    Q.train_qagent({"stage1": lambda: None, "stage2": lambda: None}, TRAIN, "m", tmp_path, {"stage1": p, "stage2": p},
                   None, probe=lambda team: {}, probe_steps={0, 4})
    assert calls == [("stage1", {0}), ("stage2", {2})]


def test_a_bad_probe_param_names_its_key():
    import yaml

    from ragteam.systems.params import load_joint

    params = yaml.safe_load(open("params.yaml"))
    params["joint"]["probe"]["every_step"] = 1
    with pytest.raises(ParamsError, match=r"joint.*every_step"):
        load_joint(params, "mask")
    params["joint"]["probe"] = {"questions": -1}
    with pytest.raises(ParamsError, match=r"joint.*questions"):
        load_joint(params, "mask")
