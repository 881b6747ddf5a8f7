"""Stage index_bm25@<backend>: BM25 index of data/prepared/corpus.jsonl with bm25s or Lucene (Anserini).

Usage: python -m stages.index_bm25 <bm25s|lucene>. The index is built in a temp dir and swapped in only when
complete, so an interrupted run leaves the previous index (or none) and never a half-written one.
"""
from __future__ import annotations

import sys
from pathlib import Path

from ragteam.config import ParamsError, load_params, parse_section
from ragteam.environment import run_record
from ragteam.io import DataError, atomic_dir, write_json
from ragteam.retrieval.config import Bm25Params
from ragteam.timing import timed

CORPUS = Path("data/prepared/corpus.jsonl")
OUT = Path("data/indexes/bm25")


@timed("retrieval")
def run(p: Bm25Params, backend: str, corpus: Path = CORPUS, out: Path = OUT) -> dict:
    if backend not in p.backends:
        raise ParamsError(f"params.yaml: retrieval.bm25.backends {p.backends} does not include {backend!r}")
    with atomic_dir(out / backend) as tmp:
        if backend == "bm25s":
            from ragteam.retrieval.bm25 import build_bm25s_index

            stats = build_bm25s_index(corpus, tmp, k1=p.k1, b=p.b, stemmer=p.bm25s.stemmer,
                                      stopwords=p.bm25s.stopwords)
        else:
            from ragteam.retrieval.lucene import build_lucene_index

            stats = build_lucene_index(corpus, tmp, threads=p.lucene.threads, k1=p.k1, b=p.b)
    size = sum(f.stat().st_size for f in (out / backend).rglob("*") if f.is_file())
    return {"backend": backend, **stats, "index_bytes": size}


def main() -> None:
    if len(sys.argv) != 2:
        sys.exit("usage: python -m stages.index_bm25 <bm25s|lucene>")
    try:
        p = parse_section(load_params(), "retrieval.bm25", Bm25Params)
        metrics = run(p, sys.argv[1])
    except (ParamsError, DataError) as e:
        sys.exit(f"index_bm25 FAILED: {e}")
    write_json(f"metrics/index_bm25_{metrics['backend']}.json", {**metrics, **run_record()})
    print(f"index_bm25: {metrics}")


if __name__ == "__main__":
    main()
