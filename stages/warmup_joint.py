"""Stage warmup_joint@<system> (issue 25 §2): the format warm-up of a joint system's shared policy, SFT (LoRA, loss
on each role's output tokens only) on its oracle traces, stopped once the held-out format error rate is below
`warmup.format_threshold` (`warmup.probe: rollout`: the share of held-out questions whose trajectory through the
system's own workflow has a malformed call; `rows`: the mean over roles of held-out trace rows; `warmup.stop_when:
every_role`: every role's rate as well) or at `warmup.sft.steps`
(`ragteam.warmup.sft`); `warmup.systems.<system>` overrides keys for one system. train_joint@<system> starts from it.

Usage: python -m stages.warmup_joint <system> (dvc.yaml: `foreach: ${joint.systems}`). Writes models/warmup/<system>
(LoRA merged, safetensors + model card), the curves reports/training/warmup_joint_<system>/ (DVCLive; + PNG) and
metrics/warmup_joint_<system>.json (held-out format error rate at the first probe and after, per role; before, when
the start model is probed). With `warmup.enabled`
false (the paper profile) it trains nothing and the dir holds only `warmup_off.json`: the system starts from
llm.model. Checkpoints live in checkpoints/warmup_joint_<system>: a killed run, rerun, resumes.
"""
from __future__ import annotations

import sys
from typing import Any

from ragteam.config import ParamsError, load_params, parse_section
from ragteam.io import DataError, atomic_dir, write_json, write_metrics
from ragteam.llm import LLMConfig
from ragteam.environment import run_record
from ragteam.train.checkpoints import save_agent
from ragteam.train.curves import curve_rows, is_wall_clock, summarize, write_curves
from ragteam.train.model_card import model_card
from ragteam.systems.warmup import WarmupSection
from ragteam.warmup.sft import train_warmup
from ragteam.warmup.start import WARMUP_DIR, WARMUP_OFF
from stages.common import CHECKPOINTS, CURVES, FIGURES, TENSORBOARD, train_seconds
from stages.oracle_traces import CORPUS, POOL, TRACES


def curve(history: list[dict]) -> list[dict]:
    """One row per step: the trainer's loss rows joined with the probe's format error rates (probe steps only)."""
    rows = {r["step"]: r for r in curve_rows(history)}
    for h in history:
        if "format_error_rate" in h:
            rows.setdefault(int(h["step"]), {"step": int(h["step"])}).update(
                {k: v for k, v in h.items() if k.startswith(("format_error", "no_answer"))})
    return [rows[s] for s in sorted(rows)]


def run(system_name: str, params: dict) -> dict[str, Any]:
    from ragteam.systems.registry import oracle_system
    from ragteam.warmup.traces import read_traces

    wp = parse_section(params, "warmup", WarmupSection).for_system(system_name)
    out = WARMUP_DIR / system_name
    if not wp.enabled:
        with atomic_dir(out) as tmp:
            write_json(tmp / WARMUP_OFF, {"enabled": False, "system": system_name})
        print(f"warmup_joint@{system_name}: warmup.enabled is false: train_joint starts from llm.model", flush=True)
        return {"enabled": False}
    llm = parse_section(params, "llm", LLMConfig).for_stage(f"warmup_joint_{system_name}")
    system = oracle_system(system_name, params)
    path = TRACES / system_name / "traces.jsonl"
    if not path.is_file():
        raise DataError(f"{path}: missing; run stage oracle_traces@{system_name} first (dvc repro)")
    traces = read_traces(path, system)
    pool, retriever = None, None
    if wp.probe == "rollout":     # the held-out questions through the workflow, searching what the rollouts search
        from ragteam.data.formats import iter_qa
        from ragteam.retrieval import open_retriever

        for need in (POOL, CORPUS):
            if not need.exists():
                raise DataError(f"{need}: missing; run stage prepare_data first (dvc repro)")
        pool = {r["id"]: r for r in iter_qa(POOL)}
        retriever = open_retriever(params["joint"]["retriever"], corpus=CORPUS)
    stage = f"warmup_joint_{system_name}"
    print(f"{stage}: SFT on the oracle traces of {len({r['question_id'] for r in traces})} questions "
          f"({len(traces)} rows), at most {wp.rows_per_role} per role, until the held-out format error rate is below "
          f"{wp.format_threshold} ("
          + ("questions with a malformed call through the workflow" if wp.probe == "rollout" else "mean over rows' roles")
          + (", and every role" if wp.stop_when == "every_role" else "") + ") or "
          f"{wp.sft.steps} steps", flush=True)
    result = train_warmup(system, traces, llm.model, str(CHECKPOINTS / stage), wp, dict(llm.sampling), llm,
                          run_tag={"system": system_name}, pool=pool, retriever=retriever)
    rows = curve(result.log_history)
    probes = [r for r in rows if "format_error_rate" in r]
    # the logged step times (probes included) survive in the checkpointed history: a rerun that only reloads the
    # finished warm-up reports the time that made the weights, like every training stage
    metrics: dict[str, Any] = {**summarize(rows, train_seconds(rows, result.seconds), result.global_step),
                               "enabled": True,
                               "stopped_by": result.extra["stopped_by"], "samples": result.extra["samples"],
                               "dropped_too_long": result.extra["dropped_too_long"],
                               "probe": result.extra["probe"], "probe_rows": result.extra["probe_rows"],
                               "probe_questions": result.extra["probe_questions"]}
    if probes:
        if probes[0]["step"] == 0:            # warmup.probe_at_start: the start model's own rate
            metrics["format_error_rate_before"] = probes[0]["format_error_rate"]
        metrics["first_probe_step"] = probes[0]["step"]
        metrics["format_error_rate_first_probe"] = probes[0]["format_error_rate"]
        metrics["format_error_rate_after"] = probes[-1]["format_error_rate"]
        metrics.update({f"{k}_after": v for k, v in probes[-1].items()
                        if k.startswith("format_error/") or k == "no_answer_rate"})
    write_curves(rows, CURVES / stage, png_path=FIGURES / f"{stage}.png", tensorboard_dir=TENSORBOARD / stage,
                 title=f"{system_name}: format warm-up (SFT on oracle traces)",
                 panels=["loss", ("held-out format error rate", [k for k in probes[-1]
                                                                if k.startswith(("format_error", "no_answer"))]
                                  if probes else [])])
    card = model_card(
        agent=f"{system_name}-warmup", base_model=llm.model, backend="trl/sft (format warm-up)",
        data={"oracle_traces": path}, params=wp.model_dump(),
        reward="SFT, cross-entropy on each role's output tokens (oracle traces), stopped by the held-out format "
               "error rate",
        metrics={k: v for k, v in metrics.items() if not is_wall_clock(k)},
        notes=(f"Rows per role: {result.extra['rows_per_role']}. "
               + (f"The held-out probe answers the traces' last {wp.heldout_questions} questions greedily through "
                  f"the system's own workflow and counts the questions with a malformed call. "
                  if wp.probe == "rollout" else
                  f"The held-out probe answers {result.extra['probe_rows']} rows of the traces' last "
                  f"{wp.heldout_questions} questions greedily and parses them with each role's own parser. ")
               + f"train_joint@{system_name} starts from these weights."))
    save_agent(result, out, card)
    metrics["seconds_this_run"] = round(result.seconds, 1)
    return metrics


# declared metrics (metrics/summary/warmup_joint_<system>.json): the held-out format error rate the warm-up stopped
# at, and its SFT loss and token accuracy at the end
COMPARED = ("format_error_rate_after", "loss_last", "token_accuracy_last")


def main() -> None:
    if len(sys.argv) != 2:
        sys.exit("usage: python -m stages.warmup_joint <system>   (a name in joint.systems)")
    name = sys.argv[1]
    stage = f"warmup_joint_{name}"
    try:
        metrics = run(name, load_params())
    except (ParamsError, DataError, ValueError) as e:
        sys.exit(f"{stage} FAILED ({WARMUP_DIR / name} left untouched): {e}")
    write_metrics(f"metrics/{stage}.json", {**metrics, **run_record()}, COMPARED)
    print(f"{stage}: {metrics}", flush=True)


if __name__ == "__main__":
    main()
