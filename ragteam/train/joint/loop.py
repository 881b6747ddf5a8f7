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
advantage estimator, which episodes train, which roles stay frozen), built by its own module
(`ragteam.systems.<system>`). The estimator is the part that differs per system: GAE with a critic (M-ASK,
JADE; the default), `"group"` (QAgent's multi-turn GRPO: `ragteam.train.advantages.group_normalized` over
`Sample.group`, no critic) or a function of the episodes (DECOR's Eq. 6). `samples` lets a system tokenise its
episodes itself (QAgent: one sample = one whole trajectory whose `Sample.mask` zeroes the environment's tokens); by
default every call of a trained role is one sample.
"""
from __future__ import annotations

import logging
import random
import statistics
import time
import warnings
from collections import defaultdict
from collections.abc import Callable, Collection, Mapping, Sequence
from functools import partial
from pathlib import Path
from typing import Any

from ragteam.config import ParamsError
from ragteam.metrics import f1_score
from ragteam.llm import EngineConfig, SamplingConfig, Team
from ragteam.llm.policy import Rollouts, policy_engine
from ragteam.records import Episode
from ragteam.train.checkpoints import (
    TrainResult,
    checkpoint_steps,
    diverged,
    fingerprint,
    load_train_state,
    model_identity,
    prepare_resume,
    save_train_state,
)
from ragteam.train.common import model_params, precision_tag
from ragteam.train.joint.actor_critic import (
    _build_actor_critic,
    _schedule,
    _trainable_state,
    compute_dtype,
    make_optimizer,
    start_logp,
)
from ragteam.train.joint.batch import Sample, _questions, _select_with_refill, episode_samples, loss_tokens
from ragteam.train.joint.params import PPOParams
from ragteam.train.joint.system import JointSystem
from ragteam.train.joint.update import _update
from ragteam.timing import timed

log = logging.getLogger(__name__)


@timed("training")
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
