"""MAPS training stages: samples from the synthesis files, ΔF1 answer pairs, unanimity labelling, and the
train_answer / train_query / label_judge / train_judge stages end to end on a tiny model (agent + card + curves)."""
import json

import pytest
from helpers_agents import KeywordRetriever, ScriptedEngine, question_of
from test_train_trl import tiny_llm  # noqa: F401  (module fixture: a 2-layer Llama with SmolLM2's tokenizer)

from ragteam.agents import maps
from ragteam.agents.core import QueryPool
from ragteam.agents.maps_workflow import MapsConfig
from ragteam.io import DataError, read_jsonl, write_jsonl
from ragteam.llm import LLMConfig, SamplingConfig, Team
from ragteam.retrieval.base import Hit
from ragteam.train.curves import read_curves
from ragteam.train.grpo import GRPOParams
from ragteam.train.maps import AnswerPairs, answer_samples, judge_samples, query_reward_func, query_samples
from ragteam.train.sft import SFTParams
from stages.common import LabelJudgeParams, TrainAnswerParams, TrainJudgeParams, TrainQueryParams

PASSAGES = [("Ann Lee", "Ann Lee was born in Paris."), ("Paris", "Paris is a city in France."),
            ("Bob Ray", "Bob Ray was born in Rome."), ("Rome", "Rome is a city in Italy."),
            ("Cy Dow", "Cy Dow is a painter from Oslo."), ("Oslo", "Oslo is a city in Norway.")]
RETRIEVER = KeywordRetriever(PASSAGES)


def _pool(question, *queries, k=1):
    pool = QueryPool()
    for q in (question, *queries):
        pool.add(q, RETRIEVER.search(q, k))
    return pool


def _row(i, question, gold, pool, top_k=3, rnd=0):
    return {"id": f"s{i}", "question_id": f"q{i}", "question": question, "golden_answers": gold, "top_k": top_k,
            "round": rnd, "pool": pool.to_dict(), "source": "single_retrieval"}


def test_answer_samples_take_their_top_k_and_render_the_maps_answer_prompt():
    p = _pool("Where was Ann Lee born?")
    rows = [_row(0, "Where was Ann Lee born?", ["Paris"], p, top_k=3),
            _row(1, "Where was Ann Lee born?", ["Paris"], p, top_k=5)]
    s3 = answer_samples(rows, 3, passage_words=2)
    assert [s.id for s in s3] == ["s0"] and [s.id for s in answer_samples(rows, 5, None)] == ["s1"]
    assert s3[0].prompt == maps.answer_messages("Where was Ann Lee born?", p.render(2))
    assert "Ann Lee ..." in "".join(m["content"] for m in s3[0].prompt)  # clipped to 2 words, as MAPS inference renders it
    with pytest.raises(ValueError, match=r"t1: row id='bad' has no valid `pool`"):
        answer_samples([{"id": "bad", "question": "x", "golden_answers": ["y"], "top_k": 3}], 3, None)


def test_query_and_judge_samples_carry_what_their_trainers_need():
    p = _pool("Where was Ann Lee born?")
    q = query_samples([_row(0, "Where was Ann Lee born?", ["Paris"], p)], None)[0]
    assert q.prompt == maps.query_messages("Where was Ann Lee born?", p.render(None))
    assert q.meta == {"question": "Where was Ann Lee born?", "pool": p.to_dict()}
    msgs = maps.judge_messages("Where was Ann Lee born?", p.render(None))
    t3 = {"id": "j0", "label": maps.SUFFICIENT, "messages": msgs + [{"role": "assistant", "content": maps.SUFFICIENT}]}
    j = judge_samples([t3])[0]
    assert j.prompt == msgs and j.completion == maps.SUFFICIENT
    with pytest.raises(ValueError, match="id='j1' is not a labelled judge sample"):
        judge_samples([{"id": "j1", "label": "maybe", "messages": t3["messages"]}])


def _answer_agent(role, msgs):
    """Answers from the evidence: the city an Ann Lee passage names, else a wrong guess."""
    assert role == "answer_agent"
    text = "".join(m["content"] for m in msgs)
    if "born in Paris" in text:
        return "Paris"
    return "Oslo" if "Oslo" in text else "Rome"


def test_answer_pairs_give_delta_f1_from_batched_cached_answers():
    engine = ScriptedEngine(_answer_agent)
    team = Team(engine, {"answer_agent": SamplingConfig(max_new_tokens=8, temperature=0.7)})
    pairs = AnswerPairs(team, RETRIEVER, top_k=1, passage_words=None)
    reward = query_reward_func(pairs)
    q = "Where was Ann Lee born?"
    meta = json.dumps({"question": q, "pool": _pool(q, k=0).to_dict()})  # nothing retrieved yet: answer "Rome"
    logged = {}
    completions = ["Keywords: Ann Lee born", "Keywords: Cy Dow painter", "!!!", "Keywords: Rome city Italy"]
    out = reward(completions=completions, golden_answers=[["Paris"]] * 4, meta=[meta] * 4,
                 log_metric=lambda k, v: logged.setdefault(k, v))
    # Ann Lee's passage -> "Paris" (+1); Cy Dow's -> "Oslo" (0: as wrong as before); malformed -> no
    # retrieval (0); Rome's passage -> "Rome" (0)
    assert out == pytest.approx([1.0, 0.0, 0.0, 0.0])
    assert logged == {"delta_f1_zero": pytest.approx(0.75), "delta_f1_positive": pytest.approx(0.25),
                      "query_malformed": pytest.approx(0.25), "query_no_new_chunks": pytest.approx(0.25)}
    # one engine call, greedy: y_n once for the shared pool + one per distinct new pool (3 queries retrieved)
    assert engine.log == [("answer_agent", 4)]
    assert pairs.stats["format_errors"] == 1 and pairs.stats["answers_generated"] == 4
    # the same queries again: every answer comes from the cache, no engine call
    assert reward(completions=completions, golden_answers=[["Paris"]] * 4, meta=[meta] * 4) == out
    assert len(engine.log) == 1 and pairs.stats["cache_hits"] >= 8


def test_answer_pairs_respect_the_evidence_cap_and_duplicates():
    engine = ScriptedEngine(_answer_agent)
    pairs = AnswerPairs(Team(engine), RETRIEVER, top_k=1, passage_words=None, max_chunks=1)
    q = "What does Cy Dow paint?"
    meta = {"question": q, "pool": _pool(q).to_dict()}   # 1 chunk already: the cap leaves no room
    y_next, y_prev = pairs(["Keywords: Ann Lee born"], [meta])
    assert y_next == y_prev == ["Oslo"] and pairs.stats["no_new_chunks"] == 1


# ---- stages, end to end on the tiny model ------------------------------------------------------------------------

TINY = dict(trainer="shared_prefix", steps=2, prompts_per_step=1, num_generations=2, micro_batch_size=2, lr=1e-3,
            max_completion_length=3, save_steps=1, temperature=1.0)


def _synthesis(tmp):
    rows = []
    for i, (q, g) in enumerate([("Where was Ann Lee born?", ["Paris"]), ("Where was Bob Ray born?", ["Rome"])]):
        for k in (3, 5):
            rows.append(_row(f"{i}_{k}", q, g, _pool(q, k=2), top_k=k))
    write_jsonl(tmp / "data/synthesis/t1_answer.jsonl", rows)
    write_jsonl(tmp / "data/synthesis/t2_query.jsonl", [r for r in rows if r["top_k"] == 3])
    write_jsonl(tmp / "data/synthesis/judge_candidates.jsonl", [r for r in rows if r["top_k"] == 3])


@pytest.mark.slow
def test_training_stages_save_agents_with_cards_curves_and_resume(tiny_llm, tmp_path, monkeypatch):  # noqa: F811
    from stages import label_judge, train_answer, train_judge, train_query

    monkeypatch.chdir(tmp_path)
    _synthesis(tmp_path)
    llm = LLMConfig(model=str(tiny_llm), device="cpu", threads=1,
                    sampling={"answer_agent": SamplingConfig(max_new_tokens=4)})
    cfg = MapsConfig(top_k=1, passage_words=5)
    grpo = GRPOParams(**TINY)
    tp = TrainAnswerParams(alpha=0.5, max_words=5, min_words=1, stage1=grpo, stage2=grpo)
    m = train_answer.run(tp, llm, cfg)
    agent = tmp_path / "models/agents/answer"
    assert (agent / "model.safetensors").is_file() and (agent / "tokenizer.json").is_file()
    card = (agent / "README.md").read_text()
    assert "R_a1 = EM + α·PR + L(y) (Eq. 4)" in card and "data/synthesis/t1_answer.jsonl" in card
    curve = read_curves(tmp_path / "reports/training/train_answer")
    assert [s for s, _ in curve["reward"]] == [1, 2, 3, 4]   # 2 + 2 steps, stage 2 continues
    assert {"loss", "em", "words"} <= set(curve)
    assert sorted(p.name for p in (tmp_path / "tensorboard/train_answer").iterdir())[0].startswith("events.out")
    assert (tmp_path / "reports/figures/train_answer.png").stat().st_size > 1000
    assert m["stage1_samples"] == 2 and m["stage2_samples"] == 2 and m["steps"] == 4   # both stages
    # a rerun with the same inputs resumes from the final checkpoints: nothing is retrained, and the agent is
    # re-saved byte for byte (DVC sees an unchanged out, downstream stages are not rerun)
    before = {p.name: p.read_bytes() for p in agent.iterdir()}
    again = train_answer.run(tp, llm, cfg)
    assert again["resumed_from_step"] == 4 and again["seconds"] == m["seconds"] > 0
    assert {p.name: p.read_bytes() for p in agent.iterdir()} == before

    qp = TrainQueryParams(retriever="unused", grpo=grpo)
    mq = train_query.run(qp, llm, cfg, "unused", retriever=RETRIEVER)
    assert (tmp_path / "models/agents/query/model.safetensors").is_file()
    assert 0.0 <= mq["delta_f1_zero_rate"] <= 1.0 and mq["answer_pairs_queries"] == 2 * 2
    rates = {k: mq[k] for k in ("delta_f1_zero_rate", "delta_f1_positive_rate", "query_malformed_rate",
                                "query_no_new_chunks_rate")}
    assert all(0.0 <= v <= 1.0 for v in rates.values())
    assert "query_no_new_chunks" in read_curves(tmp_path / "reports/training/train_query")
    # a no-op resume keeps the per-step rates (checkpointed log history); only this process's counters are 0
    mq2 = train_query.run(qp, llm, cfg, "unused", retriever=RETRIEVER)
    assert mq2["resumed_from_step"] == 2 and mq2["answer_pairs_queries"] == 0
    assert {k: mq2[k] for k in rates} == rates
    assert "ΔF1 was zero" in (tmp_path / "models/agents/query/README.md").read_text()

    # label_judge with a scripted "trained answer agent": right on Ann Lee, wrong on Bob Ray, unanimously
    class Pool:
        def team(self, role_models, default, sampling):
            assert role_models == {"answer_agent": "models/agents/answer"}
            return Team(ScriptedEngine(lambda r, m: "Paris" if "Ann" in question_of(m) else "Oslo"), sampling)

    lj = LabelJudgeParams(n_samples=16, temperature=0.7, max_new_tokens=4)
    stats = label_judge.run(lj, llm, cfg, engines=Pool())
    assert stats[maps.SUFFICIENT] == 1 and stats[maps.INSUFFICIENT] == 1 and stats["drop_rate"] == 0
    t3 = [r for _, r in read_jsonl(tmp_path / "data/judge/t3_judge.jsonl")]
    assert {r["question"]: r["label"] for r in t3} == {"Where was Ann Lee born?": maps.SUFFICIENT,
                                                       "Where was Bob Ray born?": maps.INSUFFICIENT}
    # too few of one label: the stage fails and the previous labels stay
    with pytest.raises(DataError, match="only 1 'Sufficient Information' labels"):
        label_judge.run(lj.model_copy(update={"min_per_label": 2}), llm, cfg, engines=Pool())
    assert [r for _, r in read_jsonl(tmp_path / "data/judge/t3_judge.jsonl")] == t3

    jp = TrainJudgeParams(sft=SFTParams(steps=2, batch_size=1, lr=1e-3, max_length=512, save_steps=1))
    mj = train_judge.run(jp, llm)
    assert (tmp_path / "models/agents/judge/model.safetensors").is_file()
    assert mj["samples"] == 2 and mj["label_sufficient"] == 1 and mj["steps"] == 2
    # TRL runs log their step times too (kept in the checkpointed history: the metrics' time survives a resume);
    # wall time goes to the metrics only, never to the agent, its card or the curve file
    # (from the checkpointed history itself: two steps of the tiny test model can take under 0.05 s together, which
    # the metric's 0.1 s rounding makes 0.0)
    states = sorted((tmp_path / "checkpoints/train_judge").rglob("trainer_state.json"))
    assert states, "train_judge kept no checkpoint"
    history = json.loads(states[-1].read_text())["log_history"]
    step_times = [h["step_time"] for h in history if "step" in h and "train_runtime" not in h]
    assert len(step_times) == 2 and all(t > 0 for t in step_times)
    assert mj["seconds"] == round(sum(step_times), 1) and "seconds_per_step" in mj
    assert "step_seconds" not in read_curves(tmp_path / "reports/training/train_judge")
    for agent in ("answer", "query", "judge"):
        d = tmp_path / "models/agents" / agent
        assert "seconds" not in (d / "README.md").read_text() and "seconds" not in (d / "ragteam-train.json").read_text()


def test_stages_name_their_missing_inputs(tmp_path, monkeypatch):
    from stages import train_answer, train_judge

    monkeypatch.chdir(tmp_path)
    grpo = GRPOParams(**TINY)
    tp = TrainAnswerParams(alpha=0.5, max_words=5, stage1=grpo, stage2=grpo)
    with pytest.raises(DataError, match=r"data/synthesis/t1_answer.jsonl: missing .*stage synthesize"):
        train_answer.run(tp, LLMConfig(), MapsConfig())
    p = _pool("Where was Ann Lee born?")
    write_jsonl(tmp_path / "data/synthesis/t1_answer.jsonl", [_row(0, "Where was Ann Lee born?", ["Paris"], p)])
    with pytest.raises(DataError, match="no top-5 samples for stage 2"):
        train_answer.run(tp, LLMConfig(), MapsConfig())
    with pytest.raises(DataError, match=r"data/judge/t3_judge.jsonl: missing .*stage label_judge"):
        train_judge.run(TrainJudgeParams(sft=SFTParams(batch_size=1, lr=1e-3, max_length=64, save_steps=1)),
                        LLMConfig())


def test_stage_main_exits_with_the_stage_and_agent_and_writes_no_metrics(tmp_path, monkeypatch):
    from stages import train_answer, train_judge, train_query

    monkeypatch.chdir(tmp_path)
    (tmp_path / "params.yaml").write_text("train_answer: {alpha: 0.5}\n")  # no stage1/stage2, no llm section
    for mod, stage, agent in ((train_answer, "train_answer", "answer"), (train_query, "train_query", "query"),
                              (train_judge, "train_judge", "judge")):
        with pytest.raises(SystemExit) as e:
            mod.main()
        assert str(e.value).startswith(f"{stage} FAILED (models/agents/{agent} left untouched): ")
        assert stage in str(e.value).split(": ", 1)[1]  # the params error names the section
        assert not (tmp_path / "metrics" / f"{stage}.json").exists()


def test_openrlhf_answer_backend_rejects_clipped_is_long():
    # OpenRLHF's reward sees decoded text only, so a cut-off rollout cannot be penalised there: refuse, don't ignore
    grpo = GRPOParams(**TINY)
    with pytest.raises(ValueError, match="clipped_is_long needs the completion token ids"):
        TrainAnswerParams(alpha=0.5, max_words=5, clipped_is_long=True, backend="openrlhf", stage1=grpo, stage2=grpo)
    assert TrainAnswerParams(alpha=0.5, max_words=5, clipped_is_long=True, stage1=grpo, stage2=grpo).backend == "trl"


def test_openrlhf_backend_dry_run_writes_jobs_and_stops(smollm2_dir, tmp_path, monkeypatch):
    from stages import train_answer

    from stages.common import OpenRLHFParams

    monkeypatch.chdir(tmp_path)
    _synthesis(tmp_path)
    grpo = GRPOParams(**{**TINY, "trainer": "trl"})
    tp = TrainAnswerParams(backend="openrlhf", alpha=0.5, max_words=5, stage1=grpo, stage2=grpo)
    orl = OpenRLHFParams(project_dir="/cluster/ragteam", gpus_per_node=2, vllm_engines=2)
    with pytest.raises(DataError, match="openrlhf.dry_run is true"):
        train_answer.run(tp, LLMConfig(model=str(smollm2_dir)), MapsConfig(), orl)
    s2 = (tmp_path / "jobs/openrlhf/train_answer/stage2/command.sh").read_text()
    assert "--actor.model_name_or_path checkpoints/train_answer/stage1_model" in s2
    assert "--ckpt.output_dir models/agents/answer" in s2
    assert (tmp_path / "jobs/openrlhf/train_answer/stage1/reward_func.py").is_file()
    assert not (tmp_path / "models/agents/answer").exists()


def test_hit_roundtrip_keeps_the_pool():  # the pools the trainers read are the pools synthesis wrote
    p = _pool("Where was Ann Lee born?", "Paris city")
    assert QueryPool.from_dict(json.loads(json.dumps(p.to_dict()))).render(None) == p.render(None)
    assert all(isinstance(h, Hit) for hs in p.hits for h in hs)


def test_paper_profile_dry_run_builds_the_papers_grpo_commands(smollm2_dir, tmp_path, monkeypatch):
    """params.yaml + profiles/paper.yaml, as `ragteam profile apply paper` merges them, through the real stage."""
    from pathlib import Path

    from stages import train_answer

    from ragteam.config import deep_merge, load_params, parse_section
    from ragteam.profiles import load_profile
    from stages.common import OpenRLHFParams

    repo = Path(__file__).resolve().parents[1]
    params = deep_merge(load_params(repo / "params.yaml"), load_profile("paper", repo / "profiles"))
    tp = parse_section(params, "train_answer", TrainAnswerParams)
    orl = parse_section(params, "openrlhf", OpenRLHFParams).model_copy(update={"dry_run": True})
    monkeypatch.chdir(tmp_path)
    _synthesis(tmp_path)
    with pytest.raises(DataError, match="dry_run"):
        train_answer.run(tp, LLMConfig(model=str(smollm2_dir)), parse_section(params, "maps", MapsConfig), orl)
    cmd = (tmp_path / "jobs/openrlhf/train_answer/stage1/command.sh").read_text().split()
    flag = lambda name: cmd[cmd.index(name) + 1]  # noqa: E731
    assert flag("--algo.advantage.estimator") == "group_norm"
    assert flag("--rollout.n_samples_per_prompt") == "16" and flag("--rollout.batch_size") == "32"
    assert flag("--train.batch_size") == "512"
    assert float(flag("--actor.adam.lr")) == 1e-6 and float(flag("--algo.kl.init_coef")) == 1e-4
    assert "--ds.lora.rank" not in cmd  # full fine-tuning
    reward = (tmp_path / "jobs/openrlhf/train_answer/stage1/reward_func.py").read_text()
    assert "'min_words': 0" in reward and "'max_words': 5" in reward   # Eq. 3 exactly
