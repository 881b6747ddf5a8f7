"""Batch-width benchmark: how the HF engine's generation throughput grows with the number of prompts in one call,
side by side in one run, with ratios to the narrowest batch.

Why: `evaluate` batches one row's questions per call, so a row of 2 questions (`make smoke`) or a multi-turn
workflow's later turns (fewer questions still running) decode a batch of 1-2. On CPU a decode step of SmolLM2 is
bound by reading its weights (~0.54 GB in fp32), nearly whatever the batch, so a wider batch is almost free: this
measures how much a row-spanning batch (rows on one checkpoint generating together) would gain.

Prompts are the standard RAG baseline's (`ragteam.agents.baselines.rag_messages`, `eval.baselines` settings) over the
run's own benchmark questions and BM25 index; greedy, a fixed number of new tokens (min = max) so every width
decodes the same length. Needs a run's outputs (`make smoke` leaves one in .smoke/run):

    .venv/bin/python -m benchmarks.batch_width [--root .smoke/run] [--widths 1 2 4 8 16] [--new-tokens 48]

Writes benchmarks/results/batch_width.json and .md. Wall-clock seconds on whatever the machine is doing: the JSON
records the load average before and after.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
OUT = REPO / "benchmarks" / "results"


def prompts(root: Path, params: dict, n: int) -> list:
    from ragteam.agents.baselines import rag_messages
    from ragteam.data.formats import iter_qa
    from ragteam.retrieval.loader import open_retriever

    bench = sorted((root / "data/prepared/benchmarks").glob("*.jsonl"))
    if not bench:
        raise SystemExit(f"{root}/data/prepared/benchmarks: no benchmark file (run `make smoke` or `dvc pull`)")
    questions = [q["question"] for path in bench for q in iter_qa(path)][:n]
    questions += [f"{q} (again)" for q in questions][: n - len(questions)]   # a tiny run: each question twice
    if len(questions) < n:
        raise SystemExit(f"{root}: {len(questions)} benchmark questions, the widest batch needs {n}")
    base = params["eval"]["baselines"]
    retriever = open_retriever(root / params["eval"]["retriever"], corpus=root / "data/prepared/corpus.jsonl")
    hits = retriever.batch_search(questions, base["top_k"])
    return [rag_messages(q, h, passage_words=base["passage_words"]) for q, h in zip(questions, hits)]


def main(argv: list[str] | None = None) -> int:
    from ragteam.config import load_params, parse_section
    from ragteam.llm import LLMConfig, SamplingConfig, load_engine

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--root", type=Path, default=REPO / ".smoke" / "run", help="a run's folder")
    ap.add_argument("--widths", type=int, nargs="+", default=[1, 2, 4, 8, 16])
    ap.add_argument("--new-tokens", type=int, default=48)
    ap.add_argument("--repeats", type=int, default=3, help="timed calls per width (the median is reported)")
    args = ap.parse_args(argv)

    params = load_params(args.root / "params.yaml")
    llm = parse_section(params, "llm", LLMConfig).for_stage("evaluate").model_copy(update={"backend": "hf"})
    llm = llm.model_copy(update={"batch_size": max(args.widths)})
    load_before = os.getloadavg()
    engine = load_engine(str(args.root / llm.model), llm)
    msgs = prompts(args.root, params, max(args.widths))
    greedy = SamplingConfig(max_new_tokens=args.new_tokens, min_new_tokens=args.new_tokens, temperature=0.0)
    engine.generate(msgs[:1], greedy)                                      # warm the kernels
    rows = []
    for w in args.widths:
        times = []
        for _ in range(args.repeats):
            t = time.perf_counter()
            out = engine.generate(msgs[:w], greedy)
            times.append(time.perf_counter() - t)
        tokens = sum(len(c[0].token_ids) for c in out)
        s = statistics.median(times)
        rows.append({"width": w, "seconds": round(s, 3), "new_tokens": tokens, "tokens_per_s": round(tokens / s, 1)})
        print(rows[-1], flush=True)
    base = rows[0]["tokens_per_s"]
    for r in rows:
        r["throughput_ratio"] = round(r["tokens_per_s"] / base, 2)
    result = {"benchmark": "batch_width", "root": str(args.root), "model": llm.model, "new_tokens": args.new_tokens,
              "threads": llm.threads, "dtype": llm.dtype, "repeats": args.repeats, "rows": rows,
              "cpus": os.cpu_count(), "machine": platform.machine(),
              "load_avg_before": round(load_before[0], 2), "load_avg_after": round(os.getloadavg()[0], 2)}
    OUT.mkdir(parents=True, exist_ok=True)
    (OUT / "batch_width.json").write_text(json.dumps(result, indent=1) + "\n")
    lines = ["# HF engine throughput by batch width", "",
             f"`python -m benchmarks.batch_width --widths {' '.join(map(str, args.widths))} --new-tokens "
             f"{args.new_tokens}`: standard-RAG prompts over the run's questions, greedy, {args.new_tokens} new tokens "
             f"each, median of {args.repeats} calls, {result['cpus']} cores, load average "
             f"{result['load_avg_before']} before and {result['load_avg_after']} after.", "",
             f"| prompts in the call | seconds | new tokens | tokens/s | throughput / width {rows[0]['width']} |",
             "|---:|---:|---:|---:|---:|"]
    lines += [f"| {r['width']} | {r['seconds']:.2f} | {r['new_tokens']} | {r['tokens_per_s']:.1f} | "
              f"{r['throughput_ratio']:.2f}x |" for r in rows]
    (OUT / "batch_width.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
