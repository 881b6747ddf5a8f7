"""What the MAPS training stages share (stage glue, not library): params sections, backends, the agent save with
card and curves, the entry point.

Paths follow one layout (dvc.yaml): agents in `models/agents/<agent>` (DVC outs, registered as artifacts),
resumable checkpoints in `checkpoints/<stage>` (NOT DVC outs: DVC would delete them before a rerun), curves in the
DVCLive directory `reports/training/<stage>` (DVC plots), TensorBoard event files in `tensorboard/<stage>` (not
versioned) and `reports/figures/<stage>.png`, metrics in `metrics/<stage>.json`.
"""
from __future__ import annotations

import sys
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, Literal

from pydantic import Field, model_validator

from ragteam.config import ParamsError, Strict, load_params
from ragteam.io import DataError, read_jsonl, write_metrics
from ragteam.llm import EngineDead
from ragteam.environment import run_record
from ragteam.llm.environment import ensure_engine_environment
from ragteam.ray_jobs import RayJobError
from ragteam.train.checkpoints import TrainResult, save_agent
from ragteam.train.curves import Panel, is_wall_clock, summarize, write_curves
from ragteam.train.grpo import GRPOParams
from ragteam.train.maps import AnswerAgentParams
from ragteam.train.model_card import model_card
from ragteam.train.openrlhf import OpenRLHFCluster, OpenRLHFJob, submit
from ragteam.train.sft import SFTParams

AGENTS = Path("models/agents")
CHECKPOINTS = Path("checkpoints")
CURVES = Path("reports/training")     # a DVCLive directory per stage
TENSORBOARD = Path("tensorboard")     # event files per stage: wall times and host names inside, so not versioned
FIGURES = Path("reports/figures")
JOBS = Path("jobs/openrlhf")
SYNTHESIS = Path("data/synthesis")

Backend = Literal["trl", "openrlhf"]


class OpenRLHFParams(OpenRLHFCluster):
    """params.yaml `openrlhf`: the cluster, and whether a stage only writes its job (dry run) or submits it."""

    dry_run: bool = True          # write jobs/openrlhf/<stage>/ and print the command; the stage then fails on purpose


class TrainAnswerParams(AnswerAgentParams):
    """params.yaml `train_answer` (Eq. 4 stage 1 on top-3 samples, Eq. 5 stage 2 on top-5 samples)."""

    backend: Backend = "trl"
    stage1_top_k: int = Field(3, ge=1)
    stage2_top_k: int = Field(5, ge=1)

    @model_validator(mode="after")
    def _clip_needs_token_ids(self) -> TrainAnswerParams:
        # OpenRLHF hands the reward decoded text only: whether a rollout was cut at the token budget is unknown there
        if self.backend == "openrlhf" and self.clipped_is_long:
            raise ValueError("clipped_is_long needs the completion token ids, which only the trl backend passes to "
                             "the reward; set clipped_is_long: false with backend: openrlhf")
        return self


class TrainQueryParams(Strict):
    """params.yaml `train_query` (Eq. 7: ΔF1 of the frozen trained answer agent)."""

    backend: Backend = "trl"
    retriever: str                      # index dir or http(s) service the sampled queries are run against
    max_samples: int = Field(0, ge=0)   # first n T2 samples; 0 = all
    grpo: GRPOParams


class LabelJudgeParams(Strict):
    """params.yaml `label_judge` (Algorithm 1 step 6: 16-sample unanimity of the trained answer agent)."""

    n_samples: int = Field(16, ge=2)
    metric: Literal["em", "acc"] = "em"   # what "correct" means (the paper: EM)
    sufficient_min: int | None = Field(None, ge=1)  # >= this many correct -> Sufficient (None = all: unanimity)
    insufficient_max: int = Field(0, ge=0)          # <= this many correct -> Insufficient (the paper: 0)
    temperature: float = Field(gt=0)
    max_new_tokens: int = Field(ge=1)
    seed: int = 0
    max_candidates: int = Field(0, ge=0)  # first n judge candidates; 0 = all
    min_per_label: int = Field(1, ge=0)   # fewer of either label fails the stage (an SFT judge needs both)
    # + single-retrieval pools (synthesize.retriever, top synthesize.t2_top_k, no LLM call) of the first n training-pool
    # questions synthesize did not use: candidates shaped like the ones the judge meets at inference; 0 = none
    extra_candidates: int = Field(0, ge=0)


class TrainJudgeParams(Strict):
    """params.yaml `train_judge` (SFT, loss on the assistant turn only)."""

    backend: Backend = "trl"
    balance: Literal["none", "oversample"] = "none"  # oversample: repeat the minority label's rows up to the majority
    sft: SFTParams


def load_rows(path: str | Path, what: str) -> list[dict]:
    """All rows of a JSONL the stage depends on; a missing or empty file names the stage that makes it."""
    p = Path(path)
    if not p.is_file():
        raise DataError(f"{p}: missing ({what}); run its producing stage first (dvc repro)")
    rows = [r for _, r in read_jsonl(p)]
    if not rows:
        raise DataError(f"{p}: no rows ({what})")
    return rows


def train_seconds(curve: Sequence[dict], fallback: float) -> float:
    """Training time of the run that made the weights: the sum of the logged step times (they survive a resume in
    the checkpointed history), else `fallback` (this session's wall time)."""
    steps = [r.get("step_seconds") for r in curve]
    return round(sum(steps), 1) if steps and all(x is not None for x in steps) else round(fallback, 1)


def finish_agent(result: TrainResult, curve: Sequence[dict], *, stage: str, agent: str, base_model: str,
                 backend: str, data: Mapping[str, str | Path], params: Mapping[str, Any], reward: str,
                 extra_metrics: Mapping[str, Any] | None = None, session_metrics: Mapping[str, Any] | None = None,
                 notes: str = "", title: str = "", panels: Sequence[Panel] | None = None) -> dict:
    """Save the agent (safetensors + tokenizer + model card) and its curves (`panels`: the PNG's layout); return the
    stage's metrics.

    The card holds what describes the weights (training metrics from the logged history, `extra_metrics`);
    wall time (`seconds`, `*_seconds`), `session_metrics` and the resume point describe a run and go to the
    returned metrics alone, so training the same model again, or a resumed no-op rerun, saves the same bytes.
    """
    total = train_seconds(curve, result.seconds)
    metrics = {**summarize(curve, total, result.global_step), **(extra_metrics or {})}
    write_curves(curve, CURVES / stage, png_path=FIGURES / f"{stage}.png", title=title or stage, panels=panels,
                 tensorboard_dir=TENSORBOARD / stage)
    card = model_card(agent=agent, base_model=base_model, backend=backend, data=data, params=params, reward=reward,
                      metrics={k: v for k, v in metrics.items() if not is_wall_clock(k)}, notes=notes)
    save_agent(result, AGENTS / agent, card)
    metrics["seconds_this_run"] = round(result.seconds, 1)
    if result.resumed_from is not None:
        metrics["resumed_from_step"] = result.resumed_from
    return {**metrics, **(session_metrics or {})}


def run_openrlhf(jobs: Sequence[OpenRLHFJob], stage: str, cfg: OpenRLHFParams) -> None:
    """Run the stage's jobs in order as Ray jobs on `openrlhf.ray_address` (each waited for, its logs shown), or
    print them and stop (dry run).

    A dry run ends the stage with an error on purpose: DVC must not record outputs that were never trained. A job
    that fails, or a cluster that does not answer, ends the stage the same way (DataError: one line naming the job,
    its status and its last log lines); a rerun does not train again a job that already succeeded.
    """
    for i, job in enumerate(jobs):
        try:
            line = submit(job, dry_run=cfg.dry_run, address=cfg.ray_address, name=f"{stage}-{i}")
        except RayJobError as e:
            raise DataError(f"{stage}: OpenRLHF job {i + 1}/{len(jobs)}: {e}") from None
        if cfg.dry_run:
            print(f"{stage}: OpenRLHF dry run, not executed: {line}", flush=True)
    if cfg.dry_run:
        raise DataError(f"{stage}: openrlhf.dry_run is true: the job files and commands are in {JOBS / stage} "
                        f"(command.sh); set openrlhf.dry_run false on the cluster head to submit them")


class Timer:
    def __init__(self) -> None:
        self.t0 = time.perf_counter()

    def __call__(self) -> float:
        return round(time.perf_counter() - self.t0, 1)


# what a training stage declares as DVC metrics (metrics/summary/<stage>.json, `ragteam.io.write_metrics`): where
# training started and ended by its own reward and scores; steps, seconds, counts and the rest stay in its record
COMPARED = {
    "train_answer": ("reward_first", "reward_last", "em_first", "em_last", "kl_last"),
    "train_query": ("reward_first", "reward_last", "delta_f1_positive_rate", "kl_last"),
    "train_judge": ("loss_last", "token_accuracy_last"),
    "train_joint": ("reward_first", "reward_last", "episode_f1_first", "episode_f1_last", "format_error_rate_first",
                    "format_error_rate_last", "explained_variance_last", "stage*/episode_f1_*",
                    "stage*/format_error_rate_*", "probe/team_reward_*", "probe/f1_*"),
}


def compared_keys(stage: str) -> tuple[str, ...]:
    """COMPARED of `stage` or of its family (`train_joint` for `train_joint_mask`)."""
    for family, keys in COMPARED.items():
        if stage == family or stage.startswith(f"{family}_"):
            return keys
    raise KeyError(f"no compared metrics for stage {stage!r}: add it to stages/common.py COMPARED")


def stage_main(stage: str, agent: str, body: Callable[[dict[str, Any]], dict[str, Any]], *,
               engines: bool | Literal["rollouts"] = False, system: str | None = None) -> None:
    """Entry point of a training stage: `body(params)` trains and returns the metrics, written to metrics/<stage>.json
    with the environment that ran it (`environment`: main or worker, Python and the engine packages' versions).

    `engines`: the stage samples from LLM engines (`llm.backend`; a joint `system`'s rollout_backend; "rollouts": only
    its GRPO rollouts', `rollout_backend`, so `llm.backend` alone does not move it), so params
    that ask for vLLM run it in the worker environment (`ensure_engine_environment`). Bad params or data end the
    process with one line naming the stage, and the agent's previous outs stay as they were (the agent is written
    atomically, last); the metrics file is written only after a successful run.
    """
    keys = compared_keys(stage)        # before training: a stage without them fails now, not after hours
    try:
        params = load_params()
        if engines:
            ensure_engine_environment(stage, params, system, rollouts_only=engines == "rollouts")
        metrics = body(params)
    except (ParamsError, DataError, ValueError, EngineDead) as e:
        sys.exit(f"{stage} FAILED ({AGENTS / agent} left untouched): {e}")
    write_metrics(f"metrics/{stage}.json", {**metrics, **run_record()}, keys)
    print(f"{stage}: {metrics}")
