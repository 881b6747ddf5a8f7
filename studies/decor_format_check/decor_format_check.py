"""The base model through DECOR (Algorithm 1) on a few questions: format-error rate per role, answers, rewards.

Builds a bm25s index of the corpus in a temporary directory, runs `run_decor` with the `llm` and `decor` sections
of a params file (greedy, evaluation mode: fallbacks, no truncation), scores EM/F1/LJ with the rule judge and
assigns the DECOR rewards. With `--llm-judge` the same model also judges (Appendix B; format gate ignored so that
the role prompts are sent) and its judge-error rate is reported. Example (the figures in the DECOR README section):

    .venv/bin/python studies/decor_format_check/decor_format_check.py --model ~/.cache/ragteam-tests/llm \\
        --corpus ../shared/data/corpus/mini_wiki.jsonl --questions ../shared/data/benchmarks/hotpotqa/dev.jsonl \\
        --n 3 --llm-judge --out studies/decor_format_check/decor_format_check_smollm2.json
"""
from __future__ import annotations

import argparse
import os
import tempfile
import time
from collections import Counter
from pathlib import Path

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

from ragteam.config import load_params, parse_section  # noqa: E402
from ragteam.data.formats import load_qa  # noqa: E402
from ragteam.eval.evaluate import score_episodes, summarize  # noqa: E402
from ragteam.io import write_json  # noqa: E402
from ragteam.llm import LLMConfig, Team, load_engine  # noqa: E402
from ragteam.retrieval.bm25 import Bm25sRetriever, build_bm25s_index  # noqa: E402
from ragteam.systems.decor.rewards import LLMJudge, RuleJudge, decor_rewards, score_lj  # noqa: E402
from ragteam.systems.decor.roles import POLICY_ROLES  # noqa: E402
from ragteam.systems.decor.workflow import DecorConfig, run_decor  # noqa: E402


def format_errors(episodes, roles) -> dict:
    out = {}
    for role in roles:
        calls = [c for e in episodes for c in e.calls if c.role == role]
        reasons = Counter(c.format_error for c in calls if c.format_error)
        out[role] = {"calls": len(calls), "format_errors": sum(reasons.values()),
                     "rate": round(sum(reasons.values()) / len(calls), 4) if calls else None,
                     "reasons": dict(reasons)}
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", required=True, help="model dir (every role, the summarizer and the judge)")
    ap.add_argument("--corpus", required=True, type=Path)
    ap.add_argument("--questions", required=True, type=Path, help="FlashRAG QA jsonl")
    ap.add_argument("--n", type=int, default=3)
    ap.add_argument("--params", type=Path, default=Path("params.yaml"))
    ap.add_argument("--llm-judge", action="store_true", help="also judge with the model (Appendix B prompts)")
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args()

    params = load_params(args.params)
    llm, cfg = parse_section(params, "llm", LLMConfig), parse_section(params, "decor", DecorConfig)
    rows = load_qa(args.questions)[: args.n]
    with tempfile.TemporaryDirectory() as tmp:
        build_bm25s_index(args.corpus, tmp, k1=0.9, b=0.4, show_progress=False)
        retriever = Bm25sRetriever(tmp, args.corpus)
        team = Team(load_engine(str(args.model), llm), llm.sampling)
        t0 = time.perf_counter()
        eps = run_decor(rows, team, retriever, cfg)
        seconds = time.perf_counter() - t0
    score_episodes(eps, lambda scored: score_lj(scored, RuleJudge()))
    decor_rewards(eps, RuleJudge(), cfg.reward)
    report = {"model": str(args.model), "questions": str(args.questions), "n": len(eps),
              "decor": cfg.model_dump(), "sampling": {r: s.model_dump() for r, s in llm.sampling.items()
                                                      if r.startswith("decor")},
              "seconds": round(seconds, 1), "engine_calls": team.calls,
              "format_errors": format_errors(eps, (*POLICY_ROLES, "decor_summarizer")),
              "summary": summarize(eps),
              "episodes": [{"question": e.question, "golden_answers": e.golden_answers, "answer": e.final_answer,
                            "metrics": e.metrics, "stop_reason": e.meta["stop_reason"], "rounds": e.meta["rounds"],
                            "reward": e.meta["reward"],
                            "calls": [{"role": c.role, "response": c.response, "format_error": c.format_error,
                                       "reward": c.reward} for c in e.calls]} for e in eps]}
    if args.llm_judge:
        for e in eps:  # send the role prompts too: treat every call as well-formed for this check
            for c in e.calls:
                if c.format_error:
                    c.parsed, c.format_error = c.meta.get("fallback"), None
        LLMJudge(team).judge(eps, roles=True)
        calls = [c for e in eps for c in e.meta["judge_calls"]]
        report["llm_judge"] = {"calls": len(calls), "errors": sum(c["format_error"] is not None for c in calls),
                               "responses": Counter(c["response"] for c in calls).most_common(10)}
    write_json(args.out, report)
    for role, v in report["format_errors"].items():
        print(f"{role}: {v['format_errors']}/{v['calls']} format errors {v['reasons']}")
    if args.llm_judge:
        print(f"llm judge: {report['llm_judge']['errors']}/{report['llm_judge']['calls']} not YES/NO")
    print(f"{len(eps)} questions in {seconds:.1f} s; EM {report['summary']['em']} F1 {report['summary']['f1']} "
          f"LJ(rules) {report['summary']['lj']}")


if __name__ == "__main__":
    main()
