"""What the base model loses to formatting alone (issue 24 §3, for issue 25): each joint system's base-model row
beside its `<system>_grammar` row (every role decoded under its format's regex, `ragteam.agents.grammars`), through
the `evaluate` stage's own `run` on the default benchmark questions, with vLLM (guided decoding is vLLM's).

Needs the worker environment and the outputs of `dvc repro prepare_models prepare_data index_bm25@bm25s`:

    .venv-worker/bin/python studies/grammar_rows/grammar_rows.py [--n 8] [--out studies/grammar_rows]

Writes OUT/eval.md (the stage's report: the rows, their intervals and the paired differences X_grammar - X),
OUT/metrics.json and OUT/summary.json (per row: EM, F1, no answer %, format-error questions %, seconds).
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))
SYSTEMS = ("mask", "jade", "decor", "qagent")


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=8, help="questions per benchmark (the default run's n for these rows)")
    ap.add_argument("--out", type=Path, default=REPO / "studies" / "grammar_rows")
    ap.add_argument("--systems", nargs="+", choices=SYSTEMS, default=list(SYSTEMS))
    args = ap.parse_args(argv)
    os.chdir(REPO)
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    from ragteam.config import load_params, parse_section
    from ragteam.eval.evaluate import EvalConfig, SystemSpec, WorkflowConfigs
    from ragteam.llm import LLMConfig
    from ragteam.llm.vllm_backend import close_live_engines
    from stages.evaluate import run

    params = load_params(REPO / "params.yaml")
    llm = parse_section(params, "llm", LLMConfig).for_stage("evaluate")
    if llm.backend != "vllm":
        sys.exit("grammar_rows: llm.stages.evaluate must be vllm (guided decoding)")
    ev = parse_section(params, "eval", EvalConfig)
    rows = {}
    for s in args.systems:
        rows[s] = SystemSpec(workflow=s, n_questions=args.n)
        rows[f"{s}_grammar"] = SystemSpec(workflow=s, grammar=True, n_questions=args.n)
    ev = ev.model_copy(update={"systems": rows, "compare": None, "n_questions": args.n})
    out = args.out
    out.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    try:
        metrics = run(llm, WorkflowConfigs.from_params(params, ev.baselines), ev, results=out / "episodes",
                      report=out / "eval.md", figures=out / "figures", differences=out / "differences.json")
    finally:
        close_live_engines()
    keys = ("em", "f1", "no_answer", "format_error_questions", "seconds", "completion_tokens")
    summary = {name: {k: m["avg"].get(k) for k in keys} for name, m in metrics.items()}
    (out / "metrics.json").write_text(json.dumps(metrics, indent=1) + "\n")
    (out / "summary.json").write_text(json.dumps({"n_per_benchmark": args.n, "wall_s": round(time.perf_counter() - t0, 1),
                                                  "rows": summary}, indent=1) + "\n")
    for name, s in summary.items():
        print(name, s)


if __name__ == "__main__":
    main()
