"""Stage evaluate_agents: each trained MAPS agent alone against its base model on held-out questions.

The first `eval_agents.n_questions` of each benchmark in data/prepared/benchmarks, one retrieval with
`eval_agents.retriever`; the trained checkpoints are those of `eval.agents`. Writes metrics/eval_agents.json
({benchmark | avg: {n, answer|query|judge: {base, trained, diff}}}: scores, bootstrap intervals, paired trained - base
differences; its declared metrics in metrics/summary/eval_agents.json, COMPARED), results/eval_agents/questions.json
(the per-question scores, so seed replicates can be pooled by `python -m studies summarize`) and
reports/eval_agents.md. See `ragteam.eval.agents` for what is measured.
"""
from __future__ import annotations

import sys
import time
from pathlib import Path

from ragteam.agents.maps_workflow import MapsConfig
from ragteam.systems.maps import config as maps_config
from ragteam.config import ParamsError, load_params, parse_section
from ragteam.eval.agents import ROLE, EvalAgentsConfig, report_markdown, run_agents, summarize_agents
from ragteam.eval.evaluate import EvalConfig
from ragteam.io import DataError, atomic_file, write_json, write_metrics
from ragteam.llm import EngineDead, EnginePool, LLMConfig
from ragteam.environment import environment_line, run_record
from ragteam.llm.environment import ensure_engine_environment
from stages.evaluate import BENCHMARKS, load_benchmarks

METRICS = Path("metrics/eval_agents.json")
RUN_RECORD = Path("metrics/evaluate_agents.json")   # seconds and the environment that ran it (`ragteam lineage`)
# the declared metrics (metrics/summary/eval_agents.json): over benchmarks, each agent's trained - base difference
# with its interval, and the answer agent's EM / F1 / no-answer rate, the query agent's mean delta-F1 and the judge's
# (balanced) accuracy, base and trained; per-benchmark rows, intervals and counts stay in the record
COMPARED = ("avg.*.diff.*.diff", "avg.*.diff.*.lo", "avg.*.diff.*.hi", "avg.answer.*.em", "avg.answer.*.f1",
            "avg.answer.*.no_answer", "avg.query.*.mean_delta_f1", "avg.judge.*.accuracy",
            "avg.judge.*.balanced_accuracy")
QUESTIONS = Path("results/eval_agents/questions.json")
REPORT = Path("reports/eval_agents.md")


def trained_checkpoints(ev: EvalConfig) -> dict[str, str]:
    """agent -> checkpoint from eval.agents (by role)."""
    return {agent: ev.agents[role] for agent, role in ROLE.items() if role in ev.agents}


def run(llm: LLMConfig, maps_cfg: MapsConfig, cfg: EvalAgentsConfig, trained: dict[str, str], *,
        benchmarks: Path = BENCHMARKS, metrics: Path = METRICS, questions: Path = QUESTIONS, report: Path = REPORT,
        retriever=None, engines: EnginePool | None = None, check_dirs: bool = True) -> dict:
    """Run, summarise and write the three outputs; `retriever` / `engines` default to the params (tests inject)."""
    t0 = time.perf_counter()
    needed = {a: trained.get(a) for a in {*cfg.agents, "answer"}}
    absent = sorted(f"{a} ({p})" for a, p in needed.items() if p is None or (check_dirs and not Path(p).is_dir()))
    if absent:
        raise DataError(f"trained agents missing: {absent}; eval.agents names the checkpoints (run the train_* "
                        f"stages first)")
    qa = load_benchmarks(cfg, benchmarks)
    if retriever is None:
        from ragteam.retrieval import open_retriever

        retriever = open_retriever(cfg.retriever)
    engines = engines or EnginePool(llm)
    per = run_agents(qa, engines, llm.model, trained, retriever, maps_cfg, llm.sampling, cfg.agents)
    summary = summarize_agents(per, cfg.bootstrap)
    settings = {"base model": llm.model, "trained agents": trained, "retriever": cfg.retriever,
                "top_k": maps_cfg.top_k, "passage_words": maps_cfg.passage_words,
                "questions per benchmark (max)": cfg.n_questions, "bootstrap": cfg.bootstrap.model_dump(),
                "engines": f"{llm.backend} ({environment_line()})"}
    write_json(questions, {"settings": settings, "benchmarks": {b: {k: v for k, v in p.items() if k != "examples"}
                                                                for b, p in per.items()}})
    with atomic_file(report) as f:
        f.write(report_markdown(summary, per, settings, cfg.bootstrap))
    write_metrics(metrics, summary, COMPARED)
    a = summary["avg"]
    print(f"evaluate_agents: {summary['avg']['n']} questions, {time.perf_counter() - t0:.1f} s; avg trained - base: "
          + ", ".join(f"{agent} {m} {d['diff']:+.2f} [{d['lo']:.2f}, {d['hi']:.2f}]"
                      for agent in cfg.agents for m, d in a[agent]["diff"].items()), flush=True)
    print(f"evaluate_agents: engines started {engines.started}, reloaded in place {engines.swapped}, closed "
          f"{engines.closed}", flush=True)
    return summary


def main() -> None:
    t0 = time.perf_counter()
    try:
        params = load_params()
        ensure_engine_environment("evaluate_agents", params)
        llm = parse_section(params, "llm", LLMConfig).for_stage("evaluate_agents")
        maps_cfg = maps_config(params)
        ev = parse_section(params, "eval", EvalConfig)
        cfg = parse_section(params, "eval_agents", EvalAgentsConfig)
        summary = run(llm, maps_cfg, cfg, trained_checkpoints(ev))
    except (ParamsError, DataError, ValueError, EngineDead) as e:
        sys.exit(f"evaluate_agents FAILED: {e}")
    write_json(RUN_RECORD, {"agents": list(cfg.agents), "questions": int(summary["avg"]["n"]),
                            "seconds": round(time.perf_counter() - t0, 1), **run_record()})


if __name__ == "__main__":
    main()
