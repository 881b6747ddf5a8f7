"""Regression for the lead-in stub (issue: the trained answer agent learned "The answer to this question is:" and
the first-line parse scored the stub): train the real SmolLM2 answer agent a few GRPO steps with the shipped CPU
reward on a fixed seed, then check its held-out answers and the reward's ordering of degenerate outputs."""
import pytest
import yaml

from ragteam.agents import maps
from ragteam.agents.core import FormatError, QueryPool
from ragteam.data.synthetic import generate
from ragteam.retrieval.base import Hit
from ragteam.train.grpo import GRPOParams, answer_reward_func
from ragteam.train.maps import AnswerAgentParams

from conftest import REPO


def _shipped_answer_params() -> AnswerAgentParams:
    return AnswerAgentParams.model_validate(
        {k: v for k, v in yaml.safe_load((REPO / "params.yaml").read_text())["train_answer"].items()
         if k not in ("backend", "stage1_top_k", "stage2_top_k")})


def _prompt(world, q: dict) -> list[dict]:
    pool = QueryPool()
    hits = [Hit(pid, world.passage(*pid.rsplit("-", 1)[:1], int(pid.rsplit("-", 1)[1]))["contents"], 1.0)
            for pid in q["metadata"]["supporting_ids"]]
    pool.add(q["question"], hits)
    return maps.answer_messages(q["question"], pool.render(15))


@pytest.mark.slow
def test_trained_answer_agent_never_answers_with_a_lead_in_stub(smollm2_dir, tmp_path):
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from ragteam.train.grpo_prefix import train_grpo_shared_prefix

    shipped = _shipped_answer_params()
    world, _, train, dev = generate(600, 4, 6, seed=3, question_mix={"film_director": 1, "person_city": 1})
    samples = [{"id": q["id"], "prompt": _prompt(world, q), "golden_answers": q["golden_answers"]} for q in train]
    params = GRPOParams(steps=2, prompts_per_step=2, num_generations=6, micro_batch_size=12, lr=5e-4, seed=0,
                        kl_beta=0.05, temperature=0.8, max_completion_length=16, save_steps=100,
                        trainer="shared_prefix", lora={"enabled": True, "rank": 16, "alpha": 32, "top_layers": 8})
    reward = shipped.reward("stage1")
    res = train_grpo_shared_prefix(samples, str(smollm2_dir), str(tmp_path / "ck"), params,
                                   answer_reward_func(reward, clip_tokens=16))
    assert res.global_step == 2

    tok = AutoTokenizer.from_pretrained(smollm2_dir)
    model = res.model.eval()
    raws = []
    with torch.no_grad():
        for q in dev:
            ids = tok.apply_chat_template(_prompt(world, q), add_generation_prompt=True, return_tensors="pt",
                                          return_dict=True)["input_ids"]
            out = model.generate(input_ids=ids, max_new_tokens=24, do_sample=False, pad_token_id=tok.pad_token_id)
            raws.append(tok.decode(out[0, ids.shape[1]:], skip_special_tokens=True))
    for raw in raws:
        y = maps.parse_answer(raw)
        if isinstance(y, FormatError):
            continue
        # a parsed answer is never a lead-in ("to this question is:") or a copied passage header
        assert not maps.is_lead_in(y.rstrip(":")), (raw, y)
        assert not y.lower().startswith("doc "), (raw, y)
        first = raw.strip().splitlines()[0].strip()
        if first.endswith(":") and maps.is_lead_in(first.rstrip(":")):
            assert y not in first, (raw, y)   # the answer came from below the lead-in
    # the shipped reward ranks a correct long answer above every stub the policy can fall into
    gold = dev[0]["golden_answers"]
    long_correct = f"After reading the documents carefully I am confident that it is {gold[0]} for sure"
    stubs = ["The answer to this question is:", "", "Answer:", f'Doc 1(Title: "{gold[0]}"): {gold[0]} is']
    long_r, _ = reward(long_correct, gold)
    assert all(reward(s, gold, clipped)[0] < long_r for s in stubs for clipped in (False, True))
