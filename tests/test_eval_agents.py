"""The evaluate_agents stage: each MAPS agent alone, base vs trained, with intervals and paired differences
(scripted engines whose behaviour is known question by question)."""
import json
import re
import sys
from pathlib import Path

import pytest
import yaml
from helpers_agents import KeywordRetriever, ScriptedEngine, question_of

from ragteam.agents import maps
from ragteam.agents.maps_workflow import MapsConfig
from ragteam.config import ParamsError, parse_section
from ragteam.eval import agents
from ragteam.eval.agents import EvalAgentsConfig
from ragteam.io import write_jsonl
from ragteam.llm import EngineConfig, EnginePool, LLMConfig

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
import stages.evaluate_agents as stage  # noqa: E402

TRAINED = {"answer": "tr/answer", "query": "tr/query", "judge": "tr/judge"}


def _i(messages) -> int:
    return int(re.search(r"q(\d+)r0", question_of(messages)).group(1))


def _engines():
    """Base model: answers "no", an empty query (malformed), a malformed verdict. Trained answer agent: right on
    even-numbered questions, and on any question once the chunk of query q<i>r1 is in its pool. Trained query agent:
    q<i>r1. Trained judge: Sufficient exactly on even-numbered questions (= when the trained answer agent is right)."""
    def answer(role, m):
        i = _i(m)
        return f"ans{i}" if i % 2 == 0 or f"q{i}r1" in m[0]["content"] else "no"   # the pool: system message
    replies = {
        "models/llm": lambda role, m: {"answer_agent": "no", "query_agent": "", "judge_agent": "maybe"}[role],
        "tr/answer": answer,
        "tr/query": lambda role, m: f"q{_i(m)}r1",
        "tr/judge": lambda role, m: maps.SUFFICIENT if _i(m) % 2 == 0 else maps.INSUFFICIENT}
    engines = {path: ScriptedEngine(reply) for path, reply in replies.items()}
    return engines, EnginePool(EngineConfig(), loader=lambda path, cfg: engines[path])


def _bench(tmp_path, n=4):
    root = tmp_path / "benchmarks"
    for name, off in (("hotpotqa", 0), ("bamboogle", 10)):
        write_jsonl(root / f"{name}.jsonl", [{"id": f"{name}{i}", "question": f"What is q{i + off}r0 ?",
                                              "golden_answers": [f"ans{i + off}"]} for i in range(n)])
    return root


def _retriever():
    return KeywordRetriever([(f"T{i}{r}", f"text q{i}r{r}") for i in range(20) for r in range(2)])


def _run(tmp_path, **kw):
    cfg = EvalAgentsConfig(**{"bootstrap": {"resamples": 2000}, **kw})
    engines, pool = _engines()
    out = tmp_path / "out"
    summary = stage.run(LLMConfig(), MapsConfig(top_k=1), cfg, TRAINED, benchmarks=_bench(tmp_path),
                        metrics=out / "m.json", questions=out / "q.json", report=out / "r.md", retriever=_retriever(),
                        engines=pool, check_dirs=False)
    return summary, engines, out


def test_each_agent_base_vs_trained_with_paired_differences(tmp_path):
    summary, engines, out = _run(tmp_path)
    assert list(summary) == ["hotpotqa", "bamboogle", "avg"] and summary["avg"]["n"] == 8
    declared = json.loads((out / "summary" / "m.json").read_text())     # the declared metrics: averages only
    assert list(declared) == ["avg"] and set(declared["avg"]) == {"answer", "query", "judge"}
    assert declared["avg"]["answer"]["diff"]["em"] == {k: summary["avg"]["answer"]["diff"]["em"][k]
                                                       for k in ("diff", "lo", "hi")}
    h = summary["hotpotqa"]
    # answer: base never right; trained right on questions 0 and 2 of 4
    assert (h["answer"]["base"]["em"], h["answer"]["trained"]["em"]) == (0.0, 50.0)
    assert h["answer"]["base"]["em_ci"] == [0.0, 0.0] and h["answer"]["base"]["words"] == 1.0
    d = h["answer"]["diff"]["em"]
    # 4 paired questions: P(resample without a right one) = 1/16 > 2.5 %: not significant on one benchmark ...
    assert (d["diff"], d["lo"], d["n"], d["significant"]) == (50.0, 0.0, 4, False)
    # ... but on both (resampled separately) P = 1/256: the average difference is significant
    a = summary["avg"]["answer"]["diff"]["em"]
    assert a["diff"] == 50.0 and a["lo"] > 0 and a["significant"] and a["n"] == 8
    # silence: every answer parsed in both models, tested like the scores
    assert h["answer"]["trained"]["no_answer"] == 0.0 and h["answer"]["diff"]["no_answer"]["diff"] == 0.0
    # query: the base query is malformed (ΔF1 0); the trained one brings the answer on the odd questions (ΔF1 1)
    q = h["query"]
    assert (q["base"]["mean_delta_f1"], q["base"]["malformed"], q["base"]["zero"]) == (0.0, 100.0, 100.0)
    assert (q["trained"]["mean_delta_f1"], q["trained"]["positive"], q["trained"]["malformed"]) == (50.0, 50.0, 0.0)
    assert q["base"]["no_new_chunks"] == 100.0 and q["trained"]["no_new_chunks"] == 0.0
    assert q["trained"]["f1_after"] == 100.0 and q["diff"]["mean_delta_f1"]["diff"] == 50.0
    # judge: reference = the trained answer agent right (even questions); base malformed, trained always right
    j = h["judge"]
    assert (j["base"]["accuracy"], j["base"]["malformed"], j["base"]["balanced_accuracy"]) == (0.0, 100.0, 0.0)
    assert (j["trained"]["accuracy"], j["trained"]["balanced_accuracy"], j["trained"]["said_sufficient"]) == \
        (100.0, 100.0, 50.0)
    assert j["trained"]["reference_sufficient"] == 50.0 and j["diff"]["accuracy"]["diff"] == 100.0
    assert summary["avg"]["judge"]["diff"]["balanced_accuracy"]["significant"]
    # one engine call per (agent, model) over both benchmarks' 8 questions
    assert engines["models/llm"].log == [("answer_agent", 8), ("query_agent", 8), ("judge_agent", 8)]
    assert engines["tr/query"].log == [("query_agent", 8)] and engines["tr/judge"].log == [("judge_agent", 8)]
    # the trained answer agent: its 8 answers, then y_n for each benchmark's 4 questions (with the base query,
    # whose malformed queries add nothing), then the 4 grown pools of each benchmark's trained queries
    assert engines["tr/answer"].log == [("answer_agent", 8)] + [("answer_agent", 4)] * 4
    # the files: the metric, the per-question scores (for pooling seeds), the report
    assert json.loads((out / "m.json").read_text()) == summary
    per = json.loads((out / "q.json").read_text())
    assert per["benchmarks"]["bamboogle"]["ids"] == [f"bamboogle{i}" for i in range(4)]
    assert per["benchmarks"]["hotpotqa"]["answer"]["trained"]["em"] == [1.0, 0.0, 1.0, 0.0]
    assert per["benchmarks"]["hotpotqa"]["query"]["trained"]["delta_f1"] == [0.0, 1.0, 0.0, 1.0]
    assert per["settings"]["trained agents"] == TRAINED
    md = (out / "r.md").read_text()
    assert "## answer agent" in md and "| EM | HotpotQA | 0.00 [0.00, 0.00] | 50.00 [" in md
    assert re.search(r"\| EM \| Avg \| .* \| \*\*\+50\.00 \[[\d.]+, [\d.]+\]\*\* † \|", md)
    # query: positive, zero, negative, malformed % (base -> trained), ...
    assert "| HotpotQA | 0.00 → 50.00 | 100.00 → 50.00 | 0.00 → 0.00 | 100.00 → 0.00 |" in md
    assert "- HotpotQA (gold `'ans1'`): `''` | `'q1r1'`" in md                  # examples: query agent outputs


def test_a_subset_of_agents_and_a_missing_checkpoint(tmp_path):
    summary, engines, _ = _run(tmp_path, agents=["judge"])
    assert set(summary["hotpotqa"]) == {"n", "judge"} and set(summary["avg"]) == {"n", "judge"}
    assert engines["tr/query"].log == [] and engines["models/llm"].log == [("judge_agent", 8)]
    # the judge's reference needs the trained answer agent even when only the judge is evaluated
    with pytest.raises(stage.DataError, match=r"trained agents missing: \['answer \(None\)', 'judge \(x\)'\]"):
        stage.run(LLMConfig(), MapsConfig(), EvalAgentsConfig(agents=["judge"]), {"judge": "x"},
                  benchmarks=_bench(tmp_path), metrics=tmp_path / "m", questions=tmp_path / "q",
                  report=tmp_path / "r", retriever=_retriever())
    with pytest.raises(stage.DataError, match=r"query \(nowhere/q\)"):
        stage.run(LLMConfig(), MapsConfig(), EvalAgentsConfig(), {**TRAINED, "query": "nowhere/q"},
                  benchmarks=_bench(tmp_path), metrics=tmp_path / "m", questions=tmp_path / "q",
                  report=tmp_path / "r", retriever=_retriever())
    assert not (tmp_path / "m").exists()


def test_scores_against_hand_computed_values():
    s = agents.judge_scores(["Sufficient Information", "Insufficient Information.", "insufficient information",
                             "maybe"], [True, True, False, False])
    # right: yes, no (Insufficient on a correct answer), yes, no (malformed): recall 1/2 on each class
    assert (s["accuracy"], s["balanced_accuracy"], s["said_sufficient"], s["malformed"]) == (50.0, 50.0, 25.0, 25.0)
    always_no = agents.judge_scores(["Insufficient Information"] * 5, [True, False, False, False, False])
    assert (always_no["accuracy"], always_no["balanced_accuracy"]) == (80.0, 50.0)
    a = agents.answer_scores(["Paris", "the city of Rome", ""], [["Paris"], ["Rome"], ["Oslo"]])
    # F1: 1, 2·(1/3·1)/(1/3+1) = 0.5 ("the" dropped: city, of, rome), 0
    assert (a["em"], a["f1"], a["acc"], a["words"]) == (33.33, 50.0, 66.67, 1.67)
    assert a["no_answer"] == 33.33                                            # the empty (unparsable) answer


def test_params_section_and_dvc_stage():
    params = yaml.safe_load((REPO / "params.yaml").read_text())
    cfg = parse_section(params, "eval_agents", EvalAgentsConfig)
    # the default answers enough questions for an interval narrower than the 12.5-point step of 8 questions
    assert cfg.n_questions >= 40 and cfg.agents == ["answer", "query", "judge"] and cfg.bootstrap.resamples == 10000
    with pytest.raises(ParamsError, match=r"eval_agents\.agents\.0"):
        parse_section({"eval_agents": {"agents": ["planner"]}}, "eval_agents", EvalAgentsConfig)
    from ragteam.eval.evaluate import EvalConfig
    assert stage.trained_checkpoints(parse_section(params, "eval", EvalConfig)) == {
        "answer": "models/agents/answer", "query": "models/agents/query", "judge": "models/agents/judge"}
    st = yaml.safe_load((REPO / "dvc.yaml").read_text())["stages"]["evaluate_agents"]
    assert st["cmd"] == "python -m stages.evaluate_agents"
    assert {"models/agents/answer", "models/agents/query", "models/agents/judge", "models/llm",
            "data/prepared/benchmarks", "${eval_agents.retriever}", "ragteam/eval/agents.py", "ragteam/train",
            "stages/evaluate_agents.py"} <= set(st["deps"])
    assert {"eval_agents", "eval.agents", "llm"} <= set(st["params"])
    outs = [next(iter(o)) for o in st["outs"]]
    assert outs == [str(stage.QUESTIONS), str(stage.REPORT), str(stage.METRICS),    # the record: a plain output
                    str(stage.RUN_RECORD)]                                          # seconds, the environment
    assert [next(iter(m)) for m in st["metrics"]] == ["metrics/summary/eval_agents.json"]
    assert all(v["cache"] is False for o in st["outs"] for v in o.values())   # git-tracked: readable per experiment


@pytest.mark.slow
def test_real_model_as_its_own_trained_agent_gains_nothing(tmp_path, smollm2_dir, shared_data):
    """SmolLM2 as base AND trained checkpoint, greedy: every difference is exactly 0 and none is significant (the
    real engine path: prompts, greedy sampling, parsers, ΔF1 through AnswerPairs, BM25 over the shared corpus)."""
    from helpers_agents import Bm25Retriever, smollm2_engine

    from ragteam.data.formats import load_qa

    rows = [json.loads(x) for x in (shared_data / "corpus" / "mini_wiki.jsonl").read_text().splitlines()]
    bench = tmp_path / "benchmarks"
    write_jsonl(bench / "hotpotqa.jsonl", load_qa(shared_data / "benchmarks" / "hotpotqa" / "dev.jsonl")[:2])
    engine = smollm2_engine(str(smollm2_dir))
    pool = EnginePool(EngineConfig(), loader=lambda path, cfg: engine)
    llm = LLMConfig(sampling={"default": {"max_new_tokens": 8}, "judge_agent": {"max_new_tokens": 6}})
    same = {a: str(smollm2_dir) for a in ("answer", "query", "judge")}
    summary = stage.run(llm, MapsConfig(top_k=1, passage_words=20), EvalAgentsConfig(bootstrap={"resamples": 200}),
                        same, benchmarks=bench, metrics=tmp_path / "m.json", questions=tmp_path / "q.json",
                        report=tmp_path / "r.md", retriever=Bm25Retriever(rows), engines=pool)
    for agent, metrics in agents.TESTED.items():
        for m in metrics:
            d = summary["avg"][agent]["diff"][m]
            assert (d["diff"], d["lo"], d["hi"], d["significant"]) == (0.0, 0.0, 0.0, False), (agent, m)
            assert summary["hotpotqa"][agent]["base"][m] == summary["hotpotqa"][agent]["trained"][m]
    per = json.loads((tmp_path / "q.json").read_text())["benchmarks"]["hotpotqa"]
    assert len(per["ids"]) == 2 and len(per["query"]["trained"]["delta_f1"]) == 2
    assert per["judge"]["base"]["reference"] == [float(x) for x in per["answer"]["trained"]["acc"]]
