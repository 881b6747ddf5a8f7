"""Joint multi-agent policy gradient on one shared backbone: PPO with a critic (M-ASK §3.3 + Algorithm 1, JADE §3.4
+ Algorithm 2) and critic-free group estimators (DECOR §4.4) on the same loop and the same loss.

Every role of a system is the same policy π_θ with a different system prompt; every AgentCall of a batch of
Episodes is one PPO sample, roles mixed. One training step, top to bottom:

 1. rollout   `questions_per_step` questions through the system's workflow in training mode, through the Engine
              interface (`ragteam.llm.policy`): `rollout_backend: live` generates with the policy being trained
              (transformers, CPU or CUDA; always in sync), `vllm` with a vLLM engine handed the current LoRA
              adapter or full weights every step (no restart);
 2. reward    the system's reward function writes `AgentCall.reward` (nothing is re-shaped here);
 3. samples   each call -> the prompt ids and sampled response ids the engine recorded on it (token in, token
              out; `tokenize_call`); the loss mask covers the response;
 4. old pass  one no-grad pass: log π_old and the critic's values (at the token before each response token: the
              last prompt token for the first), plus log π_ref when kl_coef > 0. With LoRA on the top layers only,
              the frozen layers below run here once per sample and every later pass of the step (π_ref, each
              minibatch) starts from their output (`reuse_frozen_layers`, `frozen_split`);
 5. advantages by the system's estimator: by default GAE with the critic, every call's reward on its last response
              token, within each call or over each episode's flattened call sequence as the system says
              (`JointSystem.gae_scope`; `ragteam.train.advantages.episode_gae`; γ = λ = 1 in the official M-ASK /
              JADE code), whitened over the batch; or the system's own `JointSystem.advantage`
              (DECOR: Eq. 6 per role within each question's group), one scalar per call broadcast to its tokens,
              with no critic. A system may first `select` the groups that train (DECOR's dynamic sampling); a
              step that keeps too few rolls out further questions, DAPO's way (`_select_with_refill`), and a
              step left with no loss token logs `skipped_update` and makes no optimiser step;
 6. update    `ppo_epochs` passes over role-mixed minibatches of `minibatch_size` calls: token-level clipped policy
              loss + vf_coef · clipped value loss (+ kl_coef · k3 KL) (`ragteam.train.pg`); the policy's and the
              critic's gradients are clipped each to its own norm (verl clips actor and critic apart); a minibatch
              whose gradient holds a NaN or inf makes no optimiser step (`nonfinite_grad_steps`);
 7. log + checkpoint (resume through `ragteam.train.checkpoints`); a non-finite loss, or `max_nonfinite_grad_steps`
              skipped optimiser steps in a row, stop training with the last good checkpoint kept.

The critic is a value head (a linear layer) on the policy's own last hidden states (`critic: shared_backbone`) or
on a second copy of the base model with its own adapters (`separate`, verl's layout: M-ASK's critic is initialised
from the same instruct model). On the shared backbone the head reads the hidden states detached, so the value loss
trains the head only and never the policy's weights (unless `value_grad_to_backbone`): a value loss of 10+ against
a policy loss of 0.3 would otherwise decide the shared update. Trainable weights are float32 whatever the engine
dtype: LoRA adapters and the value head always; with full fine-tuning in bfloat16/float16 the model is loaded in
float32 (master weights) and its forward runs under autocast, since bf16 weights round a 1e-7 step to nothing.
With several processes (`accelerate launch`), each process rolls out its share of the questions and gradients are
averaged by accelerate's data-parallel wrapper.

A system plugs in through `JointSystem` (which workflow to roll out, which reward annotates, optionally which
advantage estimator, which episodes train, which roles stay frozen): see `ragteam.train.systems`. The estimator is
the part that differs per system: GAE with a critic (M-ASK, JADE; the default), `"group"` (QAgent's multi-turn
GRPO: `ragteam.train.advantages.group_normalized` over `Sample.group`, no critic) or a function of the episodes
(DECOR's Eq. 6). `samples` lets a system tokenise its episodes itself (QAgent: one sample = one whole trajectory
whose `Sample.mask` zeroes the environment's tokens); by default every call of a trained role is one sample.
"""
from __future__ import annotations

import logging
import math
import random
import statistics
import time
import warnings
from collections import defaultdict
from collections.abc import Callable, Collection, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any, Literal

from pydantic import Field, model_validator

from ragteam.config import ParamsError, Strict
from ragteam.eval.metrics import f1_score
from ragteam.llm import EngineConfig, SamplingConfig, Team
from ragteam.llm.policy import Rollouts, policy_engine
from ragteam.records import AgentCall, Episode
from ragteam.train.advantages import Scope
from ragteam.train.checkpoints import TrainingDiverged  # noqa: F401  (callers catch it from here)
from ragteam.train.checkpoints import (TrainResult, checkpoint_steps, diverged, fingerprint, load_train_state,
                                      model_identity, prepare_resume, save_train_state)
from ragteam.train.common import LoraParams, cpu_bf16, lora_config, model_params, precision_tag

log = logging.getLogger(__name__)


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


@dataclass(frozen=True)
class JointSystem:
    """What a joint system adds to the trainer: its roles, a training-mode rollout and its reward.

    Episodes may hold any number of calls, different from episode to episode (a JADE question answered in one round
    has two calls, a decomposed one a dozen): every call is a sample and GAE runs over each episode's own calls,
    within each call or across them as `gae_scope` says.
    `stats`: the system's own per-episode figures (e.g. JADE's rounds, retrievals, decomposition share), each
    averaged over a step's episodes into the step log under its name; a name also in the generic log (`turns`,
    `searches`) replaces the generic value."""

    name: str
    roles: tuple[str, ...]                                     # the trained roles: their calls are the samples
    rollout: Callable[[Sequence[dict], Team], list[Episode]]   # questions -> Episodes (training mode)
    annotate: Callable[[list[Episode]], list[Episode]]         # fills AgentCall.reward on every trained call
    describe: dict[str, Any]                                   # what goes into the fingerprint and the card
    stats: Mapping[str, Callable[[Episode], float]] = field(default_factory=dict)
    # None: GAE with the critic (M-ASK, JADE). "group": (r - mean) / std within each Sample.group (QAgent), no
    # critic. A function: episodes -> one advantage per call (aligned with Episode.calls; None for a call that
    # does not train), broadcast to the call's tokens (DECOR Eq. 6); no critic is built
    advantage: Callable[[list[Episode]], list[list[float | None]]] | Literal["group"] | None = None
    # (tokenizer, episodes) -> samples; None: one sample per call of a trained role
    samples: Callable[[Any, Sequence[Episode]], list[Sample]] | None = None
    # which rewarded episodes train this step (DECOR's dynamic sampling): whole groups (Episode.question_id) are
    # kept or dropped; None: all. With a `select`, a step that keeps fewer than its questions' groups rolls out
    # further questions, up to `max_rollout_rounds` rollouts per step, the first included (DAPO's
    # max_num_gen_batches; 1: no refill); see `_select_with_refill`
    select: Callable[[list[Episode]], list[Episode]] | None = None
    max_rollout_rounds: int = 1
    # helper roles that are never trained: role -> checkpoint, None = the base model of the policy (its LoRA
    # adapter switched off; a second copy without LoRA). Their calls are generated but are no samples.
    frozen_roles: dict[str, str | None] = field(default_factory=dict)
    # PPOParams values the estimator needs (DECOR: the sequence-level ratio); a mismatch is an error naming the key
    requires: dict[str, Any] = field(default_factory=dict)
    # GAE systems (advantage None) must say where their rewards sit: "call" when every call carries its own reward
    # (GAE within the call: its return is its reward), "episode" when the reward sits on the terminal call and must
    # reach the earlier calls through the critic. A property of the reward, so a system's, never a param
    gae_scope: Scope | None = None

    def __post_init__(self):
        if self.advantage is None and self.gae_scope not in ("call", "episode"):
            raise ValueError(f"joint system {self.name!r}: GAE with a critic needs gae_scope 'call' or 'episode', "
                             f"not {self.gae_scope!r}")

    @property
    def critic(self) -> bool:
        return self.advantage is None


# ---- 3. samples: one per AgentCall ---------------------------------------------------------------------------

@dataclass
class Sample:
    episode: int
    call: int
    role: str
    prompt_ids: list[int]
    response_ids: list[int]
    reward: float
    group: Any = None            # advantage="group": samples of one group are normalised together
    mask: list[int] | None = None  # loss mask over response_ids (0 = injected by the environment); None: all 1
    # filled by the no-grad pass and GAE (one value per response token)
    old_logp: Any = None
    ref_logp: Any = None
    engine_logp: Any = None      # the rollout engine's log-prob of each response id (vLLM); None: the engine said none
    values: Any = None
    advantages: Any = None
    returns: Any = None
    # the frozen layers' output over prompt + response (reuse_frozen_layers; set in step 4, dropped after step 6)
    hidden: Any = None


def loss_tokens(s: Sample) -> int:
    """How many of a sample's response tokens the loss counts."""
    return len(s.response_ids) if s.mask is None else sum(s.mask)


def tokenize_call(tok, call: AgentCall) -> tuple[list[int], list[int]]:
    """(prompt ids, response ids) of a call: the ids the engine recorded (token in, token out).

    The loss must score the tokens the policy sampled: re-tokenising the decoded text can merge or split tokens at
    tags and stop strings (a sampled `<` `/` `search` `>` re-encodes as `</` `search` `>`) and train on a sequence
    the policy never sampled, the drift verl, SkyRL and rLLM users reported and fixed by keeping the sampled ids.
    So a call carrying `prompt_ids` / `response_ids` (every call a workflow makes through `llm_step` on a real
    engine) is scored on them as they are (EOS or the stop string's tokens included where sampled).
    A call without them (hand-made in tests, a scripted engine, a call read back from JSONL, which does not keep
    ids) is re-tokenised: the chat template of its messages with the generation prompt, and its response text
    followed by EOS when generation stopped there (finish_reason "stop"); an empty response is EOS."""
    if call.prompt_ids and call.response_ids:
        return list(call.prompt_ids), list(call.response_ids)
    prompt = tok.apply_chat_template(call.prompt, add_generation_prompt=True, tokenize=False)
    prompt_ids = tok(prompt, add_special_tokens=False).input_ids
    response_ids = tok(call.response, add_special_tokens=False).input_ids
    if call.finish_reason != "length" or not response_ids:
        response_ids = response_ids + [tok.eos_token_id]
    return prompt_ids, response_ids


def episode_samples(tok, episodes: Sequence[Episode], roles: Sequence[str] | None = None) -> list[Sample]:
    """One Sample per call of the trained `roles` (None: every call); calls of frozen helper roles are skipped."""
    out = []
    for ei, ep in enumerate(episodes):
        for ci, c in enumerate(ep.calls):
            if roles is not None and c.role not in roles:
                continue
            if c.reward is None:
                raise ValueError(f"episode {ep.episode_id} call {ci} ({c.role}) has no reward: the system's reward "
                                 f"function must annotate every call")
            p, r = tokenize_call(tok, c)
            # the engine's log-probs belong to its own ids only (a re-tokenised call has none that align)
            elp = (list(c.logprobs) if c.response_ids and c.logprobs and len(c.logprobs) == len(r) else None)
            out.append(Sample(ei, ci, c.role, p, r, float(c.reward), engine_logp=elp))
    return out


# ---- the actor and the critic --------------------------------------------------------------------------------

def _parts(model):
    """(decoder, lm_head) of a causal LM, through a peft wrapper (whose LoRA layers live inside the base model)."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    return base.get_decoder(), base.get_output_embeddings()


@contextmanager
def _layer_view(decoder, start: int, stop: int | None, final_norm: bool):
    """The decoder with only its layers [start:stop] (and without its final norm unless `final_norm`) for the time
    of the block: its own forward then computes the causal mask and the rotary positions as always, over fewer
    layers. Layers [0:k] from `input_ids` give the hidden states that layers [k:] continue from as `inputs_embeds`."""
    import torch

    layers, norm = decoder.layers, decoder.norm
    decoder.layers = torch.nn.ModuleList(list(layers)[start:stop])
    if not final_norm:
        decoder.norm = torch.nn.Identity()
    try:
        yield decoder
    finally:
        decoder.layers, decoder.norm = layers, norm


def frozen_split(model, p: PPOParams) -> tuple[int | None, str]:
    """(k, why): the policy's layers [0:k] are frozen and their output can be reused across a step's passes, or
    (None, the reason it cannot). Needs LoRA on the top `lora.top_layers` layers only, no gradient checkpointing,
    nothing trainable in the embeddings or layers [0:k], and a decoder whose forward, split at k, gives the same
    hidden states as in one piece: checked on a short right-padded batch, so an architecture that treats
    `inputs_embeds` differently from its own embeddings (Gemma scales them) falls back to the full forward."""
    import torch

    if not p.reuse_frozen_layers:
        return None, "reuse_frozen_layers is off"
    if not p.lora.enabled or p.lora.top_layers is None:
        return None, "no LoRA on the top layers only: every layer trains"
    if p.gradient_checkpointing:
        return None, "gradient checkpointing recomputes the layers anyway"
    decoder, _ = _parts(model)
    n = len(decoder.layers)
    k = n - p.lora.top_layers
    if k <= 0:
        return None, f"LoRA covers all {n} layers"
    frozen = [decoder.get_input_embeddings(), *list(decoder.layers)[:k]]
    if any(t.requires_grad for m in frozen for t in m.parameters()):
        return None, f"a parameter of the embeddings or of layers 0-{k - 1} is trainable"
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(0, decoder.get_input_embeddings().num_embeddings, (2, 12), generator=g)
    att = torch.ones_like(ids)
    att[1, 7:] = 0
    dev = next(decoder.parameters()).device
    ids, att = ids.to(dev), att.to(dev)
    with torch.no_grad():
        whole = decoder(input_ids=ids, attention_mask=att).last_hidden_state
        with _layer_view(decoder, 0, k, final_norm=False):
            h = decoder(input_ids=ids, attention_mask=att).last_hidden_state
        with _layer_view(decoder, k, None, final_norm=True):
            split = decoder(inputs_embeds=h, attention_mask=att).last_hidden_state
    keep = att.bool()
    if split.shape != whole.shape or not torch.allclose(split[keep].float(), whole[keep].float(), rtol=1e-4,
                                                        atol=1e-4):
        return None, f"{type(decoder).__name__} split at layer {k} does not reproduce its own forward"
    return k, f"layers 0-{k - 1} frozen, run once per sample a step"


def _build_actor_critic(model_path: str, p: PPOParams, device: str, dtype, with_critic: bool = True):
    """The policy (+ the separate critic's backbone) and the value head, with every trainable weight in float32.

    `dtype` is the compute precision (the engine's). With LoRA the frozen base stays in `dtype` and peft keeps the
    adapters in float32 (`autocast_adapter_dtype`); with full fine-tuning in bf16/fp16 the backbone is loaded in float32
    (the optimiser's master weights) and `forward` (and `autocast()` around the rollout) computes in `dtype`: AdamW on
    bf16 weights rounds an update of lr 2e-7 (M-ASK's actor) to zero, so the weights would never move."""
    import torch
    from transformers import AutoModelForCausalLM

    upcast = not p.lora.enabled and dtype != torch.float32     # full fine-tuning below fp32: fp32 master weights
    load_dtype = torch.float32 if upcast else dtype

    def backbone():
        m = AutoModelForCausalLM.from_pretrained(model_path, dtype=load_dtype)
        if p.lora.enabled:
            from peft import get_peft_model

            m = get_peft_model(m, lora_config(p.lora, model_path), autocast_adapter_dtype=True)
        return m

    class ActorCritic(torch.nn.Module):
        """log π(response tokens) and V at the token before each response token, in one forward pass."""

        def __init__(self):
            super().__init__()
            self.policy = backbone()
            hidden = self.policy.config.get_text_config().hidden_size
            self.critic = backbone() if with_critic and p.critic == "separate" else None
            self.value_head = torch.nn.Linear(hidden, 1, dtype=torch.float32)
            torch.nn.init.zeros_(self.value_head.weight)
            torch.nn.init.zeros_(self.value_head.bias)
            if not with_critic:                 # critic-free estimators: the head is never trained nor read
                self.value_head.requires_grad_(False)
            if p.gradient_checkpointing:
                for m in (self.policy, self.critic):
                    if m is not None:
                        m.gradient_checkpointing_enable()
                        if p.lora.enabled:
                            m.enable_input_require_grads()
            self.split, why = frozen_split(self.policy, p)
            log.info("reuse of the frozen layers' output across a step's passes: %s (%s)",
                     "on" if self.split is not None else "off", why)

        def autocast(self):
            """Compute in the engine dtype over float32 master weights (a no-op unless they were upcast)."""
            return torch.autocast(torch.device(device).type, dtype=dtype, enabled=upcast)

        def hidden(self, input_ids, attention_mask):
            """The frozen layers' output (layers [0:split]), without gradients: what `forward(hidden=...)` and
            the separate critic (the same frozen base weights) continue from."""
            decoder, _ = _parts(self.policy)
            with torch.no_grad(), self.autocast(), _layer_view(decoder, 0, self.split, final_norm=False):
                return decoder(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state

        def _decode(self, model, input_ids, attention_mask, hidden):
            decoder, _ = _parts(model)
            if hidden is None:
                return decoder(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state
            with _layer_view(decoder, self.split, None, final_norm=True):
                return decoder(inputs_embeds=hidden, attention_mask=attention_mask).last_hidden_state

        def forward(self, input_ids, attention_mask, positions, targets, temperature: float = 1.0,
                    values: bool = True, hidden=None):
            """`hidden`: `self.hidden(input_ids, attention_mask)`, computed once and reused; None: all layers."""
            with self.autocast():
                _, head = _parts(self.policy)
                h = self._decode(self.policy, input_ids, attention_mask, hidden)
                idx = positions[..., None].expand(-1, -1, h.shape[-1])
                hs = h.gather(1, idx)                                                   # (B, R, H)
                logits = head(hs).float() / temperature
                logp = torch.log_softmax(logits, -1).gather(-1, targets[..., None]).squeeze(-1)
                if not values:
                    return logp, None
                if self.critic is not None:
                    hc = self._decode(self.critic, input_ids, attention_mask, hidden).gather(1, idx)
                else:
                    # the value loss trains the head, not the policy's weights (unless value_grad_to_backbone)
                    hc = hs if p.value_grad_to_backbone else hs.detach()
            v = self.value_head(hc.float()).squeeze(-1)
            return logp, v

    return ActorCritic().to(device)


def is_critic_param(name: str) -> bool:
    """Whether a parameter of the ActorCritic (or of its data-parallel wrapper, "module.") belongs to the critic:
    the value head or the separate critic's backbone; everything else trainable is the policy's."""
    return name.removeprefix("module.").startswith(("value_head.", "critic."))


def actor_critic_params(model) -> tuple[list, list]:
    """(policy, critic) trainable parameters: the optimiser's two groups and the two gradient norms."""
    named = [(n, t) for n, t in model.named_parameters() if t.requires_grad]
    return [t for n, t in named if not is_critic_param(n)], [t for n, t in named if is_critic_param(n)]


def make_optimizer(ac, p: PPOParams):
    """AdamW with the policy at actor_lr and the critic at critic_lr (no weight decay: verl's default for both)."""
    import torch

    actor, critic = actor_critic_params(ac)
    groups = [{"params": actor, "lr": p.actor_lr}]
    if critic:
        groups.append({"params": critic, "lr": p.critic_lr})
    return torch.optim.AdamW(groups, betas=p.adam_betas, weight_decay=0.0)


def _collate(samples: Sequence[Sample], pad_id: int, device: str):
    """Right-padded prompt+response ids; positions[b, j] = the token before response token j; mask on responses."""
    import torch

    width = max(len(s.prompt_ids) + len(s.response_ids) for s in samples)
    rlen = max(len(s.response_ids) for s in samples)
    ids = torch.full((len(samples), width), pad_id, dtype=torch.long)
    att = torch.zeros((len(samples), width), dtype=torch.long)
    pos = torch.zeros((len(samples), rlen), dtype=torch.long)
    tgt = torch.full((len(samples), rlen), pad_id, dtype=torch.long)
    mask = torch.zeros((len(samples), rlen))
    for b, s in enumerate(samples):
        seq = s.prompt_ids + s.response_ids
        ids[b, :len(seq)] = torch.tensor(seq)
        att[b, :len(seq)] = 1
        n, lp = len(s.response_ids), len(s.prompt_ids)
        pos[b, :n] = torch.arange(lp - 1, lp - 1 + n)
        tgt[b, :n] = torch.tensor(s.response_ids)
        mask[b, :n] = 1 if s.mask is None else torch.tensor(s.mask, dtype=mask.dtype)
    return ids.to(device), att.to(device), pos.to(device), tgt.to(device), mask.to(device)


def _stack_hidden(samples: Sequence[Sample], width: int, device: str):
    """The samples' frozen-layer outputs (`Sample.hidden`), right-padded with zeros to `width` tokens as `_collate`
    pads their ids (padding is masked out, and causal attention never lets a real token see it); None when the
    samples carry none."""
    import torch

    if any(s.hidden is None for s in samples):
        return None
    h0 = samples[0].hidden
    out = torch.zeros((len(samples), width, h0.shape[-1]), dtype=h0.dtype, device=device)
    for b, s in enumerate(samples):
        out[b, :s.hidden.shape[0]] = s.hidden.to(device)
    return out


def _stack(rows: Sequence[Any], rlen: int, device: str):
    """Per-sample 1-D tensors, right-padded with zeros to `rlen`."""
    import torch

    out = torch.zeros((len(rows), rlen), device=device)
    for b, r in enumerate(rows):
        out[b, :r.shape[0]] = r.to(device)
    return out


# ---- checkpoints ---------------------------------------------------------------------------------------------

def _trainable_state(ac) -> dict:
    return {n: t.detach().cpu().clone() for n, t in ac.named_parameters() if t.requires_grad}


# ---- the loop ------------------------------------------------------------------------------------------------

def _schedule(name: str, steps: int, warmup: int = 0) -> Callable[[int], float]:
    """The lr factor at (0-based) step s: linear warm-up over `warmup` steps, then `name` over the rest."""
    rest = max(steps - warmup, 1)
    if name == "constant":
        after = lambda s: 1.0  # noqa: E731
    elif name == "linear":
        after = lambda s: max(0.0, 1.0 - s / rest)  # noqa: E731
    else:
        after = lambda s: 0.5 * (1.0 + math.cos(math.pi * min(s, rest) / rest))  # noqa: E731
    return lambda s: (s + 1) / warmup if s < warmup else after(s - warmup)


def _questions(rows: Sequence[dict], step: int, n: int, seed: int) -> list[dict]:
    """The step's questions: a seeded permutation per epoch, so a resumed run sees the same order."""
    epoch, pos = divmod(step * n, len(rows))
    order = list(range(len(rows)))
    random.Random(f"{seed}:{epoch}").shuffle(order)
    return [rows[order[(pos + k) % len(order)]] for k in range(n)]


def _refill_order(n_rows: int, step: int, seed: int) -> list[int]:
    """The order in which step `step` draws refill questions: a permutation seeded by (seed, step) alone, apart
    from the epoch order of `_questions`, so a refill never moves a later step's questions and a resumed run
    draws the same refills for the same rollout outcomes."""
    order = list(range(n_rows))
    random.Random(f"{seed}:refill:{step}").shuffle(order)
    return order


def _select_with_refill(system: JointSystem, rows: Sequence[dict], questions: Sequence[dict],
                        episodes: list[Episode], team: Team, step: int, seed: int, shard: tuple[int, int] = (0, 1)
                        ) -> tuple[list[Episode], list[Episode], dict[str, float]]:
    """Step 3's selection with DAPO's refill (dynamic sampling, DAPO Sec. 3.2 and verl's recipe/dapo trainer):
    while the kept groups are fewer than the step's questions and fewer than `system.max_rollout_rounds` rollouts
    have run, roll out and annotate as many further questions as groups are missing, the next ones of
    `_refill_order` not drawn yet this step (this process's `shard` of it, as for `_questions`), and select again.
    Then train on the first `len(questions)` kept groups in draw order (DAPO trims its batch the same way); when
    the cap is hit with fewer, train on those (DAPO raises instead: a long run should not die on a hard batch).

    Returns (every episode rolled out this step, the episodes that train, the step log's selection counts:
    `groups` rolled out, `groups_kept` by `select`, `groups_dropped`, `groups_refilled` (rolled out after the
    first round), `groups_trained`, `episodes_trained`, `rollout_rounds`). Groups are `Episode.question_id`."""
    def groups(eps: Sequence[Episode]) -> list[str]:
        return list(dict.fromkeys(ep.question_id for ep in eps))

    target = len(questions)
    kept = system.select(episodes) if system.select is not None else list(episodes)
    drawn = {r["id"] for r in questions}
    pending = iter(_refill_order(len(rows), step, seed)[shard[0]::shard[1]])
    rounds, refilled = 1, 0
    while system.select is not None and len(groups(kept)) < target and rounds < system.max_rollout_rounds:
        more: list[dict] = []
        for i in pending:
            if rows[i]["id"] not in drawn:
                drawn.add(rows[i]["id"])
                more.append(rows[i])
                if len(more) == target - len(groups(kept)):
                    break
        if not more:        # every question of the pool was drawn this step
            break
        new = system.annotate(system.rollout(more, team))
        episodes = episodes + new
        kept = kept + system.select(new)
        rounds, refilled = rounds + 1, refilled + len(more)
    trained = set(groups(kept)[:target])
    chosen = [ep for ep in kept if ep.question_id in trained]
    n_groups, n_kept = len(groups(episodes)), len(groups(kept))
    return episodes, chosen, {"groups": float(n_groups), "groups_kept": float(n_kept),
                              "groups_dropped": float(n_groups - n_kept), "groups_refilled": float(refilled),
                              "groups_trained": float(len(trained)), "episodes_trained": float(len(chosen)),
                              "rollout_rounds": float(rounds)}


def single_pass(p: PPOParams, n_samples: int) -> bool:
    """One forward pass per step suffices when the update is a single on-policy optimiser step: one PPO epoch, one
    minibatch holding every sample, no reference model."""
    return p.ppo_epochs == 1 and p.minibatch_size >= n_samples and p.kl_coef == 0


def assign_advantages(samples: Sequence[Sample], p: PPOParams, scope: Scope, whiten: bool | None = None) -> None:
    """Step 5: per-token advantages and returns of every sample, from its reward and the critic's values.

    The samples are grouped by episode (each episode with its own number of calls), kept in call order, and GAE runs
    within each call (`scope="call"`) or over the episode's flattened call sequence (`"episode"`); the scope is the
    system's (`JointSystem.gae_scope`). Then, with `normalize_advantages`, the advantages are whitened over every
    response token of the batch (`whiten`: None follows the param; the trainer whitens itself, after logging the
    raw magnitude)."""
    from ragteam.train.advantages import episode_gae

    by_ep: dict[int, list[Sample]] = defaultdict(list)
    for s in samples:
        by_ep[s.episode].append(s)
    for ss in by_ep.values():
        ss.sort(key=lambda s: s.call)
        for s, (a, r) in zip(ss, episode_gae([s.reward for s in ss], [s.values for s in ss], p.gamma, p.lam,
                                             scope=scope)):
            s.advantages, s.returns = a, r
    if p.normalize_advantages if whiten is None else whiten:
        whiten_advantages(samples)


def advantage_abs(samples: Sequence[Sample]) -> float:
    """Mean |advantage| over the response tokens the loss counts (the `advantage_abs` curves): 0 means no signal."""
    total, n = 0.0, 0
    for s in samples:
        if s.advantages is None:
            continue
        a = [abs(float(x)) for x in s.advantages]
        m = s.mask if s.mask is not None else [1] * len(a)
        total += sum(x for x, k in zip(a, m) if k)
        n += sum(1 for k in m if k)
    return total / n if n else 0.0


def whiten_advantages(samples: Sequence[Sample]) -> None:
    """Whiten the advantages over every response token of the batch (zero mean, unit variance)."""
    import torch

    from ragteam.train.pg import masked_whiten

    flat = torch.cat([s.advantages for s in samples])
    flat = masked_whiten(flat, torch.ones_like(flat))
    pos = 0
    for s in samples:
        s.advantages = flat[pos:pos + len(s.response_ids)]
        pos += len(s.response_ids)


def ppo_update(model, opt, samples: Sequence[Sample], p: PPOParams, pad_id: int, device: str, step: int = 0, *,
               ref_available: bool = False, backward: Callable | None = None, clip: Callable | None = None,
               ckpt_dir: Path | None = None, name: str = "joint", first_pass: list | None = None,
               critic: bool = True) -> dict[str, list[float]]:
    """`ppo_epochs` passes over role-mixed minibatches of `minibatch_size` samples (accumulated over micro-batches),
    one optimiser step per minibatch: clipped policy loss + vf_coef · value loss (+ kl_coef · KL to the reference).
    The samples carry old log-probs, advantages and (with a `critic`) values and returns; without one there is no
    value loss. Returns the per-micro-batch statistics, and per optimiser step the policy's and the critic's gradient
    norms (`grad_norm/policy`, `grad_norm/critic`, before clipping) and `nonfinite_grad` (1: skipped).

    Gradients: the policy's parameters and the critic's (value head, separate critic) are clipped each to
    `max_grad_norm` on its own (verl clips actor and critic in their own workers), so a large value loss cannot scale
    the policy's update down; a minibatch whose gradient holds a NaN or inf makes no optimiser step (the caller counts
    such steps in a row against `max_nonfinite_grad_steps`).

    `first_pass` (the on-policy single pass, see `single_pass`): the (log-probs, values) of every micro-batch in
    sample order, computed with gradients when the old log-probs were taken; they are used instead of a second
    forward pass. Same update: before the first optimiser step π_θ = π_old, so ratio = 1 and nothing is clipped.

    `critic=False` (group-normalised advantages): no value loss. `loss_agg="group_token_mean"` (QAgent Eq. 3): each
    token weighs 1 / (groups in the minibatch × its group's loss tokens in the minibatch), policy and KL terms alike,
    so the summed micro-batch losses are the minibatch's mean over groups of each group's token-summed loss."""
    import torch

    from ragteam.train.pg import (aggregate, group_token_weights, kl_k3, policy_loss, truncated_is_weights,
                                  value_loss)

    backward = backward or (lambda loss: loss.backward())
    clip = clip or torch.nn.utils.clip_grad_norm_
    model.train()
    stats: dict[str, list[float]] = defaultdict(list)
    rng = random.Random(f"{p.seed}:update:{step}")
    actor_params, critic_params = actor_critic_params(model)
    for _epoch in range(p.ppo_epochs):
        order = list(range(len(samples)))
        if first_pass is None:
            rng.shuffle(order)
        for m0 in range(0, len(order), p.minibatch_size):
            mb = [samples[i] for i in order[m0:m0 + p.minibatch_size]]
            n_tok = sum(loss_tokens(s) for s in mb)
            by_group = p.loss_agg == "group_token_mean"
            row_w = group_token_weights([loss_tokens(s) for s in mb], [s.group for s in mb]) if by_group else None
            mb_policy = 0.0
            opt.zero_grad(set_to_none=True)
            for u0 in range(0, len(mb), p.micro_batch_size):
                micro = mb[u0:u0 + p.micro_batch_size]
                batch = _collate(micro, pad_id, device)
                mask, rlen = batch[4], batch[4].shape[1]
                tw = (torch.tensor(row_w[u0:u0 + len(micro)], device=device)[:, None].expand_as(mask)
                      if by_group else None)
                logp, v = (first_pass[u0 // p.micro_batch_size] if first_pass
                           else model(*batch[:4], p.temperature, values=critic,
                                      hidden=_stack_hidden(micro, batch[0].shape[1], device)))
                old_logp = _stack([s.old_logp for s in micro], rlen, device)
                adv = _stack([s.advantages for s in micro], rlen, device)
                isw = None
                if p.rollout_is_cap is not None and all(s.engine_logp is not None for s in micro):
                    isw = truncated_is_weights(old_logp, _stack([torch.tensor(s.engine_logp) for s in micro], rlen,
                                                                device), mask, p.rollout_is_cap)
                    stats["is_weight_mean"].append(float((isw * mask).sum() / mask.sum().clamp(min=1)))
                pl, pst = policy_loss(logp, old_logp, adv, mask, eps_low=p.clip_eps, eps_high=p.clip_eps_high,
                                      ratio_level=p.ratio_level, agg=p.loss_agg, token_weights=tw, is_weights=isw)
                loss, vl, vst = pl, None, {}
                if critic:
                    ret = _stack([s.returns for s in micro], rlen, device)
                    old_v = _stack([s.values for s in micro], rlen, device)
                    vl, vst = value_loss(v, old_v, ret, mask, p.value_clip, p.loss_agg)
                    loss = pl + p.vf_coef * vl
                if p.kl_coef > 0 and ref_available:
                    kl = kl_k3(logp, _stack([s.ref_logp for s in micro], rlen, device))
                    kl_mean = (aggregate(kl, mask, p.loss_agg, tw) if by_group
                               else (kl * mask).sum() / mask.sum().clamp(min=1))
                    loss = loss + p.kl_coef * kl_mean
                    stats["kl_ref"].append(float(kl_mean.detach()))
                if not torch.isfinite(loss):     # broken data (a NaN reward), not a passing overflow: stop at once
                    raise diverged(name, f"non-finite loss at step {step + 1} (policy {float(pl.detach())}, value "
                                         f"{float(vl.detach()) if vl is not None else 'none'})", ckpt_dir)
                if by_group:       # already normalised over the minibatch (the token weights)
                    weight = 1.0
                elif p.loss_agg == "token_mean":
                    weight = sum(loss_tokens(s) for s in micro) / max(n_tok, 1)
                else:
                    weight = len(micro) / len(mb)
                backward(loss * weight)
                if by_group:       # a micro-batch holds a share of the sum: log the minibatch's whole loss
                    mb_policy += float(pl.detach())
                else:
                    stats["policy_loss"].append(float(pl.detach()))
                if vl is not None:
                    stats["value_loss"].append(float(vl.detach()))
                for k, x in {**pst, **vst}.items():
                    stats[k].append(x)
            if by_group:
                stats["policy_loss"].append(mb_policy)
            # each norm is taken before its clipping: finite iff each of its gradients is
            norms = {"policy": float(clip(actor_params, p.max_grad_norm))}
            if critic_params and critic:
                norms["critic"] = float(clip(critic_params, p.max_grad_norm))
            for k, g in norms.items():
                stats[f"grad_norm/{k}"].append(g)
            if all(math.isfinite(g) for g in norms.values()):
                opt.step()
                stats["nonfinite_grad"].append(0.0)
            else:                                # a NaN/inf would be written into the weights: skip this step
                opt.zero_grad(set_to_none=True)
                stats["nonfinite_grad"].append(1.0)
                log.warning("%s step %d: non-finite gradient (%s): optimiser step skipped", name, step + 1,
                            ", ".join(f"{k} norm {g}" for k, g in norms.items()))
    return stats


def _update(system: JointSystem, p: PPOParams, samples: list[Sample], episodes: Sequence[Episode], ac, ac_wrapped,
            opt, accel, ref_logp: Callable, pad_id: int, device: str, step: int, ckpt_dir: Path
            ) -> dict[str, list[float]]:
    """Steps 4-6 on the samples that train: old log-probs (and values, reference log-probs), the system's
    advantages, the clipped update."""
    import torch

    from ragteam.train.pg import kl_k3

    # 4. old log-probs, values (and reference log-probs). With one PPO epoch over one minibatch the update is
    #    on-policy: this pass keeps its gradients and the update reuses it (one forward pass instead of two)
    single = single_pass(p, len(samples))
    first_pass = [] if single else None
    ac.train(single)
    # the start model's log-probs: the KL term's reference (kl_coef > 0), and the `kl_start` curve
    with_ref = p.kl_coef > 0 or (p.log_kl_to_start and p.lora.enabled)
    kl_sum, kl_tokens = 0.0, 0.0
    with torch.set_grad_enabled(single):
        for i in range(0, len(samples), p.micro_batch_size):
            chunk = samples[i:i + p.micro_batch_size]
            batch = _collate(chunk, pad_id, device)
            # the frozen layers run once here; this pass, the reference's and every minibatch's continue from them
            hidden = ac.hidden(*batch[:2]) if ac.split is not None else None
            logp, v = (ac_wrapped if single else ac)(*batch[:4], p.temperature, values=system.critic, hidden=hidden)
            if single:
                first_pass.append((logp, v))
            with torch.no_grad():
                rl = ref_logp(batch, hidden) if with_ref else None
                if rl is not None:
                    mask = batch[4]
                    kl_sum += float((kl_k3(logp.detach(), rl) * mask).sum())
                    kl_tokens += float(mask.sum())
            for b, s in enumerate(chunk):
                n = len(s.response_ids)
                s.old_logp = logp[b, :n].detach().cpu()
                s.values = v[b, :n].detach().cpu() if v is not None else None
                s.ref_logp = rl[b, :n].cpu() if rl is not None and p.kl_coef > 0 else None
                if hidden is not None and not single:      # the single pass never runs the model again
                    s.hidden = hidden[b, :len(s.prompt_ids) + n]
    mismatch = engine_mismatch(samples)
    # 5. advantages
    if system.advantage == "group":
        group_advantages(samples)
    elif system.advantage is not None:
        # the system's estimator: one scalar per call, the same for each of its tokens (DECOR Eq. 6)
        adv = system.advantage([episodes[i] for i in sorted({s.episode for s in samples})])
        index = {e: k for k, e in enumerate(sorted({s.episode for s in samples}))}
        for s in samples:
            a = adv[index[s.episode]][s.call]
            if a is None:
                raise ValueError(f"{system.name}: the estimator gave no advantage to a {s.role} call (episode "
                                 f"{episodes[s.episode].episode_id}, call {s.call}), a trained role")
            s.advantages = torch.full((len(s.response_ids),), float(a))
    else:
        assign_advantages(samples, p, system.gae_scope, whiten=False)   # GAE within each call or over the episode
    raw_abs = advantage_abs(samples)         # before whitening: how much signal the estimator found
    if system.advantage != "group" and p.normalize_advantages:    # whitened over the batch (QAgent's never)
        whiten_advantages(samples)
    # 6. PPO epochs over role-mixed minibatches
    stats = ppo_update(ac_wrapped, opt, samples, p, pad_id, device, step, ref_available=p.kl_coef > 0,
                       backward=accel.backward, clip=accel.clip_grad_norm_, ckpt_dir=ckpt_dir, name=system.name,
                       first_pass=first_pass, critic=system.critic)
    for s in samples:
        s.hidden = None
    for k, v in mismatch.items():
        stats[k] = [v]
    stats["advantage_abs_raw"] = [raw_abs]
    stats["advantage_abs"] = [advantage_abs(samples)]
    if kl_tokens:
        stats["kl_start"] = [kl_sum / kl_tokens]
    return stats


def start_logp(ac, ref, p: PPOParams, batch, hidden=None):
    """log π_start of a collated batch's response tokens (no gradients): the reference of the KL term and of the
    `kl_start` curve. With LoRA (`ref` None) the start model is the policy with its adapters off, above the same
    frozen layers (`hidden`, when the step reuses their output); without, the separately loaded `ref`."""
    import torch

    ids, att, pos, tgt, _ = batch
    if ref is None:
        with ac.policy.disable_adapter():
            return ac(ids, att, pos, tgt, p.temperature, values=False, hidden=hidden)[0]
    h = ref.get_decoder()(input_ids=ids, attention_mask=att).last_hidden_state
    logits = ref.get_output_embeddings()(h.gather(1, pos[..., None].expand(-1, -1, h.shape[-1]))).float()
    return torch.log_softmax(logits / p.temperature, -1).gather(-1, tgt[..., None]).squeeze(-1)


def engine_mismatch(samples: Sequence[Sample]) -> dict[str, float]:
    """How far the rollout engine's log-probs of its samples are from the trainer's own (`old_logp`, step 4) over
    the tokens the loss counts: `engine_logp_abs_diff` (mean |Δ|) and `engine_logp_max_abs_diff`; {} when no
    sample carries the engine's log-probs (the live HF policy, whose samples are the trainer's own numerics)."""
    diffs = []
    for s in samples:
        if s.engine_logp is None or s.old_logp is None:
            continue
        d = (s.old_logp.float() - s.old_logp.new_tensor(s.engine_logp).float()).abs()
        diffs += (d if s.mask is None else d[s.old_logp.new_tensor(s.mask).bool()]).tolist()
    if not diffs:
        return {}
    return {"engine_logp_abs_diff": sum(diffs) / len(diffs), "engine_logp_max_abs_diff": max(diffs)}


def compute_dtype(engine_dtype: str, device: str):
    """The joint trainer's compute precision: the engine's on CUDA (as before), bf16 on the CPU when asked
    (`cpu_bf16`), else float32 (fp16 has no fast CPU kernels)."""
    import torch

    if str(device).startswith("cpu"):
        return torch.bfloat16 if cpu_bf16(engine_dtype, "cpu") else torch.float32
    return torch.float32 if engine_dtype in ("auto", "float32") else getattr(torch, engine_dtype)


def train_joint_ppo(system: JointSystem, rows: Sequence[dict], model_path: str, ckpt_dir: str | Path,
                    p: PPOParams, engine_cfg: EngineConfig, sampling: dict[str, SamplingConfig] | None = None,
                    *, run_tag: dict[str, Any] | None = None,
                    on_step: Callable[[int, dict], None] | None = None,
                    probe: Callable[[Team], dict[str, float]] | None = None,
                    probe_steps: Collection[int] = ()) -> TrainResult:
    """Train one shared policy on every role of `system` with PPO; checkpoints under `ckpt_dir` (resumed).

    `rows`: training questions ({"id", "question", "golden_answers"}). `sampling`: per-role generation settings
    (max_new_tokens; temperature and top_p come from `p`). Returns the policy (LoRA not merged) and the log history.
    `probe` (`ragteam.train.probe`): run on a greedy Team of the current policy before the first step (0 in
    `probe_steps`: a log entry of its own at step 0) and after each step in `probe_steps` (merged into that step's
    entry, with `probe_seconds`); it reads the policy and changes nothing a step learns.
    """
    import torch
    from accelerate import Accelerator
    from transformers import AutoTokenizer

    from ragteam.train.pg import explained_variance

    if not rows:
        raise ValueError("train_joint_ppo: no training questions")
    wrong = {k: (getattr(p, k), v) for k, v in system.requires.items() if getattr(p, k) != v}
    if wrong:
        raise ParamsError(f"joint.{system.name}.ppo: " + "; ".join(f"{k} is {have!r} but {system.name}'s estimator "
                                                                  f"needs {need!r}" for k, (have, need) in wrong.items()))
    bad = [r.get("id") for r in rows if not r.get("golden_answers")]
    if bad:
        raise ValueError(f"train_joint_ppo: {len(bad)} training question(s) without golden answers, e.g. {bad[:3]}")
    if p.loss_agg == "group_token_mean" and system.advantage != "group":
        raise ValueError(f"{system.name}: loss_agg group_token_mean needs a system with group advantages")
    if not system.critic:   # critic-free estimators: never load a second backbone for a critic nobody trains
        p = p.model_copy(update={"critic": "shared_backbone"})
    ckpt_dir = Path(ckpt_dir)
    fp = fingerprint(kind="joint_ppo", system=system.name, params=model_params(p), model=model_identity(model_path),
                     data=[[r["id"], r["question"], r["golden_answers"]] for r in rows], tag=run_tag or {},
                     gae_scope=system.gae_scope,
                     workflow=system.describe, sampling={k: v.model_dump() for k, v in (sampling or {}).items()},
                     **precision_tag(engine_cfg.dtype, "cpu" if engine_cfg.device == "cpu" else None))
    accel = Accelerator(cpu=engine_cfg.device == "cpu")
    if accel.is_main_process:      # stale checkpoints (another fingerprint) are wiped once, then every process resumes
        prepare_resume(ckpt_dir, fp)
    accel.wait_for_everyone()
    done = checkpoint_steps(ckpt_dir)
    resume = str(ckpt_dir / f"checkpoint-{done[-1]}") if done else None
    torch.manual_seed(p.seed)
    random.seed(p.seed)
    if engine_cfg.threads:
        torch.set_num_threads(engine_cfg.threads)
    device = str(accel.device)
    dtype = compute_dtype(engine_cfg.dtype, device)
    tok = AutoTokenizer.from_pretrained(model_path)
    pad_id = tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id
    ac = _build_actor_critic(model_path, p, device, dtype, with_critic=system.critic)
    ref = None
    if p.kl_coef > 0 and not p.lora.enabled:   # with LoRA the reference is the policy with its adapters disabled
        from transformers import AutoModelForCausalLM

        ref = AutoModelForCausalLM.from_pretrained(model_path, dtype=dtype).to(device).eval().requires_grad_(False)
    opt = make_optimizer(ac, p)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, _schedule(p.lr_scheduler, p.steps, p.warmup_steps))
    step, history = 0, []
    if resume:
        step, history = load_train_state(resume, dict(ac.named_parameters()), opt, sched)
        log.info("resuming %s from %s (step %d)", system.name, resume, step)
    start_step = step
    nonfinite_run = 0                       # optimiser steps skipped in a row for a NaN/inf gradient
    ac_wrapped, opt = accel.prepare(ac, opt)
    # the rollout engine: the live policy or vLLM (ragteam.llm.policy); the loop only hands it the weights
    engine = policy_engine(p.rollout_backend, ac.policy, tok, model_path, engine_cfg, ckpt_dir / "rollout_sync")
    rollouts = Rollouts(engine, dict(sampling or {}), system.roles, system.frozen_roles, engine_cfg,
                        temperature=p.temperature, top_p=p.top_p, seed=p.seed)
    t_start = time.perf_counter()

    ref_logp = partial(start_logp, ac, ref, p)

    def run_probe() -> dict[str, float]:
        t = time.perf_counter()
        was_training = ac.training
        ac.eval()
        try:
            with ac.autocast():
                out = probe(rollouts.greedy_team(ac.policy))
        finally:
            ac.train(was_training)
        print(f"{system.name}: probe after step {step}: "
              + " ".join(f"{k.removeprefix('probe/')} {v:.3f}" for k, v in out.items())
              + f" ({time.perf_counter() - t:.1f} s)", flush=True)
        return {**out, "probe_seconds": time.perf_counter() - t}

    if probe is not None and step == 0 and 0 in probe_steps:
        history.append({"step": 0, **run_probe()})
    while step < p.steps:
        t0 = time.perf_counter()
        # 1-2. rollout (this process's share of the step's questions) and rewards
        qs = _questions(rows, step, p.questions_per_step, p.seed)[accel.process_index::accel.num_processes]
        ac.eval()
        team = rollouts.team(step, ac.policy, accel.process_index)
        with ac.autocast():        # live rollouts over fp32 master weights compute in the engine dtype, as the loss
            episodes = system.annotate(system.rollout(qs, team))
            # 3. the episodes that train (all, unless the system selects: then refills, see _select_with_refill) ...
            episodes, chosen, selection = _select_with_refill(system, rows, qs, episodes, team, step, p.seed,
                                                              (accel.process_index, accel.num_processes))
        t_rollout = time.perf_counter() - t0
        # ... and the samples: the calls of the trained roles (or the system's own samples) of every episode
        samples = (system.samples(tok, episodes) if system.samples is not None
                   else episode_samples(tok, episodes, system.roles))
        keep = {id(ep) for ep in chosen}
        train_eps = {i for i, ep in enumerate(episodes) if id(ep) in keep}
        batch_samples = [s for s in samples if s.episode in train_eps]
        if not any(loss_tokens(s) for s in batch_samples):
            # nothing to learn from (dynamic sampling kept no group, or every trajectory was cut at QAgent's
            # max_seq_len): no optimiser step, the step still counts
            stats: dict[str, list[float]] = {}
            selection["skipped_update"] = 1.0
            log.warning("%s step %d: nothing to train on (%d of %d groups kept, no loss token in the %d samples "
                        "selected): update skipped", system.name, step + 1, int(selection["groups_kept"]),
                        int(selection["groups"]), len(batch_samples))
        else:
            selection["skipped_update"] = 0.0
            stats = _update(system, p, batch_samples, episodes, ac, ac_wrapped, opt, accel, ref_logp, pad_id,
                            device, step, ckpt_dir)
            for skipped in stats.get("nonfinite_grad", []):
                nonfinite_run = nonfinite_run + 1 if skipped else 0
            if nonfinite_run >= p.max_nonfinite_grad_steps:
                raise diverged(system.name, f"non-finite gradients in {nonfinite_run} optimiser steps in a row (up to "
                                            f"step {step + 1}; max_nonfinite_grad_steps {p.max_nonfinite_grad_steps})",
                               ckpt_dir)
        with warnings.catch_warnings():    # a skipped update steps the schedule without an optimiser step
            warnings.filterwarnings("ignore", message="Detected call of `lr_scheduler.step", category=UserWarning)
            sched.step()
        step += 1
        # 7. log and checkpoint
        entry = _step_log(step, episodes, samples, stats, explained_variance, sched.get_last_lr()[0],
                          system.stats)
        entry.update(selection)
        entry.update(step_seconds=time.perf_counter() - t0, rollout_seconds=t_rollout)
        if probe is not None and step in probe_steps:
            entry.update(run_probe())
        history.append(entry)
        log.info("step %d/%d reward %.3f f1 %.3f policy_loss %.4f value_loss %.4f (%.1fs)", step, p.steps,
                 entry["reward"], entry["episode_f1"], entry.get("policy_loss", 0.0), entry.get("value_loss", 0.0),
                 entry["step_seconds"])
        if on_step is not None:
            on_step(step, entry)
        if accel.is_main_process and (step % p.save_steps == 0 or step == p.steps):
            save_train_state(ckpt_dir, step, _trainable_state(ac), opt, sched, history, p.save_total_limit)
        accel.wait_for_everyone()

    ac.eval()
    if not p.lora.enabled and not device.startswith("cpu"):
        ac.policy.to(dtype)                 # fp32 master weights: the agent is saved in the engine dtype, as loaded
                                            # (on the CPU it stays fp32: bf16 would round the last steps away)
    rollouts.close()
    return TrainResult(model=ac.policy, tokenizer=tok, log_history=history, global_step=step,
                       seconds=time.perf_counter() - t_start, resumed_from=start_step if resume else None,
                       extra={"fingerprint": fp, "value_head": ac.value_head.state_dict()})


def group_advantages(samples: Sequence[Sample]) -> None:
    """Step 5 of critic-free group systems (QAgent): (r - mean) / std within each `Sample.group` on every response
    token (the mask decides which count in the loss); returns 0 (no critic to fit).

    QAgent Eq. 3 writes A_i = (R_i − μ_R) / σ_R over the G rollouts and states neither the std convention nor an ε:
    the population std and ε = 1e-6 (this trainer's choice since it was written; the code is not public)."""
    import torch

    from ragteam.train.advantages import group_normalized

    if any(s.group is None for s in samples):
        raise ValueError("group advantages: every sample needs a group id (Sample.group)")
    adv = group_normalized([s.reward for s in samples], [s.group for s in samples], std="population", eps=1e-6)
    for s, a in zip(samples, adv):
        s.advantages = torch.full((len(s.response_ids),), float(a))
        s.returns = torch.zeros(len(s.response_ids))


def _step_log(step: int, episodes: Sequence[Episode], samples: Sequence[Sample], stats: dict[str, list[float]],
              explained_variance, lr: float,
              system_stats: Mapping[str, Callable[[Episode], float]] | None = None) -> dict[str, float]:
    """One history entry: rewards (all calls and per role), episode F1, losses, explained variance, clip fraction,
    response length and format-error rate (all calls and per role), turns and searches per episode, and the
    system's own per-episode figures (`JointSystem.stats`, mean over the step's episodes)."""
    import torch

    calls = [c for ep in episodes for c in ep.calls]
    mean = lambda xs: float(sum(xs) / len(xs)) if xs else 0.0  # noqa: E731
    entry: dict[str, float] = {"step": step, "lr": lr}
    entry["reward"] = mean([s.reward for s in samples])
    entry["episode_f1"] = mean([f1_score(ep.final_answer or "", ep.golden_answers) for ep in episodes])
    entry["response_tokens"] = mean([loss_tokens(s) for s in samples])     # tokens the loss counts
    entry["format_error_rate"] = mean([c.format_error is not None for c in calls])
    entry["calls_per_episode"] = len(calls) / max(len(episodes), 1)
    entry["turns"] = mean([float(ep.meta.get("workflow", {}).get("turns", 0)) for ep in episodes])
    entry["searches"] = mean([float(ep.cost.get("retrieval_calls", 0)) for ep in episodes])
    for name, fn in (system_stats or {}).items():
        entry[name] = mean([float(fn(ep)) for ep in episodes])
    by_role: dict[str, list[Sample]] = defaultdict(list)
    for s in samples:
        by_role[s.role].append(s)
    for role, ss in sorted(by_role.items()):
        entry[f"reward/{role}"] = mean([s.reward for s in ss])
        entry[f"response_tokens/{role}"] = mean([loss_tokens(s) for s in ss])
        entry[f"format_error_rate/{role}"] = mean([episodes[s.episode].calls[s.call].format_error is not None
                                                   for s in ss])
    critic = [s for s in samples if s.values is not None and s.returns is not None]
    if critic:                                  # GAE systems (critic-free estimators have no values)
        values = torch.cat([s.values for s in critic])
        returns = torch.cat([s.returns for s in critic])
        entry["explained_variance"] = explained_variance(values, returns, torch.ones_like(values))
        entry["value_mean"] = float(values.mean())
    elif samples and all(s.advantages is not None for s in samples):   # critic-free: zero advantage = no signal
        entry["zero_advantage"] = mean([float(abs(float(s.advantages[0])) < 1e-8) if len(s.advantages) else 1.0
                                        for s in samples])
    # the spread of the team reward within each question's group of rollouts (systems with G > 1 per question):
    # 0 in every group means every advantage of a group estimator is 0
    returns: dict[str, list[float]] = defaultdict(list)
    for ep in episodes:
        if any(c.reward is not None for c in ep.calls):
            returns[ep.question_id].append(sum(c.reward for c in ep.calls if c.reward is not None))
    spreads = [statistics.pstdev(rs) for rs in returns.values() if len(rs) > 1]
    if spreads:
        entry["reward_group_std"] = mean(spreads)
        entry["groups_with_spread"] = mean([float(x > 1e-9) for x in spreads])
    for k in ("advantage_abs", "advantage_abs_raw", "policy_loss", "value_loss", "clip_frac", "approx_kl",
              "value_clip_frac", "kl_ref", "kl_start",
              "grad_norm/policy", "grad_norm/critic", "ratio_mean", "is_weight_mean", "engine_logp_abs_diff",
              "engine_logp_max_abs_diff"):
        if stats.get(k):
            entry[k] = mean(stats[k])
    if "nonfinite_grad" in stats:             # optimiser steps skipped for a NaN/inf gradient
        entry["nonfinite_grad_steps"] = float(sum(stats["nonfinite_grad"]))
        # ppo_epochs x minibatches: at 1 the update is one on-policy step (ratio 1), so clip_frac is 0 by construction
        entry["optimizer_steps"] = float(len(stats["nonfinite_grad"]))
    return entry
