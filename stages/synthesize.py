"""Stage synthesize (MAPS Algorithm 1, steps 1-4): difficulty labels, Q1/Q2 split, debate synthesis T1,
query-agent data T2 and judge candidates, each validated (GX) and summarised as DVC metrics."""
from __future__ import annotations

import sys
import time
from collections import Counter
from pathlib import Path
from typing import Literal

from pydantic import Field

from ragteam.agents.debate import DebateConfig
from ragteam.config import ParamsError, Strict, load_params, parse_section
from ragteam.data.formats import load_qa
from ragteam.data.validate import Limits, ValidationFailed, check_files
from ragteam.io import DataError, atomic_dir, write_json, write_jsonl
from ragteam.llm import EngineDead, EnginePool, LLMConfig
from ragteam.environment import run_record
from ragteam.llm.environment import ensure_engine_environment
from ragteam.records import write_episodes
from ragteam.train import synthesis

OUT = Path("data/synthesis")


class DifficultyParams(Strict):
    k: int = Field(ge=1)                      # sampled answers per question
    easy_min: int = Field(ge=0)               # correct >= easy_min -> easy
    hard_max: int = Field(ge=0)               # correct <= hard_max -> hard; else medium
    metric: Literal["em", "acc"]
    top_k: int = Field(ge=1)
    temperature: float = Field(gt=0)
    max_new_tokens: int = Field(ge=1)


class SynthesizeParams(Strict):
    retriever: str
    max_questions: int = Field(ge=0)          # first n of the training pool; 0 = all
    seed: int
    passage_words: int | None = Field(None, ge=1)
    difficulty: DifficultyParams
    answer_pool: list[Literal["easy", "medium", "hard"]]   # labels that form Q1 (answer-agent data)
    max_q1: int = Field(0, ge=0)              # debate at most the first n Q1 questions; 0 = all (paper 8,148)
    max_t2: int = Field(0, ge=0)              # T2 from at most the first n Q2 questions; 0 = all (paper 10,000)
    top3_fraction: float = Field(ge=0, le=1)  # share of Q1 debated with top-3 chunks per round (paper 6000/8148)
    max_samples_per_question: int = Field(ge=1, le=4)
    t2_top_k: int = Field(ge=1)
    judge_candidates: list[Literal["t1", "t2"]]


def run(sp: SynthesizeParams, llm: LLMConfig, debate: DebateConfig, pool_file: Path, out: Path = OUT) -> dict:
    from ragteam.retrieval import open_retriever

    t0 = time.time()
    rows = load_qa(pool_file)
    if sp.max_questions:
        rows = rows[: sp.max_questions]
    if not rows:
        raise DataError(f"{pool_file}: the training pool is empty")
    retriever = open_retriever(sp.retriever)
    team = EnginePool(llm).team({}, llm.model, llm.sampling)  # the base model plays every role
    d = sp.difficulty
    rule = synthesis.DifficultyRule(d.k, d.easy_min, d.hard_max, d.metric)
    print(f"synthesize: difficulty of {len(rows)} questions ({d.k} samples each)", flush=True)
    labelled = synthesis.label_difficulty(rows, team, retriever, rule, d.top_k, d.temperature, d.max_new_tokens,
                                          sp.passage_words, sp.seed)
    q1, q2 = synthesis.split_questions(labelled, sp.answer_pool, sp.max_q1, sp.max_t2)
    print(f"synthesize: Q1 (answer agent) {len(q1)}, Q2 (query agent) {len(q2)}; debating Q1", flush=True)
    t1, episodes = synthesis.debate_samples(q1, team, retriever, debate.model_copy(update={
        "passage_words": sp.passage_words}), round(sp.top3_fraction * len(q1)), sp.max_samples_per_question)
    t2 = synthesis.query_samples(q2, retriever, sp.t2_top_k)
    cands = ([dict(s, source=f"t1/{s['source']}") for s in t1] if "t1" in sp.judge_candidates else []) + \
            ([dict(s, source=f"t2/{s['source']}") for s in t2] if "t2" in sp.judge_candidates else [])
    with atomic_dir(out) as tmp:
        files = {"difficulty": write_jsonl(tmp / "difficulty.jsonl", labelled),
                 "t1_answer": write_jsonl(tmp / "t1_answer.jsonl", t1),
                 "t2_query": write_jsonl(tmp / "t2_query.jsonl", t2),
                 "judge_candidates": write_jsonl(tmp / "judge_candidates.jsonl", cands)}
        write_episodes(tmp / "debate_episodes.jsonl", episodes)
        check_files([(tmp / f"{name}.jsonl", "train", Limits((1 if name != "judge_candidates" else 0, 10**7)))
                     for name in files])
    return {"rows": files, "seconds": round(time.time() - t0, 1),
            "difficulty": dict(Counter(r["metadata"]["difficulty"] for r in labelled)),
            "t1_by_top_k": {str(k): v for k, v in Counter(s["top_k"] for s in t1).items()},
            "t1_by_round": {str(k): v for k, v in Counter(s["round"] for s in t1).items()},
            "t1_stop_reasons": dict(Counter(s["stop_reason"] for s in t1 if s["round"] == 0)),
            "judge_candidates_by_source": dict(Counter(c["source"] for c in cands)),
            "q1": len(q1), "q2": len(q2)}


def main() -> None:
    params = load_params()
    ensure_engine_environment("synthesize", params)
    try:
        sp = parse_section(params, "synthesize", SynthesizeParams)
        llm = parse_section(params, "llm", LLMConfig).for_stage("synthesize")
        debate = parse_section(params, "maps.debate", DebateConfig)
        metrics = run(sp, llm, debate, Path("data/prepared/train/pool.jsonl"))
    except (ParamsError, DataError, EngineDead) as e:
        extra = "" if not isinstance(e, ValidationFailed) else " (previous data/synthesis left untouched)"
        print(f"synthesize FAILED{extra}:\n{e}", file=sys.stderr)
        sys.exit(1)
    write_json("metrics/synthesize.json", {**metrics, **run_record()})
    print(f"synthesize: {metrics}")


if __name__ == "__main__":
    main()
