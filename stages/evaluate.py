"""Stage evaluate: every system of `eval.systems` on the first `eval.n_questions` of each benchmark.

Writes results/eval/<system>/<benchmark>.jsonl (Episodes: every agent call, prompt, parse, tokens, retrieved ids),
metrics/eval.json ({system: {benchmark | avg: EM/F1/Acc in % + cost per question}}), reports/eval.md (MAPS Table 1
layout + cost columns) and reports/figures/eval_*.png. Outputs are swapped in only when every system finished.
"""
from __future__ import annotations

import os
import sys
import time
from pathlib import Path

from ragteam.agents.mask_workflow import MaskConfig
from ragteam.agents.maps_workflow import MapsConfig
from ragteam.config import ParamsError, load_params, parse_section
from ragteam.data.formats import load_qa
from ragteam.eval.evaluate import EvalConfig, make_team, run_system, summarize, with_average
from ragteam.eval.report import (order_benchmarks, plot_cost_accuracy, plot_scores, publish_prefect_artifact,
                                 report_markdown, table_markdown)
from ragteam.io import DataError, atomic_dir, atomic_file, write_json
from ragteam.llm import EnginePool, LLMConfig
from ragteam.records import write_episodes

BENCHMARKS = Path("data/prepared/benchmarks")
RESULTS = Path("results/eval")
METRICS = Path("metrics/eval.json")
REPORT = Path("reports/eval.md")
FIGURES = Path("reports/figures")


def load_benchmarks(ev: EvalConfig, root: Path = BENCHMARKS) -> dict[str, list[dict]]:
    names = sorted(p.stem for p in root.glob("*.jsonl")) if ev.benchmarks == "all" else list(ev.benchmarks)
    if not names:
        raise DataError(f"{root}: no benchmark files (*.jsonl)")
    missing = [n for n in names if not (root / f"{n}.jsonl").is_file()]
    if missing:
        raise DataError(f"eval.benchmarks: {missing} not found in {root} "
                        f"(have {sorted(p.stem for p in root.glob('*.jsonl'))})")
    return {n: load_qa(root / f"{n}.jsonl")[: ev.n_questions] for n in order_benchmarks(names)}


def run(llm: LLMConfig, maps_cfg: MapsConfig, ev: EvalConfig, *, benchmarks: Path = BENCHMARKS,
        results: Path = RESULTS, report: Path = REPORT, figures: Path = FIGURES, retriever=None,
        engines: EnginePool | None = None, mask_cfg: MaskConfig | None = None) -> dict:
    """Evaluate every system; `retriever` / `engines` default to eval.retriever and the llm section (tests inject)."""
    t0 = time.perf_counter()
    qa = load_benchmarks(ev, benchmarks)
    needs_retrieval = any(s.workflow != "native" for s in ev.systems.values())
    if retriever is None and needs_retrieval:
        from ragteam.retrieval import open_retriever

        retriever = open_retriever(ev.retriever)
    engines = engines or EnginePool(llm)
    # All benchmarks of a system run as one batch: every step is one engine call over all their questions.
    rows = [dict(r, _benchmark=b) for b, rs in qa.items() for r in rs]
    metrics: dict = {}
    with atomic_dir(results) as tmp:
        for name, spec in ev.systems.items():
            ts = time.perf_counter()
            team = make_team(engines, spec, ev.agents, llm.model, llm.sampling)
            eps = run_system(spec, rows, team, retriever, maps_cfg, ev.baselines, name, mask_cfg=mask_cfg)
            per = {}
            for b in qa:
                mine = [e for e, r in zip(eps, rows) if r["_benchmark"] == b]
                for e in mine:
                    e.meta["benchmark"] = b
                write_episodes(tmp / name / f"{b}.jsonl", mine)
                per[b] = summarize(mine)
            metrics[name] = with_average(per)
            a = metrics[name]["avg"]
            print(f"evaluate: {name}: EM {a['em']:.2f} F1 {a['f1']:.2f} on {len(rows)} questions, "
                  f"{time.perf_counter() - ts:.1f} s, engine calls {team.calls}", flush=True)
    benches = list(qa)
    cost_png = plot_cost_accuracy(metrics, figures / "eval_cost.png")
    scores_png = plot_scores(metrics, benches, figures / "eval_scores.png")
    context = {"base model": llm.model, "backend": f"{llm.backend} ({llm.device}, {llm.dtype})",
               "retriever": ev.retriever, "questions per benchmark (max)": ev.n_questions,
               "MAPS": f"max_rounds {maps_cfg.max_rounds}, top_k {maps_cfg.top_k}, fixed_rounds "
                       f"{maps_cfg.fixed_rounds}, max_chunks {maps_cfg.max_chunks}",
               "trained agents": dict(ev.agents) or "none (every role uses the base model)",
               "CPU cores": os.cpu_count(), "total seconds": round(time.perf_counter() - t0, 1)}
    md = report_markdown(metrics, benches, context,
                         [os.path.relpath(p, report.parent) for p in (cost_png, scores_png)])
    with atomic_file(report) as f:
        f.write(md)
    publish_prefect_artifact(md)
    return metrics


def main() -> None:
    try:
        params = load_params()
        llm = parse_section(params, "llm", LLMConfig)
        maps_cfg = parse_section(params, "maps", MapsConfig)
        ev = parse_section(params, "eval", EvalConfig)
        mask_cfg = parse_section(params, "mask", MaskConfig)
        metrics = run(llm, maps_cfg, ev, mask_cfg=mask_cfg)
    except (ParamsError, DataError) as e:
        sys.exit(f"evaluate FAILED (previous outputs left untouched): {e}")
    write_json(METRICS, metrics)
    print(table_markdown(metrics, [b for b in next(iter(metrics.values())) if b != "avg"]))


if __name__ == "__main__":
    main()
