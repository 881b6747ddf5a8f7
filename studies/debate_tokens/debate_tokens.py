"""How many new tokens do the DRAG debaters need? (sizes llm.sampling.proponent / opponent.max_new_tokens)

The opponent's answer must end with `Query Expansion: [q]` (or `Concede`) after "a brief, strong argument"; a
budget that cuts the argument short cuts the query line with it, the parser then falls back to `Concede` and the
debate ends after one round. This gives both debaters the first debate round's prompt (the question's top-k BM25
passages over a mirror corpus, rendered as in synthesis) with a large budget and greedy decoding, one batched call
per role, and reports how long the answers are when the model ends them itself, where the `Query Expansion:`
line ends, and which share each budget would cut:

    .venv/bin/python studies/debate_tokens/debate_tokens.py --model models/llm --data ../shared/data \
        --out studies/debate_tokens/debate_tokens_smollm2.json
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

from pathlib import Path  # noqa: E402

from ragteam.agents import maps  # noqa: E402
from ragteam.agents.core import QueryPool  # noqa: E402
from ragteam.data.formats import load_qa  # noqa: E402
from ragteam.llm import EngineConfig, SamplingConfig, load_engine  # noqa: E402
from ragteam.retrieval.bm25 import Bm25sRetriever, build_bm25s_index  # noqa: E402

BUDGETS = (48, 128, 256, 384)


def measure(texts_tokens: list[tuple[str, int, str]], count_tokens) -> dict:
    """Per-answer facts and a summary over the answers the model ended itself (finish reason `stop`)."""
    rows = []
    for text, n, finish in texts_tokens:
        i = text.find("Query Expansion:")
        qe = None
        if i >= 0:
            end = text.find("\n", i)
            qe = count_tokens(text[: end if end >= 0 else len(text)])
        rows.append({"tokens": n, "finish": finish, "query_expansion_ends_at": qe, "concede": "Concede" in text,
                     "tail": text[-160:]})
    ended = sorted(r["tokens"] for r in rows if r["finish"] == "stop")
    return {"answers": len(rows), "ended_by_model": len(ended),
            "ended_tokens": {"median": statistics.median(ended) if ended else None, "max": max(ended, default=None)},
            "query_expansion_lines": sum(r["query_expansion_ends_at"] is not None for r in rows),
            # an answer the model did not end within the measurement's budget is cut at every budget up to it
            "cut_at_budget": {str(b): sum(r["tokens"] > b or r["finish"] == "length" for r in rows) for b in BUDGETS},
            "rows": rows}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="models/llm")
    ap.add_argument("--data", default="../shared/data", help="a mirror dir: corpus/*.jsonl, benchmarks/<name>/dev.jsonl")
    ap.add_argument("--benchmarks", nargs="+", default=["hotpotqa", "2wikimultihopqa"])
    ap.add_argument("--n", type=int, default=8, help="questions per benchmark")
    ap.add_argument("--top-k", type=int, default=3)
    ap.add_argument("--max-new-tokens", type=int, default=384)
    ap.add_argument("--out", type=Path, required=True)
    a = ap.parse_args()
    t0 = time.time()
    data = Path(a.data)
    rows = [r for b in a.benchmarks for r in load_qa(data / "benchmarks" / b / "dev.jsonl")[: a.n]]
    with tempfile.TemporaryDirectory() as tmp:
        corpus = sorted((data / "corpus").glob("*.jsonl"))[0]
        build_bm25s_index(corpus, Path(tmp) / "bm25", k1=0.9, b=0.4, show_progress=False)
        hits = Bm25sRetriever(Path(tmp) / "bm25").batch_search([r["question"] for r in rows], a.top_k)
    pools = []
    for r, h in zip(rows, hits):
        pool = QueryPool()
        pool.add(r["question"], h)
        pools.append(pool.render(None))  # whole passages, as the paper profile renders them
    engine = load_engine(a.model, EngineConfig(device="auto", threads=1, batch_size=8))
    sampling = SamplingConfig(max_new_tokens=a.max_new_tokens, temperature=0.0)

    def count_tokens(text: str) -> int:
        return len(engine.tokenizer(text, add_special_tokens=False)["input_ids"])

    out = {"model": a.model, "data": a.data, "benchmarks": a.benchmarks, "n": len(rows), "top_k": a.top_k,
           "max_new_tokens": a.max_new_tokens}
    for role, build in (("opponent", maps.opponent_messages), ("proponent", maps.proponent_messages)):
        outs = engine.generate([build(r["question"], p) for r, p in zip(rows, pools)], sampling)
        out[role] = measure([(o[0].text, o[0].completion_tokens, o[0].finish_reason) for o in outs], count_tokens)
    out["seconds"] = round(time.time() - t0, 1)
    a.out.write_text(json.dumps(out, indent=1, ensure_ascii=False) + "\n")
    for role in ("opponent", "proponent"):
        print(role, {k: v for k, v in out[role].items() if k != "rows"})


if __name__ == "__main__":
    main()
