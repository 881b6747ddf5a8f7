"""Stage label_judge (MAPS Algorithm 1 step 6): the trained answer agent samples `n_samples` answers per judge
candidate; all EM-correct -> "Sufficient Information", all wrong -> "Insufficient Information", mixed -> dropped.

Candidates: synthesize's (data/synthesis/judge_candidates.jsonl, the first `max_candidates`), then, with
`extra_candidates: n`, single-retrieval pools (the T2 builder: `synthesize.retriever`, top `synthesize.t2_top_k`) of
the first n training-pool questions that synthesize did not use (source `extra/single_retrieval`). The judge meets
one-retrieval pools at inference; a CPU synthesis budget leaves it few of them to learn from (13 of 64 on the mirror).

Writes data/judge/t3_judge.jsonl (validated), metrics/label_judge.json (label balance, drop rate, per source).
"""
from __future__ import annotations

import sys
from pathlib import Path

from pydantic import BaseModel, Field

from ragteam.agents.maps_workflow import MapsConfig
from ragteam.systems.maps import config as maps_config
from ragteam.config import ParamsError, load_params, parse_section
from ragteam.data.formats import load_qa
from ragteam.data.validate import Limits, ValidationFailed, check_files
from ragteam.io import DataError, atomic_dir, write_jsonl, write_metrics
from ragteam.llm import EngineDead, EnginePool, LLMConfig
from ragteam.environment import run_record
from ragteam.llm.environment import ensure_engine_environment
from ragteam.train import synthesis
from stages.common import AGENTS, SYNTHESIS, LabelJudgeParams, Timer, load_rows

STAGE = "label_judge"
CANDIDATES = SYNTHESIS / "judge_candidates.jsonl"
POOL = Path("data/prepared/train/pool.jsonl")
USED = SYNTHESIS / "difficulty.jsonl"     # the training-pool questions synthesize labelled (and so may have used)
OUT = Path("data/judge")
ANSWER_AGENT = AGENTS / "answer"
EXTRA_SOURCE = "extra/single_retrieval"


class ExtraParams(BaseModel):
    """The two `synthesize` keys the extra candidates share with T2 (other keys of that section are not read)."""

    retriever: str
    t2_top_k: int = Field(ge=1)


def extra_candidates(n: int, xp: ExtraParams, pool_file: Path = POOL, used_file: Path = USED) -> list[dict]:
    """Single-retrieval pools of the first `n` training-pool questions that synthesize did not label (pool order).
    No LLM call: the retrieval alone; the labels come from the answer agent like every other candidate's."""
    from ragteam.retrieval import open_retriever

    used = {r["id"] for r in load_rows(used_file, "difficulty labels, stage synthesize")}
    if not pool_file.is_file():
        raise DataError(f"{pool_file}: missing (training pool); run stage prepare_data first (dvc repro)")
    pool = load_qa(pool_file)
    unused = [r for r in pool if r["id"] not in used]
    if len(unused) < n:
        raise DataError(f"{STAGE}.extra_candidates = {n}: only {len(unused)} of the {len(pool)} questions in "
                        f"{pool_file} were not used by synthesize ({len(used)} were; see synthesize.max_questions)")
    retriever = open_retriever(xp.retriever)
    return [dict(s, source=EXTRA_SOURCE) for s in synthesis.query_samples(unused[:n], retriever, xp.t2_top_k)]


def run(lp: LabelJudgeParams, llm: LLMConfig, maps_cfg: MapsConfig, out: Path = OUT, engines=None,
        xp: ExtraParams | None = None) -> dict:
    timer = Timer()
    cands = load_rows(CANDIDATES, "judge candidates, stage synthesize")
    if not (ANSWER_AGENT / "config.json").is_file():
        raise DataError(f"{ANSWER_AGENT}: the trained answer agent is missing (stage train_answer)")
    if lp.max_candidates:
        cands = cands[: lp.max_candidates]
    if lp.extra_candidates:
        if xp is None:
            raise ParamsError(f"{STAGE}.extra_candidates = {lp.extra_candidates} needs synthesize.retriever and "
                              "synthesize.t2_top_k")
        extra = extra_candidates(lp.extra_candidates, xp)
        print(f"{STAGE}: + {len(extra)} single-retrieval candidates of unused training-pool questions", flush=True)
        cands = cands + extra
    team = (engines or EnginePool(llm)).team({"answer_agent": str(ANSWER_AGENT)}, llm.model, llm.sampling)
    print(f"{STAGE}: {len(cands)} candidates x {lp.n_samples} samples (T={lp.temperature})", flush=True)
    rows, stats = synthesis.label_judge(cands, team, lp.n_samples, lp.temperature, lp.max_new_tokens,
                                        maps_cfg.passage_words, lp.seed, lp.metric, lp.sufficient_min,
                                        lp.insufficient_max)
    for label in (synthesis.SUFFICIENT, synthesis.INSUFFICIENT):
        if stats[label] < lp.min_per_label:
            raise DataError(f"{STAGE}: only {stats[label]} '{label}' labels out of {len(cands)} candidates "
                            f"(label_judge.min_per_label = {lp.min_per_label}): {stats}")
    with atomic_dir(out) as tmp:
        write_jsonl(tmp / "t3_judge.jsonl", rows)
        check_files([(tmp / "t3_judge.jsonl", "train", Limits((1, 10**7)))])
    by_source: dict[str, dict[str, int]] = {}
    for r in rows:
        by_source.setdefault(r.get("source", "?"), {}).setdefault(r["label"], 0)
        by_source[r.get("source", "?")][r["label"]] += 1
    return {**stats, "by_source": by_source, "seconds": timer()}


COMPARED = ("drop_rate", "sufficient_share")   # declared metrics: the labels' balance, not their counts


def main() -> None:
    try:
        params = load_params()
        ensure_engine_environment(STAGE, params)
        lp = parse_section(params, STAGE, LabelJudgeParams)
        llm = parse_section(params, "llm", LLMConfig).for_stage(STAGE)
        maps_cfg = maps_config(params)
        xp = parse_section(params, "synthesize", ExtraParams) if lp.extra_candidates else None
        metrics = run(lp, llm, maps_cfg, xp=xp)
    except (ParamsError, DataError, ValueError, EngineDead) as e:
        extra = " (previous data/judge left untouched)" if isinstance(e, (ValidationFailed, DataError)) else ""
        sys.exit(f"{STAGE} FAILED{extra}: {e}")
    write_metrics(f"metrics/{STAGE}.json", {**metrics, **run_record()}, COMPARED)
    print(f"{STAGE}: {metrics}")


if __name__ == "__main__":
    main()
