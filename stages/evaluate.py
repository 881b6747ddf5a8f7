"""Stage evaluate: every system of `eval.systems` on the first `eval.n_questions` of each benchmark.

Writes results/eval/<system>/<benchmark>.jsonl (Episodes: every agent call, prompt, parse, tokens, retrieved ids),
metrics/eval.json ({system: {benchmark | avg: EM/F1/Acc (+ LJ for DECOR) in % + cost per question + em_ci/f1_ci
bootstrap intervals}}) and metrics/eval_compare.json (paired-bootstrap differences for the eval.compare pairs), both
plain outputs; the declared metrics metrics/summary/eval.json (each row's average EM / F1 / no-answer rate, each
pair's F1 difference and interval: what `dvc metrics show` and `dvc exp show` list); reports/eval.md (MAPS Table 1
layout + cost columns, intervals, differences) and reports/figures/eval_*.png (a panel or a colour per system
family). Outputs are swapped in only when every system finished.
"""
from __future__ import annotations

import os
import sys
import time
from collections.abc import Mapping
from pathlib import Path

from ragteam.agents.maps_workflow import MapsConfig
from ragteam.config import ParamsError, load_params, parse_section
from ragteam.data.formats import load_qa
from ragteam.eval.evaluate import (COMPARED, EvalConfig, WorkflowConfigs, add_intervals, compare_systems,
                                   comparison_pairs, make_team, no_answer_reasons, question_scores, row_kind,
                                   rows_without_their_stage, run_system, summarize, system_groups, with_average,
                                   without_rows)
from ragteam.eval.report import (order_benchmarks, plot_cost_accuracy, plot_scores, publish_prefect_artifact,
                                 report_markdown, table_markdown)
from ragteam.environment import environment_line, run_record
from ragteam.io import DataError, atomic_dir, atomic_file, compared_numbers, summary_path, write_json
from ragteam.llm import EngineDead, EnginePool, LLMConfig
from ragteam.systems.registry import frozen_role_models, report_context
from ragteam.llm.environment import ensure_engine_environment
from ragteam.records import write_episodes

BENCHMARKS = Path("data/prepared/benchmarks")
RESULTS = Path("results/eval")
METRICS = Path("metrics/eval.json")
DIFFERENCES = Path("metrics/eval_compare.json")
# the run's own record (rows run and left out, seconds, the environment and library versions that ran it, which
# `ragteam lineage` shows); metrics/eval.json stays keyed by row
RUN_RECORD = Path("metrics/evaluate.json")
REPORT = Path("reports/eval.md")
FIGURES = Path("reports/figures")


def load_benchmarks(ev, root: Path = BENCHMARKS, first: int | None = None) -> dict[str, list[dict]]:
    """The first `first` (default `ev.n_questions`) rows of each of `ev.benchmarks` (an eval or eval_agents
    section)."""
    first = ev.n_questions if first is None else first
    names = sorted(p.stem for p in root.glob("*.jsonl")) if ev.benchmarks == "all" else list(ev.benchmarks)
    if not names:
        raise DataError(f"{root}: no benchmark files (*.jsonl)")
    missing = [n for n in names if not (root / f"{n}.jsonl").is_file()]
    if missing:
        raise DataError(f"eval.benchmarks: {missing} not found in {root} "
                        f"(have {sorted(p.stem for p in root.glob('*.jsonl'))})")
    return {n: load_qa(root / f"{n}.jsonl")[: first] for n in order_benchmarks(names)}


def run(llm: LLMConfig, cfgs: WorkflowConfigs | MapsConfig, ev: EvalConfig, *, benchmarks: Path = BENCHMARKS,
        results: Path = RESULTS, report: Path = REPORT, figures: Path = FIGURES, retriever=None,
        engines: EnginePool | None = None, differences: Path = DIFFERENCES,
        left_out: Mapping[str, str] | None = None) -> dict:
    """Evaluate every system; `retriever` / `engines` default to eval.retriever and the llm section (tests inject).
    `left_out`: rows of eval.systems not run, and why (`rows_without_their_stage`); the report lists them.

    `cfgs`: the workflows' params sections (a bare MapsConfig = the other sections at their defaults)."""
    if isinstance(cfgs, MapsConfig):
        cfgs = WorkflowConfigs(maps=cfgs)
    cfgs = cfgs.model_copy(update={"baselines": ev.baselines})
    used = {s.workflow for s in ev.systems.values()}
    guided = [n for n, s in ev.systems.items() if s.grammar]
    if guided and llm.backend != "vllm":
        raise ParamsError(f"eval.systems {guided}: grammar rows decode with vLLM's guided decoding, but evaluate runs "
                          f"on the {llm.backend} engine: set llm.stages.evaluate to vllm, or drop the rows")
    t0 = time.perf_counter()
    qa = load_benchmarks(ev, benchmarks, ev.max_questions())  # every system answers a prefix of these
    needs_retrieval = any(row_kind(s.workflow).retrieves for s in ev.systems.values())
    if retriever is None and needs_retrieval:
        from ragteam.retrieval import open_retriever

        retriever = open_retriever(ev.retriever)
    engines = engines or EnginePool(llm)
    metrics: dict = {}
    scores: dict = {}  # system -> benchmark -> em/f1 per question, for the bootstrap
    reasons: dict = {}  # system -> why its unanswered questions have no answer -> questions
    with atomic_dir(results) as tmp:
        for name, spec in ev.systems.items():
            ts = time.perf_counter()
            # all benchmarks of a system run as one batch: every step is one engine call over all their questions
            n = ev.questions_for(name)
            rows = [dict(r, _benchmark=b) for b, rs in qa.items() for r in rs[:n]]
            team = make_team(engines, spec, ev.agents, llm.model, llm.sampling, frozen_role_models(cfgs))
            team.on_call = lambda role, k, s, name=name, ts=ts: print(
                f"evaluate: {name}: {role} on {k} prompts, {s:.1f} s (system {time.perf_counter() - ts:.0f} s)",
                flush=True)
            eps = run_system(spec, rows, team, retriever, cfgs, name, ev.lj == "all")
            per = {}
            for b in qa:
                mine = [e for e, r in zip(eps, rows) if r["_benchmark"] == b]
                for e in mine:
                    e.meta["benchmark"] = b
                write_episodes(tmp / name / f"{b}.jsonl", mine)
                per[b] = summarize(mine)
                scores.setdefault(name, {})[b] = question_scores(mine)
            metrics[name] = add_intervals(with_average(per), scores[name], ev.bootstrap)
            reasons[name] = no_answer_reasons(eps)
            a = metrics[name]["avg"]
            print(f"evaluate: {name}: EM {a['em']:.2f} F1 {a['f1']:.2f} no answer {a['no_answer']:.1f} % on "
                  f"{len(rows)} questions, "
                  f"{time.perf_counter() - ts:.1f} s, engine calls {team.calls}", flush=True)
    print(f"evaluate: engines started {engines.started}, reloaded in place {engines.swapped}, closed "
          f"{engines.closed}", flush=True)
    benches = list(qa)
    groups = system_groups(ev.systems)
    cost_png = plot_cost_accuracy(metrics, figures / "eval_cost.png", groups)
    scores_png = plot_scores(metrics, benches, figures / "eval_scores.png", groups)
    context = {"base model": llm.model, "backend": f"{llm.backend} ({llm.device}, {llm.dtype})",
               "retriever": ev.retriever, "questions per benchmark": _questions_context(ev),
               **report_context(cfgs, llm.model, used, ev.lj == "all"),     # each system's own settings
               "trained agents": dict(ev.agents) or "none (every role uses the base model)",
               "engines": f"{llm.backend} ({environment_line()})",
               **({"rows left out": "; ".join(f"{k} ({v})" for k, v in left_out.items())} if left_out else {}),
               "CPU cores": os.cpu_count(), "total seconds": round(time.perf_counter() - t0, 1)}
    diffs = compare_systems(scores, comparison_pairs(ev.systems, ev.compare), ev.bootstrap)
    write_json(differences, diffs)
    write_json(summary_path(differences.parent / METRICS.name),       # the declared metrics (COMPARED)
               compared_numbers({"systems": metrics, "differences": diffs}, COMPARED))
    md = report_markdown(metrics, benches, context,
                         [os.path.relpath(p, report.parent) for p in (cost_png, scores_png)], diffs,
                         ev.bootstrap.model_dump(), reasons)
    with atomic_file(report) as f:
        f.write(md)
    publish_prefect_artifact(md)
    return metrics


def _questions_context(ev: EvalConfig) -> str:
    """eval.n_questions, and the systems that answer a different number (their rows' n column says it too)."""
    own = {name: ev.questions_for(name) for name in ev.systems if ev.questions_for(name) != ev.n_questions}
    return f"{ev.n_questions}" + (f" ({', '.join(f'{k}: {v}' for k, v in own.items())})" if own else "")


def main() -> None:
    t0 = time.perf_counter()
    try:
        params = load_params()
        ensure_engine_environment("evaluate", params)
        llm = parse_section(params, "llm", LLMConfig).for_stage("evaluate")
        ev = parse_section(params, "eval", EvalConfig)
        left_out = rows_without_their_stage(ev, params.get("joint") or {})
        for name, why in left_out.items():
            print(f"evaluate: row {name} left out: {why}", flush=True)
        ev = without_rows(ev, left_out)
        metrics = run(llm, WorkflowConfigs.from_params(params, ev.baselines), ev, left_out=left_out)
    except (ParamsError, DataError, EngineDead) as e:
        sys.exit(f"evaluate FAILED (previous outputs left untouched): {e}")
    write_json(METRICS, metrics)
    write_json(RUN_RECORD, {"rows": list(metrics), "rows_left_out": left_out,
                            "questions": {n: int(m["avg"]["n"]) for n, m in metrics.items()},
                            "seconds": round(time.perf_counter() - t0, 1), **run_record()})
    print(table_markdown(metrics, [b for b in next(iter(metrics.values())) if b != "avg"]))


if __name__ == "__main__":
    main()
