"""Stage train_judge (MAPS Algorithm 1 step 7): SFT of the judge agent on the unanimity labels (T3), the loss on
the assistant turn only. Writes models/agents/judge, the curves reports/training/train_judge/ (DVCLive; + PNG),
metrics/train_judge.json. Resumes from checkpoints/train_judge after a kill.
"""
from __future__ import annotations

from collections import Counter
from pathlib import Path

from ragteam.config import ParamsError, parse_section
from ragteam.io import DataError
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
        if orl is None:
            raise ParamsError("train_judge.backend is openrlhf but params.yaml has no `openrlhf` section")
        if orl.runner == "local":
            return run_local(samples, labels, tp, llm, orl)
        from ragteam.train.openrlhf import prepare_sft_job

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


def run_local(samples: list, labels: Counter, tp: TrainJudgeParams, llm: LLMConfig, orl: OpenRLHFParams) -> dict:
    """openrlhf.runner local: `openrlhf.cli.train_sft` here, in .venv-openrlhf (one process; on the CPU where there
    is no CUDA), its model read back and saved as the TRL judge is (models/agents/judge, same card, curves and
    metrics), so the evaluation stages use it unchanged. A dry run writes the job and stops, as for Ray."""
    from ragteam.train.openrlhf_local import (OpenRLHFFailed, load_local_sft, openrlhf_versions,
                                              prepare_local_sft_job, run_local_sft)

    job_dir = JOBS / STAGE
    out = CHECKPOINTS / STAGE / "openrlhf_model"     # OpenRLHF's own save; models/agents/judge is written below
    job = prepare_local_sft_job(samples, job_dir, model_path=llm.model, output_dir=str(out), params=tp.sft)
    if orl.dry_run:
        raise DataError(f"{STAGE}: openrlhf.dry_run is true: the local job is in {job_dir} (command.sh); set "
                        f"openrlhf.dry_run false to run it")
    try:
        rows, seconds = run_local_sft(job)
    except OpenRLHFFailed as e:
        raise DataError(f"{STAGE}: local OpenRLHF SFT: {e}") from None
    result = load_local_sft(out, llm.model, log_rows=rows, seconds=seconds, samples=len(samples), dtype=llm.dtype)
    return finish_agent(
        result, curve_rows(result.log_history), stage=STAGE, agent=AGENT, base_model=llm.model,
        backend="openrlhf/sft (local, .venv-openrlhf)", data={"t3_judge": T3}, params=tp.model_dump(),
        reward="SFT, cross-entropy on the response (the assistant turn) only: OpenRLHF SFTDataset's loss mask",
        extra_metrics={"samples": len(samples), "balance": tp.balance,
                       **{f"label_{k.split()[0].lower()}": v for k, v in labels.items()}},
        session_metrics={"openrlhf_environment": openrlhf_versions()},
        title="judge agent (SFT, OpenRLHF)")


def from_params(params: dict) -> dict:
    tp = parse_section(params, STAGE, TrainJudgeParams)
    orl = parse_section(params, "openrlhf", OpenRLHFParams) if tp.backend == "openrlhf" else None
    return run(tp, parse_section(params, "llm", LLMConfig), orl)


def main() -> None:
    stage_main(STAGE, AGENT, from_params)


if __name__ == "__main__":
    main()
