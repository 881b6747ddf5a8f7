"""The one policy-gradient core of the joint trainers: token-level clipped policy loss, KL to a reference, clipped
value loss. Tensors in, scalars out; every function takes a `mask` (1 on the tokens that count, 0 elsewhere).

What differs between systems is the advantage (`ragteam.train.advantages`) and a few switches here:
- M-ASK / JADE (PPO): per-token GAE advantages, `ratio_level="token"`, eps_low = eps_high, value loss with clipping;
- DECOR: per-role group-normalised advantages broadcast to tokens, `ratio_level="sequence"`, clip-higher
  (eps_high > eps_low);
- QAgent: group-normalised advantages with injected retrieval tokens masked out (mask 0), the loss normalised by
  each group's total tokens (`agg="group_token_mean"`, QAgent Eq. 3, weights from `group_token_weights`).

    ratio_t   = exp(log π_θ(u_t|o_t) - log π_old(u_t|o_t))          token level, or per sequence:
    ratio_seq = exp(mean_t over the sequence's tokens of the same log-ratio)   (sequence level, length-normalised)
    L_pg      = mean over tokens of max(-A_t·ratio, -A_t·clip(ratio, 1-eps_low, 1+eps_high))
    KL (k3)   = exp(ref - logp) - (ref - logp) - 1                  (Schulman's unbiased, non-negative estimator)
    w_t       = min(π_old(u_t|o_t) / π_engine(u_t|o_t), C)         truncated importance sampling of samples drawn by
                a rollout engine whose numerics differ from the trainer's (Yao et al. 2025, "Your Efficient RL
                Framework Secretly Brings You Off-Policy RL Training"; verl's and TRL's TIS): L_pg weighs each
                token's term by w_t (no gradient through w)
    L_v       = mean over tokens of 0.5·max((V-R)², (V_old + clip(V-V_old, -c, c) - R)²)
"""
from __future__ import annotations

from collections.abc import Hashable, Sequence
from typing import Literal

import torch

RatioLevel = Literal["token", "sequence"]
Aggregation = Literal["token_mean", "seq_mean_token_mean", "group_token_mean"]


def masked_mean(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    return (x * mask).sum() / mask.sum().clamp(min=1)


def masked_whiten(x: torch.Tensor, mask: torch.Tensor, eps: float = 1e-8) -> torch.Tensor:
    """(x - mean) / std over the masked entries (advantage whitening over a batch, as verl's GAE does)."""
    mean = masked_mean(x, mask)
    var = masked_mean((x - mean) ** 2, mask)
    return (x - mean) * torch.rsqrt(var + eps) * mask


def group_token_weights(n_tokens: Sequence[int], groups: Sequence[Hashable]) -> list[float]:
    """Per-sample token weight of QAgent's Eq. 3, J = E_q[(1/Σ_i|y_i|) Σ_i Σ_t ...]: 1 / (number of groups × the
    total loss tokens of the sample's group), so Σ over all tokens of weight · loss is the mean over groups of each
    group's token-summed loss divided by its token count (a group without loss tokens gets weight 0)."""
    if len(n_tokens) != len(groups):
        raise ValueError(f"group_token_weights: {len(n_tokens)} token counts for {len(groups)} group ids")
    total: dict[Hashable, int] = {}
    for n, g in zip(n_tokens, groups):
        total[g] = total.get(g, 0) + int(n)
    return [1.0 / (len(total) * total[g]) if total[g] else 0.0 for g in groups]


def aggregate(per_token: torch.Tensor, mask: torch.Tensor, how: Aggregation = "token_mean",
              token_weights: torch.Tensor | None = None) -> torch.Tensor:
    """token_mean: every token of the batch weighs the same; seq_mean_token_mean: the mean over each sequence's
    tokens, then over sequences (each sample weighs the same); group_token_mean: Σ token_weights · loss over the
    masked tokens, the weights from `group_token_weights` (each group weighs the same, each token within it too)."""
    if how == "group_token_mean":
        if token_weights is None:
            raise ValueError("aggregate: group_token_mean needs token_weights (see group_token_weights)")
        return (per_token * mask * token_weights).sum()
    if how == "token_mean":
        return masked_mean(per_token, mask)
    per_seq = (per_token * mask).sum(-1) / mask.sum(-1).clamp(min=1)
    has = (mask.sum(-1) > 0).float()
    return (per_seq * has).sum() / has.sum().clamp(min=1)


def log_ratio(logp: torch.Tensor, old_logp: torch.Tensor, mask: torch.Tensor,
              level: RatioLevel = "token") -> torch.Tensor:
    """Per-token log π_θ/π_old, or (sequence level) each sequence's mean log-ratio broadcast to its tokens."""
    lr = (logp - old_logp) * mask
    if level == "token":
        return lr
    seq = lr.sum(-1, keepdim=True) / mask.sum(-1, keepdim=True).clamp(min=1)
    return seq.expand_as(lr) * mask


def policy_loss(logp: torch.Tensor, old_logp: torch.Tensor, advantages: torch.Tensor, mask: torch.Tensor, *,
                eps_low: float = 0.2, eps_high: float | None = None, ratio_level: RatioLevel = "token",
                agg: Aggregation = "token_mean", token_weights: torch.Tensor | None = None,
                is_weights: torch.Tensor | None = None) -> tuple[torch.Tensor, dict[str, float]]:
    """The clipped surrogate (PPO Eq. 7, M-ASK Eq. 4, QAgent Eq. 3) as a loss to minimise; stats: clip fraction,
    approx. KL. `token_weights`: for agg="group_token_mean". `is_weights`: w_t of `truncated_is_weights` (samples
    from a rollout engine other than the trained policy), multiplying each token's term; None: 1."""
    per_token, stats = surrogate(logp, old_logp, advantages, mask, eps_low=eps_low, eps_high=eps_high,
                                 ratio_level=ratio_level, is_weights=is_weights)
    return aggregate(per_token, mask, agg, token_weights), stats


def surrogate(logp: torch.Tensor, old_logp: torch.Tensor, advantages: torch.Tensor, mask: torch.Tensor, *,
              eps_low: float = 0.2, eps_high: float | None = None, ratio_level: RatioLevel = "token",
              is_weights: torch.Tensor | None = None) -> tuple[torch.Tensor, dict[str, float]]:
    """`policy_loss`'s per-token terms before aggregation: max(-A·r, -A·clip(r, 1-ε_low, 1+ε_high)) (× w_t). With
    `old_logp = logp.detach()` (one update per batch, on-policy: MAPS's shared-prefix GRPO) r = 1, nothing is
    clipped, and the gradient is the policy gradient -A·∇log π (GRPO Eq. 3 of DeepSeekMath without the ratio)."""
    eps_high = eps_low if eps_high is None else eps_high
    ratio = torch.exp(log_ratio(logp, old_logp, mask, ratio_level))
    unclipped = -advantages * ratio
    clipped = -advantages * torch.clamp(ratio, 1.0 - eps_low, 1.0 + eps_high)
    per_token = torch.maximum(unclipped, clipped)
    if is_weights is not None:
        per_token = per_token * is_weights.detach()
    with torch.no_grad():
        d = (old_logp - logp) * mask
        stats = {"clip_frac": float(masked_mean((clipped > unclipped).float(), mask)),
                 "approx_kl": float(masked_mean(0.5 * d ** 2, mask)),
                 "ratio_mean": float(masked_mean(ratio, mask))}
    return per_token, stats


def truncated_is_weights(old_logp: torch.Tensor, engine_logp: torch.Tensor, mask: torch.Tensor, cap: float
                         ) -> torch.Tensor:
    """w_t = min(exp(log π_old - log π_engine), cap) on the masked tokens, 0 elsewhere (the header's TIS line):
    corrects the policy gradient for samples a rollout engine drew from its own numerics of the policy (vLLM's
    kernels, another precision), truncated at `cap` so one token the engine found unlikely cannot dominate."""
    if cap <= 0:
        raise ValueError(f"truncated_is_weights: cap must be > 0, not {cap}")
    return torch.exp(old_logp - engine_logp).clamp(max=cap) * mask


def kl_k3(logp: torch.Tensor, ref_logp: torch.Tensor) -> torch.Tensor:
    """Per-token k3 estimate of KL(π_θ || π_ref): exp(r) - r - 1 with r = log π_ref - log π_θ (always >= 0)."""
    r = ref_logp - logp
    return torch.exp(r) - r - 1.0


def value_loss(values: torch.Tensor, old_values: torch.Tensor, returns: torch.Tensor, mask: torch.Tensor,
               clip: float | None = 0.2, agg: Aggregation = "token_mean") -> tuple[torch.Tensor, dict[str, float]]:
    """0.5·max((V-R)², (V_clipped-R)²) with V_clipped = V_old + clip(V - V_old, -clip, clip); no clipping if None."""
    unclipped = (values - returns) ** 2
    if clip is None:
        per_token = unclipped
        frac = 0.0
    else:
        v_clip = old_values + torch.clamp(values - old_values, -clip, clip)
        clipped = (v_clip - returns) ** 2
        per_token = torch.maximum(unclipped, clipped)
        frac = float(masked_mean((clipped > unclipped).float(), mask))
    return 0.5 * aggregate(per_token, mask, agg), {"value_clip_frac": frac}


def explained_variance(values: torch.Tensor, returns: torch.Tensor, mask: torch.Tensor) -> float:
    """1 - Var(R - V) / Var(R) over the masked tokens (1: the critic explains the returns; <= 0: no better than a
    constant); NaN when the returns do not vary."""
    var_r = masked_mean((returns - masked_mean(returns, mask)) ** 2, mask)
    resid = returns - values
    var_e = masked_mean((resid - masked_mean(resid, mask)) ** 2, mask)
    return float("nan") if float(var_r) == 0.0 else float(1.0 - var_e / var_r)
