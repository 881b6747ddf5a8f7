"""SFT on TRL (SFTTrainer) with the loss on the assistant turn only: the MAPS judge agent (Section 3.4).

Samples are conversational prompt-completion pairs: `prompt` = chat messages, `completion` = the assistant text.
TRL tokenises prompt and prompt+completion with the chat template and masks every prompt token (`labels = -100`),
so the loss covers the assistant content and its end-of-turn token only (`completion_only_loss=True`). This works
with any chat template; TRL's other route, `assistant_only_loss`, needs `{% generation %}` markers that
SmolLM2's template lacks.
"""
from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from ragteam.config import Strict
from ragteam.train.checkpoints import TrainResult, fingerprint, model_identity, prepare_resume, run_resumable
from ragteam.train.common import (LoraParams, Messages, device_args, lora_config, model_params, precision_tag,
                                  trl_lm_head_labelled_only, validate_samples)


class SFTParams(Strict):
    """One SFT run (params.yaml: e.g. `train_judge.sft`)."""

    steps: int = Field(-1, ge=-1)                     # optimiser steps; -1 = `epochs` passes over the data
    epochs: float = Field(1.0, gt=0)
    batch_size: int = Field(ge=1)                     # sequences per forward/backward
    grad_accum: int = Field(1, ge=1)
    lr: float = Field(gt=0)
    lr_scheduler: Literal["constant", "linear", "cosine"] = "linear"
    max_length: int = Field(ge=8)                     # tokens; longer prompt+answer samples are dropped (counted)
    seed: int = 0
    save_steps: int = Field(ge=1)
    save_total_limit: int = Field(2, ge=1)
    gradient_checkpointing: bool = False
    lora: LoraParams = LoraParams()


class SFTSample(BaseModel):
    model_config = ConfigDict(extra="forbid")
    id: str
    prompt: Messages = Field(min_length=1)
    completion: str = Field(min_length=1)
    meta: dict[str, Any] = Field(default_factory=dict)


def sft_rows(samples: Sequence[SFTSample | dict], tokenizer, max_length: int) -> tuple[list[dict], list[str]]:
    """Samples -> TRL conversational prompt-completion rows, and the ids dropped for exceeding `max_length`.

    Over-long samples are dropped rather than truncated: TRL cuts at the end, which would cut the answer.
    """
    rows, dropped = [], []
    for s in validate_samples(samples, SFTSample):
        completion = [{"role": "assistant", "content": s.completion}]
        n = len(tokenizer.apply_chat_template(s.prompt + completion, tokenize=True, return_dict=True)["input_ids"])
        if n > max_length:
            dropped.append(s.id)
        else:
            rows.append({"prompt": s.prompt, "completion": completion, "id": s.id})
    if not rows:
        raise ValueError(f"all {len(dropped)} SFT samples are longer than max_length={max_length} tokens")
    return rows, dropped


def sft_trainer(rows: list[dict], model_path: str, ckpt_dir: str, params: SFTParams, callbacks: list | None = None,
                dtype: str = "float32"):
    """The configured SFTTrainer (its `train_dataset` holds input_ids / labels, prompt tokens at -100); `dtype` is
    the compute precision (`llm.dtype`: bfloat16 trains under bf16 autocast, also on the CPU)."""
    from datasets import Dataset
    from trl import SFTConfig, SFTTrainer

    trl_lm_head_labelled_only()   # the loss covers the completion: the LM head projects only its positions
    cfg = SFTConfig(
        output_dir=str(ckpt_dir), max_steps=params.steps, num_train_epochs=params.epochs,
        per_device_train_batch_size=params.batch_size, gradient_accumulation_steps=params.grad_accum,
        learning_rate=params.lr, lr_scheduler_type=params.lr_scheduler, max_length=params.max_length,
        completion_only_loss=True, seed=params.seed, data_seed=params.seed, save_strategy="steps",
        save_steps=params.save_steps, save_total_limit=params.save_total_limit, logging_steps=1, report_to="none",
        gradient_checkpointing=params.gradient_checkpointing, **device_args(dtype),
    )
    return SFTTrainer(model=str(model_path), args=cfg, train_dataset=Dataset.from_list(rows),
                      callbacks=callbacks,
                      peft_config=lora_config(params.lora, str(model_path)) if params.lora.enabled else None)


def train_sft(samples: Sequence[SFTSample | dict], model_path: str, ckpt_dir: str, params: SFTParams, *,
              run_tag: dict[str, Any] | None = None, callbacks: list | None = None,
              dtype: str = "float32") -> TrainResult:
    """SFT from `model_path`, checkpointing under `ckpt_dir` and resuming from its last checkpoint."""
    from transformers import AutoTokenizer

    rows, dropped = sft_rows(samples, AutoTokenizer.from_pretrained(model_path), params.max_length)
    fp = fingerprint(kind="sft", params=model_params(params), model=model_identity(model_path), data=rows,
                     tag=run_tag or {}, **precision_tag(dtype))
    resume = prepare_resume(ckpt_dir, fp)
    trainer = sft_trainer(rows, model_path, ckpt_dir, params, callbacks, dtype)
    history, step, seconds = run_resumable(trainer, resume)
    return TrainResult(model=trainer.model, tokenizer=trainer.processing_class, log_history=history,
                       global_step=step, seconds=seconds,
                       resumed_from=int(resume.rsplit("-", 1)[1]) if resume else None,
                       extra={"samples": len(rows), "dropped_too_long": len(dropped), "fingerprint": fp})
