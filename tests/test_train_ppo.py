"""The joint PPO core: GAE and the losses against hand-computed values, one update on SmolLM2, the training loop
(resume after a kill, NaN stops with the last good checkpoint kept), params validation."""
from __future__ import annotations

import math

import pytest
import torch

from ragteam.train.advantages import episode_gae, gae, group_normalized
from ragteam.train.pg import explained_variance, kl_k3, policy_loss, value_loss

# ---- GAE on a 3-call episode ---------------------------------------------------------------------------------
# calls of 1, 2 and 1 response tokens, rewards 1.0, 0.5, 2.0 on their last tokens; values per token:
REWARDS, VALUES = [1.0, 0.5, 2.0], [torch.tensor([0.5]), torch.tensor([0.2, 0.4]), torch.tensor([1.0])]


def test_gae_over_the_flattened_episode_by_hand():
    # γ = 0.9, λ = 0.5 (γλ = 0.45); tokens t0 | t1 t2 | t3, rewards 1 | 0 0.5 | 2, values .5 | .2 .4 | 1
    # δ3 = 2 - 1 = 1                       A3 = 1
    # δ2 = 0.5 + .9·1 - .4 = 1.0           A2 = 1 + .45·1 = 1.45
    # δ1 = 0 + .9·.4 - .2 = 0.16           A1 = .16 + .45·1.45 = 0.8125
    # δ0 = 1 + .9·.2 - .5 = 0.68           A0 = .68 + .45·.8125 = 1.045625
    out = episode_gae(REWARDS, VALUES, gamma=0.9, lam=0.5, scope="episode")
    adv = torch.cat([a for a, _ in out]).tolist()
    ret = torch.cat([r for _, r in out]).tolist()
    assert adv == pytest.approx([1.045625, 0.8125, 1.45, 1.0])
    assert ret == pytest.approx([1.545625, 1.0125, 1.85, 2.0])
    assert [len(a) for a, _ in out] == [1, 2, 1]


def test_gae_within_each_call_by_hand():
    # scope "call": no bootstrapping across calls. A3 = 1; A2 = .5 - .4 = .1; A1 = .9·.4 - .2 + .45·.1 = .205;
    # A0 = 1 - .5 = .5
    adv = torch.cat([a for a, _ in episode_gae(REWARDS, VALUES, 0.9, 0.5, scope="call")]).tolist()
    assert adv == pytest.approx([0.5, 0.205, 0.1, 1.0])
    # γ = λ = 1 (the official code): every token of a call gets its reward minus its own value
    adv1 = torch.cat([a for a, _ in episode_gae(REWARDS, VALUES, 1.0, 1.0, scope="call")]).tolist()
    assert adv1 == pytest.approx([0.5, 0.3, 0.1, 1.0])
    # ... and over the episode the reward-to-go: t1 sees 0.5 + 2 later
    adv_ep = torch.cat([a for a, _ in episode_gae(REWARDS, VALUES, 1.0, 1.0, scope="episode")]).tolist()
    assert adv_ep == pytest.approx([3.5 - 0.5, 2.5 - 0.2, 2.5 - 0.4, 2.0 - 1.0])


def test_gae_rejects_bad_shapes():
    with pytest.raises(ValueError, match="same length"):
        gae(torch.zeros(3), torch.zeros(2), torch.zeros(3, dtype=torch.bool), 1.0, 1.0)
    with pytest.raises(ValueError, match="2 rewards for 1 calls"):
        episode_gae([1.0, 2.0], [torch.zeros(1)], 1.0, 1.0, scope="call")
    with pytest.raises(ValueError, match="no response tokens"):
        episode_gae([1.0], [torch.zeros(0)], 1.0, 1.0, scope="call")


def test_one_group_normalisation_with_the_std_convention_and_eps_named_by_the_caller():
    # group a: 1, 3 (μ 2): population σ = 1, sample σ = sqrt(2 / 1) = 1.41421; group b: 5, 5 (σ = 0) -> A = 0
    rewards, groups = [1.0, 3.0, 5.0, 5.0], ["a", "a", "b", "b"]
    assert group_normalized(rewards, groups, std="population", eps=0.0) == pytest.approx([-1, 1, 0, 0])
    assert group_normalized(rewards, groups, std="sample", eps=0.0) == pytest.approx(
        [-1 / math.sqrt(2), 1 / math.sqrt(2), 0, 0])
    assert group_normalized(rewards, groups, std="sample", eps=1e-4) == pytest.approx(
        [-1 / (math.sqrt(2) + 1e-4), 1 / (math.sqrt(2) + 1e-4), 0, 0])
    # 0, 1, 2: μ 1, population σ = sqrt(2/3), sample σ = 1
    assert group_normalized([0.0, 1.0, 2.0], ["g"] * 3, std="population", eps=1e-6) == pytest.approx(
        [-1 / (math.sqrt(2 / 3) + 1e-6), 0, 1 / (math.sqrt(2 / 3) + 1e-6)])
    assert group_normalized([0.0, 1.0, 2.0], ["g"] * 3, std="sample", eps=0.0) == pytest.approx([-1, 0, 1])
    # one sample, or equal rewards: no signal, exactly 0 (also with eps 0, where 0/0 would be NaN)
    assert group_normalized([2.0], ["solo"], std="sample", eps=0.0) == [0.0]
    assert group_normalized([0.1] * 3, ["g"] * 3, std="population", eps=0.0) == [0.0] * 3
    # a NaN reward poisons its group only, for the trainer's non-finite checks to see
    # (h: 1, 2: μ 1.5, sample σ = sqrt(0.5))
    out = group_normalized([float("nan"), 1.0, 1.0, 2.0], ["g", "g", "h", "h"], std="sample", eps=1e-4)
    assert all(math.isnan(x) for x in out[:2]) and out[2:] == pytest.approx([-0.5 / (math.sqrt(0.5) + 1e-4),
                                                                             0.5 / (math.sqrt(0.5) + 1e-4)])
    with pytest.raises(TypeError):           # the convention is the caller's to name: no default
        group_normalized(rewards, groups)
    with pytest.raises(ValueError, match="std must be"):
        group_normalized(rewards, groups, std="unbiased", eps=0.0)


def test_every_group_estimator_uses_the_one_normalisation_with_its_papers_convention(monkeypatch):
    """DECOR Eq. 6 (sample std, ε 1e-4) and QAgent (population std, ε 1e-6) go through `advantages.group_normalized`
    (the shared-prefix GRPO's TRL convention: tests/test_train_grpo_prefix.py)."""
    import ragteam.train.advantages as A
    from ragteam.systems.decor.roles import POLICY_ROLES
    from ragteam.records import AgentCall, Episode
    from ragteam.train.decor_adv import EPS, decor_advantages
    from ragteam.train.joint.batch import Sample
    from ragteam.train.joint.update import group_advantages

    calls = []
    real = A.group_normalized

    def spy(rewards, groups, *, std, eps):
        calls.append((std, eps))
        return real(rewards, groups, std=std, eps=eps)

    monkeypatch.setattr(A, "group_normalized", spy)
    import ragteam.train.decor_adv as D
    monkeypatch.setattr(D, "group_normalized", spy)
    eps = []
    for r in (1.0, 0.0):
        e = Episode(question_id="q", question="q", golden_answers=["a"])
        e.add_call(AgentCall(role=POLICY_ROLES[0], prompt=[], reward=r))
        eps.append(e)
    adv = decor_advantages(eps, POLICY_ROLES)
    assert calls[-1] == ("sample", EPS) and adv[0][0] == pytest.approx(0.5 / (math.sqrt(0.5) + EPS))
    samples = [Sample(0, 0, "r", [1], [2, 3], r, group="g") for r in (1.0, 0.0)]
    group_advantages(samples)
    # QAgent: 1, 0 -> μ 0.5, population σ 0.5
    assert calls[-1] == ("population", 1e-6)
    assert samples[0].advantages.tolist() == pytest.approx([0.5 / (0.5 + 1e-6)] * 2)
    assert not hasattr(A, "group_normalized_by_role")


# ---- the clipped losses ------------------------------------------------------------------------------------------

def _pg_inputs():
    # log-ratios .1, -.5, .3, .05 and a padded 5th token that must not count
    old = torch.zeros(1, 5)
    logp = torch.tensor([[0.1, -0.5, 0.3, 0.05, 9.0]])
    adv = torch.tensor([[1.0, -1.0, 2.0, 0.5, 100.0]])
    mask = torch.tensor([[1.0, 1.0, 1.0, 1.0, 0.0]])
    return logp, old, adv, mask


def test_ppo_policy_loss_by_hand():
    logp, old, adv, mask = _pg_inputs()
    # ratios 1.10517, .60653, 1.34986, 1.05127; ε = .2:
    #  t0 A=1:  ratio 1.10517 inside [.8, 1.2]: -1.10517
    #  t1 A=-1: max(.60653, clip .8 -> .8) = .8 (clipped)
    #  t2 A=2:  max(-2.69972, -2·1.2 = -2.4) = -2.4 (clipped)
    #  t3 A=.5: -.525636 (inside the range)
    loss, st = policy_loss(logp, old, adv, mask, eps_low=0.2)
    r = [math.exp(x) for x in (0.1, -0.5, 0.3, 0.05)]
    expect = (-r[0] + 0.8 - 2.4 - 0.5 * r[3]) / 4
    assert float(loss) == pytest.approx(expect, rel=1e-5)
    assert st["clip_frac"] == pytest.approx(0.5)
    # clip-higher (DECOR): ε_high = .4 lets t2's ratio 1.35 through
    loss_h, _ = policy_loss(logp, old, adv, mask, eps_low=0.2, eps_high=0.4)
    assert float(loss_h) == pytest.approx((-r[0] + 0.8 - 2 * r[2] - 0.5 * r[3]) / 4, rel=1e-5)
    # sequence level: one ratio exp(mean log-ratio) = exp(-.0125) for every token
    loss_s, _ = policy_loss(logp, old, adv, mask, eps_low=0.2, ratio_level="sequence")
    rs = math.exp((0.1 - 0.5 + 0.3 + 0.05) / 4)
    assert float(loss_s) == pytest.approx(-rs * (1 - 1 + 2 + 0.5) / 4, rel=1e-5)


def test_value_loss_clipping_by_hand():
    v, old, ret, mask = (torch.tensor([[1.0, 0.0]]), torch.tensor([[0.5, 0.5]]), torch.tensor([[2.0, 0.0]]),
                         torch.ones(1, 2))
    # unclipped (V-R)² = 1, 0; clipped V = .7, .3 -> 1.69, .09; max -> 1.69, .09; loss = .5·mean = .445
    loss, st = value_loss(v, old, ret, mask, clip=0.2)
    assert float(loss) == pytest.approx(0.445) and st["value_clip_frac"] == 1.0
    assert float(value_loss(v, old, ret, mask, clip=None)[0]) == pytest.approx(0.25)
    # inside the clip range nothing changes
    assert float(value_loss(torch.tensor([[0.6, 0.4]]), old, ret, mask, clip=0.2)[0]) == pytest.approx(
        0.5 * ((0.6 - 2) ** 2 + 0.4 ** 2) / 2)


def test_kl_and_explained_variance():
    assert float(kl_k3(torch.tensor(0.3), torch.tensor(0.3))) == 0.0
    assert float(kl_k3(torch.tensor(-1.0), torch.tensor(0.0))) == pytest.approx(math.exp(1) - 2)
    ret = torch.tensor([1.0, 2.0, 3.0])
    assert explained_variance(ret, ret, torch.ones(3)) == pytest.approx(1.0)
    assert explained_variance(torch.zeros(3), ret, torch.ones(3)) == pytest.approx(0.0)
    assert math.isnan(explained_variance(torch.zeros(2), torch.ones(2), torch.ones(2)))


# ---- params ------------------------------------------------------------------------------------------------------

def test_unknown_joint_key_is_an_error_naming_it():
    from ragteam.config import ParamsError
    from ragteam.systems.params import load_joint

    params = {"joint": {"systems": ["mask"], "retriever": "x", "ppo": {**PPO, "clip_ratio": 0.2},
                        "mask": {"max_questions": 0}}}
    with pytest.raises(ParamsError, match=r"joint\.ppo\.clip_ratio"):
        load_joint(params, "mask")
    params["joint"]["ppo"].pop("clip_ratio")
    params["joint"]["mask"]["ppo"] = {"actor_lrr": 1.0}
    with pytest.raises(ParamsError, match=r"joint\.mask\.ppo\.actor_lrr"):
        load_joint(params, "mask")
    params["joint"]["mask"]["ppo"] = {"actor_lr": 0.5}
    assert load_joint(params, "mask")[0].actor_lr == 0.5
    with pytest.raises(ParamsError, match="not in joint.systems"):
        load_joint(params, "jade")


PPO = {"steps": 2, "questions_per_step": 1, "minibatch_size": 8, "micro_batch_size": 4, "actor_lr": 1e-3,
       "critic_lr": 1e-3, "save_steps": 1, "temperature": 1.0,
       "lora": {"enabled": True, "rank": 8, "alpha": 16, "top_layers": 2}}


# ---- SmolLM2: one update moves log-probs the way the advantages say ----------------------------------------------

def test_one_ppo_update_on_smollm2_follows_the_advantages(smollm2_dir):
    from transformers import AutoTokenizer

    from ragteam.train.joint.params import PPOParams
    from ragteam.train.joint.batch import Sample, _collate
    from ragteam.train.joint.actor_critic import _build_actor_critic
    from ragteam.train.joint.update import ppo_update

    torch.manual_seed(0)
    p = PPOParams(**{**PPO, "actor_lr": 5e-3, "vf_coef": 0.0})
    tok = AutoTokenizer.from_pretrained(smollm2_dir)
    ac = _build_actor_critic(str(smollm2_dir), p, "cpu", torch.float32)
    msgs = [{"role": "user", "content": "Name a colour."}]
    prompt = tok(tok.apply_chat_template(msgs, add_generation_prompt=True, tokenize=False),
                 add_special_tokens=False).input_ids
    good, bad = (tok(" Blue", add_special_tokens=False).input_ids + [tok.eos_token_id],
                 tok(" Seven", add_special_tokens=False).input_ids + [tok.eos_token_id])
    samples = [Sample(0, 0, "r", prompt, good, 1.0), Sample(0, 1, "r", prompt, bad, -1.0)]

    def logps():
        with torch.no_grad():
            batch = _collate(samples, tok.eos_token_id, "cpu")
            lp, v = ac(*batch[:4])
        return [lp[b, :len(s.response_ids)] for b, s in enumerate(samples)], v

    before, v = logps()
    for s, lp, a in zip(samples, before, (1.0, -1.0)):
        s.old_logp, s.values = lp, v[0, :len(s.response_ids)] * 0
        s.advantages, s.returns = torch.full_like(lp, a), torch.zeros_like(lp)
    opt = torch.optim.AdamW([t for t in ac.parameters() if t.requires_grad], lr=p.actor_lr)
    stats = ppo_update(ac, opt, samples, p, tok.eos_token_id, "cpu")
    after, _ = logps()
    assert float(after[0].sum()) > float(before[0].sum()) + 1e-3      # positive advantage: more likely
    assert float(after[1].sum()) < float(before[1].sum()) - 1e-3      # negative advantage: less likely
    assert stats["clip_frac"] == [0.0]                                # on-policy first step: ratio 1


# ---- the loop on SmolLM2: a killed run resumes; a NaN loss stops with the last good checkpoint kept --------------

def _tiny_system(nan_at_step: int | None = None):
    from helpers_agents import KeywordRetriever

    from ragteam.systems.mask import mask_system

    retr = KeywordRetriever([("Xland", "Xville is the capital of Xland."), ("Yland", "Yville is in Yland.")])
    params = {"mask": {"max_turns": 1, "top_k": 1, "passage_words": 8, "format_penalty": 1.0}}
    system = mask_system(params, retr)
    if nan_at_step is None:
        return system
    seen = {"n": 0}

    def annotate(eps):
        seen["n"] += 1
        eps = system.annotate(eps)
        if seen["n"] == nan_at_step:
            eps[0].calls[0].reward = float("nan")
        return eps

    from dataclasses import replace

    return replace(system, annotate=annotate)


ROWS = [{"id": "q1", "question": "What is the capital of Xland?", "golden_answers": ["Xville"]},
        {"id": "q2", "question": "Which country is Yville in?", "golden_answers": ["Yland"]}]


def _train(tmp_path, smollm2_dir, system, on_step=None):
    from ragteam.llm import EngineConfig, SamplingConfig
    from ragteam.train.joint.params import PPOParams
    from ragteam.train.joint.loop import train_joint_ppo

    p = PPOParams(**PPO)
    sampling = {"default": SamplingConfig(max_new_tokens=6)}
    return train_joint_ppo(system, ROWS, str(smollm2_dir), tmp_path / "ckpt", p,
                           EngineConfig(device="cpu", threads=1, batch_size=4), sampling, on_step=on_step)


def test_nan_loss_stops_keeping_the_last_good_checkpoint_and_a_rerun_resumes(tmp_path, smollm2_dir):
    from ragteam.train.checkpoints import TrainingDiverged

    # a NaN reward at step 2 makes the loss non-finite: training stops, checkpoint-1 stays (like a killed run)
    with pytest.raises(TrainingDiverged, match=r"non-finite loss at step 2.*checkpoint-1"):
        _train(tmp_path, smollm2_dir, _tiny_system(nan_at_step=2))
    assert (tmp_path / "ckpt" / "checkpoint-1" / "state.pt").exists()
    assert not (tmp_path / "ckpt" / "checkpoint-2").exists()
    first = json_load(tmp_path / "ckpt" / "checkpoint-1" / "trainer_state.json")["log_history"][0]
    # the rerun resumes from checkpoint-1 and runs only step 2
    res = _train(tmp_path, smollm2_dir, _tiny_system())
    assert res.resumed_from == 1 and res.global_step == 2 and len(res.log_history) == 2
    assert res.log_history[0] == first
    e = res.log_history[1]
    for key in ("reward", "episode_f1", "value_loss", "policy_loss", "explained_variance", "clip_frac",
                "response_tokens", "format_error_rate", "reward/mask_planning", "reward/mask_answer"):
        assert key in e, key
    assert e["calls_per_episode"] >= 3                      # Planning, Search, ..., Answer
    assert (tmp_path / "ckpt" / "checkpoint-2" / "trainer_state.json").exists()


def json_load(path):
    import json

    return json.loads(path.read_text())


# ---- issue 23 §4: sampling seeds and token in, token out ---------------------------------------------------------

def test_rollout_calls_of_one_step_draw_fresh_samples_and_a_rebuilt_step_reproduces_them(tmp_path, tiny_llama):
    """Every engine call of a step used to run with the step's one seed, so successive calls (roles, turns) replayed
    one random stream. The step's Team now derives a seed per call (`ragteam.llm.Team`, `call_seed`): two calls with
    the same prompts in one step differ at temperature 1, and a Team rebuilt for the same step (a rerun, a resumed
    step) reproduces every call's samples; another step samples otherwise."""
    from transformers import AutoTokenizer

    from ragteam.llm import EngineConfig, SamplingConfig
    from ragteam.llm.policy import Rollouts, policy_engine
    from ragteam.train.joint.params import PPOParams
    from ragteam.train.joint.actor_critic import _build_actor_critic

    p = PPOParams(**{**PPO, "lora": {"enabled": False}})
    tok = AutoTokenizer.from_pretrained(tiny_llama)
    ac = _build_actor_critic(str(tiny_llama), p, "cpu", torch.float32)
    cfg = EngineConfig(device="cpu", threads=1)
    rollouts = Rollouts(policy_engine("live", ac.policy, tok, str(tiny_llama), cfg, tmp_path / "sync"),
                        {"default": SamplingConfig(max_new_tokens=6)}, ("mask_search", "mask_answer"), None, cfg,
                        temperature=p.temperature, top_p=p.top_p, seed=p.seed)
    prompts = [[{"role": "user", "content": "Name a city."}]] * 2

    def step(k):
        team = rollouts.team(k, ac.policy)
        return [[c[0].text for c in team.generate(role, prompts)]
                for role in ("mask_search", "mask_answer", "mask_search")]

    first = step(0)
    assert first[0] != first[1] and first[0] != first[2] and first[1] != first[2]   # each call its own stream
    assert step(0) == first                                                         # the step reproduced
    assert step(1) != first
    # a whole M-ASK rollout (every role, every turn) rerun for the same step samples every call again
    system = _tiny_system()

    def rollout():
        return [c.response for ep in system.rollout(ROWS, rollouts.team(3, ac.policy)) for c in ep.calls]

    assert rollout() == rollout()
    # the rollouts' calls carry the sampled ids the loss will score (token in, token out)
    from ragteam.agents.core import llm_step, new_episode

    ep = new_episode({"id": "q", "question": "Name a city.", "golden_answers": ["x"]}, "mask")
    [call] = llm_step(rollouts.team(0, ac.policy), "mask_search", [ep], prompts[:1], lambda t: t)
    assert call.response_ids and tok.decode(call.response_ids, skip_special_tokens=True) == call.response


def _merged_split(tok):
    """A real re-tokenisation mismatch of the SmolLM2 tokenizer: `</search>` sampled as `<` `/` `search` `>`
    decodes to text that re-encodes as `</` `search` `>`."""
    enc = lambda t: tok(t, add_special_tokens=False).input_ids  # noqa: E731
    sampled = enc("<search>capital of Xland<") + enc("/") + enc("search>") + [tok.eos_token_id]
    text = tok.decode(sampled, skip_special_tokens=True)
    assert text == "<search>capital of Xland</search>"
    assert enc(text) + [tok.eos_token_id] != sampled                 # the text alone re-encodes differently
    return sampled, text


def test_a_call_is_scored_on_its_sampled_ids_not_a_retokenisation_of_its_text(smollm2_dir):
    """Token in, token out (issue 23 §4): the engine's prompt and sampled ids travel on the AgentCall (`llm_step`)
    and the trainer's sample, hence the loss's targets, are those ids. A call without recorded ids (hand-made, read
    back from JSONL, which does not keep them) is re-tokenised."""
    from transformers import AutoTokenizer

    from ragteam.agents.core import llm_step, new_episode
    from ragteam.llm import Completion, Team
    from ragteam.records import Episode, reproducible
    from ragteam.train.joint.batch import _collate, episode_samples, tokenize_call

    tok = AutoTokenizer.from_pretrained(smollm2_dir)
    sampled, text = _merged_split(tok)
    msgs = [{"role": "user", "content": "What is the capital of Xland?"}]
    prompt_ids = tuple(tok(tok.apply_chat_template(msgs, add_generation_prompt=True, tokenize=False),
                           add_special_tokens=False).input_ids)

    class Engine:
        def generate(self, prompts, sampling):
            return [[Completion(text, len(prompt_ids), len(sampled), "stop", prompt_ids=prompt_ids,
                                token_ids=tuple(sampled), logprobs=tuple(-0.5 for _ in sampled))] for _ in prompts]

    ep = new_episode({"id": "q", "question": msgs[0]["content"], "golden_answers": ["Xville"]}, "mask")
    [untrained] = llm_step(Team(Engine()), "mask_search", [ep.model_copy(deep=True)], [msgs], lambda t: t)
    assert untrained.response_ids is None                              # evaluation keeps no ids (memory)
    [call] = llm_step(Team(Engine(), keep_token_ids=True), "mask_search", [ep], [msgs], lambda t: t)
    assert call.prompt_ids == list(prompt_ids) and call.response_ids == sampled and len(call.logprobs) == len(sampled)
    call.reward = 1.0
    [s] = episode_samples(tok, [ep], ("mask_search",))
    assert s.prompt_ids == list(prompt_ids) and s.response_ids == sampled
    targets = _collate([s], tok.eos_token_id, "cpu")[3][0].tolist()
    assert targets == sampled                                           # the loss scores the sampled tokens
    # the written form keeps no ids; a call read back from it is re-tokenised
    [written] = list(reproducible([ep]))
    assert not {"prompt_ids", "response_ids", "logprobs"} & set(written["calls"][0])
    back = Episode.model_validate(written).calls[0]
    retokenised = tok(text, add_special_tokens=False).input_ids + [tok.eos_token_id]
    assert back.response_ids is None and tokenize_call(tok, back) == (list(prompt_ids), retokenised)


# ---- the frozen layers run once a step (reuse_frozen_layers) -------------------------------------------------------

def _actor_critic_and_samples(tiny_llama, **over):
    """A LoRA policy on the top layer of the 2-layer tiny Llama, its adapters moved off zero (so that the start
    model differs from it), and 6 samples of different lengths in 3 episodes."""
    from ragteam.train.joint.params import PPOParams
    from ragteam.train.joint.batch import Sample
    from ragteam.train.joint.actor_critic import _build_actor_critic

    p = PPOParams(**{**PPO, "lora": {"enabled": True, "rank": 4, "alpha": 8, "top_layers": 1}, **over})
    torch.manual_seed(0)
    ac = _build_actor_critic(str(tiny_llama), p, "cpu", torch.float32)
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for n, t in ac.named_parameters():
            if t.requires_grad:
                t.copy_(torch.randn(t.shape, generator=g) * 0.1)
    samples = []
    for i, (lp, lr) in enumerate([(5, 3), (9, 2), (4, 6), (7, 4), (3, 1), (8, 5)]):
        ids = torch.randint(5, 200, (lp + lr,), generator=g).tolist()
        samples.append(Sample(i // 2, i % 2, "r", ids[:lp], ids[lp:], float(i % 3) - 1.0))
    return p, ac, samples


@pytest.mark.parametrize("over, passes_without", [
    ({"minibatch_size": 2, "micro_batch_size": 2, "kl_coef": 0.05}, 3),   # old + reference + 3 minibatches: 3 passes
    ({"minibatch_size": 8, "micro_batch_size": 2}, 2),                     # single pass (+ the kl_start reference)
])
def test_the_frozen_layers_run_once_a_step_and_the_update_is_the_same(tiny_llama, over, passes_without):
    """One step's update with and without reuse: the bottom layer runs once per micro-batch of the old pass instead
    of once in every pass, and the update (weights, losses, kl_start, grad norms) is the same."""
    from types import SimpleNamespace

    from ragteam.train.joint.actor_critic import _parts, make_optimizer, start_logp
    from ragteam.train.joint.update import _update
    from ragteam.systems.mask import mask_system

    system = mask_system({"mask": {"max_turns": 1, "top_k": 1, "passage_words": 8, "format_penalty": 1.0}}, None)
    accel = SimpleNamespace(backward=lambda loss: loss.backward(), clip_grad_norm_=torch.nn.utils.clip_grad_norm_)
    runs = {}
    for reuse in (True, False):
        p, ac, samples = _actor_critic_and_samples(tiny_llama, reuse_frozen_layers=reuse, **over)
        assert ac.split == (1 if reuse else None)
        calls = []
        _parts(ac.policy)[0].layers[0].register_forward_hook(lambda *a: calls.append(a[1][0].shape[0]))
        stats = _update(system, p, samples, [], ac, ac, make_optimizer(ac, p), accel,
                        lambda batch, hidden=None: start_logp(ac, None, p, batch, hidden), 0, "cpu", 0, None)
        assert all(s.hidden is None for s in samples)       # dropped after the update
        weights = {n: t.detach().clone() for n, t in ac.named_parameters() if t.requires_grad}
        runs[reuse] = calls, stats, weights
    (calls_on, on, w_on), (calls_off, off, w_off) = runs[True], runs[False]
    assert sum(calls_on) == 6 and len(calls_on) == 3                # each sample once, in the 3 old-pass chunks
    assert sum(calls_off) == 6 * passes_without
    assert set(on) == set(off) and on["kl_start"][0] > 1e-4
    for k in off:
        assert on[k] == pytest.approx(off[k], rel=1e-4, abs=1e-6), k
    for n in w_off:
        assert torch.allclose(w_on[n], w_off[n], atol=1e-6), n
    assert any(not torch.equal(w_off[n], t) for n, t in _actor_critic_and_samples(tiny_llama)[1].named_parameters()
               if t.requires_grad)                              # the update did move the weights


def test_the_frozen_layers_are_not_reused_where_they_do_not_exist_or_the_split_changes_the_forward(
        tiny_llama, monkeypatch):
    from ragteam.train.joint import actor_critic as ppo

    for over, why in [({"reuse_frozen_layers": False}, "is off"),
                      ({"lora": {"enabled": False}}, "every layer trains"),
                      ({"lora": {"enabled": True, "rank": 4, "alpha": 8, "top_layers": None}}, "every layer trains"),
                      ({"lora": {"enabled": True, "rank": 4, "alpha": 8, "top_layers": 2}}, "covers all 2 layers"),
                      ({"gradient_checkpointing": True}, "recomputes")]:
        p, ac, _ = _actor_critic_and_samples(tiny_llama, **over)
        assert ac.split is None
        assert why in ppo.frozen_split(ac.policy, p)[1]
    # a decoder whose forward from `inputs_embeds` is not the continuation of its lower layers (as Gemma's, which
    # scales them): the check on a short batch sees it and every pass runs every layer
    real = ppo._layer_view

    def scaled(decoder, start, stop, final_norm):
        return real(decoder, start + 1 if start else start, stop, final_norm)   # the upper part skips a layer

    monkeypatch.setattr(ppo, "_layer_view", scaled)
    p, ac, _ = _actor_critic_and_samples(tiny_llama)
    assert ac.split is None and "does not reproduce" in ppo.frozen_split(ac.policy, p)[1]
