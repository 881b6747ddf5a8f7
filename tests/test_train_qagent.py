"""QAgent training (issue 15 deliverable 4) on the joint trainer's one core: Eq. 3's normalisation by each group's
total tokens against hand-computed values, the <information> / retry mask reaching the loss (perturbing the
injected tokens' logits changes neither loss nor gradient), stage 2 starting from stage 1's weights, and
`python -m stages.train_joint qagent` end to end to a saved agent with a model card (tiny random Llama with the
SmolLM2 tokenizer, scripted rollouts and generator)."""
from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import pytest
import torch
from helpers_agents import KeywordRetriever, ScriptedEngine

import ragteam.systems.qagent.train as Q
from ragteam.llm import SamplingConfig, Team
from ragteam.systems.qagent.workflow import QAgentConfig, trajectory_tokens
from ragteam.train.curves import read_curves
from ragteam.train.pg import group_token_weights, policy_loss

REPO = Path(__file__).resolve().parents[1]

PASSAGES = [("Ed Wood", "Ed Wood was an American filmmaker born in Poughkeepsie."),
            ("Denver", "Denver is the capital of Colorado.")]
ROWS = [{"id": "A", "question": "Where was Ed Wood born?", "golden_answers": ["Poughkeepsie"]},
        {"id": "B", "question": "Which state has Denver as capital?", "golden_answers": ["Colorado"]}]


# ---- Eq. 3 in the core, by hand --------------------------------------------------------------------------------------

def test_group_token_weights_by_hand():
    # group a: 2 + 1 tokens, group b: 3 tokens, group c: none -> 1 / (3 groups x tokens of the group)
    assert group_token_weights([2, 1, 3, 0], ["a", "a", "b", "c"]) == pytest.approx([1 / 9, 1 / 9, 1 / 9, 0.0])
    assert group_token_weights([4, 4], [0, 0]) == pytest.approx([1 / 8, 1 / 8])
    with pytest.raises(ValueError, match="2 token counts for 1 group"):
        group_token_weights([1, 2], ["a"])


def test_policy_loss_normalised_by_each_groups_total_tokens_by_hand():
    # 3 sequences: rows 0, 1 are group a (2 and 1 counted tokens; row 0's third token is injected, mask 0),
    # row 2 is group b (2 tokens). Per-token log-ratio lr, advantage A (one per sequence, as GRPO)
    lr = torch.tensor([[0.1, 0.0, 5.0], [-0.05, 0.0, 0.0], [0.0, 0.1, -0.1]])
    adv = torch.tensor([[1.0, 1.0, 1.0], [-1.0, -1.0, -1.0], [0.5, 0.5, 0.5]])
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 0.0, 0.0], [1.0, 1.0, 0.0]])
    w = torch.tensor(group_token_weights([2, 1, 2], ["a", "a", "b"]))[:, None].expand_as(mask)
    loss, _ = policy_loss(lr, torch.zeros_like(lr), adv, mask, eps_low=0.2, agg="group_token_mean", token_weights=w)
    e = torch.exp
    # token losses max(-A·r, -A·clip(r)); every counted ratio is inside [0.8, 1.2] -> -A·r (row 0's masked 5.0
    # would be clipped, and must not count)
    group_a = (-e(torch.tensor(0.1)) - 1.0 + e(torch.tensor(-0.05))) / 3        # Σ over 3 counted tokens / 3
    group_b = 0.5 * (-1.0 - e(torch.tensor(0.1))) / 2
    assert float(loss) == pytest.approx(float(group_a + group_b) / 2, rel=1e-6)
    # not the batch token mean (what token_mean would give)
    tm, _ = policy_loss(lr, torch.zeros_like(lr), adv, mask, eps_low=0.2, agg="token_mean")
    assert float(tm) != pytest.approx(float(loss), rel=1e-3)
    with pytest.raises(ValueError, match="needs token_weights"):
        policy_loss(lr, torch.zeros_like(lr), adv, mask, agg="group_token_mean")


# ---- scripted rollouts -> samples ------------------------------------------------------------------------------------

def _agent_reply(role, m):
    """Rollout 1 of every group searches then answers; the others retry once then answer (so the trajectories
    hold both kinds of injected text, <information> and the retry prompt)."""
    assert role == "qagent", role
    so_far = m[-1]["content"] if m[-1]["role"] == "assistant" else ""
    if not so_far:
        return ("<plan>look it up</plan>\n<search>\n<query>Ed Wood</query>\n<query>Denver</query>\n</search>"
                if "Ed Wood" in m[0]["content"] else "hmm, not sure.")
    return "<reflection>ok</reflection>\n<answer>Poughkeepsie</answer>"


@pytest.fixture(scope="module")
def tiny(tiny_llama):
    from transformers import AutoTokenizer

    return tiny_llama, AutoTokenizer.from_pretrained(tiny_llama)

def _samples(tok):
    from ragteam.systems.qagent.rewards import qagent_rewards_stage1
    from ragteam.systems.qagent.train import rollout_groups, trajectory_samples

    team = Team(ScriptedEngine(_agent_reply), {"qagent": SamplingConfig(max_new_tokens=64)})
    eps = rollout_groups(ROWS, team, KeywordRetriever(PASSAGES), QAgentConfig(max_turns=3), group_size=2)
    qagent_rewards_stage1(eps)
    return eps, trajectory_samples(tok, eps)


def test_trajectory_samples_carry_the_mask_group_and_reward(tiny):
    _, tok = tiny
    eps, samples = _samples(tok)
    assert [e.meta["group"] for e in eps] == [0, 0, 1, 1]
    assert [s.group for s in samples] == [("A", 0), ("A", 0), ("B", 1), ("B", 1)]
    # A answers "Poughkeepsie" after a well-formed search: reward 1; B's first turn had no tags: gated (0)
    assert [s.reward for s in samples] == [1.0, 1.0, 0.0, 0.0]
    kinds = {c.meta.get("injected_kind") for e in eps for c in e.calls} - {None}
    assert kinds == {"information", "retry"}
    for e, s in zip(eps, samples):
        t = trajectory_tokens(e, tok)
        assert s.prompt_ids + s.response_ids == t.input_ids and s.mask == t.loss_mask[t.prompt_len:]
        assert 0 in s.mask and sum(s.mask) == t.n_generated
    assert [e.meta["truncated_tokens"] for e in eps] == [0] * 4


def test_dynamic_sampling_keeps_the_groups_whose_rewards_vary_and_refills_keep_their_own_groups(tiny):
    """QAgent's select (joint.qagent.dynamic_sampling): a group whose G rewards are equal has every advantage 0 and
    is dropped, one with a spread is kept; a degenerate group (every rollout rewarded alike, right or wrong) never
    trains. A refill rollout's positions start at 0 again, and its samples still form groups of their own."""
    from ragteam.train.decor_adv import dynamic_sampling
    from ragteam.systems.qagent.train import rollout_groups, trajectory_return, trajectory_samples

    _, tok = tiny
    eps, _ = _samples(tok)                        # stage-1 rewards: A 1, 1 (both right), B 0, 0 (both gated)
    assert [trajectory_return(e) for e in eps] == [{"qagent": 1.0}] * 2 + [{"qagent": 0.0}] * 2
    assert dynamic_sampling(eps, trajectory_return) == []          # all right or all wrong: no signal
    Q.agent_calls(eps[1])[-1].reward = 0.0                          # A now 1, 0: a spread
    assert [e.question_id for e in dynamic_sampling(eps, trajectory_return)] == ["A", "A"]
    Q.agent_calls(eps[0])[-1].reward = None
    with pytest.raises(ValueError, match="no reward"):
        trajectory_return(eps[0])
    # a refill rollout of B alone: its position is 0, as A's was in the first rollout, its group is not A's
    team = Team(ScriptedEngine(_agent_reply), {"qagent": SamplingConfig(max_new_tokens=64)})
    refill = rollout_groups(ROWS[1:], team, KeywordRetriever(PASSAGES), QAgentConfig(max_turns=3), group_size=2)
    from ragteam.systems.qagent.rewards import qagent_rewards_stage1
    qagent_rewards_stage1(refill)
    first, _ = _samples(tok)
    groups = [s.group for s in trajectory_samples(tok, first[:2] + refill)]
    assert [e.meta["group"] for e in first[:2] + refill] == [0, 0, 0, 0]
    assert groups == [("A", 0), ("A", 0), ("B", 0), ("B", 0)]


def test_a_step_without_a_spread_refills_to_a_group_with_one(tiny, tmp_path):
    """The joint loop with QAgent's dynamic sampling on and one question a step: the question whose rollouts are
    all rewarded alike is dropped and the step rolls out the other, whose rewards vary, and trains on it alone
    (groups_refilled 1, groups_trained 1, a non-zero gradient). Off, the same draw makes a step whose every
    advantage is 0 (gradient norm 0), which is what the default run's QAgent stage 1 did at every step."""
    from dataclasses import replace

    from ragteam.llm import EngineConfig
    from ragteam.train.joint.params import PPOParams
    from ragteam.train.joint.batch import _questions
    from ragteam.train.joint.loop import train_joint_ppo

    path, _ = tiny
    p = PPOParams(steps=1, questions_per_step=1, minibatch_size=2, micro_batch_size=2, actor_lr=0.05, critic_lr=1e-3,
                  loss_agg="group_token_mean", vf_coef=0.0, seed=3,
                  lora={"enabled": True, "rank": 4, "alpha": 8, "top_layers": 1})
    flat = _questions(ROWS, 0, 1, p.seed)[0]["id"]          # the step's first question gets no spread
    spread = "B" if flat == "A" else "A"

    def annotate(eps):
        for e in eps:
            Q.agent_calls(e)[-1].reward = float(e.meta["rollout"] == 0) if e.question_id == spread else 0.5
        return eps

    logs = {}
    for on in (False, True):
        tp = Q.QAgentTrainParams(group_size=2, stage1_steps=1, max_seq_len=1024,
                                 dynamic_sampling={"enabled": on, "max_rounds": 2})
        system = replace(Q.qagent_system(QAgentConfig(max_turns=1), tp, KeywordRetriever(PASSAGES), "stage1"),
                         annotate=annotate)
        assert (system.select is not None) is on and system.max_rollout_rounds == (2 if on else 1)
        res = train_joint_ppo(system, ROWS, str(path), tmp_path / f"ckpt-{on}", p,
                              EngineConfig(device="cpu", threads=1, batch_size=8),
                              {"qagent": SamplingConfig(max_new_tokens=8)})
        logs[on] = res.log_history[0]
    off, on = logs[False], logs[True]
    assert off["zero_advantage"] == 1.0 and off["grad_norm/policy"] == 0.0
    assert off["groups_refilled"] == 0.0 and off["rollout_rounds"] == 1.0 and off["groups"] == 1.0
    assert on["groups_dropped"] == 1.0 and on["grad_norm/policy"] > 0.0
    assert on["skipped_update"] == 0.0 and on["rollout_rounds"] == 2.0 and on["groups_refilled"] == 1.0
    assert on["groups"] == 2.0 and on["groups_kept"] == 1.0 and on["groups_trained"] == 1.0
    assert on["episodes_trained"] == 2.0 and "policy_loss" in on


def test_a_trajectory_cut_at_max_seq_len_never_trains_but_stays_in_its_group(tiny):
    """Issue 23 §3: the Ed Wood group's first rollout searches (a long trajectory), its second answers at once; a
    max_seq_len between the two cuts the first one's final answer. Its loss mask becomes all 0 (no token of it
    trains), it is counted, and it keeps its reward in the group's statistics (DAPO's overlong masking), so its
    group-mate's advantage is what the whole group gives."""
    from ragteam.systems.qagent.rewards import qagent_rewards_stage1
    from ragteam.train.joint.update import group_advantages
    from ragteam.train.joint.batch import loss_tokens
    from ragteam.systems.qagent.train import rollout_groups, trajectory_samples, truncated

    _, tok = tiny
    n = {"ed": 0}

    def reply(role, m):
        so_far = m[-1]["content"] if m[-1]["role"] == "assistant" else ""
        if "Ed Wood" in m[0]["content"] and not so_far:
            n["ed"] += 1
            if n["ed"] == 1:
                return "<plan>look it up</plan>\n<search>\n<query>Ed Wood</query>\n</search>"
        return ("<reflection>ok</reflection>\n" if so_far else "") + "<answer>Poughkeepsie</answer>"

    team = Team(ScriptedEngine(reply), {"qagent": SamplingConfig(max_new_tokens=64)})
    eps = rollout_groups(ROWS[:1], team, KeywordRetriever(PASSAGES), QAgentConfig(max_turns=3), group_size=2)
    qagent_rewards_stage1(eps)
    full = trajectory_samples(tok, eps)
    long_, short = (len(s.prompt_ids) + len(s.response_ids) for s in full)
    assert long_ > short
    cut = trajectory_samples(tok, eps, max_seq_len=short + 1)
    assert [len(s.prompt_ids) + len(s.response_ids) for s in cut] == [short + 1, short]
    assert sum(cut[0].mask) == 0 and loss_tokens(cut[0]) == 0                   # nothing of it trains
    assert cut[1].mask == full[1].mask and loss_tokens(cut[1]) > 0               # its group-mate is whole
    assert eps[0].meta["truncated_tokens"] == sum(full[0].mask) - sum(full[0].mask[:short + 1 - len(
        full[0].prompt_ids)]) > 0 and eps[1].meta["truncated_tokens"] == 0
    assert [truncated(e) for e in eps] == [1.0, 0.0]
    assert [s.reward for s in cut] == [s.reward for s in full] and [s.group for s in cut] == [("A", 0)] * 2
    # kept in the group statistics: rewards 1 (cut) and 0 -> advantages +1 / -1, as without the cut
    cut[0].reward, cut[1].reward = 1.0, 0.0
    group_advantages(cut)
    assert [float(s.advantages[0]) for s in cut] == pytest.approx([1.0, -1.0], abs=1e-5)
    # a prompt that alone reaches max_seq_len is an error naming the episode
    with pytest.raises(ValueError, match="the prompt alone has"):
        trajectory_samples(tok, eps, max_seq_len=len(full[1].prompt_ids))


def _actor(path):
    from ragteam.train.joint.params import PPOParams
    from ragteam.train.joint.actor_critic import _build_actor_critic

    p = PPOParams(steps=1, questions_per_step=2, minibatch_size=4, micro_batch_size=4, actor_lr=1e-3,
                  critic_lr=1e-3, kl_coef=0.01, loss_agg="group_token_mean", lora={"enabled": False})
    torch.manual_seed(0)
    return p, _build_actor_critic(str(path), p, "cpu", torch.float32)


def _update_grads(ac, samples, p, tok, perturb=None, monkeypatch=None):
    """Gradients of one ppo_update (lr 0: weights unchanged), optionally adding noise to the logits of the response
    positions where `perturb(mask)` is 1 in every forward pass of the update (the mask of the batch being run:
    ppo_update shuffles the samples, so it is read from the update's own `_collate`)."""
    import ragteam.train.joint.update as P
    from ragteam.train.joint.actor_critic import _parts

    head = _parts(ac.policy)[1]
    handle, last = None, {}
    if perturb is not None:
        real = P._collate

        def collate(micro, pad_id, device):
            out = real(micro, pad_id, device)
            last["sel"] = perturb(out[4])
            return out

        monkeypatch.setattr(P, "_collate", collate)

        def hook(_m, _i, out):
            sel = last["sel"]
            noise = torch.randn(out.shape, generator=torch.Generator().manual_seed(1)) * 5
            return out + noise * sel[..., None]

        handle = head.register_forward_hook(hook)
    opt = torch.optim.SGD([t for t in ac.parameters() if t.requires_grad], lr=0.0)
    try:
        stats = P.ppo_update(ac, opt, samples, p, tok.pad_token_id, "cpu", ref_available=True, critic=False)
    finally:
        if handle is not None:
            handle.remove()
            monkeypatch.undo()
    return {n: t.grad.clone() for n, t in ac.named_parameters() if t.grad is not None}, stats


def test_mask_reaches_the_core_and_eq3_loss_by_hand(tiny, monkeypatch):
    from ragteam.train.joint.batch import _collate
    from ragteam.train.joint.update import group_advantages

    path, tok = tiny
    p, ac = _actor(path)
    _, samples = _samples(tok)
    with torch.no_grad():
        batch = _collate(samples, tok.pad_token_id, "cpu")
        logp, _ = ac(*batch[:4])
    for b, s in enumerate(samples):
        n = len(s.response_ids)
        s.old_logp, s.ref_logp = logp[b, :n].clone(), logp[b, :n].clone() - 0.1
    group_advantages(samples)
    # group 0 rewards [1, 1] -> advantages 0; group 1 [0, 0] -> 0: give group 1 a spread to learn from
    samples[2].reward, samples[3].reward = 1.0, 0.0
    group_advantages(samples)
    assert [float(s.advantages[0]) for s in samples] == pytest.approx([0, 0, 1, -1], abs=1e-5)
    assert batch[4].tolist() == [s.mask + [0] * (batch[4].shape[1] - len(s.mask)) for s in samples]

    base, stats = _update_grads(ac, samples, p, tok)
    # on-policy: ratio 1, token loss -A; Eq. 3 per group, mean over the 2 groups. Group 0 has A = 0.
    n2, n3 = sum(samples[2].mask), sum(samples[3].mask)
    assert stats["policy_loss"] == pytest.approx([(0.0 + (-1.0 * n2 + 1.0 * n3) / (n2 + n3)) / 2], abs=1e-5)
    # k3 KL with log π_ref = log π - 0.1 on every token: exp(-.1) + .1 - 1, the same weighted mean
    assert stats["kl_ref"] == pytest.approx([float(torch.exp(torch.tensor(-0.1))) + 0.1 - 1], rel=1e-4)
    # the injected tokens' logits do not matter ...
    masked_only, st2 = _update_grads(ac, samples, p, tok, perturb=lambda m: (1 - m), monkeypatch=monkeypatch)
    assert st2["policy_loss"] == pytest.approx(stats["policy_loss"], abs=1e-6)
    assert base.keys() == masked_only.keys() and base
    for n in base:
        assert torch.allclose(base[n], masked_only[n], atol=1e-7), n
    # ... while the generated tokens' do (the check can fail)
    generated, _ = _update_grads(ac, samples, p, tok, perturb=lambda m: m, monkeypatch=monkeypatch)
    assert any(not torch.allclose(base[n], generated[n], atol=1e-6) for n in base)
    # micro-batching does not change the Eq. 3 gradient
    p1 = p.model_copy(update={"micro_batch_size": 1})
    micro, st3 = _update_grads(ac, samples, p1, tok)
    assert st3["policy_loss"] == pytest.approx(stats["policy_loss"], abs=1e-5)
    for n in base:
        assert torch.allclose(base[n], micro[n], atol=1e-6), n


def test_group_loss_needs_a_group_system_and_whole_groups_per_minibatch():
    from ragteam.train.joint.params import PPOParams
    from ragteam.systems.qagent.train import QAgentTrainParams, stage_ppo

    p = PPOParams(steps=1, questions_per_step=2, minibatch_size=7, actor_lr=1e-3, critic_lr=1e-3,
                  loss_agg="group_token_mean")
    tp = QAgentTrainParams(group_size=4, stage1_steps=3, stage2_steps=5)
    with pytest.raises(ValueError, match=r"minibatch_size \(7\) must hold .* = 8"):
        stage_ppo(p, tp, "stage1")
    p8 = p.model_copy(update={"minibatch_size": 8})
    assert stage_ppo(p8, tp, "stage2").steps == 5
    with pytest.raises(ValueError, match="group_token_mean"):
        stage_ppo(p8.model_copy(update={"loss_agg": "token_mean"}), tp, "stage1")


def test_warmup_schedule():
    from ragteam.train.joint.actor_critic import _schedule

    f = _schedule("linear", 6, warmup=2)
    assert [f(s) for s in range(6)] == pytest.approx([0.5, 1.0, 1.0, 0.75, 0.5, 0.25])
    assert _schedule("constant", 4)(0) == 1.0


# ---- both stages through the joint loop, and the stage ---------------------------------------------------------------

def _generator():
    """A scripted frozen G: right for every other call, so each group's stage-2 rewards differ."""
    n = {"i": 0}

    def reply(role, m):
        assert role == "answer_agent", role
        n["i"] += 1
        q = re.search(r"Question: (.*)", m[-1]["content"]).group(1)
        gold = "Poughkeepsie" if "Ed Wood" in q else "Colorado"
        return gold if n["i"] % 2 else "no idea"

    return Team(ScriptedEngine(reply))


def test_stage2_starts_from_stage1_weights(tiny, tmp_path, monkeypatch):
    from safetensors.torch import load_file

    import ragteam.systems.qagent.train as Q
    from ragteam.llm import EngineConfig
    from ragteam.train.joint.params import PPOParams

    path, tok = tiny
    tp = Q.QAgentTrainParams(group_size=2, stage1_steps=1, stage2_steps=1, max_seq_len=1024)
    cfg = QAgentConfig(max_turns=2, passage_words=8)
    retr = KeywordRetriever(PASSAGES)
    s1 = Q.qagent_system(cfg, tp, retr, "stage1")
    # stage 1: a random tiny model never answers well formed, so score rollout 0 of each group 1 (a spread to learn)
    stage1 = lambda: s1.__class__(**{**s1.__dict__, "annotate": lambda eps: [  # noqa: E731
        setattr(Q.agent_calls(e)[-1], "reward", float(e.meta["rollout"] == 0)) or e for e in eps]})
    systems = {"stage1": stage1, "stage2": lambda: Q.qagent_system(cfg, tp, retr, "stage2", _generator())}
    p = PPOParams(steps=1, questions_per_step=2, minibatch_size=4, micro_batch_size=2, actor_lr=0.05,
                  critic_lr=1e-3, kl_coef=0.001, loss_agg="group_token_mean", vf_coef=0.0,
                  lora={"enabled": True, "rank": 4, "alpha": 8, "top_layers": 1})
    seen = []
    real = Q.train_joint_ppo
    monkeypatch.setattr(Q, "train_joint_ppo", lambda system, rows, model, *a, **k: seen.append(model) or real(
        system, rows, model, *a, **k))
    sampling = {"qagent": SamplingConfig(max_new_tokens=12)}
    res, curve = Q.train_qagent(systems, ROWS, str(path), tmp_path / "w", {"stage1": p, "stage2": p},
                                EngineConfig(device="cpu", threads=1, batch_size=8), sampling)
    stage1_model = tmp_path / "w" / "stage1_model"
    assert seen == [str(path), str(stage1_model)]                    # stage 2 loads the stage-1 model
    w0 = load_file(str(path / "model.safetensors"))
    w1 = load_file(str(stage1_model / "model.safetensors"))
    assert any(not torch.equal(w0[k], w1[k]) for k in w0)            # stage 1 moved the weights
    assert res.global_step == 2 and [r["stage"] for r in curve] == ["stage1", "stage2"]
    assert [r["step"] for r in curve] == [1, 2]
    assert (tmp_path / "w" / "stage1" / "checkpoint-1").is_dir() and (tmp_path / "w" / "stage2" / "checkpoint-1").is_dir()
    assert res.extra["stages"]["stage2"]["fingerprint"] != res.extra["stages"]["stage1"]["fingerprint"]
    # stage 2's rewards are Eq. 10: G right (1) or not (0) + 0.5·Hit, so a group's rewards differ
    assert curve[1]["zero_advantage"] < 1.0 and "explained_variance" not in curve[1]
    # a rerun resumes both finished stages as no-ops
    seen.clear()
    again, _ = Q.train_qagent(systems, ROWS, str(path), tmp_path / "w", {"stage1": p, "stage2": p},
                              EngineConfig(device="cpu", threads=1, batch_size=8), sampling)
    assert again.resumed_from == 2 and again.global_step == 2


def test_cut_trajectories_are_logged_and_a_step_of_only_cut_ones_makes_no_update(tiny, tmp_path):
    """The joint loop with live rollouts of the tiny policy and max_seq_len one token past the prompt: every
    trajectory loses generated tokens, the step log says `truncated` 1.0, and with no loss token left the step
    makes no optimiser step (LoRA B stays at its zero init) instead of a zero-loss one."""
    from dataclasses import replace

    import ragteam.systems.qagent.train as Q
    from ragteam.llm import EngineConfig
    from ragteam.train.joint.params import PPOParams
    from ragteam.train.joint.loop import train_joint_ppo

    path, tok = tiny
    prompt = max(len(s.prompt_ids) for s in _samples(tok)[1])
    tp = Q.QAgentTrainParams(group_size=2, stage1_steps=1, max_seq_len=prompt + 1)
    s1 = Q.qagent_system(QAgentConfig(max_turns=1), tp, KeywordRetriever(PASSAGES), "stage1")
    system = replace(s1, annotate=lambda eps: [  # a spread of rewards, so only the cut can stop the update
        setattr(Q.agent_calls(e)[-1], "reward", float(e.meta["rollout"] == 0)) or e for e in eps])
    p = PPOParams(steps=1, questions_per_step=2, minibatch_size=4, micro_batch_size=2, actor_lr=0.05,
                  critic_lr=1e-3, loss_agg="group_token_mean", lora={"enabled": True, "rank": 4, "alpha": 8,
                                                                    "top_layers": 1})
    res = train_joint_ppo(system, ROWS, str(path), tmp_path / "ckpt", p,
                          EngineConfig(device="cpu", threads=1, batch_size=8),
                          {"qagent": SamplingConfig(max_new_tokens=8)})
    e = res.log_history[0]
    assert e["truncated"] == 1.0 and e["skipped_update"] == 1.0 and "policy_loss" not in e
    assert e["response_tokens"] == 0.0                                   # tokens the loss counts
    state = torch.load(tmp_path / "ckpt" / "checkpoint-1" / "state.pt", weights_only=False)
    assert state["optimizer"]["state"] == {}
    assert all(float(t.abs().sum()) == 0.0 for k, t in state["trainable"].items() if "lora_B" in k)


def test_stage_trains_both_stages_to_a_saved_agent_with_a_card(tiny, tmp_path, monkeypatch):
    import yaml

    import ragteam.retrieval
    from ragteam.io import write_jsonl

    path, _ = tiny
    sys.path.insert(0, str(REPO))
    import stages.train_joint as stage

    params = yaml.safe_load((REPO / "params.yaml").read_text())
    params["llm"].update(model=str(path), device="cpu", threads=1)
    params["llm"]["sampling"]["qagent"] = {"max_new_tokens": 8}
    params["qagent"].update(max_turns=2)
    params["joint"]["qagent"].update(group_size=2, stage1_steps=1, stage2_steps=1, max_questions=2)
    params["joint"]["qagent"]["ppo"].update(questions_per_step=1, minibatch_size=2, micro_batch_size=2)
    params["joint"]["qagent"]["ppo"]["lora"] = {"enabled": True, "rank": 4, "alpha": 8, "top_layers": 1}
    # the team-reward probe on the pool's last question, which neither RL (the first 2) nor the warm-up (the
    # first 1) reads: before stage 1's first step and after stage 2's last
    params["joint"]["probe"] = {"questions": 1, "every": 0}
    params["warmup"]["questions"] = 1
    monkeypatch.chdir(tmp_path)
    held = {"id": "H", "question": "Which state has Denver as capital?", "golden_answers": ["Colorado"],
            "metadata": {}}
    write_jsonl(Path("data/prepared/train/pool.jsonl"), [*ROWS, held])
    monkeypatch.setattr(ragteam.retrieval, "open_retriever", lambda index: KeywordRetriever(PASSAGES))
    from ragteam.io import DataError
    from ragteam.warmup.start import WARMUP_OFF
    with pytest.raises(DataError, match="warmup_joint@qagent"):     # train_joint starts where the warm-up left off
        stage.run("qagent", params)
    assert not (tmp_path / "models/agents/qagent").exists()
    # what warmup_joint@qagent writes with warmup.enabled false: the joint stage starts from the base model
    (tmp_path / "models/warmup/qagent").mkdir(parents=True)
    (tmp_path / "models/warmup/qagent" / WARMUP_OFF).write_text(json.dumps({"enabled": False, "system": "qagent"}))
    metrics = stage.run("qagent", params)
    card = (tmp_path / "models/agents/qagent/README.md").read_text()
    assert "Eq. 7" in card and "Eq. 8-10" in card and "masked" in card
    assert (tmp_path / "models/agents/qagent/model.safetensors").exists()
    info = json.loads((tmp_path / "models/agents/qagent/ragteam-train.json").read_text())
    assert info["global_step"] == 2
    assert metrics["questions"] == 2 and "stage1/reward_last" in metrics and "stage2/reward_last" in metrics
    assert metrics["stage1/truncated_last"] == metrics["stage2/truncated_last"] == 0.0   # max_seq_len 2048
    curves = read_curves(tmp_path / "reports/training/train_joint_qagent")
    assert [s for s, _ in curves["reward"]] == [1, 2] and "reward.qagent" in curves
    # the probe: its own step-0 point, then after the last step of stage 2 (global step 2), on one question
    assert [s for s, _ in curves["probe.team_reward"]] == [0, 2] and [s for s, _ in curves["probe.f1"]] == [0, 2]
    assert metrics["probe/team_reward_first"] == curves["probe.team_reward"][0][1]
    assert metrics["probe/team_reward_last"] == curves["probe.team_reward"][1][1]
    assert '"question_ids": [\n      "H"\n    ]' in card      # which questions, on the model card
