"""GRPO on TRL (GRPOTrainer): the answer agent's two-stage reward (Eq. 4, 5) or any completion reward.

One optimiser step = `prompts_per_step` prompts x `num_generations` rollouts (the paper: 32 x 16 = train batch 512),
processed in micro-batches of `micro_batch_size` completions. The group-normalised advantage
A_i = (r_i - mean(r_group)) / std(r_group) and the clipped loss with KL coefficient `kl_beta` are TRL's.
"""
from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from typing import Any, Literal

from ragteam.metrics import exact_match
from ragteam.rewards.maps import ANSWER_REWARDS, AnswerReward
from ragteam.train.checkpoints import TrainResult, fingerprint, model_identity, prepare_resume, run_resumable
from ragteam.train.common import (GRPOParams, GRPOSample, Messages, device_args, lora_config, model_params,
                                  trl_lm_head_labelled_only, validate_samples)


def completion_text(completion: str | Messages) -> str:
    """TRL hands conversational completions as [{"role": "assistant", "content": ...}]; plain ones as str."""
    if isinstance(completion, str):
        return completion.strip()
    return "".join(m.get("content", "") for m in completion).strip()


def answer_reward_func(reward: AnswerReward, clip_tokens: int | None = None,
                       eos_token_ids: Sequence[int] = ()) -> Callable[..., list[float]]:
    """The TRL reward callable for the answer agent: `reward` (Eq. 4 or Eq. 5 on the parsed answer) per completion.

    TRL passes the dataset's `golden_answers` column (aligned with the completions) as a kwarg. EM, words and the
    share of clipped and answer-less outputs are logged next to TRL's `reward`. `clip_tokens`
    (= max_completion_length; None = off): a completion that used all of them without ending was cut off, its real
    length is unknown, so L(y) = -1 as for an over-long answer. Without it, short generation budgets let a policy
    earn the length term with answers that never end. A completion whose last id is an EOS of `eos_token_ids` ended
    on its own, even in the budget's last slot (the completion ids hold the EOS; TRL's own truncation test is the
    same: `ids[-1] not in eos_and_pad`).
    """
    eos = frozenset(eos_token_ids)

    def reward_func(completions: list, golden_answers: list[list[str]], log_metric=None, completion_ids=None,
                    **_: Any) -> list[float]:
        texts = [completion_text(c) for c in completions]
        clipped = [False] * len(texts)
        if clip_tokens is not None and completion_ids is not None:
            clipped = [len(ids) >= clip_tokens and (not ids or ids[-1] not in eos) for ids in completion_ids]
        scored = [reward(t, g, c) for t, g, c in zip(texts, golden_answers, clipped)]
        ys = [y for _, y in scored]
        if log_metric is not None:
            n = max(len(ys), 1)
            log_metric("em", sum(exact_match(y, g) for y, g in zip(ys, golden_answers)) / n)
            log_metric("words", sum(len(y.split()) for y in ys) / n)
            log_metric("clipped", sum(clipped) / n)
            log_metric("no_answer", sum(not y for y in ys) / n)
        return [r for r, _ in scored]

    reward_func.__name__ = ANSWER_REWARDS[reward.equation].__name__  # TRL logs rewards/<__name__>/mean
    return reward_func


def grpo_config(params: GRPOParams, ckpt_dir: str, **overrides: Any):
    """GRPOParams -> trl.GRPOConfig (one generation round of P x G completions per optimiser step)."""
    from trl import GRPOConfig

    total = params.prompts_per_step * params.num_generations
    kw = dict(
        output_dir=str(ckpt_dir), max_steps=params.steps, learning_rate=params.lr,
        lr_scheduler_type=params.lr_scheduler, per_device_train_batch_size=params.micro_batch_size,
        gradient_accumulation_steps=total // params.micro_batch_size, num_generations=params.num_generations,
        beta=params.kl_beta, temperature=params.temperature, max_completion_length=params.max_completion_length,
        seed=params.seed, data_seed=params.seed, save_strategy="steps", save_steps=params.save_steps,
        save_total_limit=params.save_total_limit, logging_steps=1, report_to="none",
        gradient_checkpointing=params.gradient_checkpointing, use_vllm=params.use_vllm,
        vllm_gpu_memory_utilization=params.vllm_gpu_memory_utilization, disable_tqdm=False,
        **device_args(),
    )
    kw.update(overrides)
    return GRPOConfig(**kw)


def train_grpo(
    samples: Sequence[GRPOSample | dict],
    model_path: str,
    ckpt_dir: str,
    params: GRPOParams,
    reward_funcs: Callable | list[Callable],
    *,
    run_tag: dict[str, Any] | None = None,
    callbacks: list | None = None,
    engine_cfg=None,
) -> TrainResult:
    """Run GRPO on `samples` from `model_path`, checkpointing under `ckpt_dir` and resuming from its last checkpoint.

    `run_tag` (e.g. reward name, α, l) goes into the checkpoint fingerprint with the params, data and base model,
    so changing any of them restarts rather than resumes. Extra dataset columns reach the reward as kwargs.
    `params.trainer == "shared_prefix"` runs the same GRPO in `ragteam.train.grpo_prefix` instead of TRL, its
    groups sampled by the policy or (`rollout_backend: vllm`) by a vLLM engine started with `engine_cfg`.
    """
    if params.trainer == "shared_prefix":
        from ragteam.train.grpo_prefix import train_grpo_shared_prefix

        return train_grpo_shared_prefix(samples, model_path, ckpt_dir, params, reward_funcs, run_tag=run_tag,
                                        callbacks=callbacks, engine_cfg=engine_cfg)
    from datasets import Dataset
    from trl import GRPOTrainer

    trl_lm_head_labelled_only()   # the loss covers the completions: the LM head projects only their positions
    rows = validate_samples(samples)
    # meta travels as JSON (Arrow wants one schema); rewards that need it decode it (see maps.query_reward_func)
    data = [{"prompt": s.prompt, "golden_answers": s.golden_answers, "id": s.id,
             "meta": json.dumps(s.meta, sort_keys=True)} for s in rows]
    fp = fingerprint(kind="grpo", params=model_params(params), model=model_identity(model_path), data=data,
                     tag=run_tag or {})
    resume = prepare_resume(ckpt_dir, fp)
    trainer = GRPOTrainer(
        model=str(model_path), reward_funcs=reward_funcs, args=grpo_config(params, ckpt_dir),
        train_dataset=Dataset.from_list(data), callbacks=callbacks,
        peft_config=lora_config(params.lora, str(model_path)) if params.lora.enabled else None,
    )
    history, step, seconds = run_resumable(trainer, resume)
    return TrainResult(model=trainer.model, tokenizer=trainer.processing_class, log_history=history,
                       global_step=step, seconds=seconds,
                       resumed_from=int(resume.rsplit("-", 1)[1]) if resume else None, extra={"fingerprint": fp})
