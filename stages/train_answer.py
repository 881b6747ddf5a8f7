"""Stage train_answer (MAPS Algorithm 1 step 3): GRPO stage 1 on top-3 samples of T1 with R_a1 (Eq. 4), then
stage 2 on top-5 samples with R_a2 (Eq. 5) from the stage-1 model (`stage1_reward: stage2` trains both stages with
Eq. 5: MAPS Figure 3's single-reward design).

Writes models/agents/answer (safetensors + model card), the curves reports/training/train_answer/ (DVCLive; + PNG) and
metrics/train_answer.json. Resumes from checkpoints/train_answer after a kill.
"""
from __future__ import annotations

from ragteam.agents.maps_workflow import MapsConfig
from ragteam.systems.maps import config as maps_config
from ragteam.config import ParamsError, parse_section
from ragteam.io import DataError
from ragteam.llm import LLMConfig
from ragteam.train.curves import summarize
from ragteam.train.maps import answer_samples, train_answer_agent
from stages.common import (AGENTS, CHECKPOINTS, JOBS, SYNTHESIS, OpenRLHFParams, TrainAnswerParams,
                                 finish_agent, load_rows, run_openrlhf, stage_main)

STAGE, AGENT = "train_answer", "answer"
T1 = SYNTHESIS / "t1_answer.jsonl"


def samples(tp: TrainAnswerParams, passage_words: int | None):
    rows = load_rows(T1, "answer-agent data T1, stage synthesize")
    s1 = answer_samples(rows, tp.stage1_top_k, passage_words, where=str(T1))
    s2 = answer_samples(rows, tp.stage2_top_k, passage_words, where=str(T1))
    for name, s, k in (("stage 1", s1, tp.stage1_top_k), ("stage 2", s2, tp.stage2_top_k)):
        if not s:
            raise DataError(f"{T1}: no top-{k} samples for {name} (synthesize.top3_fraction decides the split)")
    return s1, s2


def run(tp: TrainAnswerParams, llm: LLMConfig, maps_cfg: MapsConfig, orl: OpenRLHFParams | None = None) -> dict:
    s1, s2 = samples(tp, maps_cfg.passage_words)
    print(f"{STAGE}: stage 1 on {len(s1)} top-{tp.stage1_top_k} samples, stage 2 on {len(s2)} "
          f"top-{tp.stage2_top_k} samples, backend {tp.backend}", flush=True)
    common = {"alpha": tp.alpha, "l": tp.max_words, "min_words": tp.min_words,
              "passage_words": maps_cfg.passage_words}
    if tp.backend == "openrlhf":
        return run_openrlhf_backend(tp, llm, s1, s2, orl)
    result, curve = train_answer_agent(s1, s2, llm.model, CHECKPOINTS / STAGE, tp, engine_cfg=llm)
    # the card and metrics describe both stages: steps and seconds of stage 1 + stage 2
    st1 = result.extra["stage1"]
    result.seconds += st1["seconds"]      # this session's wall time (train time comes from the logged steps)
    result.global_step += st1["global_step"]
    if result.resumed_from is not None or st1["resumed_from"] is not None:
        # steps not run in this session: stage 1's resume point, plus all of stage 1 when stage 2 resumed
        result.resumed_from = (st1["global_step"] + result.resumed_from if result.resumed_from is not None
                               else st1["resumed_from"])
    stage1_eq = ("R_a1 = EM + α·PR + L(y) (Eq. 4)" if tp.stage1_reward == "stage1"
                 else "R_a2 = EM + α·F1 + L(y) (Eq. 5, Figure 3's single reward)")
    reward = (f"stage 1: {stage1_eq}; stage 2: R_a2 = EM + α·F1 + L(y) (Eq. 5); y = the parsed answer; "
              f"α = {tp.alpha}, l = {tp.max_words} words, min_words = {tp.min_words}, "
              f"no parseable answer -> {tp.format_penalty if tp.format_penalty is not None else 'the empty answer'}")
    metrics = finish_agent(
        result, curve, stage=STAGE, agent=AGENT, base_model=llm.model, backend=f"trl/{tp.stage1.trainer}",
        data={"t1_answer": T1}, params={**tp.model_dump(), **common}, reward=reward,
        extra_metrics={"stage1_samples": len(s1), "stage2_samples": len(s2),
                       "stage1_seconds": round(sum(r.get("step_seconds", 0.0) for r in curve
                                                   if r.get("stage") == "stage1"), 1)},
        title=f"answer agent: stage 1 (Eq. 4) steps 1-{tp.stage1.steps}, stage 2 (Eq. 5) after")
    for st in ("stage1", "stage2"):  # first/last-quarter means per stage, as for the whole curve
        per = summarize([r for r in curve if r.get("stage") == st], 0.0, 0)
        metrics.update({f"{st}_{k}": v for k, v in per.items() if k.split("_")[0] in ("reward", "em")})
    return metrics


def run_openrlhf_backend(tp: TrainAnswerParams, llm: LLMConfig, s1, s2, orl: OpenRLHFParams | None) -> dict:
    """Stage 1 then stage 2 as two Ray jobs; stage 2 starts from stage 1's HF save."""
    from transformers import AutoTokenizer

    from ragteam.train.openrlhf import prepare_answer_grpo_job

    if orl is None:
        raise ParamsError("train_answer.backend is openrlhf but params.yaml has no `openrlhf` section")
    special = AutoTokenizer.from_pretrained(llm.model).all_special_tokens
    jobs, model = [], llm.model
    for st, s, p, out in (("stage1", s1, tp.stage1, CHECKPOINTS / STAGE / "stage1_model"),
                          ("stage2", s2, tp.stage2, AGENTS / AGENT)):
        jobs.append(prepare_answer_grpo_job(s, JOBS / STAGE / st, model_path=str(model), output_dir=str(out),
                                            params=p, reward=tp.reward(st), special_tokens=special, cluster=orl))
        model = out
    run_openrlhf(jobs, STAGE, orl)
    return {"backend": "openrlhf", "stage1_samples": len(s1), "stage2_samples": len(s2)}


def from_params(params: dict) -> dict:
    tp = parse_section(params, STAGE, TrainAnswerParams)
    orl = parse_section(params, "openrlhf", OpenRLHFParams) if tp.backend == "openrlhf" else None
    return run(tp, parse_section(params, "llm", LLMConfig).for_stage(STAGE), maps_config(params),
               orl)


def main() -> None:
    stage_main(STAGE, AGENT, from_params, engines="rollouts")   # rollout_backend: vllm runs it in the worker env


if __name__ == "__main__":
    main()
