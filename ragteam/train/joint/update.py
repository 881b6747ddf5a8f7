"""One optimisation step: advantages (GAE with the critic, or a group estimator), whitening, and `ppo_update`:
`ppo_epochs` passes over role-mixed minibatches of the clipped policy loss + clipped value loss (+ k3 KL) from
`ragteam.train.pg`, each network's gradient clipped to its own norm."""
from __future__ import annotations

import logging
import math
import random
from collections import defaultdict
from collections.abc import Callable, Sequence
from pathlib import Path

from ragteam.records import Episode
from ragteam.train.advantages import Scope
from ragteam.train.checkpoints import diverged
from ragteam.train.joint.actor_critic import actor_critic_params
from ragteam.train.joint.batch import Sample, _collate, _stack, _stack_hidden, engine_mismatch, loss_tokens
from ragteam.train.joint.params import PPOParams
from ragteam.train.joint.system import JointSystem

log = logging.getLogger(__name__)


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

    from ragteam.train.pg import aggregate, group_token_weights, kl_k3, policy_loss, truncated_is_weights, value_loss

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
