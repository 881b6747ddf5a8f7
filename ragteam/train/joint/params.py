"""`PPOParams`: the joint trainer's hyper-parameters (`joint.<system>.ppo` in params.yaml), validated."""
from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, model_validator

from ragteam.config import Strict
from ragteam.train.common import LoraParams


class PPOParams(Strict):
    """params.yaml `joint.ppo` (shared by every joint system; `joint.<system>.ppo` overrides single keys)."""

    steps: int = Field(ge=1)                          # optimiser rounds (one rollout batch each)
    questions_per_step: int = Field(ge=1)             # episodes per rollout batch (M-ASK/JADE code: 128)
    minibatch_size: int = Field(ge=1)                 # calls per optimiser step (verl ppo_mini_batch_size)
    micro_batch_size: int = Field(4, ge=1)            # calls per forward/backward (gradient accumulation)
    ppo_epochs: int = Field(1, ge=1)
    actor_lr: float = Field(gt=0)
    critic_lr: float = Field(gt=0)                    # value head (+ the separate critic's backbone); unused by
                                                      # critic-free systems (DECOR)
    adam_betas: tuple[float, float] = (0.9, 0.999)   # AdamW (β1, β2) of every parameter group (DECOR: β2 0.95)
    lr_scheduler: Literal["constant", "linear", "cosine"] = "constant"
    warmup_steps: int = Field(0, ge=0)               # linear warm-up: step s < warmup uses (s+1)/warmup of the lr
    gamma: float = Field(1.0, ge=0, le=1)
    lam: float = Field(1.0, ge=0, le=1)
    normalize_advantages: bool = True
    clip_eps: float = Field(0.2, gt=0)                # ε (eps_low)
    clip_eps_high: float | None = Field(None, gt=0)   # None: = clip_eps (symmetric PPO)
    ratio_level: Literal["token", "sequence"] = "token"
    loss_agg: Literal["token_mean", "seq_mean_token_mean", "group_token_mean"] = "token_mean"  # pg.aggregate
    value_clip: float | None = Field(0.2, gt=0)       # None: unclipped value loss
    vf_coef: float = Field(0.5, ge=0)
    kl_coef: float = Field(0.0, ge=0)                 # 0: no reference model is loaded (M-ASK/JADE code: no KL)
    # log `kl_start`, the k3 estimate of KL(π_θ || π_start) over each step's response tokens before its update: how
    # far RL has moved the policy from where it started. With LoRA the start model is the policy with its adapters
    # off (one forward pass without gradients a step); without LoRA it is logged only where kl_coef loads a reference
    log_kl_to_start: bool = True
    max_grad_norm: float = Field(1.0, gt=0)            # clips the policy's and the critic's gradients, each apart
    # shared_backbone: let the value loss reach the policy's weights (true) or train the value head only (false)
    value_grad_to_backbone: bool = False
    max_nonfinite_grad_steps: int = Field(3, ge=1)    # skipped (NaN/inf-gradient) optimiser steps in a row that stop
    temperature: float = Field(1.0, gt=0)             # rollout sampling (and the log-prob temperature)
    top_p: float = Field(1.0, gt=0, le=1)
    critic: Literal["shared_backbone", "separate"] = "shared_backbone"
    rollout_backend: Literal["live", "vllm"] = "live"
    # truncated importance sampling of the engine's samples (pg.truncated_is_weights, cap C): with vllm rollouts the
    # engine samples from its own numerics of the policy; each token's loss term is weighted by
    # min(π_old/π_engine, C). None: no correction (the mismatch is still logged as engine_logp_abs_diff)
    rollout_is_cap: float | None = Field(None, gt=0)
    seed: int = 0
    save_steps: int = Field(1, ge=1)
    save_total_limit: int = Field(2, ge=1)
    gradient_checkpointing: bool = False
    # LoRA on the top `lora.top_layers` layers: run the frozen layers below once per sample a step and start every
    # pass (old log-probs, the reference / kl_start, each minibatch) from their output, instead of running all
    # layers in each pass. Same numbers (tests/test_train_ppo.py); off or inapplicable: every pass runs every layer
    reuse_frozen_layers: bool = True
    collapse_window: int = Field(3, ge=1)             # steps per window of the `collapsed` flag (curves.collapsed)
    collapse_drop: float = Field(0.5, gt=0, lt=1)     # "off a cliff": the last window below (1 - drop) x the best
    lora: LoraParams = LoraParams()

    @model_validator(mode="after")
    def _check(self) -> PPOParams:
        if self.micro_batch_size > self.minibatch_size:
            raise ValueError(f"micro_batch_size ({self.micro_batch_size}) > minibatch_size ({self.minibatch_size})")
        return self


class JointSystemParams(Strict):
    """`joint.<system>`: what one joint system trains on, and its overrides of `joint.ppo`."""

    max_questions: int = Field(0, ge=0)          # first n questions of the training pool; 0 = all
    ppo: dict[str, Any] = Field(default_factory=dict)


class GroupEstimatorParams(JointSystemParams):
    """`joint.<system>` of a GAE system that may train without its critic: the fields every `joint.<system>` has
    (`JointSystemParams`) and the choice of advantage estimator,
    `gae` (the paper's: a critic, one rollout per question) or `group` (this project's critic-free alternative for a
    backbone whose critic explains nothing: `group_size` rollouts of each question, a step then trains
    `questions_per_step` x `group_size` episodes)."""

    estimator: Literal["gae", "group"] = "gae"
    group_size: int = Field(1, ge=1)              # rollouts per question; >= 2 with estimator group, 1 with gae

    @model_validator(mode="after")
    def _check_group(self) -> GroupEstimatorParams:
        if self.estimator == "group" and self.group_size < 2:
            raise ValueError(f"estimator group needs group_size >= 2 (one rollout of a question has no group to "
                             f"normalise within), got {self.group_size}")
        if self.estimator == "gae" and self.group_size != 1:
            raise ValueError(f"group_size {self.group_size}: rollouts per question apply to estimator group only; "
                             "estimator gae rolls out each question once (set estimator: group, or group_size: 1)")
        return self


