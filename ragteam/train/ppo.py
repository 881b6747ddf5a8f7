"""Joint multi-agent PPO on one shared backbone (M-ASK §3.3 + Algorithm 1, JADE §3.4 + Algorithm 2).

Every role of a system is the same policy π_θ with a different system prompt; every AgentCall of a batch of
Episodes is one PPO sample, roles mixed. One training step, top to bottom:

 1. rollout   `questions_per_step` questions through the system's workflow in training mode, through the Engine
              interface: `rollout_backend: live` generates with the policy being trained (transformers, CPU or
              CUDA; always in sync), `vllm` with a vLLM engine that loads the current LoRA adapter every step;
 2. reward    the system's reward function writes `AgentCall.reward` (nothing is re-shaped here);
 3. samples   each call -> prompt ids (the chat template of its prompt messages, generation prompt added) and
              response ids (its text, plus EOS when the engine stopped on it); the loss mask covers the response;
 4. old pass  one no-grad pass: log π_old and the critic's values (at the token before each response token: the
              last prompt token for the first), plus log π_ref when kl_coef > 0;
 5. GAE       over each episode's flattened call sequence, every call's reward on its last response token
              (`ragteam.train.advantages.episode_gae`; γ = λ = 1 in the official M-ASK / JADE code);
              advantages whitened over the batch;
 6. update    `ppo_epochs` passes over role-mixed minibatches of `minibatch_size` calls: token-level clipped policy
              loss + vf_coef · clipped value loss (+ kl_coef · k3 KL), gradient clipping (`ragteam.train.pg`);
 7. log + checkpoint (resume through `ragteam.train.checkpoints`); a non-finite loss stops training with the last
              good checkpoint kept.

The critic is a value head (a linear layer) on the policy's own last hidden states (`critic: shared_backbone`) or
on a second copy of the base model with its own adapters (`separate`, verl's layout: M-ASK's critic is initialised
from the same instruct model). With several processes (`accelerate launch`), each process rolls out its share of
the questions and gradients are averaged by accelerate's data-parallel wrapper.

A system plugs in through `JointSystem` (which workflow to roll out, which reward annotates): see
`ragteam.train.systems`. Two choices of the system generalise the loop beyond one-sample-per-call PPO (QAgent's
multi-turn GRPO uses both): `samples` tokenises its episodes itself (one sample = one whole trajectory whose
`Sample.mask` zeroes the environment's tokens), and `advantage="group"` replaces steps 4-5's critic and GAE with
group-normalised rewards (`ragteam.train.advantages.group_normalized` over `Sample.group`; no value head is
trained and no value loss is added).
"""
from __future__ import annotations

import json
import logging
import math
import random
import shutil
import time
from collections import defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from pydantic import Field, model_validator

from ragteam.config import Strict
from ragteam.eval.metrics import f1_score
from ragteam.io import write_json
from ragteam.llm import EngineConfig, SamplingConfig, Team
from ragteam.records import AgentCall, Episode
from ragteam.train.checkpoints import TrainResult, checkpoint_steps, fingerprint, model_identity, prepare_resume
from ragteam.train.common import LoraParams, lora_config

log = logging.getLogger(__name__)


class PPOParams(Strict):
    """params.yaml `joint.ppo` (shared by every joint system; `joint.<system>.ppo` overrides single keys)."""

    steps: int = Field(ge=1)                          # optimiser rounds (one rollout batch each)
    questions_per_step: int = Field(ge=1)             # episodes per rollout batch (M-ASK/JADE code: 128)
    minibatch_size: int = Field(ge=1)                 # calls per optimiser step (verl ppo_mini_batch_size)
    micro_batch_size: int = Field(4, ge=1)            # calls per forward/backward (gradient accumulation)
    ppo_epochs: int = Field(1, ge=1)
    actor_lr: float = Field(gt=0)
    critic_lr: float = Field(gt=0)                    # value head (+ the separate critic's backbone)
    lr_scheduler: Literal["constant", "linear", "cosine"] = "constant"
    warmup_steps: int = Field(0, ge=0)               # linear warm-up: step s < warmup uses (s+1)/warmup of the lr
    gamma: float = Field(1.0, ge=0, le=1)
    lam: float = Field(1.0, ge=0, le=1)
    gae_scope: Literal["episode", "call"] = "episode"  # bootstrap across an episode's calls, or within each call
    normalize_advantages: bool = True
    clip_eps: float = Field(0.2, gt=0)                # ε (eps_low)
    clip_eps_high: float | None = Field(None, gt=0)   # None: = clip_eps (symmetric PPO)
    ratio_level: Literal["token", "sequence"] = "token"
    loss_agg: Literal["token_mean", "seq_mean_token_mean", "group_token_mean"] = "token_mean"  # pg.aggregate
    value_clip: float | None = Field(0.2, gt=0)       # None: unclipped value loss
    vf_coef: float = Field(0.5, ge=0)
    kl_coef: float = Field(0.0, ge=0)                 # 0: no reference model is loaded (M-ASK/JADE code: no KL)
    max_grad_norm: float = Field(1.0, gt=0)
    temperature: float = Field(1.0, gt=0)             # rollout sampling (and the log-prob temperature)
    top_p: float = Field(1.0, gt=0, le=1)
    critic: Literal["shared_backbone", "separate"] = "shared_backbone"
    rollout_backend: Literal["live", "vllm"] = "live"
    seed: int = 0
    save_steps: int = Field(1, ge=1)
    save_total_limit: int = Field(2, ge=1)
    gradient_checkpointing: bool = False
    collapse_window: int = Field(3, ge=1)             # steps per window of the `collapsed` flag (curves.collapsed)
    collapse_drop: float = Field(0.5, gt=0, lt=1)     # "off a cliff": the last window below (1 - drop) x the best
    lora: LoraParams = LoraParams()

    @model_validator(mode="after")
    def _check(self) -> PPOParams:
        if self.micro_batch_size > self.minibatch_size:
            raise ValueError(f"micro_batch_size ({self.micro_batch_size}) > minibatch_size ({self.minibatch_size})")
        if self.rollout_backend == "vllm" and not self.lora.enabled:
            raise ValueError("rollout_backend vllm loads the LoRA adapter each step and needs lora.enabled; with "
                             "full fine-tuning use rollout_backend live (weight sync into vLLM is not implemented)")
        return self


@dataclass(frozen=True)
class JointSystem:
    """What a joint system adds to the trainer: its roles, a training-mode rollout and its reward."""

    name: str
    roles: tuple[str, ...]
    rollout: Callable[[Sequence[dict], Team], list[Episode]]   # questions -> Episodes (training mode)
    annotate: Callable[[list[Episode]], list[Episode]]         # fills AgentCall.reward on every call
    describe: dict[str, Any]                                   # what goes into the fingerprint and the card
    advantage: Literal["gae", "group"] = "gae"                 # GAE with a critic | group-normalised, no critic
    samples: Callable[[Any, Sequence[Episode]], list[Sample]] | None = None  # (tokenizer, episodes); None: per call


class TrainingDiverged(ValueError):
    """A non-finite loss: training stops, the last good checkpoint stays."""


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
    values: Any = None
    advantages: Any = None
    returns: Any = None


def loss_tokens(s: Sample) -> int:
    """How many of a sample's response tokens the loss counts."""
    return len(s.response_ids) if s.mask is None else sum(s.mask)


def tokenize_call(tok, call: AgentCall) -> tuple[list[int], list[int]]:
    """(prompt ids, response ids) of a call: the chat template of its messages with the generation prompt, and its
    response text followed by EOS when generation stopped there (finish_reason "stop"); an empty response is EOS."""
    prompt = tok.apply_chat_template(call.prompt, add_generation_prompt=True, tokenize=False)
    prompt_ids = tok(prompt, add_special_tokens=False).input_ids
    response_ids = tok(call.response, add_special_tokens=False).input_ids
    if call.finish_reason != "length" or not response_ids:
        response_ids = response_ids + [tok.eos_token_id]
    return prompt_ids, response_ids


def episode_samples(tok, episodes: Sequence[Episode]) -> list[Sample]:
    out = []
    for ei, ep in enumerate(episodes):
        for ci, c in enumerate(ep.calls):
            if c.reward is None:
                raise ValueError(f"episode {ep.episode_id} call {ci} ({c.role}) has no reward: the system's reward "
                                 f"function must annotate every call")
            p, r = tokenize_call(tok, c)
            out.append(Sample(ei, ci, c.role, p, r, float(c.reward)))
    return out


# ---- the actor and the critic --------------------------------------------------------------------------------

def _parts(model):
    """(decoder, lm_head) of a causal LM, through a peft wrapper (whose LoRA layers live inside the base model)."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    return base.get_decoder(), base.get_output_embeddings()


def _build_actor_critic(model_path: str, p: PPOParams, device: str, dtype):
    import torch
    from transformers import AutoModelForCausalLM

    class ActorCritic(torch.nn.Module):
        """log π(response tokens) and V at the token before each response token, in one forward pass."""

        def __init__(self):
            super().__init__()
            policy = AutoModelForCausalLM.from_pretrained(model_path, dtype=dtype)
            if p.lora.enabled:
                from peft import get_peft_model

                policy = get_peft_model(policy, lora_config(p.lora, model_path))
            self.policy = policy
            hidden = policy.config.get_text_config().hidden_size
            self.critic = None
            if p.critic == "separate":
                critic = AutoModelForCausalLM.from_pretrained(model_path, dtype=dtype)
                if p.lora.enabled:
                    from peft import get_peft_model

                    critic = get_peft_model(critic, lora_config(p.lora, model_path))
                self.critic = critic
            self.value_head = torch.nn.Linear(hidden, 1)
            torch.nn.init.zeros_(self.value_head.weight)
            torch.nn.init.zeros_(self.value_head.bias)
            if p.gradient_checkpointing:
                for m in (self.policy, self.critic):
                    if m is not None:
                        m.gradient_checkpointing_enable()
                        if p.lora.enabled:
                            m.enable_input_require_grads()

        def forward(self, input_ids, attention_mask, positions, targets, temperature: float = 1.0,
                    values: bool = True):
            decoder, head = _parts(self.policy)
            h = decoder(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state
            idx = positions[..., None].expand(-1, -1, h.shape[-1])
            hs = h.gather(1, idx)                                                   # (B, R, H)
            logits = head(hs).float() / temperature
            logp = torch.log_softmax(logits, -1).gather(-1, targets[..., None]).squeeze(-1)
            if not values:
                return logp, None
            if self.critic is not None:
                cdec, _ = _parts(self.critic)
                hc = cdec(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state.gather(1, idx)
            else:
                hc = hs
            v = self.value_head(hc.float()).squeeze(-1)
            return logp, v

    return ActorCritic().to(device)


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


def _save_checkpoint(ckpt_dir: Path, step: int, ac, opt, sched, history: list[dict], keep: int) -> None:
    import torch

    d, tmp = ckpt_dir / f"checkpoint-{step}", ckpt_dir / f".checkpoint-{step}.tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    torch.save({"trainable": _trainable_state(ac), "optimizer": opt.state_dict(), "scheduler": sched.state_dict(),
                "torch_rng": torch.get_rng_state(), "py_rng": random.getstate()}, tmp / "state.pt")
    write_json(tmp / "trainer_state.json", {"global_step": step, "log_history": history})  # completeness marker
    shutil.rmtree(d, ignore_errors=True)
    tmp.rename(d)
    for old in checkpoint_steps(ckpt_dir)[:-keep]:
        shutil.rmtree(ckpt_dir / f"checkpoint-{old}", ignore_errors=True)


def _load_checkpoint(path: Path, ac, opt, sched) -> tuple[int, list[dict]]:
    import torch

    state = torch.load(path / "state.pt", weights_only=False)
    params = dict(ac.named_parameters())
    with torch.no_grad():
        for n, t in state["trainable"].items():
            params[n].copy_(t)
    opt.load_state_dict(state["optimizer"])
    sched.load_state_dict(state["scheduler"])
    torch.set_rng_state(state["torch_rng"])
    random.setstate(state["py_rng"])
    meta = json.loads((path / "trainer_state.json").read_text())
    return int(meta["global_step"]), list(meta["log_history"])


# ---- the rollout engine --------------------------------------------------------------------------------------

class _Rollouts:
    """A Team for the system's roles whose engine is the current policy (live) or vLLM with its LoRA adapter."""

    def __init__(self, ac, tok, model_path: str, p: PPOParams, engine_cfg: EngineConfig,
                 sampling: dict[str, SamplingConfig], roles: Sequence[str], adapter_dir: Path):
        self.p, self.ac, self.adapter_dir = p, ac, adapter_dir
        if p.rollout_backend == "live":
            from ragteam.llm.hf import HFEngine

            base = ac.policy.get_base_model() if hasattr(ac.policy, "get_base_model") else ac.policy
            self.engine = HFEngine(model_path, engine_cfg, model=base, tokenizer=tok)
        else:
            from ragteam.llm.vllm_backend import VLLMEngine

            self.engine = VLLMEngine(model_path, engine_cfg, max_lora_rank=p.lora.rank)
        default = sampling.get("default") or SamplingConfig()
        self.sampling = {r: (sampling.get(r) or default).model_copy(update={"temperature": p.temperature,
                                                                           "top_p": p.top_p, "n": 1})
                         for r in roles}

    def team(self, step: int) -> Team:
        if self.p.rollout_backend == "live":
            self.engine.clear_prefix_cache()          # the weights changed: cached prefix KV is stale
        else:
            d = self.adapter_dir / f"step-{step}"
            self.ac.policy.save_pretrained(str(d))
            self.engine.load_lora(str(d))
        seeded = {r: s.model_copy(update={"seed": self.p.seed * 100003 + step}) for r, s in self.sampling.items()}
        return Team(self.engine, seeded)


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


def single_pass(p: PPOParams, n_samples: int) -> bool:
    """One forward pass per step suffices when the update is a single on-policy optimiser step: one PPO epoch, one
    minibatch holding every sample, no reference model."""
    return p.ppo_epochs == 1 and p.minibatch_size >= n_samples and p.kl_coef == 0


def ppo_update(model, opt, samples: Sequence[Sample], p: PPOParams, pad_id: int, device: str, step: int = 0, *,
               ref_available: bool = False, backward: Callable | None = None, clip: Callable | None = None,
               ckpt_dir: Path | None = None, name: str = "joint", first_pass: list | None = None,
               critic: bool = True) -> dict[str, list[float]]:
    """`ppo_epochs` passes over role-mixed minibatches of `minibatch_size` samples (accumulated over micro-batches),
    one optimiser step per minibatch: clipped policy loss + vf_coef · value loss (+ kl_coef · KL to the reference).
    The samples carry old log-probs, values, advantages and returns. Returns the per-micro-batch statistics.

    `first_pass` (the on-policy single pass, see `single_pass`): the (log-probs, values) of every micro-batch in
    sample order, computed with gradients when the old log-probs were taken; they are used instead of a second
    forward pass. Same update: before the first optimiser step π_θ = π_old, so ratio = 1 and nothing is clipped.

    `critic=False` (group-normalised advantages): no value loss. `loss_agg="group_token_mean"` (QAgent Eq. 3): each
    token weighs 1 / (groups in the minibatch × its group's loss tokens in the minibatch), policy and KL terms alike,
    so the summed micro-batch losses are the minibatch's mean over groups of each group's token-summed loss."""
    import torch

    from ragteam.train.pg import aggregate, group_token_weights, kl_k3, policy_loss, value_loss

    backward = backward or (lambda loss: loss.backward())
    clip = clip or torch.nn.utils.clip_grad_norm_
    model.train()
    stats: dict[str, list[float]] = defaultdict(list)
    rng = random.Random(f"{p.seed}:update:{step}")
    trainable = [t for t in model.parameters() if t.requires_grad]
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
                logp, v = first_pass[u0 // p.micro_batch_size] if first_pass else model(*batch[:4], p.temperature)
                old_logp = _stack([s.old_logp for s in micro], rlen, device)
                adv = _stack([s.advantages for s in micro], rlen, device)
                pl, pst = policy_loss(logp, old_logp, adv, mask, eps_low=p.clip_eps, eps_high=p.clip_eps_high,
                                      ratio_level=p.ratio_level, agg=p.loss_agg, token_weights=tw)
                if critic:
                    ret = _stack([s.returns for s in micro], rlen, device)
                    old_v = _stack([s.values for s in micro], rlen, device)
                    vl, vst = value_loss(v, old_v, ret, mask, p.value_clip, p.loss_agg)
                    loss = pl + p.vf_coef * vl
                else:
                    vl, vst, loss = torch.zeros(()), {}, pl
                if p.kl_coef > 0 and ref_available:
                    kl = kl_k3(logp, _stack([s.ref_logp for s in micro], rlen, device))
                    kl_mean = (aggregate(kl, mask, p.loss_agg, tw) if by_group
                               else (kl * mask).sum() / mask.sum().clamp(min=1))
                    loss = loss + p.kl_coef * kl_mean
                    stats["kl_ref"].append(float(kl_mean.detach()))
                if not torch.isfinite(loss):
                    last = checkpoint_steps(ckpt_dir) if ckpt_dir is not None else []
                    raise TrainingDiverged(
                        f"{name}: non-finite loss at step {step + 1} (policy {float(pl.detach())}, value "
                        f"{float(vl.detach())}); "
                        f"training stopped, the last good checkpoint "
                        f"{'checkpoint-' + str(last[-1]) if last else '(none yet)'} in {ckpt_dir} is kept")
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
                if critic:
                    stats["value_loss"].append(float(vl.detach()))
                for k, x in {**pst, **vst}.items():
                    stats[k].append(x)
            if by_group:
                stats["policy_loss"].append(mb_policy)
            stats["grad_norm"].append(float(clip(trainable, p.max_grad_norm)))
            opt.step()
    return stats


def train_joint_ppo(system: JointSystem, rows: Sequence[dict], model_path: str, ckpt_dir: str | Path,
                    p: PPOParams, engine_cfg: EngineConfig, sampling: dict[str, SamplingConfig] | None = None,
                    *, run_tag: dict[str, Any] | None = None,
                    on_step: Callable[[int, dict], None] | None = None) -> TrainResult:
    """Train one shared policy on every role of `system` with PPO; checkpoints under `ckpt_dir` (resumed).

    `rows`: training questions ({"id", "question", "golden_answers"}). `sampling`: per-role generation settings
    (max_new_tokens; temperature and top_p come from `p`). Returns the policy (LoRA not merged) and the log history.
    """
    import torch
    from accelerate import Accelerator
    from transformers import AutoTokenizer

    from ragteam.train.pg import explained_variance

    if not rows:
        raise ValueError("train_joint_ppo: no training questions")
    bad = [r.get("id") for r in rows if not r.get("golden_answers")]
    if bad:
        raise ValueError(f"train_joint_ppo: {len(bad)} training question(s) without golden answers, e.g. {bad[:3]}")
    if p.loss_agg == "group_token_mean" and system.advantage != "group":
        raise ValueError(f"{system.name}: loss_agg group_token_mean needs a system with group advantages")
    critic = system.advantage == "gae"
    if not critic:       # group-normalised advantages need no critic: never load a second backbone for one
        p = p.model_copy(update={"critic": "shared_backbone"})
    ckpt_dir = Path(ckpt_dir)
    fp = fingerprint(kind="joint_ppo", system=system.name, params=p.model_dump(), model=model_identity(model_path),
                     data=[[r["id"], r["question"], r["golden_answers"]] for r in rows], tag=run_tag or {},
                     workflow=system.describe, sampling={k: v.model_dump() for k, v in (sampling or {}).items()})
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
    cpu_or_default = engine_cfg.dtype in ("auto", "float32") or device == "cpu"
    dtype = torch.float32 if cpu_or_default else getattr(torch, engine_cfg.dtype)
    tok = AutoTokenizer.from_pretrained(model_path)
    pad_id = tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id
    ac = _build_actor_critic(model_path, p, device, dtype)
    ref = None
    if p.kl_coef > 0 and not p.lora.enabled:   # with LoRA the reference is the policy with its adapters disabled
        from transformers import AutoModelForCausalLM

        ref = AutoModelForCausalLM.from_pretrained(model_path, dtype=dtype).to(device).eval().requires_grad_(False)
    critic_ids = {id(t) for n, t in ac.named_parameters() if n.startswith(("value_head", "critic"))}
    actor_params = [t for t in ac.parameters() if t.requires_grad and id(t) not in critic_ids]
    critic_params = [t for t in ac.parameters() if t.requires_grad and id(t) in critic_ids]
    opt = torch.optim.AdamW([{"params": actor_params, "lr": p.actor_lr}, {"params": critic_params, "lr": p.critic_lr}],
                            betas=(0.9, 0.999), weight_decay=0.0)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, _schedule(p.lr_scheduler, p.steps, p.warmup_steps))
    step, history = 0, []
    if resume:
        step, history = _load_checkpoint(Path(resume), ac, opt, sched)
        log.info("resuming %s from %s (step %d)", system.name, resume, step)
    start_step = step
    ac_wrapped, opt = accel.prepare(ac, opt)
    rollouts = _Rollouts(ac, tok, model_path, p, engine_cfg, dict(sampling or {}), system.roles,
                         ckpt_dir / "rollout_adapter")
    t_start = time.perf_counter()

    def ref_logp(batch) -> torch.Tensor:
        ids, att, pos, tgt, _ = batch
        if ref is None:
            with ac.policy.disable_adapter():
                return ac(ids, att, pos, tgt, p.temperature, values=False)[0]
        h = ref.get_decoder()(input_ids=ids, attention_mask=att).last_hidden_state
        logits = ref.get_output_embeddings()(h.gather(1, pos[..., None].expand(-1, -1, h.shape[-1]))).float()
        return torch.log_softmax(logits / p.temperature, -1).gather(-1, tgt[..., None]).squeeze(-1)

    while step < p.steps:
        t0 = time.perf_counter()
        # 1-2. rollout (this process's share of the step's questions) and rewards
        qs = _questions(rows, step, p.questions_per_step, p.seed)[accel.process_index::accel.num_processes]
        ac.eval()
        episodes = system.annotate(system.rollout(qs, rollouts.team(step)))
        t_rollout = time.perf_counter() - t0
        # 3. samples
        samples = (system.samples or episode_samples)(tok, episodes)
        # 4. old log-probs, values (and reference log-probs). With one PPO epoch over one minibatch the update is
        #    on-policy: this pass keeps its gradients and the update reuses it (one forward pass instead of two)
        single = single_pass(p, len(samples))
        first_pass = [] if single else None
        ac.train(single)
        with torch.set_grad_enabled(single):
            for i in range(0, len(samples), p.micro_batch_size):
                chunk = samples[i:i + p.micro_batch_size]
                batch = _collate(chunk, pad_id, device)
                logp, v = (ac_wrapped if single else ac)(*batch[:4], p.temperature)
                if single:
                    first_pass.append((logp, v))
                with torch.no_grad():
                    rl = ref_logp(batch) if p.kl_coef > 0 else None
                for b, s in enumerate(chunk):
                    n = len(s.response_ids)
                    s.old_logp, s.values = logp[b, :n].detach().cpu(), v[b, :n].detach().cpu()
                    s.ref_logp = rl[b, :n].cpu() if rl is not None else None
        # 5. advantages: GAE (+ whitening), or group-normalised rewards
        fill_advantages(samples, system.advantage, p)
        # 6. PPO epochs over role-mixed minibatches
        stats = ppo_update(ac_wrapped, opt, samples, p, pad_id, device, step, ref_available=p.kl_coef > 0,
                           backward=accel.backward, clip=accel.clip_grad_norm_, ckpt_dir=ckpt_dir, name=system.name,
                           first_pass=first_pass, critic=critic)
        sched.step()
        step += 1
        # 7. log and checkpoint
        entry = _step_log(step, episodes, samples, stats, explained_variance if critic else None,
                          sched.get_last_lr()[0])
        entry.update(step_seconds=time.perf_counter() - t0, rollout_seconds=t_rollout)
        history.append(entry)
        log.info("step %d/%d reward %.3f f1 %.3f policy_loss %.4f value_loss %.4f (%.1fs)", step, p.steps,
                 entry["reward"], entry["episode_f1"], entry.get("policy_loss", float("nan")),
                 entry.get("value_loss", float("nan")), entry["step_seconds"])
        if on_step is not None:
            on_step(step, entry)
        if accel.is_main_process and (step % p.save_steps == 0 or step == p.steps):
            _save_checkpoint(ckpt_dir, step, ac, opt, sched, history, p.save_total_limit)
        accel.wait_for_everyone()

    ac.eval()
    shutil.rmtree(ckpt_dir / "rollout_adapter", ignore_errors=True)
    return TrainResult(model=ac.policy, tokenizer=tok, log_history=history, global_step=step,
                       seconds=time.perf_counter() - t_start, resumed_from=start_step if resume else None,
                       extra={"fingerprint": fp, "value_head": ac.value_head.state_dict()})


def fill_advantages(samples: Sequence[Sample], estimator: Literal["gae", "group"], p: PPOParams) -> None:
    """Step 5. gae: over each episode's flattened calls (in call order), every call's reward on its last response
    token, then (normalize_advantages) whitening over the batch; group: (r - mean) / std within each `Sample.group`
    on every response token (the mask decides which count), returns 0 (no critic to fit)."""
    import torch

    from ragteam.train.advantages import episode_gae, group_normalized
    from ragteam.train.pg import masked_whiten

    if estimator == "group":
        if any(s.group is None for s in samples):
            raise ValueError("group advantages: every sample needs a group id (Sample.group)")
        for s, a in zip(samples, group_normalized([s.reward for s in samples], [s.group for s in samples])):
            s.advantages = torch.full((len(s.response_ids),), float(a))
            s.returns = torch.zeros(len(s.response_ids))
        return
    by_ep: dict[int, list[Sample]] = defaultdict(list)
    for s in samples:
        by_ep[s.episode].append(s)
    for ss in by_ep.values():
        for s, (a, r) in zip(ss, episode_gae([s.reward for s in ss], [s.values for s in ss], p.gamma, p.lam,
                                             p.gae_scope)):
            s.advantages, s.returns = a, r
    if p.normalize_advantages:
        flat = torch.cat([s.advantages for s in samples])
        flat = masked_whiten(flat, torch.ones_like(flat))
        pos = 0
        for s in samples:
            s.advantages = flat[pos:pos + len(s.response_ids)]
            pos += len(s.response_ids)


def _step_log(step: int, episodes: Sequence[Episode], samples: Sequence[Sample], stats: dict[str, list[float]],
              explained_variance, lr: float) -> dict[str, float]:
    """One history entry: rewards (all calls and per role), episode F1, losses, explained variance, clip fraction,
    response length and format-error rate (all calls and per role), turns and searches per episode."""
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
    by_role: dict[str, list[Sample]] = defaultdict(list)
    for s in samples:
        by_role[s.role].append(s)
    for role, ss in sorted(by_role.items()):
        entry[f"reward/{role}"] = mean([s.reward for s in ss])
        entry[f"response_tokens/{role}"] = mean([loss_tokens(s) for s in ss])
        entry[f"format_error_rate/{role}"] = mean([episodes[s.episode].calls[s.call].format_error is not None
                                                   for s in ss])
    if explained_variance is not None:      # None: no critic (group advantages)
        values = torch.cat([s.values for s in samples])
        returns = torch.cat([s.returns for s in samples])
        entry["explained_variance"] = explained_variance(values, returns, torch.ones_like(values))
        entry["value_mean"] = float(values.mean())
    else:                                   # groups with one reward for all: no learning signal
        entry["zero_advantage"] = mean([float(abs(float(s.advantages[0])) < 1e-8) if len(s.advantages) else 1.0
                                        for s in samples])
    for k in ("policy_loss", "value_loss", "clip_frac", "approx_kl", "value_clip_frac", "kl_ref", "grad_norm",
              "ratio_mean"):
        if stats.get(k):
            entry[k] = mean(stats[k])
    return entry
