"""Stage label_judge (MAPS Algorithm 1 step 6): the trained answer agent samples `n_samples` answers per judge
candidate; all EM-correct -> "Sufficient Information", all wrong -> "Insufficient Information", mixed -> dropped.

Writes data/judge/t3_judge.jsonl (validated), metrics/label_judge.json (label balance, drop rate).
"""
from __future__ import annotations

import sys
from pathlib import Path

from ragteam.agents.maps_workflow import MapsConfig
from ragteam.config import ParamsError, load_params, parse_section
from ragteam.data.validate import Limits, ValidationFailed, check_files
from ragteam.io import DataError, atomic_dir, write_json, write_jsonl
from ragteam.llm import EnginePool, LLMConfig
from ragteam.train import synthesis
from stages.common import AGENTS, SYNTHESIS, LabelJudgeParams, Timer, load_rows

STAGE = "label_judge"
CANDIDATES = SYNTHESIS / "judge_candidates.jsonl"
OUT = Path("data/judge")
ANSWER_AGENT = AGENTS / "answer"


def run(lp: LabelJudgeParams, llm: LLMConfig, maps_cfg: MapsConfig, out: Path = OUT, engines=None) -> dict:
    timer = Timer()
    cands = load_rows(CANDIDATES, "judge candidates, stage synthesize")
    if lp.max_candidates:
        cands = cands[: lp.max_candidates]
    if not (ANSWER_AGENT / "config.json").is_file():
        raise DataError(f"{ANSWER_AGENT}: the trained answer agent is missing (stage train_answer)")
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


def main() -> None:
    try:
        params = load_params()
        lp = parse_section(params, STAGE, LabelJudgeParams)
        llm = parse_section(params, "llm", LLMConfig)
        maps_cfg = parse_section(params, "maps", MapsConfig)
        metrics = run(lp, llm, maps_cfg)
    except (ParamsError, DataError, ValueError) as e:
        extra = " (previous data/judge left untouched)" if isinstance(e, (ValidationFailed, DataError)) else ""
        sys.exit(f"{STAGE} FAILED{extra}: {e}")
    write_json(f"metrics/{STAGE}.json", metrics)
    print(f"{STAGE}: {metrics}")


if __name__ == "__main__":
    main()
