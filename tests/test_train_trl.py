"""TRL backend: GRPO with the MAPS answer reward, SFT with assistant-only loss, resume after a kill, the saved agent
(save_pretrained + model card) and the training curves."""
import json
import math

import pytest

from ragteam.config import ParamsError, parse_section
from ragteam.io import sha256_file, write_jsonl
from ragteam.rewards.maps import maps_answer_reward_stage1
from ragteam.train.checkpoints import checkpoint_steps, save_agent
from ragteam.train.curves import curve_rows, read_curves, summarize, write_curves
from ragteam.agents.maps import parse_answer
from ragteam.rewards.maps import AnswerReward
from ragteam.train.grpo import GRPOParams, answer_reward_func, completion_text, train_grpo
from ragteam.train.maps import AnswerAgentParams, query_reward_func, train_answer_agent
from ragteam.train.model_card import model_card
from ragteam.train.sft import SFTParams, sft_rows, sft_trainer, train_sft

QUESTIONS = [("Paris is the capital of France.", "What is the capital of France?", ["Paris"]),
             ("The Nile flows through Egypt.", "Which river flows through Egypt?", ["Nile", "the Nile river"]),
             ("Mount Fuji is in Japan.", "In which country is Mount Fuji?", ["Japan"]),
             ("Ottawa is the capital of Canada.", "What is the capital of Canada?", ["Ottawa"])]
SAMPLES = [{"id": f"q{i}", "golden_answers": g,
            "prompt": [{"role": "system", "content": "Answer with the answer only."},
                       {"role": "user", "content": f"{doc}\nQuestion: {q}"}]}
           for i, (doc, q, g) in enumerate(QUESTIONS)]
TINY_GRPO = dict(prompts_per_step=2, num_generations=2, micro_batch_size=4, lr=1e-3, max_completion_length=4,
                 save_steps=1, temperature=1.0)


@pytest.fixture(scope="module")
def tiny_llm(tiny_llama):
    return tiny_llama

def _kill_at(step):
    """A callback that raises at the end of `step`, before that step's checkpoint is written: a crash."""
    from transformers import TrainerCallback

    class Kill(TrainerCallback):
        def on_step_end(self, args, state, control, **kw):
            if state.global_step == step:
                raise KeyboardInterrupt(f"killed at step {step}")

    return Kill()


def test_answer_reward_func_scores_completions_against_the_golden_answers_column():
    logged = {}
    f = answer_reward_func(AnswerReward("stage1", 0.5, 3))
    completions = [[{"role": "assistant", "content": " Paris. "}], [{"role": "assistant", "content": "It is Paris"}],
                   "I believe it must be the Nile river"]
    golds = [["Paris"], ["Paris"], ["Nile", "the Nile river"]]
    out = f(prompts=[None] * 3, completions=completions, golden_answers=golds,
            log_metric=lambda k, v: logged.setdefault(k, v), trainer_state=None)
    # "Paris." EM 1 + 0.5; "It is Paris" PR 1/3; 8 words > 3: PR vs "the nile river" 2/7 (no article) -> 1/7 - 1
    assert out == pytest.approx([1.5, 0.5 / 3, 0.5 * 2 / 7 - 1.0])
    assert logged["em"] == pytest.approx(1 / 3) and logged["words"] == pytest.approx((1 + 3 + 8) / 3)
    assert f.__name__ == "maps_answer_reward_stage1"  # TRL logs rewards/<name>/mean
    assert answer_reward_func(AnswerReward("stage2", 0.5, 3)).__name__ == "maps_answer_reward_stage2"
    assert completion_text("  x ") == "x"


def test_grpo_params_validate_at_the_edge():
    p = parse_section({"train_answer": {"stage1": {"steps": 3, **TINY_GRPO}}}, "train_answer.stage1", GRPOParams)
    assert p.lora.enabled is False and p.kl_beta == 0.0
    with pytest.raises(ParamsError, match=r"s\.num_generations"):
        parse_section({"s": {"steps": 3, **{**TINY_GRPO, "num_generations": 1}}}, "s", GRPOParams)
    with pytest.raises(ParamsError, match="micro_batch_size"):
        parse_section({"s": {"steps": 3, **{**TINY_GRPO, "micro_batch_size": 3}}}, "s", GRPOParams)
    with pytest.raises(ParamsError, match="s.learning_rate"):
        parse_section({"s": {"steps": 3, "learning_rate": 1e-5, **TINY_GRPO}}, "s", GRPOParams)


@pytest.mark.slow
def test_grpo_on_smollm2_trains_with_the_library_reward_and_saves_the_agent(smollm2_dir, tmp_path):
    seen = []
    reward = answer_reward_func(AnswerReward("stage1", 0.5, 2))

    def recording_reward(completions, golden_answers, **kw):
        out = reward(completions, golden_answers, **kw)
        seen.append([(completion_text(c), g, r) for c, g, r in zip(completions, golden_answers, out)])
        return out

    recording_reward.__name__ = reward.__name__
    params = GRPOParams(steps=2, kl_beta=0.01, **{**TINY_GRPO, "save_steps": 10, "lr": 1e-5})
    res = train_grpo(SAMPLES, str(smollm2_dir), str(tmp_path / "ckpt"), params, recording_reward,
                     run_tag={"reward": "Eq. 4", "alpha": 0.5, "l": 2})
    assert res.global_step == 2 and res.resumed_from is None
    # the reward saw each group's golden answers (from the dataset column) and scored with Eq. 4
    assert len(seen) == 2 and all(len(batch) == 4 for batch in seen)
    golds = {json.dumps(s["golden_answers"]) for s in SAMPLES}
    for batch in seen:
        for y, g, r in batch:
            assert json.dumps(g) in golds
            parsed = parse_answer(y)   # the reward scores the answer as the pipeline parses it
            assert r == pytest.approx(maps_answer_reward_stage1(parsed if isinstance(parsed, str) else "", g, 0.5, 2))
    # TRL's logged reward is the mean of ours; KL is logged because beta > 0
    rows = curve_rows(res.log_history, stage="stage1")
    assert [r["step"] for r in rows] == [1, 2]
    for row, batch in zip(rows, seen):
        assert row["reward"] == pytest.approx(sum(r for *_, r in batch) / len(batch), abs=1e-5)
        assert {"loss", "kl", "em", "stage"} <= set(row)

    # curves for dvc plots + PNG; the saved agent with its model card
    write_curves(rows, tmp_path / "curves", png_path=tmp_path / "curves.png", title="t")
    curves = read_curves(tmp_path / "curves")
    assert {"reward", "loss", "kl", "em"} <= set(curves) and "stage" not in curves
    assert [s for s, _ in curves["reward"]] == [1, 2]
    assert [v for _, v in curves["reward"]] == pytest.approx([r["reward"] for r in rows])
    assert (tmp_path / "curves.png").read_bytes()[:4] == b"\x89PNG"
    data = tmp_path / "t1.jsonl"
    write_jsonl(data, SAMPLES)
    metrics = summarize(rows, res.seconds, res.global_step)
    card = model_card(agent="answer_agent", base_model=str(smollm2_dir), backend="trl", data={"t1": data},
                      params=params.model_dump(), reward="R_a1 = EM + 0.5 PR + L(y), l = 2 (Eq. 4)", metrics=metrics)
    out = save_agent(res, tmp_path / "answer_agent", card)
    assert (out / "model.safetensors").exists() and (out / "tokenizer.json").exists()
    text = (out / "README.md").read_text()
    assert sha256_file(data) in text and "Eq. 4" in text and "| 4 |" in text and str(smollm2_dir) in text
    assert f"| steps | {float(2)} |" in text and '"num_generations": 2' in text

    from transformers import AutoModelForCausalLM

    m = AutoModelForCausalLM.from_pretrained(out)
    assert m.config.num_hidden_layers == 30 and not any(p.isnan().any() for p in m.parameters())


def test_grpo_resumes_from_the_last_checkpoint_after_a_kill(tiny_llm, tmp_path):
    params = GRPOParams(steps=4, **TINY_GRPO)
    reward = answer_reward_func(AnswerReward("stage2", 0.5, 12))
    ckpt = tmp_path / "ckpt"
    with pytest.raises(KeyboardInterrupt, match="killed at step 3"):
        train_grpo(SAMPLES, str(tiny_llm), str(ckpt), params, reward, callbacks=[_kill_at(3)])
    assert checkpoint_steps(ckpt) == [1, 2]  # save_total_limit 2; step 3 died before its save

    res = train_grpo(SAMPLES, str(tiny_llm), str(ckpt), params, reward)
    assert res.resumed_from == 2 and res.global_step == 4
    steps = [h["step"] for h in res.log_history if "reward" in h]
    assert steps == [1, 2, 3, 4]  # history of steps 1-2 comes from the checkpoint; the counter continued

    # other params: the old checkpoints are not resumed (they belong to another run) but replaced
    res = train_grpo(SAMPLES, str(tiny_llm), str(ckpt), params.model_copy(update={"steps": 1}), reward)
    assert res.resumed_from is None and res.global_step == 1 and checkpoint_steps(ckpt) == [1]


def test_a_rerun_of_a_finished_grpo_run_loads_it_and_trains_no_further(tiny_llm, tmp_path):
    """The checkpoint at `steps` is a finished run: a rerun (a DVC stage rerun whose checkpoints survive) returns its
    weights and history; transformers' Trainer resumed there would train step steps+1."""
    import torch

    params = GRPOParams(steps=2, **TINY_GRPO)
    reward = answer_reward_func(AnswerReward("stage2", 0.5, 12))
    ckpt = tmp_path / "ckpt"
    first = train_grpo(SAMPLES, str(tiny_llm), str(ckpt), params, reward)
    assert first.global_step == 2 and checkpoint_steps(ckpt)[-1] == 2
    weights = {k: v.detach().clone() for k, v in first.model.named_parameters()}

    def never(*a, **kw):
        raise AssertionError("a finished run must not sample or score again")

    again = train_grpo(SAMPLES, str(tiny_llm), str(ckpt), params, never)
    assert again.resumed_from == 2 and again.global_step == 2 and again.seconds == 0.0
    assert [h["step"] for h in again.log_history if "reward" in h] == [1, 2]
    assert checkpoint_steps(ckpt)[-1] == 2
    for k, v in again.model.named_parameters():
        assert torch.equal(v, weights[k]), k


def test_query_reward_is_delta_f1_of_the_answers_with_and_without_the_new_chunks():
    calls, logged = [], {}

    def answer_pairs(queries, metas):  # the frozen answer agent, faked: the pool decides the answers
        calls.append((queries, metas))
        return [m["with"] for m in metas], [m["without"] for m in metas]

    f = query_reward_func(answer_pairs)
    metas = [{"with": "Paris", "without": "London"}, {"with": "It is Paris", "without": "It is Paris"},
             {"with": "Lyon", "without": "Paris"}]
    out = f(completions=[[{"role": "assistant", "content": " capital France "}], "q2", "q3"],
            golden_answers=[["Paris"]] * 3, meta=[json.dumps(m) for m in metas],
            log_metric=lambda k, v: logged.setdefault(k, v), trainer_state=None)
    assert out == pytest.approx([1.0, 0.0, -1.0])
    assert calls[0] == (["capital France", "q2", "q3"], metas)
    # a plain callable keeps no AnswerPairs.stats: only the reward shares are logged
    assert logged == {"delta_f1_zero": pytest.approx(1 / 3), "delta_f1_positive": pytest.approx(1 / 3)}


def test_grpo_with_lora_on_the_top_layers_saves_a_plain_model(tiny_llm, tmp_path):
    from transformers import AutoModelForCausalLM

    seen_meta = []

    def answer_pairs(queries, metas):
        seen_meta.extend(metas)
        return ["Paris"] * len(queries), [""] * len(queries)

    samples = [{**s, "meta": {"question": s["id"], "pool": {"queries": [s["id"]]}}} for s in SAMPLES]
    params = GRPOParams(steps=1, lora={"enabled": True, "rank": 4, "alpha": 8, "top_layers": 1}, **TINY_GRPO)
    res = train_grpo(samples, str(tiny_llm), str(tmp_path / "ckpt"), params, query_reward_func(answer_pairs))
    # each sample's meta reached the reward (G = 2 copies of each of the 2 prompts of the step)
    assert len(seen_meta) == 4 and all(m["pool"]["queries"] == [m["question"]] for m in seen_meta)
    trainable = [n for n, p in res.model.named_parameters() if p.requires_grad]
    assert trainable and all("lora_" in n and ".layers.1." in n for n in trainable)
    out = save_agent(res, tmp_path / "agent")
    m = AutoModelForCausalLM.from_pretrained(out)  # merged: no peft needed to load it
    assert not any("lora" in n for n, _ in m.named_parameters())


def test_sft_loss_covers_the_assistant_turn_only(tiny_llm, tmp_path):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_llm)
    judge = [{"id": f"j{i}", "prompt": s["prompt"], "completion": label}
             for i, (s, label) in enumerate(zip(SAMPLES, ["Sufficient Information", "Insufficient Information"] * 2))]
    long = {"id": "long", "prompt": [{"role": "user", "content": "word " * 300}],
            "completion": "Sufficient Information"}
    params = SFTParams(steps=2, batch_size=2, lr=1e-3, max_length=96, save_steps=1)
    rows, dropped = sft_rows(judge + [long], tok, params.max_length)
    assert dropped == ["long"] and len(rows) == 4

    trainer = sft_trainer(rows, str(tiny_llm), str(tmp_path / "inspect"), params)
    for ex, sample in zip(trainer.train_dataset, judge):
        ids, labels = ex["input_ids"], ex["labels"]
        kept = [i for i, l in zip(ids, labels) if l != -100]
        assert kept == [l for l in labels if l != -100]
        # exactly the assistant content and its end-of-turn token are trained, never the prompt
        assert tok.decode(kept).strip() == sample["completion"] + "<|im_end|>"
        first = labels.index(next(l for l in labels if l != -100))
        prompt_text = tok.apply_chat_template(sample["prompt"], add_generation_prompt=True, tokenize=False)
        assert tok.decode(ids[:first]) == prompt_text and all(l == -100 for l in labels[:first])

    res = train_sft(judge + [long], str(tiny_llm), str(tmp_path / "ckpt"), params)
    assert res.global_step == 2 and res.extra["samples"] == 4 and res.extra["dropped_too_long"] == 1
    losses = [h["loss"] for h in res.log_history if "loss" in h]
    assert len(losses) == 2 and all(math.isfinite(x) and x > 0 for x in losses)
    with pytest.raises(ValueError, match="longer than max_length"):
        train_sft([long], str(tiny_llm), str(tmp_path / "ckpt2"), params)


def test_answer_agent_stage2_starts_from_stage1_and_reruns_resume(tiny_llm, tmp_path):
    p = GRPOParams(steps=1, **TINY_GRPO)
    params = AnswerAgentParams(alpha=0.5, max_words=5, stage1=p, stage2=p)
    top3, top5 = SAMPLES[:2], SAMPLES[2:]
    res, rows = train_answer_agent(top3, top5, str(tiny_llm), tmp_path / "work", params)
    assert [(r["step"], r["stage"]) for r in rows] == [(1, "stage1"), (2, "stage2")]
    assert res.resumed_from is None and res.extra["stage1"]["global_step"] == 1
    stage1_model = tmp_path / "work" / "stage1_model"
    assert json.loads((stage1_model / "ragteam-train.json").read_text())["fingerprint"] == \
        res.extra["stage1"]["fingerprint"]
    assert json.loads((stage1_model / "config.json").read_text())["num_hidden_layers"] == 2

    # a rerun (e.g. after a kill) trains nothing again: both stages resume from their final checkpoints
    res, rows = train_answer_agent(top3, top5, str(tiny_llm), tmp_path / "work", params)
    assert res.resumed_from == 1 and [r["step"] for r in rows] == [1, 2]
    # new stage-1 data -> a new stage-1 model -> stage 2 cannot reuse its checkpoints
    res, _ = train_answer_agent(top5, top5, str(tiny_llm), tmp_path / "work", params)
    assert res.resumed_from is None


def test_answer_reward_treats_a_clipped_completion_as_too_long():
    f = answer_reward_func(AnswerReward("stage1", 0.5, 5, 1), clip_tokens=4)
    logged = {}
    out = f(completions=["Paris", "Paris", "It is Paris maybe"], golden_answers=[["Paris"]] * 3,
            completion_ids=[[1, 2], [1, 2, 3, 4], [1, 2, 3, 4]], log_metric=lambda k, v: logged.setdefault(k, v))
    # EM + α·PR + L: ended within the budget (1.5); cut at 4 tokens -> L = -1 (0.5); cut and wordy (0.125 - 1)
    assert out == pytest.approx([1.5, 0.5, 0.5 * 0.25 - 1.0])
    assert logged["clipped"] == pytest.approx(2 / 3)
    # a completion that ended with EOS (id 2) in the budget's last slot ended on its own: not clipped (it used to be
    # counted, one token early, as TRL's own `ids[-1] not in eos_and_pad` does not)
    f = answer_reward_func(AnswerReward("stage1", 0.5, 5, 1), clip_tokens=4, eos_token_ids=[2])
    out = f(completions=["Paris", "Paris"], golden_answers=[["Paris"]] * 2, completion_ids=[[1, 1, 1, 2], [1, 1, 1, 1]])
    assert out == pytest.approx([1.5, 0.5])
    # off (the paper profile): Eq. 4 exactly
    assert answer_reward_func(AnswerReward("stage1", 0.5, 5, 1))(completions=["Paris"], golden_answers=[["Paris"]],
                                                   completion_ids=[[1, 2, 3, 4]]) == [1.5]


def test_answer_reward_scores_the_parsed_answer_so_a_bare_label_is_empty():
    f = answer_reward_func(AnswerReward("stage1", 0.5, 5, 1))
    logged = {}
    out = f(completions=["Answer:", "Answer: Paris.", "Paris\nbecause it is the capital",
                         "The answer to this question is:\nParis"], golden_answers=[["Paris"]] * 4,
            log_metric=lambda k, v: logged.setdefault(k, v))
    # "Answer:" has no answer: "" (min_words -> -1, where the raw text scored 0); a lead-in line hands over to the
    # answer below it, which is scored in full
    assert out == pytest.approx([-1.0, 1.5, 1.5, 1.5])
    assert logged["no_answer"] == pytest.approx(0.25)
    # with a format penalty an answer-less output gets it whatever min_words says (the paper profile: None)
    f = answer_reward_func(AnswerReward("stage1", 0.5, 5, 0, format_penalty=-1.0))
    assert f(completions=["Answer:", ""], golden_answers=[["Paris"]] * 2) == [-1.0, -1.0]
