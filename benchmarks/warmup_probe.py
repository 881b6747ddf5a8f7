"""Warm-up probe benchmark: the held-out rollout probe of `warmup_joint@<system>` with the HF engine's prefix cache
off and on, side by side in one run, with ratios and whether the greedy trajectories are the same.

The probe (`ragteam.warmup.sft.RolloutProbe`) runs the warm-up's held-out questions greedily through the system's
own workflow. Each system is probed with the warm-up model of the committed run (`models/warmup/<system>`), cache off
then on, `--pairs` times; the cache is `llm.prefix_cache_tokens` (the default profile's), off is 0.

Needs the outputs of `dvc repro warmup_joint` (or `dvc pull`):

    .venv/bin/python -m benchmarks.warmup_probe [--systems mask jade decor qagent] [--pairs 1]

Writes benchmarks/results/warmup_probe_cache.json and .md. Wall-clock seconds on whatever the machine is doing: the
JSON records the load average before and after.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
OUT = REPO / "benchmarks" / "results"


def probe_once(name: str, params: dict, cache: int) -> tuple[float, list[list[str]]]:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from ragteam.config import parse_section
    from ragteam.data.formats import iter_qa
    from ragteam.llm import LLMConfig
    from ragteam.retrieval import open_retriever
    from ragteam.systems.registry import oracle_system
    from ragteam.warmup.sft import RolloutProbe, WarmupParams, heldout_questions
    from ragteam.warmup.traces import read_traces
    from stages.oracle_traces import CORPUS, POOL, TRACES

    wp = parse_section(params, "warmup", WarmupParams).for_system(name)
    llm = parse_section(params, "llm", LLMConfig).for_stage(f"warmup_joint_{name}")
    system = oracle_system(name, params)
    traces = read_traces(TRACES / name / "traces.jsonl", system)
    pool = {r["id"]: r for r in iter_qa(POOL)}
    retriever = open_retriever(params["joint"]["retriever"], corpus=CORPUS)
    model = AutoModelForCausalLM.from_pretrained(REPO / "models" / "warmup" / name)
    probe = RolloutProbe(system, heldout_questions(traces, wp.heldout_questions, pool), retriever,
                         dict(llm.sampling), llm.model_copy(update={"prefix_cache_tokens": cache}), llm.model,
                         AutoTokenizer.from_pretrained(llm.model))
    t = time.perf_counter()
    episodes = probe.episodes(model)
    return time.perf_counter() - t, [[c.response for c in ep.calls] for ep in episodes]


def main(argv: list[str] | None = None) -> int:
    from ragteam.config import load_params

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--systems", nargs="+", default=["mask", "jade", "decor", "qagent"])
    ap.add_argument("--pairs", type=int, default=1)
    args = ap.parse_args(argv)
    params = load_params(REPO / "params.yaml")
    cache = int(params["llm"]["prefix_cache_tokens"])
    load_before = os.getloadavg()
    rows = []
    for name in args.systems:
        off, on, same = [], [], True
        for _ in range(args.pairs):
            t0, a = probe_once(name, params, 0)
            t1, b = probe_once(name, params, cache)
            off.append(t0), on.append(t1)
            same &= a == b
            print(f"{name}: cache off {t0:.1f} s, on {t1:.1f} s, same trajectories: {a == b}", flush=True)
        rows.append({"system": name, "off_s": [round(x, 1) for x in off], "on_s": [round(x, 1) for x in on],
                     "ratio": round(sum(off) / sum(on), 2), "same_trajectories": same})
    record = {"prefix_cache_tokens": cache, "pairs": args.pairs, "rows": rows, "machine": platform.processor()
              or platform.machine(), "cpus": os.cpu_count(), "loadavg_before": load_before,
              "loadavg_after": os.getloadavg()}
    OUT.mkdir(parents=True, exist_ok=True)
    (OUT / "warmup_probe_cache.json").write_text(json.dumps(record, indent=2) + "\n")
    lines = ["# The warm-up's rollout probe with the HF engine's prefix cache off and on",
             "", f"`python -m benchmarks.warmup_probe --pairs {args.pairs}`: each system's held-out probe on its "
             f"committed warm-up model, cache off then on (`llm.prefix_cache_tokens` {cache}), {os.cpu_count()} "
             f"cores, load average {load_before[0]:.2f} before and {record['loadavg_after'][0]:.2f} after.", "",
             "| system | cache off (s) | cache on (s) | off / on | same greedy trajectories |",
             "|---|---:|---:|---:|---|"]
    lines += [f"| {r['system']} | {', '.join(map(str, r['off_s']))} | {', '.join(map(str, r['on_s']))} | "
              f"{r['ratio']:.2f}x | {'yes' if r['same_trajectories'] else 'NO'} |" for r in rows]
    (OUT / "warmup_probe_cache.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0 if all(r["same_trajectories"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
