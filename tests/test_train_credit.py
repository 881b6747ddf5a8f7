"""Credit assignment of the joint trainer (issue 23 §1): M-ASK's per-call returns under every profile, and fp32
master weights under a bf16 engine."""
from __future__ import annotations

from pathlib import Path

import pytest
import torch
import yaml
from helpers_agents import KeywordRetriever, ScriptedEngine
from test_mask_agents import PASSAGES
from test_mask_agents import reply as mask_reply

from ragteam.agents import mask as M
from ragteam.config import deep_merge
from ragteam.llm import Team

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

    from ragteam.train.ppo import assign_advantages, episode_samples
    from ragteam.train.systems import mask_system
    from stages.train_joint import load_joint

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
    from ragteam.train.ppo import JointSystem
    from ragteam.train.systems import jade_system, mask_system
    from stages.train_joint import load_joint

    retr = KeywordRetriever(PASSAGES)
    params = _profiles()["default"]
    assert mask_system(params, retr).gae_scope == "call" and jade_system(params, retr).gae_scope == "episode"
    params["joint"]["mask"]["ppo"] = {"gae_scope": "episode"}        # a profile cannot set the inverted form back
    with pytest.raises(ParamsError, match=r"joint\.mask\.ppo\.gae_scope"):
        load_joint(params, "mask")
    with pytest.raises(ValueError, match="'nope': GAE with a critic needs gae_scope"):
        JointSystem(name="nope", roles=("r",), rollout=None, annotate=None, describe={})


# ---- update helpers -------------------------------------------------------------------------------------------------

def _samples(tok, advantages=(1.0, -1.0), ret=8.0):
    from ragteam.train.ppo import Sample

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
    from ragteam.train.ppo import _collate

    with torch.no_grad():
        lp, v = ac(*_collate(samples, tok.eos_token_id, "cpu")[:4])
    for b, s in enumerate(samples):
        n = len(s.response_ids)
        s.old_logp, s.values = lp[b, :n].float(), v[b, :n].float()


# ---- fp32 master weights under a bf16 engine ---------------------------------------------------------------------

def test_paper_profile_step_moves_the_weights_under_bf16(tiny_llama):
    """The paper profile's M-ASK actor (full fine-tuning, lr 2e-7, separate critic, lr 1e-5) in bfloat16: one optimiser
    step changes the trainable weights. In bf16 a weight of 0.02 has a spacing of 1.2e-4: AdamW's ~2e-7 step
    rounds to nothing."""
    from transformers import AutoTokenizer

    from ragteam.train.ppo import _build_actor_critic, actor_critic_params, make_optimizer, ppo_update
    from stages.train_joint import load_joint

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
