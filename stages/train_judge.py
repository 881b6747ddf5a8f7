"""Stage train_judge (MAPS Algorithm 1 step 7): SFT of the judge agent on the unanimity labels (T3), the loss on
the assistant turn only. Writes models/agents/judge, the curves reports/training/train_judge/ (DVCLive; + PNG),
metrics/train_judge.json. Resumes from checkpoints/train_judge after a kill.
"""
from __future__ import annotations

from collections import Counter
from pathlib import Path

from ragteam.config import ParamsError, parse_section
from ragteam.llm import LLMConfig
from ragteam.train.curves import curve_rows
from ragteam.train.maps import judge_samples, oversample_labels
from ragteam.train.sft import train_sft
from stages.common import (AGENTS, CHECKPOINTS, JOBS, OpenRLHFParams, TrainJudgeParams, finish_agent,
                                 load_rows, run_openrlhf, stage_main)

STAGE, AGENT = "train_judge", "judge"
T3 = Path("data/judge/t3_judge.jsonl")


def run(tp: TrainJudgeParams, llm: LLMConfig, orl: OpenRLHFParams | None = None) -> dict:
    samples = judge_samples(load_rows(T3, "judge labels T3, stage label_judge"), where=str(T3))
    labels = Counter(s.completion for s in samples)
    if tp.balance == "oversample":
        samples = oversample_labels(samples)
    print(f"{STAGE}: SFT on {len(samples)} labelled snapshots {dict(labels)}, backend {tp.backend}", flush=True)
    if tp.backend == "openrlhf":
        from ragteam.train.openrlhf import prepare_sft_job

        if orl is None:
            raise ParamsError("train_judge.backend is openrlhf but params.yaml has no `openrlhf` section")
        job = prepare_sft_job(samples, JOBS / STAGE, model_path=llm.model, output_dir=str(AGENTS / AGENT),
                              params=tp.sft, cluster=orl)
        run_openrlhf([job], STAGE, orl)
        return {"backend": "openrlhf", "samples": len(samples)}
    result = train_sft(samples, llm.model, str(CHECKPOINTS / STAGE), tp.sft, run_tag={"agent": "judge"},
                       dtype=llm.dtype)
    return finish_agent(
        result, curve_rows(result.log_history), stage=STAGE, agent=AGENT, base_model=llm.model, backend="trl/sft",
        data={"t3_judge": T3}, params=tp.model_dump(),
        reward="SFT, cross-entropy on the assistant turn only (the unanimity label)",
        extra_metrics={"samples": result.extra["samples"], "dropped_too_long": result.extra["dropped_too_long"],
                       "balance": tp.balance,
                       **{f"label_{k.split()[0].lower()}": v for k, v in labels.items()}},
        title="judge agent (SFT)")


def from_params(params: dict) -> dict:
    tp = parse_section(params, STAGE, TrainJudgeParams)
    orl = parse_section(params, "openrlhf", OpenRLHFParams) if tp.backend == "openrlhf" else None
    return run(tp, parse_section(params, "llm", LLMConfig), orl)


def main() -> None:
    stage_main(STAGE, AGENT, from_params)


if __name__ == "__main__":
    main()
