"""Trained vs base MAPS answer agent on held-out dev questions, the answer agent alone.

Each dev question gets one retrieval with the question as the query (top-k of the pipeline's BM25 index, the
MAPS answer prompt over that pool, passages clipped to maps.passage_words); both agents answer greedily in one
batched call each. Isolates the answer agent from the query agent / judge, on more questions than the evaluate
stage's default 8. Run from a repo whose default pipeline has run:

    .venv/bin/python experiments/answer_agent_heldout.py --n 100
"""
from __future__ import annotations

import argparse
import json
import os
import time

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

from pathlib import Path  # noqa: E402

from ragteam.agents.maps_workflow import MapsConfig  # noqa: E402
from ragteam.config import load_params, parse_section  # noqa: E402
from ragteam.data.formats import load_qa  # noqa: E402
from ragteam.data.synthesis import sample_answers, single_retrieval_pools  # noqa: E402
from ragteam.eval.metrics import accuracy, exact_match, f1_score  # noqa: E402
from ragteam.llm import EnginePool, LLMConfig, SamplingConfig  # noqa: E402
from ragteam.retrieval import open_retriever  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=100, help="questions per benchmark")
    ap.add_argument("--agent", default="models/agents/answer")
    ap.add_argument("--out", default=None, help="write the JSON result here")
    a = ap.parse_args()
    params = load_params()
    llm = parse_section(params, "llm", LLMConfig)
    mc = parse_section(params, "maps", MapsConfig)
    retriever = open_retriever(params["eval"]["retriever"])
    pool = EnginePool(llm)
    greedy = SamplingConfig(max_new_tokens=llm.sampling["answer_agent"].max_new_tokens, temperature=0.0)
    result = {}
    for path in sorted(Path("data/prepared/benchmarks").glob("*.jsonl")):
        rows = load_qa(path)[: a.n]
        pools = single_retrieval_pools(rows, retriever, mc.top_k)
        res = {"n": len(rows)}
        for name, model in (("base", llm.model), ("trained", a.agent)):
            t = time.perf_counter()
            team = pool.team({"answer_agent": model}, llm.model, {})
            ans = [x[0] for x in sample_answers(team, "answer_agent", rows, pools, greedy, mc.passage_words)]
            golds = [r["golden_answers"] for r in rows]
            res[name] = {"em": round(100 * sum(exact_match(y, g) for y, g in zip(ans, golds)) / len(rows), 2),
                         "f1": round(100 * sum(f1_score(y, g) for y, g in zip(ans, golds)) / len(rows), 2),
                         "acc": round(100 * sum(accuracy(y, g) for y, g in zip(ans, golds)) / len(rows), 2),
                         "words": round(sum(len(y.split()) for y in ans) / len(rows), 2),
                         "seconds": round(time.perf_counter() - t, 1), "examples": list(zip(ans, golds))[:4]}
        result[path.stem] = res
        print(path.stem, {k: ({m: v for m, v in x.items() if m != "examples"} if isinstance(x, dict) else x)
                          for k, x in res.items()}, flush=True)
    if a.out:
        Path(a.out).write_text(json.dumps(result, indent=2, ensure_ascii=False) + "\n")


if __name__ == "__main__":
    main()
