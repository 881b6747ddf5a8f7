"""Stage eval_retrieval: recall@k of supporting titles and of answer strings, per retriever and benchmark.

Reads every data/prepared/benchmarks/*.jsonl and the indexes built by index_bm25 / index_dense; writes the DVC
metrics file metrics/retrieval.json as {retriever: {benchmark: {metric@k: value}}}, and metrics/eval_retrieval.json,
the run's own record: which retrievers and benchmarks, the seconds, and the environment that ran it (the retrieval
libraries' versions, for `ragteam lineage`), kept out of the retriever-keyed record that its readers iterate.
"""
from __future__ import annotations

import sys
import time
from pathlib import Path

from ragteam.config import ParamsError, load_params, parse_section
from ragteam.data.formats import load_qa
from ragteam.environment import run_record
from ragteam.io import DataError, write_json, write_metrics
from ragteam.retrieval.config import RetrievalParams

BENCHMARKS = Path("data/prepared/benchmarks")
BM25 = Path("data/indexes/bm25")
DENSE = Path("data/indexes/dense")
METRICS = Path("metrics/retrieval.json")
RUN = Path("metrics/eval_retrieval.json")


def open_configured(p: RetrievalParams, name: str, cache: dict):
    """The retriever `name` of retrieval.eval.retrievers, opened once and shared (RRF reuses BM25 + dense)."""
    from ragteam.retrieval import open_retriever
    from ragteam.retrieval.fusion import RRFRetriever

    if name not in cache:
        if name in ("bm25s", "lucene"):
            cache[name] = open_retriever(BM25 / name, threads=p.bm25.lucene.threads)
        elif name == "dense":
            d = p.dense
            cache[name] = open_retriever(DENSE, device=None if d.device == "auto" else d.device, fp16=d.fp16,
                                         batch_size=d.batch_size, ef_search=d.faiss.ef_search,
                                         nprobe=d.faiss.nprobe)
        else:
            parts = [open_configured(p, p.rrf.bm25_backend, cache), open_configured(p, "dense", cache)]
            cache[name] = RRFRetriever(parts, rrf_k=p.rrf.k, depth=p.rrf.depth)
    return cache[name]


def run(p: RetrievalParams, benchmarks: Path = BENCHMARKS) -> dict:
    from ragteam.retrieval.quality import retrieval_quality

    files = sorted(benchmarks.glob("*.jsonl"))
    if not files:
        raise DataError(f"{benchmarks}: no benchmark files")
    qa = {f.stem: load_qa(f) for f in files}
    if p.eval.max_questions:
        qa = {n: rows[: p.eval.max_questions] for n, rows in qa.items()}
    cache: dict = {}
    out: dict = {}
    for name in p.eval.retrievers:
        r = open_configured(p, name, cache)
        out[name] = {}
        for bench, rows in qa.items():
            t0 = time.perf_counter()
            m = retrieval_quality(r, rows, ks=p.eval.ks, show_progress=True)
            m["seconds"] = round(time.perf_counter() - t0, 2)
            out[name][bench] = m
    return out


def markdown_table(metrics: dict, ks: list[int]) -> str:
    cols = [f"support_recall@{k}" for k in ks] + [f"answer_recall@{k}" for k in ks]
    lines = ["| retriever | benchmark | n | " + " | ".join(c.replace("_recall", "") for c in cols) + " |",
             "|---|---|---:|" + "---:|" * len(cols)]
    for r, benches in metrics.items():
        for b, m in benches.items():
            vals = [f"{m[c]:.3f}" if c in m else "–" for c in cols]
            lines.append(f"| {r} | {b} | {m['n']} | " + " | ".join(vals) + " |")
    return "\n".join(lines)


# declared metrics: recall@5 of answers and of supporting passages per retriever and benchmark
COMPARED = ("*.*.answer_recall@5", "*.*.support_recall@5")


def main() -> None:
    try:
        p = parse_section(load_params(), "retrieval", RetrievalParams)
        metrics = run(p)
    except (ParamsError, DataError, ValueError) as e:
        sys.exit(f"eval_retrieval FAILED: {e}")
    write_metrics(METRICS, metrics, COMPARED)
    benches = sorted({b for per in metrics.values() for b in per})
    seconds = round(sum(m.get("seconds", 0.0) for per in metrics.values() for m in per.values()), 2)
    write_json(RUN, {"retrievers": list(metrics), "benchmarks": benches, "seconds": seconds,
                     **run_record()})
    print(markdown_table(metrics, p.eval.ks))


if __name__ == "__main__":
    main()
