"""Each trained MAPS agent against its base model, alone, on held-out dev questions.

Every dev question gets one retrieval with the question as the query (top-k of the pipeline's retriever, the pool
rendered as MAPS inference renders it). Then, with greedy decoding and one batched engine call per agent and model:

- answer agent: EM / F1 / Acc of the base and the trained answer agent over that pool;
- query agent: the base and the trained query agent each propose one new query; its reward is the training reward,
  ΔF1 = F1(y_{n+1}) - F1(y_n) of the frozen trained answer agent with and without the query's chunks
  (`ragteam.train.maps.AnswerPairs`, the same code train_query scores with); reported as mean ΔF1 and the shares
  of positive / zero / negative rewards and of malformed queries;
- judge agent: the base and the trained judge decide Sufficient / Insufficient over the pool; the reference is
  whether the trained answer agent's greedy answer over that pool is correct (label_judge's metric). A greedy
  answer stands in for label_judge's 16-sample unanimity, which would cost 16x the generations; a malformed
  verdict counts as wrong. Reported as accuracy, balanced accuracy and the share of Sufficient verdicts.

This isolates each agent from the other two, on more questions than the evaluate stage. Run from a repo whose
pipeline has run (models/agents/* exist):

    .venv/bin/python experiments/agents_heldout.py --n 50 --out experiments/agents_heldout_<profile>.json
"""
from __future__ import annotations

import argparse
import json
import os
import time

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

from pathlib import Path  # noqa: E402

from ragteam.agents import maps  # noqa: E402
from ragteam.agents.maps_workflow import MapsConfig  # noqa: E402
from ragteam.config import load_params, parse_section  # noqa: E402
from ragteam.data.formats import load_qa  # noqa: E402
from ragteam.train.synthesis import sample_answers, single_retrieval_pools  # noqa: E402
from ragteam.eval.metrics import accuracy, exact_match, f1_score  # noqa: E402
from ragteam.llm import EnginePool, LLMConfig, SamplingConfig  # noqa: E402
from ragteam.retrieval import open_retriever  # noqa: E402
from ragteam.rewards.maps import delta_f1  # noqa: E402
from ragteam.train.maps import AnswerPairs  # noqa: E402

AGENTS = {"answer": "answer_agent", "query": "query_agent", "judge": "judge_agent"}


def pct(x: float, n: int) -> float:
    return round(100 * x / max(n, 1), 2)


def greedy(llm: LLMConfig, role: str) -> SamplingConfig:
    return SamplingConfig(max_new_tokens=llm.sampling[role].max_new_tokens, temperature=0.0)


def answer_scores(answers: list[str], golds: list[list[str]]) -> dict:
    n = len(answers)
    return {"em": pct(sum(exact_match(y, g) for y, g in zip(answers, golds)), n),
            "f1": pct(sum(f1_score(y, g) for y, g in zip(answers, golds)), n),
            "acc": pct(sum(accuracy(y, g) for y, g in zip(answers, golds)), n),
            "words": round(sum(len(y.split()) for y in answers) / max(n, 1), 2)}


def query_scores(texts: list[str], rows: list[dict], pools, pairs: AnswerPairs) -> dict:
    before = dict(pairs.stats)
    metas = [{"question": r["question"], "pool": p.to_dict()} for r, p in zip(rows, pools)]
    y_next, y_prev = pairs(texts, metas)
    rewards = [delta_f1(a, b, r["golden_answers"]) for a, b, r in zip(y_next, y_prev, rows)]
    n = len(rewards)
    return {"mean_delta_f1": round(100 * sum(rewards) / max(n, 1), 2),
            "positive": pct(sum(r > 0 for r in rewards), n), "zero": pct(sum(r == 0 for r in rewards), n),
            "negative": pct(sum(r < 0 for r in rewards), n),
            "malformed": pct(pairs.stats["format_errors"] - before["format_errors"], n),
            "no_new_chunks": pct(pairs.stats["no_new_chunks"] - before["no_new_chunks"], n),
            "f1_after": pct(sum(f1_score(y, r["golden_answers"]) for y, r in zip(y_next, rows)), n)}


def judge_scores(texts: list[str], reference: list[bool]) -> dict:
    verdicts = [maps.parse_judge(t) for t in texts]
    said = [v if isinstance(v, str) else None for v in verdicts]
    right = [(s == maps.SUFFICIENT) == ref if s is not None else False for s, ref in zip(said, reference)]
    pos = [r for r, ref in zip(right, reference) if ref]
    neg = [r for r, ref in zip(right, reference) if not ref]
    recalls = [sum(x) / len(x) for x in (pos, neg) if x]
    n = len(texts)
    return {"accuracy": pct(sum(right), n), "balanced_accuracy": round(100 * sum(recalls) / len(recalls), 2),
            "said_sufficient": pct(sum(s == maps.SUFFICIENT for s in said), n),
            "malformed": pct(sum(s is None for s in said), n),
            "reference_sufficient": pct(sum(reference), n)}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=50, help="questions per benchmark")
    ap.add_argument("--agents", default="answer,query,judge")
    ap.add_argument("--out", default=None, help="write the JSON result here")
    a = ap.parse_args()
    which = [x.strip() for x in a.agents.split(",") if x.strip()]
    unknown = sorted(set(which) - set(AGENTS))
    if unknown:
        raise SystemExit(f"--agents: unknown {unknown}; choose from {sorted(AGENTS)}")
    params = load_params()
    llm = parse_section(params, "llm", LLMConfig)
    mc = parse_section(params, "maps", MapsConfig)
    trained = {k: f"models/agents/{k}" for k in AGENTS}
    for k in which + ["answer"]:
        if not Path(trained[k]).is_dir():
            raise SystemExit(f"{trained[k]} is missing: run `dvc repro` first")
    retriever = open_retriever(params["eval"]["retriever"])
    engines = EnginePool(llm)
    frozen = engines.team({"answer_agent": trained["answer"]}, llm.model, {})
    pairs = AnswerPairs(frozen, retriever, mc.top_k, mc.passage_words, mc.max_chunks)
    result = {"n_per_benchmark": a.n, "retriever": params["eval"]["retriever"], "top_k": mc.top_k,
              "passage_words": mc.passage_words, "base_model": llm.model, "benchmarks": {}}
    for path in sorted(Path("data/prepared/benchmarks").glob("*.jsonl")):
        rows = load_qa(path)[: a.n]
        golds = [r["golden_answers"] for r in rows]
        pools = single_retrieval_pools(rows, retriever, mc.top_k)
        rendered = [p.render(mc.passage_words) for p in pools]
        res: dict = {"n": len(rows)}
        # the trained answer agent's greedy answers: the answer-agent row and the judge's reference
        t0 = time.perf_counter()
        trained_answers = [x[0] for x in sample_answers(frozen, "answer_agent", rows, pools,
                                                         greedy(llm, "answer_agent"), mc.passage_words)]
        trained_answer_seconds = time.perf_counter() - t0
        for agent in which:
            role = AGENTS[agent]
            res[agent] = {}
            for name, model in (("base", llm.model), ("trained", trained[agent])):
                t = time.perf_counter()
                if agent == "answer":
                    ans = trained_answers if name == "trained" else [
                        x[0] for x in sample_answers(engines.team({role: model}, llm.model, {}), role, rows, pools,
                                                     greedy(llm, role), mc.passage_words)]
                    scores = answer_scores(ans, golds)
                    scores["examples"] = list(zip(ans, golds))[:4]
                else:
                    build = maps.query_messages if agent == "query" else maps.judge_messages
                    outs = engines.team({role: model}, llm.model, {}).generate(
                        role, [build(r["question"], s) for r, s in zip(rows, rendered)], greedy(llm, role))
                    texts = [o[0].text for o in outs]
                    scores = (query_scores(texts, rows, pools, pairs) if agent == "query" else
                              judge_scores(texts, [bool(accuracy(y, g)) for y, g in zip(trained_answers, golds)]))
                    scores["examples"] = texts[:4]
                spent = time.perf_counter() - t + (trained_answer_seconds if (agent, name) == ("answer", "trained")
                                                   else 0.0)
                scores["seconds"] = round(spent, 1)
                res[agent][name] = scores
        result["benchmarks"][path.stem] = res
        print(path.stem, json.dumps({k: {m: {x: y for x, y in v.items() if x != "examples"} for m, v in d.items()}
                                     for k, d in res.items() if isinstance(d, dict)}), flush=True)
    result["answer_pair_stats"] = pairs.stats
    if a.out:
        Path(a.out).write_text(json.dumps(result, indent=2, ensure_ascii=False) + "\n")


if __name__ == "__main__":
    main()
