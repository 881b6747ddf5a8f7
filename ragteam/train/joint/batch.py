"""Rollouts -> a batch: one `Sample` per AgentCall (prompt and response ids as the engine recorded them, the loss
mask over the response), padding into tensors, the questions of a step and DAPO-style refills when a system's
`select` keeps too few groups, and the check of the engine's log-probs against the policy's."""
from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from ragteam.llm import Team
from ragteam.records import AgentCall, Episode
from ragteam.train.joint.system import JointSystem


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
