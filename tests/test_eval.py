"""Evaluation: scoring and cost summaries, the Table-1 report, plots, the Prefect artifact, and the evaluate stage
(scripted engines for the artifacts; the real SmolLM2 end to end on a handful of questions)."""
import json
import sys
from pathlib import Path

import pytest
import yaml
from helpers_agents import Bm25Retriever, KeywordRetriever, ScriptedEngine, smollm2_engine

from ragteam.agents import maps
from ragteam.agents.maps_workflow import MapsConfig
from ragteam.config import ParamsError, parse_section
from ragteam.data.formats import load_qa
from ragteam.eval import report
from ragteam.eval.evaluate import (BootstrapConfig, EvalConfig, SystemSpec, add_intervals, compare_systems,
                                   comparison_pairs, score_episodes, summarize, with_average)
from ragteam.io import write_jsonl
from ragteam.llm import EngineConfig, EnginePool, LLMConfig
from ragteam.records import AgentCall, Episode, read_episodes

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
import stages.evaluate as stage  # noqa: E402

SYSTEMS = {"native": {"workflow": "native"}, "standard_rag": {"workflow": "standard_rag"},
           "iter_retgen": {"workflow": "iter_retgen"}, "drag": {"workflow": "drag"},
           "maps": {"workflow": "maps", "trained_agents": True}}


def _ep(pred, golds, tokens=(10, 2), retrievals=1, seconds=0.5, errors=0):
    ep = Episode(question_id="q", question="?", golden_answers=golds, final_answer=pred,
                 cost={"llm_calls": 1, "prompt_tokens": tokens[0], "completion_tokens": tokens[1],
                       "retrieval_calls": retrievals, "seconds": seconds})
    ep.calls = [AgentCall(role="x", prompt=[], format_error="bad" if i < errors else None) for i in range(2)]
    return ep


def test_summarize_scores_in_percent_and_cost_per_question():
    eps = score_episodes([_ep("Paris", ["paris"]), _ep("the city of Lyon", ["Lyon"], errors=1),
                          _ep(None, ["x"], tokens=(40, 0), retrievals=4, seconds=2.0)])
    assert [e.metrics["em"] for e in eps] == [1.0, 0.0, 0.0]
    s = summarize(eps)
    assert s["n"] == 3 and s["em"] == pytest.approx(33.33) and s["acc"] == pytest.approx(66.67)
    assert s["f1"] == pytest.approx(100 * (1 + 0.5) / 3, abs=0.01)         # "city lyon" vs "lyon": P=1/2, R=1
    assert s["tokens"] == pytest.approx((12 + 12 + 40) / 3, abs=1e-3) and s["retrieval_calls"] == 2.0
    assert s["seconds"] == 1.0 and s["format_error_rate"] == pytest.approx(1 / 6, abs=1e-4)
    avg = with_average({"a": {"n": 2.0, "em": 10.0}, "b": {"n": 4.0, "em": 30.0}})
    assert avg["avg"] == {"n": 6.0, "em": 20.0}                               # unweighted over benchmarks


def test_silence_is_reported_per_question_with_its_reason():
    """A question with no answer (empty, or nothing left after normalisation) and one whose call broke its format
    are counted per question, not per call; the reason names the malformed role and what was wrong, without the
    quoted output; a workflow's own reason (a fallback that is empty by construction) wins."""
    from ragteam.eval.evaluate import no_answer_reason, no_answer_reasons, question_scores

    stub = _ep("", ["Ada"])
    stub.calls[-1].format_error = "a lead-in without an answer: 'The answer is:'"
    fallback = _ep("", ["x"])
    fallback.meta["no_answer_reason"] = "no candidate parsed: empty answer by construction"
    eps = score_episodes([_ep("Ada", ["Ada"]), _ep("the", ["Ada"]), stub, fallback, _ep("Lyon", ["Ada"], errors=2)])
    s = summarize(eps)
    assert s["no_answer"] == 60.0                       # "the" normalises to nothing: no answer, as "" is
    assert s["format_error_questions"] == 40.0           # the stub and the 2-error question: per question, not call
    assert s["format_error_rate"] == pytest.approx(3 / 10, abs=1e-4)
    assert question_scores(eps)["no_answer"] == [0.0, 1.0, 1.0, 1.0, 0.0]
    assert no_answer_reason(eps[0]) is None
    assert no_answer_reason(stub) == "x: a lead-in without an answer"
    assert no_answer_reasons(eps) == {"no candidate parsed: empty answer by construction": 1,
                                      "x: a lead-in without an answer": 1, "x: an empty answer": 1}
    # files written before the flags existed: the flags come from the episode itself
    old = eps[2].model_copy(deep=True)
    old.metrics = {k: v for k, v in old.metrics.items() if k in ("em", "f1", "acc")}
    assert summarize([old])["no_answer"] == 100.0 and question_scores([old])["no_answer"] == [1.0]


def _metrics():
    row = lambda em, f1: {"n": 5.0, "em": em, "f1": f1, "acc": em + 1, "llm_calls": 2.0, "prompt_tokens": 90.0,  # noqa
                          "completion_tokens": 10.0, "tokens": 100.0, "retrieval_calls": 1.0, "seconds": 0.5,
                          "format_error_rate": 0.0, "no_answer": 15.0, "format_error_questions": 25.0}
    return {"native": with_average({"hotpotqa": row(10, 20), "bamboogle": row(30, 40)}),
            "maps": with_average({"hotpotqa": row(50, 60), "bamboogle": row(70, 80)})}


def test_table_has_the_paper_layout_and_cost_columns():
    benches = report.order_benchmarks(["bamboogle", "zzz", "hotpotqa", "2wikimultihopqa"])
    assert benches == ["hotpotqa", "2wikimultihopqa", "bamboogle", "zzz"]
    lines = report.table_markdown(_metrics(), ["hotpotqa", "bamboogle"]).splitlines()
    assert lines[0] == ("| Method | HotpotQA EM | HotpotQA F1 | Bamboogle EM | Bamboogle F1 | Avg EM | Avg F1 "
                        "| Avg Acc | No answer % | Format error q % | LLM calls/q | Tokens/q | Retrievals/q | Seconds/q "
                        "| Passages/q |")
    assert lines[2] == ("| native | 10.00 | 20.00 | 30.00 | 40.00 | 20.00 | 30.00 | 21.00 | 15.0 | 25.0 | 2.0 | 100 "
                        "| 1.0 | 0.50 | – |")                                # passages: only where recorded
    assert lines[3].startswith("| maps | 50.00 | 60.00 | 70.00 | 80.00 | 60.00 | 70.00 |")


def test_report_and_plots(tmp_path):
    m = _metrics()
    png = report.plot_cost_accuracy(m, tmp_path / "fig" / "cost.png")
    bars = report.plot_scores(m, ["hotpotqa", "bamboogle"], tmp_path / "fig" / "scores.png")
    for p in (png, bars):
        assert p.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and p.stat().st_size > 5000
    md = report.report_markdown(m, ["hotpotqa", "bamboogle"], {"base model": "m"}, ["fig/cost.png"])
    assert "| maps | 50.00" in md and "![cost](fig/cost.png)" in md and "| base model | m |" in md
    assert "HotpotQA 5, Bamboogle 5" in md


def test_figures_group_systems_by_family_at_most_8_per_panel_with_f1_intervals_as_error_bars(tmp_path, monkeypatch):
    """The default eval.systems and profiles/extra_rows' (29 rows) in panels of their family (the paper they come
    from), none over 8 series;
    each bar's error bar is its 95 % bootstrap interval; a group over 8 is refused rather than drawn unreadable."""
    from matplotlib.axes import Axes

    from ragteam.eval.evaluate import system_groups

    from ragteam.profiles import merged_params

    repo = Path(__file__).parents[1]
    systems = parse_section(merged_params(["extra_rows"], repo / "params.yaml", repo / "profiles"), "eval",
                            EvalConfig).systems
    assert len(systems) == 29
    groups = system_groups(systems)
    assert list(groups)[:3] == ["Baselines", "MAPS", "JADE"] and "M-ASK" in groups and "QAgent" in groups
    assert all(1 <= len(g) <= 8 for g in groups.values()) and sum(map(len, groups.values())) == len(systems)
    assert {"qagent", "qagent_plugin_trained", "qagent_grammar"} <= set(groups["QAgent"])
    many = {f"s{i}": SystemSpec(workflow="native") for i in range(10)}
    assert {g: len(n) for g, n in system_groups(many).items()} == {"Baselines (1/2)": 8, "Baselines (2/2)": 2}

    m = _metrics()
    for per in m.values():
        for row in per.values():
            row["f1_ci"] = [row["f1"] - 5.0, row["f1"] + 7.0]
    bars = []
    real_bar = Axes.bar

    def bar(self, x, height, width, **kw):
        bars.append((self.get_title(), kw.get("label"), kw.get("yerr")))
        return real_bar(self, x, height, width, **kw)

    monkeypatch.setattr(Axes, "bar", bar)
    png = report.plot_scores(m, ["hotpotqa", "bamboogle"], tmp_path / "s.png", {"Baselines": ["native"],
                                                                               "MAPS": ["maps", "gone"]})
    assert png.read_bytes()[:4] == b"\x89PNG"
    # panels titled by group, the missing row skipped; lower and upper error per column (2 benchmarks + average)
    assert [(t, lab) for t, lab, _ in bars] == [("Baselines", "native"), ("MAPS", "maps")]
    assert bars[0][2] == [[5.0, 5.0, 5.0], [7.0, 7.0, 7.0]]
    with pytest.raises(ValueError, match="more than 8 systems"):
        report.plot_scores({f"s{i}": m["native"] for i in range(9)}, ["hotpotqa"], tmp_path / "x.png",
                           {"all": [f"s{i}" for i in range(9)]})
    assert report.plot_cost_accuracy(m, tmp_path / "c.png", {"Baselines": ["native"], "MAPS": ["maps"]}).is_file()


def test_prefect_artifact_only_inside_a_run(monkeypatch):
    assert report.in_prefect_run() is False and report.publish_prefect_artifact("# x") is False
    made = []
    import prefect.artifacts

    monkeypatch.setattr(report, "in_prefect_run", lambda: True)
    monkeypatch.setattr(prefect.artifacts, "create_markdown_artifact", lambda **kw: made.append(kw))
    assert report.publish_prefect_artifact("| t |", key="eval-report") is True
    assert made == [{"markdown": "| t |", "key": "eval-report", "description": "ragteam evaluate: Table 1"}]


def test_eval_params_are_validated_with_the_key_named():
    bad = {"eval": {"systems": {"maps": {"workflow": "mapz"}}}}
    with pytest.raises(ParamsError, match=r"eval\.systems\.maps\.workflow"):
        parse_section(bad, "eval", EvalConfig)
    with pytest.raises(ParamsError, match=r"eval\.systems\.maps\.base_roles"):
        parse_section({"eval": {"systems": {"maps": {"workflow": "maps", "base_roles": ["judge"]}}}}, "eval",
                      EvalConfig)
    for section, model in (("llm", LLMConfig), ("maps", MapsConfig), ("eval", EvalConfig)):
        parse_section(yaml.safe_load((REPO / "params.yaml").read_text()), section, model)  # shipped defaults


def _prepared(tmp_path, n=3):
    bench = tmp_path / "benchmarks"
    write_jsonl(bench / "hotpotqa.jsonl", [{"id": f"h{i}", "question": f"What is q{i}r0 ?",
                                            "golden_answers": [f"ans{i}"]} for i in range(n)])
    write_jsonl(bench / "bamboogle.jsonl", [{"id": f"b{i}", "question": f"What is q{i + 10}r0 ?",
                                             "golden_answers": [f"ans{i + 10}"]} for i in range(n)])
    return bench


def test_evaluate_stage_writes_episodes_metrics_report_and_plots(tmp_path, capsys):
    def reply(role, m):
        text = m[-1]["content"]
        i = text.split("q", 1)[1].split("r0", 1)[0]
        return {"query_agent": f"q{i}r1", "judge_agent": maps.SUFFICIENT, "opponent": "Concede",
                "proponent": "fine", "moderator": "Proponent"}.get(role, f"ans{i}" if int(i) % 2 == 0 else "no")
    engine = ScriptedEngine(reply)
    loads = []
    pool = EnginePool(EngineConfig(), loader=lambda path, cfg: loads.append(path) or engine)
    ret = KeywordRetriever([(f"T{i}{r}", f"text q{i}r{r}") for i in range(6) for r in range(2)])
    systems = {**SYSTEMS, "maps_untrained": {"workflow": "maps"}}
    ev = EvalConfig(benchmarks="all", n_questions=2, systems=systems, agents={"answer_agent": "models/trained"})
    out = tmp_path / "out"
    metrics = stage.run(LLMConfig(), MapsConfig(max_rounds=2, top_k=1, judge_initial=False), ev,
                        benchmarks=_prepared(tmp_path),
                        results=out / "results", report=out / "eval.md", figures=out / "fig", retriever=ret,
                        engines=pool, differences=out / "compare.json")
    assert list(metrics) == list(systems) and list(metrics["maps"]) == ["hotpotqa", "bamboogle", "avg"]
    assert sorted(loads) == ["models/llm", "models/trained"]          # maps answer agent uses eval.agents
    for system in SYSTEMS:
        for bench in ("hotpotqa", "bamboogle"):
            eps = read_episodes(out / "results" / system / f"{bench}.jsonl")
            assert len(eps) == 2 and all(e.system == system and e.meta["benchmark"] == bench for e in eps)
            assert [e.metrics["em"] for e in eps] == [1.0, 0.0]        # even-numbered questions answered right
        assert metrics[system]["avg"]["em"] == 50.0
    assert metrics["native"]["avg"]["retrieval_calls"] == 0 and metrics["maps"]["avg"]["llm_calls"] == 3
    md = (out / "eval.md").read_text()
    assert "| Method | HotpotQA EM | HotpotQA F1 | Bamboogle EM" in md and "| maps | 50.00 |" in md
    assert "![eval_cost](fig/eval_cost.png)" in md and (out / "fig" / "eval_scores.png").is_file()
    # 2 questions per benchmark, one right: EM 50 with the interval [0, 100] each; avg over 2 benchmarks [25, 75]
    assert metrics["maps"]["hotpotqa"]["em_ci"] == [0.0, 100.0] and metrics["maps"]["avg"]["em_ci"] == [0.0, 100.0]
    assert "| maps | 2/2 | 50.00 [0.00, 100.00] |" in md
    diffs = json.loads((out / "compare.json").read_text())
    assert list(diffs) == ["standard_rag vs native", "maps vs maps_untrained"]  # derived pairs
    head = json.loads((out / "summary" / "eval.json").read_text())   # the declared metrics: averages and F1 diffs
    assert head["systems"]["maps"] == {"avg": {"em": 50.0, "f1": metrics["maps"]["avg"]["f1"], "no_answer": 0.0}}
    assert list(head["systems"]) == list(systems) and list(head["differences"]) == list(diffs)
    assert head["differences"]["maps vs maps_untrained"] == {"avg": {"f1": {"diff": 0.0, "lo": 0.0, "hi": 0.0}}}
    d = diffs["maps vs maps_untrained"]                               # the scripted engine ignores the checkpoint
    assert (d["a"], d["b"], d["avg"]["n"]) == ("maps", "maps_untrained", 4)
    assert d["hotpotqa"]["f1"] == {"diff": 0.0, "lo": 0.0, "hi": 0.0, "n": 2, "significant": False}
    assert "## Differences" in md and "| maps − maps_untrained | HotpotQA | 2 | 0.00 [0.00, 0.00] |" in md
    # silence: every question answered ("ans0" or "no"); the no-answer rate has its interval and paired difference
    assert metrics["maps"]["avg"]["no_answer"] == 0.0 and metrics["maps"]["avg"]["no_answer_ci"] == [0.0, 0.0]
    assert d["avg"]["no_answer"]["diff"] == 0.0 and "## Questions without an answer" in md
    assert "| maps | 4 | 0.00 [0.00, 0.00] | 0.00 [0.00, 0.00] | 0.00 [0.00, 0.00] | 0.00 [0.00, 0.00] | 0.0 | – |" in md
    # progress while a system runs: one line per engine call (maps: query, judge, answer over 4 questions)
    log = capsys.readouterr().out
    assert "evaluate: maps: query_agent on 4 prompts" in log and "evaluate: maps: answer_agent on 4 prompts" in log


def test_a_system_with_its_own_n_questions_answers_that_prefix_and_pairs_on_the_common_one(tmp_path):
    engine = ScriptedEngine(lambda role, m: "ans0")
    pool = EnginePool(EngineConfig(), loader=lambda path, cfg: engine)
    ev = EvalConfig(n_questions=1, systems={"native": {"workflow": "native", "n_questions": 3},
                                            "native_trained": {"workflow": "native"}})
    out = tmp_path / "out"
    metrics = stage.run(LLMConfig(), MapsConfig(), ev, benchmarks=_prepared(tmp_path, n=4), results=out / "res",
                        report=out / "eval.md", figures=out / "fig", differences=out / "compare.json",
                        engines=pool)
    assert [metrics["native"][b]["n"] for b in ("hotpotqa", "bamboogle")] == [3, 3]
    assert [metrics["native_trained"][b]["n"] for b in ("hotpotqa", "bamboogle")] == [1, 1]
    assert [e.question_id for e in read_episodes(out / "res" / "native" / "hotpotqa.jsonl")] == ["h0", "h1", "h2"]
    d = json.loads((out / "compare.json").read_text())["native_trained vs native"]
    assert (d["hotpotqa"]["n"], d["avg"]["n"]) == (1, 2)        # the first question of each benchmark, paired
    md = (out / "eval.md").read_text()
    assert "native: HotpotQA 3, Bamboogle 3; native_trained: HotpotQA 1, Bamboogle 1" in md
    assert "| native | 3/3 |" in md
    assert ev.max_questions() == 3 and "1 (native: 3)" in md


def test_evaluate_stage_rejects_unknown_benchmarks(tmp_path):
    ev = EvalConfig(benchmarks=["hotpotqa", "nq"], systems={"native": {"workflow": "native"}})
    with pytest.raises(stage.DataError, match=r"\['nq'\] not found"):
        stage.run(LLMConfig(), MapsConfig(), ev, benchmarks=_prepared(tmp_path), results=tmp_path / "r",
                  report=tmp_path / "r.md", figures=tmp_path / "f", retriever=KeywordRetriever([("a", "b")]),
                  differences=tmp_path / "d.json")
    assert not (tmp_path / "r").exists()


@pytest.mark.slow
def test_end_to_end_every_system_with_smollm2_on_shared_hotpotqa(tmp_path, smollm2_dir, shared_data):
    """The real model, a real BM25 index over the shared mini-Wikipedia, three HotpotQA questions, all systems."""
    rows = [json.loads(x) for x in (shared_data / "corpus" / "mini_wiki.jsonl").read_text().splitlines()]
    bench = tmp_path / "benchmarks"
    write_jsonl(bench / "hotpotqa.jsonl", load_qa(shared_data / "benchmarks" / "hotpotqa" / "dev.jsonl")[:3])
    engine = smollm2_engine(str(smollm2_dir))
    pool = EnginePool(EngineConfig(), loader=lambda path, cfg: engine)
    small = {"max_new_tokens": 12}
    llm = LLMConfig(sampling={"default": small, "judge_agent": {"max_new_tokens": 6},
                              "proponent": {"max_new_tokens": 24}, "opponent": {"max_new_tokens": 24},
                              "moderator": {"max_new_tokens": 4}})
    maps_cfg = MapsConfig(max_rounds=2, top_k=2, passage_words=30,
                          debate={"max_rounds": 2, "top_k": 2, "passage_words": 30})
    ev = EvalConfig(n_questions=3, systems=SYSTEMS, baselines={"top_k": 2, "iterations": 2, "passage_words": 30})
    metrics = stage.run(llm, maps_cfg, ev, benchmarks=bench, results=tmp_path / "res", report=tmp_path / "eval.md",
                        figures=tmp_path / "fig", retriever=Bm25Retriever(rows), engines=pool,
                        differences=tmp_path / "compare.json")
    for system in SYSTEMS:
        eps = read_episodes(tmp_path / "res" / system / "hotpotqa.jsonl")
        assert len(eps) == 3 and all(isinstance(e.final_answer, str) for e in eps)
        for e in eps:
            assert e.calls and all(c.prompt_tokens > 0 and c.completion_tokens > 0 for c in e.calls)
            assert e.cost["llm_calls"] == len(e.calls) and "seconds" not in e.cost  # wall time: metrics only
            assert set(e.metrics) == {"em", "f1", "acc", "no_answer", "format_error_questions"}
        assert 0 <= metrics[system]["avg"]["f1"] <= 100 and metrics[system]["avg"]["seconds"] > 0
    maps_eps = read_episodes(tmp_path / "res" / "maps" / "hotpotqa.jsonl")
    for e in maps_eps:
        assert 1 <= e.meta["rounds"] <= 2 and e.queries[0] == e.question
        assert len(e.queries) == e.meta["rounds"] + 1 and len(e.meta["pool"]["docs"]) == len(e.queries)
        assert len(e.queries[1].split()) <= 8                              # sanitised keyword query
        assert e.calls[-1].role == "answer_agent" and "Query Pool:\nQuery 1: " in e.calls[-1].prompt[0]["content"]
    # retrieval found at least one supporting passage for some question (BM25 over the real corpus works)
    titles = {t for r in load_qa(bench / "hotpotqa.jsonl") for t in r["metadata"]["supporting_titles"]}
    got = {d["contents"].split("\n")[0].strip('"') for e in maps_eps for hs in e.meta["pool"]["docs"] for d in hs}
    assert titles & got
    assert "| maps |" in (tmp_path / "eval.md").read_text()


def test_cli_ask_runs_a_configured_system(monkeypatch, ask_params):
    from typer.testing import CliRunner

    import ragteam.llm.hf
    import ragteam.retrieval
    from ragteam.cli import app

    def reply(role, m):   # the judge wants the second query's passage (maps.judge_initial asks it on the first)
        judge = maps.SUFFICIENT if "q0r1" in m[-1]["content"] else maps.INSUFFICIENT
        return {"query_agent": "q0r1", "judge_agent": judge, "answer_agent": "ans0"}[role]

    class Fake(ScriptedEngine):
        def __init__(self, path, cfg):
            super().__init__(reply)

    opened = []
    monkeypatch.setattr(ragteam.llm.hf, "HFEngine", Fake)
    monkeypatch.setattr(ragteam.retrieval, "open_retriever", lambda index: opened.append(index) or KeywordRetriever(
        [("T0", "text q0r0"), ("T1", "text q0r1")]))
    res = CliRunner().invoke(app, ["ask", "What is q0r0 ?", "--params", str(ask_params), "--calls",
                                   "--index", "idx"])
    assert res.exit_code == 0, res.output
    assert "A: ans0" in res.output and "1 round(s), judge_sufficient" in res.output and opened == ["idx"]
    assert "[judge_agent] 'Insufficient Information'" in res.output     # the verdict on the initial retrieval
    assert "[query_agent] 'q0r1' -> 'q0r1'" in res.output
    bad = CliRunner().invoke(app, ["ask", "x", "--system", "nope", "--params", str(REPO / "params.yaml")])
    assert bad.exit_code == 1 and "not in eval.systems" in bad.output


def test_dvc_stage_declares_what_the_stage_reads_and_writes():
    st = yaml.safe_load((REPO / "dvc.yaml").read_text())["stages"]["evaluate"]
    assert st["cmd"] == "python -m stages.evaluate"
    # joint.systems: which joint systems' rows have checkpoints (rows_without_their_stage); of QAgent's training
    # params only Eq. 10's weight, its plug-in rows' team reward (ragteam.rewards.team)
    assert set(st["params"]) == {"llm", "maps", "eval", "jade", "decor", "mask", "qagent", "joint.systems",
                                 "joint.qagent.hit_weight"}
    deps = set(st["deps"])
    assert {"stages/evaluate.py", "ragteam/agents", "ragteam/llm", "ragteam/eval/evaluate.py", "ragteam/rewards",
            "models/llm", "models/agents", "models/warmup"} <= deps     # the checkpoints as directories
    assert "${eval.retriever}" in deps and any(str(stage.BENCHMARKS).startswith(d) for d in deps)
    outs = [next(iter(o)) if isinstance(o, dict) else o for o in st["outs"]]
    # every score and difference as plain outputs; the declared metrics (dvc metrics show / exp show) the headline
    assert outs == [str(stage.RESULTS), str(stage.REPORT), str(stage.METRICS), str(stage.DIFFERENCES),
                    str(stage.RUN_RECORD)]      # the run's record: seconds and the environment (ragteam lineage)
    assert [next(iter(m)) for m in st["metrics"]] == ["metrics/summary/eval.json"]
    assert [next(iter(p)) for p in st["plots"]] == [str(stage.FIGURES / "eval_cost.png"),
                                                    str(stage.FIGURES / "eval_scores.png")]


def test_comparison_pairs_derived_from_the_systems_or_given():
    systems = {n: SystemSpec(**s) for n, s in {
        "standard_rag": {"workflow": "standard_rag"}, "maps_untrained": {"workflow": "maps"},
        "maps": {"workflow": "maps", "trained_agents": True},
        "maps_base_query": {"workflow": "maps", "trained_agents": True, "base_roles": ["query_agent"]},
        "maps_base_judge": {"workflow": "maps", "trained_agents": True, "base_roles": ["judge_agent"]},
        "maps_2_rounds": {"workflow": "maps", "trained_agents": True, "fixed_rounds": 2},
        "drag": {"workflow": "drag"}, "drag_trained": {"workflow": "drag"}}.items()}
    assert comparison_pairs(systems) == [("drag_trained", "drag"), ("maps", "maps_untrained"),
                                         ("maps", "maps_base_query"), ("maps", "maps_base_judge")]
    with_native = {**systems, "native": SystemSpec(workflow="native")}
    assert comparison_pairs(with_native)[0] == ("standard_rag", "native")   # does retrieval help at all
    assert len(comparison_pairs(with_native)) == 5
    assert comparison_pairs(systems, [["maps", "drag"]]) == [("maps", "drag")]
    assert comparison_pairs(systems, []) == []                       # an explicit empty list turns them off
    two = {"maps": {"workflow": "maps"}, "m2": {"workflow": "maps"}}
    with pytest.raises(ParamsError, match=r"eval.compare\[1\] = \['maps', 'mapz'\]: \['mapz'\] not in eval"):
        parse_section({"eval": {"systems": two, "compare": [["maps", "m2"], ["maps", "mapz"]]}}, "eval", EvalConfig)
    with pytest.raises(ParamsError, match="compared with itself"):
        parse_section({"eval": {"systems": {"maps": {"workflow": "maps"}}, "compare": [["maps", "maps"]]}}, "eval",
                      EvalConfig)


def _scores(em_h, em_b):
    return {"hotpotqa": {"em": em_h, "f1": em_h}, "bamboogle": {"em": em_b, "f1": em_b}}


def test_intervals_and_paired_differences_per_benchmark_and_on_the_average():
    cfg = BootstrapConfig(resamples=2000, seed=0)
    good = _scores([1.0] * 10, [1.0] * 5 + [0.0] * 5)
    bad = _scores([0.0] * 10, [1.0] * 5 + [0.0] * 5)
    summary = with_average({"hotpotqa": {"n": 10.0, "em": 100.0, "f1": 100.0},
                            "bamboogle": {"n": 10.0, "em": 50.0, "f1": 50.0}})
    add_intervals(summary, good, cfg)
    assert summary["hotpotqa"]["em_ci"] == [100.0, 100.0]             # constant scores: zero width
    lo, hi = summary["bamboogle"]["f1_ci"]
    assert lo < 50 < hi and lo >= 10 and hi <= 90
    a_lo, a_hi = summary["avg"]["em_ci"]                              # (100 + bamboogle) / 2: half as wide
    assert a_lo == pytest.approx(50 + lo / 2, abs=0.01) and a_hi == pytest.approx(50 + hi / 2, abs=0.01)
    d = compare_systems({"good": good, "bad": bad, "same": good}, [("good", "bad"), ("good", "same")], cfg)
    h = d["good vs bad"]["hotpotqa"]
    assert h["n"] == 10 and h["em"] == {"diff": 100.0, "lo": 100.0, "hi": 100.0, "n": 10, "significant": True}
    bf1 = d["good vs bad"]["bamboogle"]["f1"]
    assert bf1["significant"] is False and bf1["diff"] == 0
    assert d["good vs bad"]["avg"]["em"]["diff"] == 50.0 and d["good vs bad"]["avg"]["n"] == 20
    assert not any(d["good vs same"][b]["em"]["significant"] for b in ("hotpotqa", "bamboogle", "avg"))
    # a system that answered fewer questions is compared on the first n both answered, per benchmark
    short = _scores([0.0] * 3, [1.0])
    d = compare_systems({"good": good, "short": short}, [("good", "short")], cfg)["good vs short"]
    assert (d["hotpotqa"]["n"], d["bamboogle"]["n"], d["avg"]["n"]) == (3, 1, 4)
    assert d["hotpotqa"]["em"]["diff"] == 100.0 and d["bamboogle"]["f1"]["diff"] == 0.0
    with pytest.raises(ValueError, match="not run on the same benchmarks"):
        compare_systems({"good": good, "other": {"nq": short["hotpotqa"]}}, [("good", "other")], cfg)


def test_report_marks_significant_differences_and_states_the_rule():
    m = _metrics()
    for system in m:
        for b in m[system]:
            m[system][b]["em_ci"], m[system][b]["f1_ci"] = [1.0, 2.5], [3.0, 4.0]
    cell = lambda diff, lo, hi, sig: {"diff": diff, "lo": lo, "hi": hi, "n": 5, "significant": sig}  # noqa: E731
    diffs = {"maps vs native": {
        "a": "maps", "b": "native",
        "hotpotqa": {"n": 5, "em": cell(40.0, 20.0, 60.0, True), "f1": cell(-2.5, -9.0, 4.0, False)},
        "avg": {"n": 10, "em": cell(40.0, 25.0, 55.0, True), "f1": cell(0.0, -1.0, 1.0, False)}}}
    md = report.report_markdown(m, ["hotpotqa", "bamboogle"], {}, (), diffs,
                                {"resamples": 500, "seed": 3, "level": 0.9})
    assert "## Scores with 90 % intervals" in md and "(500 resamples, seed 3)" in md
    assert "| native | 5/5 | 10.00 [1.00, 2.50] | 20.00 [3.00, 4.00] | 30.00 [1.00, 2.50] |" in md
    assert "| maps − native | HotpotQA | 5 | **+40.00 [20.00, 60.00]** † | -2.50 [-9.00, 4.00] |" in md
    assert "| maps − native | Avg | 10 | **+40.00 [25.00, 55.00]** † | 0.00 [-1.00, 1.00] |" in md
    assert "0 lies outside the interval" in md and "central 90 % of the resampled mean difference" in md
    plain = report.report_markdown(_metrics(), ["hotpotqa"], {})
    assert "intervals" not in plain and "Differences" not in plain     # older metrics files still render
