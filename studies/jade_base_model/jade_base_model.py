"""What a base model does with JADE's roles: the workflow end to end, and each role's prompt on its own.

1. The `jade` system (Algorithm 1 with the params.yaml `jade` and `llm.sampling` settings) on the first `--n` dev
   questions of each benchmark: EM / F1 / Acc, cost, the workflow figures, R_global, format errors per role.
2. Each role's Appendix E prompt sent straight to the model for the same questions (one batched call per role;
   DS and AG over the question's top-k BM25 passages, AS over one placeholder sub-answer), since a model that never
   writes a valid plan reaches only the fallback roles inside the workflow: format errors per role.

The corpus is indexed with bm25s into a temporary directory. Run from the repo root:

    .venv/bin/python studies/jade_base_model/jade_base_model.py --data ../shared/data --benchmarks hotpotqa,nq,musique --n 3 \
        --model ~/.cache/ragteam-tests/llm --out studies/jade_base_model/jade_base_model_smollm2.json
"""
from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
from collections import Counter
from pathlib import Path

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

from ragteam.config import load_params, parse_section  # noqa: E402
from ragteam.data.formats import load_qa  # noqa: E402
from ragteam.eval.evaluate import SystemSpec, WorkflowConfigs, run_system, summarize  # noqa: E402
from ragteam.llm import EnginePool, LLMConfig, Team  # noqa: E402
from ragteam.records import Episode  # noqa: E402
from ragteam.retrieval.base import Retriever  # noqa: E402
from ragteam.systems.jade import roles as jade  # noqa: E402
from ragteam.systems.jade.workflow import JadeConfig  # noqa: E402

PARSERS = {jade.PLANNER: jade.parse_plan, jade.QR: jade.parse_rewrite, jade.QDS: jade.parse_subquestions,
           jade.QDP: jade.parse_subquestions, jade.DS: jade.parse_doc_ids, jade.AG: jade.parse_answer,
           jade.AS: jade.parse_answer}


def per_role_errors(episodes: list[Episode]) -> dict[str, dict[str, int]]:
    """Calls and format errors per role inside the workflow."""
    calls = Counter(c.role for e in episodes for c in e.calls)
    errors = Counter(c.role for e in episodes for c in e.calls if c.format_error)
    return {role: {"calls": calls[role], "format_errors": errors[role]} for role in calls}


def probe_roles(team: Team, questions: list[str], retriever: Retriever, cfg: JadeConfig) -> dict[str, dict]:
    """Each role's prompt for every question, one batched call per role; format errors and one example each."""
    docs = retriever.batch_search(questions, cfg.top_k)
    prompts = {
        jade.PLANNER: [jade.planner_messages(q) for q in questions],
        jade.QR: [jade.qr_messages(q) for q in questions],
        jade.QDS: [jade.qds_messages(q) for q in questions],
        jade.QDP: [jade.qdp_messages(q) for q in questions],
        jade.DS: [jade.ds_messages(q, d, cfg.passage_words) for q, d in zip(questions, docs) if d],
        jade.AG: [jade.ag_messages(q, d, cfg.passage_words) for q, d in zip(questions, docs)],
        jade.AS: [jade.as_messages(q, [(q, "unknown")]) for q in questions],
    }
    out = {}
    for role, ps in prompts.items():
        texts = [c.text for c in team.complete(role, ps)]
        bad = [t for t in texts if isinstance(PARSERS[role](t), jade.FormatError)]
        out[role] = {"prompts": len(ps), "format_errors": len(bad), "example": texts[0] if texts else ""}
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", type=Path, required=True, help="a dir in the layout of ../shared/data")
    ap.add_argument("--benchmarks", default="hotpotqa,nq,musique")
    ap.add_argument("--n", type=int, default=3, help="first n dev questions per benchmark")
    ap.add_argument("--model", default=None, help="model dir (default: llm.model of params.yaml)")
    ap.add_argument("--params", type=Path, default=Path("params.yaml"))
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args()

    from ragteam.retrieval.bm25 import Bm25sRetriever, build_bm25s_index

    params = load_params(args.params)
    llm, cfg = parse_section(params, "llm", LLMConfig), parse_section(params, "jade", JadeConfig)
    rows = [r for b in args.benchmarks.split(",") for r in load_qa(args.data / "benchmarks" / b / "dev.jsonl")[:args.n]]
    corpus = sorted((args.data / "corpus").glob("*.jsonl"))[0]
    engines = EnginePool(llm)
    team = Team(lambda role: engines.get(args.model or llm.model), llm.sampling)
    with tempfile.TemporaryDirectory() as tmp:
        build_bm25s_index(corpus, tmp, k1=0.9, b=0.4, show_progress=False)
        retriever = Bm25sRetriever(tmp, corpus)
        t0 = time.perf_counter()
        eps = run_system(SystemSpec(workflow="jade"), rows, team, retriever, WorkflowConfigs(jade=cfg), "jade")
        workflow_s = time.perf_counter() - t0
        t0 = time.perf_counter()
        probe = probe_roles(team, [r["question"] for r in rows], retriever, cfg)
        probe_s = time.perf_counter() - t0
    result = {"model": args.model or llm.model, "questions": len(rows), "benchmarks": args.benchmarks,
              "jade": cfg.model_dump(), "workflow": {"summary": summarize(eps), "per_role": per_role_errors(eps),
                                                     "plans": Counter(p["plan"] + ("*" if p["fallback"] else "")
                                                                      for e in eps for p in e.meta["plans"]),
                                                     "seconds": round(workflow_s, 1)},
              "probe": {"per_role": probe, "seconds": round(probe_s, 1)}}
    args.out.write_text(json.dumps(result, indent=1, ensure_ascii=False) + "\n")
    print(json.dumps({k: result[k] for k in ("workflow", "probe")}, indent=1, ensure_ascii=False))


if __name__ == "__main__":
    main()
