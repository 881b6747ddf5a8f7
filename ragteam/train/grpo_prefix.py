"""GRPO with the prompt computed once per group: the CPU trainer for the default profile (same math as TRL's).

Why: a GRPO group is G completions of ONE prompt. TRL runs the prompt G times, in generation and again in the
loss, so with ~200-token RAG prompts and ~10-token answers >90 % of the FLOPs re-encode the same prompt. Here the
prompt goes through the model once, its KV cache is repeated G times, and only the completions are decoded and
trained on: per group (L_p + G·L_c) tokens instead of G·(L_p + L_c), ~7x less at L_p = 200, L_c = 16, G = 16.

Same objective as TRL's GRPOTrainer with num_iterations = 1 (on-policy, so the PPO ratio is 1 and clipping is
inactive), scale_rewards = "group" (TRL's A = (r - mean) / (std + 1e-4) with torch's sample std), loss_type = "dapo"
(token mean over the step), KL k3 to the reference when kl_beta > 0. Same reward callables (TRL keyword protocol),
same GRPOParams, checkpoints and log history. Unlike TRL, a step whose gradient holds a NaN or inf is skipped (no
optimiser step, counted as `nonfinite_grad_steps`), and `max_nonfinite_grad_steps` such steps in a row stop the run.
"""
from __future__ import annotations

import json
import logging
import math
import random
import time
from collections import defaultdict
from collections.abc import Callable, Sequence
from types import SimpleNamespace
from typing import Any

from ragteam.llm import call_seed
from ragteam.train.advantages import group_normalized
from ragteam.train.checkpoints import (TrainResult, diverged, fingerprint, load_train_state, model_identity,
                                      prepare_resume, save_train_state)
from ragteam.train.common import GRPOParams, GRPOSample, cpu_bf16, lora_config, model_params, validate_samples
from ragteam.timing import timed

log = logging.getLogger(__name__)


def _sample_group(model, prompt_ids, G: int, max_new: int, temperature: float, eos_id: int, pad_id: int,
                  greedy_first: bool = False):
    """G sampled completions of one prompt: prefill once, repeat the KV cache G times, decode together.
    `greedy_first`: completion 0 takes the argmax at every token (the greedy output inference gives)."""
    import torch

    with torch.no_grad():
        out = model(prompt_ids[None], use_cache=True)
        cache = out.past_key_values
        cache.batch_repeat_interleave(G)
        logits = out.logits[:, -1].expand(G, -1)
        done = torch.zeros(G, dtype=torch.bool, device=prompt_ids.device)
        tokens = []
        for _ in range(max_new):
            nxt = torch.multinomial(torch.softmax(logits.float() / temperature, -1), 1).squeeze(1)
            if greedy_first:
                nxt[0] = logits[0].argmax()
            nxt = torch.where(done, torch.full_like(nxt, pad_id), nxt)
            tokens.append(nxt)
            done |= nxt == eos_id
            if bool(done.all()):
                break
            logits = model(nxt[:, None], past_key_values=cache, use_cache=True).logits[:, -1]
    comp = torch.stack(tokens, 1)                                   # (G, L)
    # mask: every token up to and including the first EOS
    is_eos = (comp == eos_id).int()
    mask = (is_eos.cumsum(1) - is_eos) == 0
    return comp, mask


def _engine_groups(engine, prompts: list, prompt_ids: list, G: int, max_new: int, temperature: float,
                   greedy_first: bool, seed: int, pad_id: int, device):
    """The same groups as `_sample_group`, drawn by a policy engine (`ragteam.llm.policy`) already synced to the
    policy: per prompt (completion ids (G, L) padded with `pad_id`, mask, the engine's log-probs (G, L), how many
    completions the budget cut).
    `greedy_first`: completion 0 is the engine's greedy one; its log-probs are NaN (the engine's are those of greedy
    decoding, not of the policy at `temperature`: it is scored as the live trainer scores it, uncorrected). The engine's ids run through EOS when it stopped there,
    as `_sample_group`'s mask does. The engine must have tokenised each prompt as the trainer did (its log-probs are
    recomputed on the trainer's `prompt_ids`): a mismatch is an error naming the prompt, never a silent one."""
    import torch

    from ragteam.llm import SamplingConfig

    n = G - 1 if greedy_first else G
    sampled = engine.generate(prompts, SamplingConfig(max_new_tokens=max_new, temperature=temperature, n=n,
                                                      seed=seed))
    greedy = (engine.generate(prompts, SamplingConfig(max_new_tokens=max_new, temperature=0.0, n=1))
              if greedy_first else [[] for _ in prompts])
    out = []
    for k, (g, s) in enumerate(zip(greedy, sampled)):
        comps = [*g, *s]
        if len(comps) != G:
            raise RuntimeError(f"rollout engine on {engine.model_path}: {len(comps)} completions for prompt {k} of "
                               f"the step, {G} asked")
        for c in comps:
            if c.token_ids is None or c.logprobs is None:
                raise RuntimeError(f"rollout engine on {engine.model_path}: completion without token ids or "
                                   "log-probs; the GRPO loss needs the sampled ids")
            if c.prompt_ids is not None and list(c.prompt_ids) != prompt_ids[k].tolist():
                raise RuntimeError(f"rollout engine on {engine.model_path}: prompt {k} of the step was tokenised "
                                   f"into {len(c.prompt_ids)} ids by the engine and {len(prompt_ids[k])} by the "
                                   "trainer; the loss would score another context")
        L = max(1, max(len(c.token_ids) for c in comps))
        comp = torch.full((G, L), pad_id, dtype=torch.long, device=device)
        mask = torch.zeros((G, L), dtype=torch.bool, device=device)
        elp = torch.zeros((G, L), dtype=torch.float32, device=device)
        for j, c in enumerate(comps):
            m = len(c.token_ids)
            comp[j, :m] = torch.tensor(c.token_ids, dtype=torch.long)
            mask[j, :m] = True
            if m:
                elp[j, :m] = torch.tensor(c.logprobs, dtype=torch.float32)
        if g:   # the greedy completion was not drawn from the policy at `temperature`: no engine log-probs to compare
            elp[0] = float("nan")
        # cut by the budget: the engine knows (it also stops on a generation config's other EOS ids)
        clipped = sum(c.finish_reason == "length" for c in comps)
        out.append((comp, mask, elp, clipped))
    return out


def _group_logps(model, prompt_ids, comp, temperature: float):
    """log π(completion tokens | prompt) for a group, the prompt encoded once (gradients flow through its cache)."""
    import torch

    G = comp.shape[0]
    out_p = model(prompt_ids[None], use_cache=True)
    cache = out_p.past_key_values
    cache.batch_repeat_interleave(G)
    out_c = model(comp, past_key_values=cache, use_cache=False)
    # position t predicts completion token t: the prompt's last logits, then the completion's own shifted
    logits = torch.cat([out_p.logits[:, -1:].expand(G, -1, -1), out_c.logits[:, :-1]], 1).float() / temperature
    return torch.log_softmax(logits, -1).gather(-1, comp[..., None]).squeeze(-1)   # (G, L)


@timed("training")
def train_grpo_shared_prefix(
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
    """GRPO as `ragteam.train.grpo.train_grpo` (which dispatches here) with one prompt pass per group; resumes from
    `ckpt_dir`.

    `callbacks`: objects with `on_step_end(args, state, control)` (e.g. transformers TrainerCallbacks), called after
    each optimiser step before its checkpoint is written. `engine_cfg` (an EngineConfig): how the rollout engine of
    `params.rollout_backend: vllm` is started (threads, vLLM options); required there.
    """
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer, get_scheduler

    from ragteam.train.pg import kl_k3, surrogate, truncated_is_weights

    rows = validate_samples(samples)
    funcs = reward_funcs if isinstance(reward_funcs, list) else [reward_funcs]
    data = [{"prompt": s.prompt, "golden_answers": s.golden_answers, "id": s.id,
             "meta": json.dumps(s.meta, sort_keys=True)} for s in rows]
    # the compute precision: fp32, or on the CPU with LoRA and `llm.dtype: bfloat16` the frozen base in bf16 and the
    # adapters in fp32 (as the joint trainer); full fine-tuning keeps fp32 weights (bf16 rounds small steps away)
    bf16 = params.lora.enabled and engine_cfg is not None and cpu_bf16(engine_cfg.dtype)
    fp = fingerprint(kind="grpo", params=model_params(params), model=model_identity(model_path), data=data,
                     tag=run_tag or {}, trainer="shared_prefix", **({"dtype": "bfloat16"} if bf16 else {}))
    resume = prepare_resume(ckpt_dir, fp)
    torch.manual_seed(params.seed)
    random.seed(params.seed)

    # on the GPU when there is one (rollouts and loss on the same device), else the CPU
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    tok = AutoTokenizer.from_pretrained(model_path)
    model = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.bfloat16 if bf16 else torch.float32)
    model = model.to(device)
    ref = None
    if params.lora.enabled:
        from peft import get_peft_model

        model = get_peft_model(model, lora_config(params.lora, model_path), autocast_adapter_dtype=True)
    elif params.kl_beta > 0:
        ref = (AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32).to(device).eval()
               .requires_grad_(False))
    model.train()
    if params.gradient_checkpointing:
        model.gradient_checkpointing_enable()
    trainable = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(trainable, lr=params.lr, betas=(0.9, 0.999), weight_decay=0.0)
    sched = get_scheduler(params.lr_scheduler, opt, num_warmup_steps=0, num_training_steps=params.steps)
    eos_id, pad_id = tok.eos_token_id, tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id
    prompt_ids = [torch.tensor(tok.apply_chat_template(s.prompt, add_generation_prompt=True, return_dict=True)
                               ["input_ids"], device=device) for s in rows]

    step, history = (0, [])
    if resume:
        step, history = load_train_state(resume, dict(model.named_parameters()), opt, sched, device)
    start_step = step
    t_start = time.perf_counter()
    P, G = params.prompts_per_step, params.num_generations
    nonfinite_run = 0                 # optimiser steps skipped in a row for a NaN/inf gradient
    engine = None
    if params.rollout_backend == "vllm" and step < params.steps:   # a finished run starts no engine
        from ragteam.llm import EngineConfig
        from ragteam.llm.policy import policy_engine

        if engine_cfg is None:
            raise ValueError("GRPO rollout_backend: vllm needs the engine settings (engine_cfg: the llm section)")
        cfg = EngineConfig.model_validate({k: getattr(engine_cfg, k) for k in EngineConfig.model_fields})
        # on a GPU the engine shares the device with the policy, its reference and the optimiser: its own share
        vllm = cfg.vllm.model_copy(update={"gpu_memory_utilization": params.vllm_gpu_memory_utilization})
        cfg = cfg.model_copy(update={"backend": "vllm", "vllm": vllm})
        engine = policy_engine("vllm", model, tok, model_path, cfg, f"{ckpt_dir}/rollout_sync")

    try:
        while step < params.steps:
            t0 = time.perf_counter()
            # prompts of this step: a seeded permutation per epoch, so a resumed run sees the same order
            epoch, pos = divmod(step * P, len(rows))
            order = list(range(len(rows)))
            random.Random(f"{params.seed}:{epoch}").shuffle(order)
            idx = [order[(pos + k) % len(order)] for k in range(P)]

            # 1. rollout: G completions per prompt (no grad), by the policy itself or by an engine given its weights
            model.eval()
            engine_logps = None
            if engine is None:
                groups = [(i, *_sample_group(model, prompt_ids[i], G, params.max_completion_length, params.temperature,
                                             eos_id, pad_id, params.greedy_in_group)) for i in idx]
            else:
                engine.sync(model)
                drawn = _engine_groups(engine, [rows[i].prompt for i in idx], [prompt_ids[i] for i in idx], G,
                                       params.max_completion_length, params.temperature, params.greedy_in_group,
                                       call_seed(params.seed, step), pad_id, device)
                groups = [(i, comp, mask) for i, (comp, mask, _, _) in zip(idx, drawn)]
                engine_logps = [elp for _, _, elp, _ in drawn]
                engine_clipped = sum(c for *_, c in drawn)
            model.train()

            # 2. rewards (TRL's keyword protocol), group-normalised advantages A = (r - mean) / std
            metrics: dict[str, list[float]] = defaultdict(list)
            texts = [[tok.decode(c[m], skip_special_tokens=True) for c, m in zip(comp, mask)] for _, comp, mask in groups]
            rewards = []
            for (i, comp, mask), ys in zip(groups, texts):
                kw = {"prompts": [rows[i].prompt] * G, "completions": [[{"role": "assistant", "content": y}] for y in ys],
                      "completion_ids": [c[m].tolist() for c, m in zip(comp, mask)],
                      "golden_answers": [rows[i].golden_answers] * G, "id": [rows[i].id] * G,
                      "meta": [data[i]["meta"]] * G, "trainer_state": SimpleNamespace(global_step=step),
                      "log_metric": lambda k, v: metrics[k].append(v), "log_extra": lambda *a, **k: None}
                rewards.append(torch.tensor([f(**kw) for f in funcs], dtype=torch.float32).sum(0))
            n_tokens = sum(int(m.sum()) for _, _, m in groups)

            # 3. loss: the surrogate of -A_i · log π(y_it) (+ β·KL) over all tokens, one backward per group (grad accum.)
            opt.zero_grad(set_to_none=True)
            loss_sum, kl_sum = 0.0, 0.0
            diffs: list[float] = []
            isw_means: list[float] = []
            for g, ((i, comp, mask), r) in enumerate(zip(groups, rewards)):
                # TRL's scale_rewards="group": sample std, ε 1e-4 (a group with equal rewards gets A = 0)
                adv = torch.tensor(group_normalized(r.tolist(), [0] * len(r), std="sample", eps=1e-4),
                                   dtype=torch.float32, device=device)
                logp = _group_logps(model, prompt_ids[i], comp, params.temperature)
                isw = None
                if engine_logps is not None:      # the engine's numerics of the same policy: how far, and corrected
                    known = ~torch.isnan(engine_logps[g])                   # the sampled rows (not the greedy one)
                    elp = torch.where(known, engine_logps[g], logp.detach())
                    sampled = mask & known
                    gap = (logp.detach() - elp).abs() * sampled
                    diffs.append(float(gap.sum() / sampled.sum().clamp(min=1)))
                    if params.rollout_is_cap is not None:
                        isw = truncated_is_weights(logp.detach(), elp, mask.float(), params.rollout_is_cap)
                        isw = torch.where(known, isw, mask.float())         # the greedy row: weight 1, whatever the cap
                        isw_means.append(float((isw * sampled).sum() / sampled.sum().clamp(min=1)))
                # pg.py's clipped surrogate, on-policy (old = this policy, detached: r = 1, nothing clipped): the
                # gradient -A·∇log π (× w_t), the same loss the joint trainer's PPO uses
                per_token, _ = surrogate(logp, logp.detach(), adv[:, None], mask, is_weights=isw)
                if params.kl_beta > 0:
                    with torch.no_grad():
                        if ref is None:
                            with model.disable_adapter():
                                ref_logp = _group_logps(model, prompt_ids[i], comp, params.temperature)
                        else:
                            ref_logp = _group_logps(ref, prompt_ids[i], comp, params.temperature)
                    # k3 estimator, as TRL; 0 past a completion's end (exp() of a padded position cannot overflow)
                    kl = kl_k3(logp, torch.where(mask, ref_logp, logp))
                    per_token = per_token + params.kl_beta * kl
                    kl_sum += float((kl.detach() * mask).sum())
                loss = (per_token * mask).sum() / n_tokens
                loss.backward()
                loss_sum += float(loss.detach())
            # the norm before clipping: finite iff every gradient is (a NaN/inf one would be written into the weights)
            grad_norm = float(torch.nn.utils.clip_grad_norm_(trainable, 1.0))
            finite = math.isfinite(grad_norm)
            if finite:
                opt.step()
                nonfinite_run = 0
            else:
                opt.zero_grad(set_to_none=True)
                nonfinite_run += 1
                log.warning("step %d: non-finite gradient (norm %s): optimiser step skipped (%d in a row)", step + 1,
                            grad_norm, nonfinite_run)
                if nonfinite_run >= params.max_nonfinite_grad_steps:
                    raise diverged("grpo", f"non-finite gradients in {nonfinite_run} optimiser steps in a row (up to "
                                           f"step {step + 1}; max_nonfinite_grad_steps {params.max_nonfinite_grad_steps})",
                                   ckpt_dir)
            sched.step()
            step += 1

            r_all = torch.stack(rewards)
            entry = {"loss": loss_sum, "grad_norm": grad_norm, "nonfinite_grad_steps": float(not finite),
                     "learning_rate": sched.get_last_lr()[0],
                     "reward": float(r_all.mean()), "reward_std": float(r_all.std()),
                     "frac_reward_zero_std": float(sum(float(r.std()) < 1e-6 for r in rewards) / len(rewards)),
                     "completions/mean_length": n_tokens / (P * G),
                     "completions/clipped_ratio": (engine_clipped if engine_logps is not None else sum(
                         int((~(c == eos_id).any(1)).sum()) for _, c, _ in groups)) / (P * G),
                     **{k: sum(v) / len(v) for k, v in metrics.items()},
                     "step_time": time.perf_counter() - t0, "step": step}
            if params.kl_beta > 0:
                entry["kl"] = kl_sum / n_tokens
            if diffs:
                entry["engine_logp_abs_diff"] = sum(diffs) / len(diffs)
            if isw_means:
                entry["is_weight_mean"] = sum(isw_means) / len(isw_means)
            history.append(entry)
            log.info("step %d/%d reward %.3f loss %.4f (%.1fs)", step, params.steps, entry["reward"], loss_sum,
                     entry["step_time"])
            for cb in callbacks or []:
                if hasattr(cb, "on_step_end"):
                    cb.on_step_end(None, SimpleNamespace(global_step=step), None)
            if step % params.save_steps == 0 or step == params.steps:
                weights = {n: t.detach().clone() for n, t in model.named_parameters() if t.requires_grad}
                save_train_state(ckpt_dir, step, weights, opt, sched, history, params.save_total_limit, device)
    finally:   # the engine's processes and synced weights go with the run, however it ends
        if engine is not None:
            engine.close()

    model.eval()
    return TrainResult(model=model, tokenizer=tok, log_history=history, global_step=step,
                       seconds=time.perf_counter() - t_start,
                       resumed_from=start_step if resume else None,
                       extra={"fingerprint": fp, "trainer": "shared_prefix"})
