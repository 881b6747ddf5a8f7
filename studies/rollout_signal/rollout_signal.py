"""Does a joint system's RL reward carry an answer signal? (issue 25 §3: find out from the curves why RL gains nothing)

The lock's `train_joint@mask`, `@jade` and `@decor` curves show episode F1 0 at every step: the rollouts, sampled at
`joint.ppo.temperature` 1.0 from the warm-up's policy, never answered a training question right, so the only reward
that varied was the format penalty, and RL could only learn formats. This rolls a system's start policy (its
warm-up model) out exactly as `train_joint@<system>` does (`ragteam.systems.registry.build_joint`: the training-mode
workflow, the system's own rewards, frozen roles on the backbone) on the first n training questions, each `--repeat`
times (a system with its own groups, DECOR, samples its G itself), at several temperatures, and reports per
temperature: the share of episodes whose final answer scores F1 > 0, the mean episode F1, the mean call reward, the
mean within-question standard deviation of the episode reward (what a group or a critic has to learn from), and the
sampled format error rate.

    .venv-worker/bin/python studies/rollout_signal/rollout_signal.py mask --model models/warmup/mask --n 16 --repeat 2 \\
        --temperatures 1.0 0.7 0.3 --out studies/rollout_signal/mask.json   # in a checkout after `dvc repro`
"""
from __future__ import annotations

import argparse
import dataclasses
import os
import statistics
import time
from collections import defaultdict
from pathlib import Path

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

from ragteam.config import load_params, parse_section  # noqa: E402
from ragteam.data.formats import load_qa  # noqa: E402
from ragteam.metrics import f1_score  # noqa: E402
from ragteam.io import write_json  # noqa: E402
from ragteam.llm import LLMConfig, Team, call_seed, load_engine  # noqa: E402
from ragteam.retrieval import open_retriever  # noqa: E402
from ragteam.systems.registry import build_joint  # noqa: E402


def measure(episodes, roles) -> dict:
    """The answer signal of a batch of episodes (rewards already annotated by the system)."""
    f1 = [f1_score(e.final_answer or "", e.golden_answers) for e in episodes]
    calls = [c for e in episodes for c in e.calls if c.role in roles]
    rewards = [c.reward for c in calls if c.reward is not None]

    def episode_reward(e) -> float:
        rs = [c.reward for c in e.calls if c.role in roles and c.reward is not None]
        return sum(rs) / len(rs) if rs else 0.0

    by_q: dict[str, list[float]] = defaultdict(list)
    for e in episodes:
        by_q[e.question_id].append(episode_reward(e))
    spreads = [statistics.pstdev(v) for v in by_q.values() if len(v) > 1]
    return {"episodes": len(episodes), "questions": len(by_q),
            "answered_share": round(sum(bool((e.final_answer or "").strip()) for e in episodes) / len(episodes), 4),
            "f1_positive_share": round(sum(x > 0 for x in f1) / len(f1), 4),
            "episode_f1_mean": round(sum(f1) / len(f1), 4),
            "call_reward_mean": round(sum(rewards) / len(rewards), 4) if rewards else None,
            "within_question_reward_sd": round(sum(spreads) / len(spreads), 4) if spreads else None,
            "questions_with_reward_spread": sum(s > 0 for s in spreads),
            "format_error_rate": round(sum(c.format_error is not None for c in calls) / len(calls), 4) if calls else None}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("system", choices=["mask", "jade", "decor"])
    ap.add_argument("--model", help="the policy (default: models/warmup/<system>)")
    ap.add_argument("--questions", type=Path, default=Path("data/prepared/train/pool.jsonl"))
    ap.add_argument("--n", type=int, default=16, help="the first n training questions (what RL rolls out first)")
    ap.add_argument("--repeat", type=int, default=2, help="rollouts per question (DECOR: 1, it samples its own G)")
    ap.add_argument("--temperatures", type=float, nargs="+", default=[1.0, 0.7, 0.3])
    ap.add_argument("--params", type=Path, default=Path("params.yaml"))
    ap.add_argument("--backend", default="vllm", choices=["vllm", "hf"])
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args()
    if args.n < 1 or args.repeat < 1:
        ap.error("--n and --repeat must be >= 1")

    params = load_params(args.params)
    llm = parse_section(params, "llm", LLMConfig).model_copy(update={"backend": args.backend})
    model = args.model or f"models/warmup/{args.system}"
    system = build_joint(args.system, params, open_retriever(params["joint"]["retriever"]))
    frozen = {r: p or llm.model for r, p in system.frozen_roles.items()}     # as train_joint: on the backbone
    system = dataclasses.replace(system, frozen_roles=frozen)
    rows = [r for r in load_qa(args.questions)[: args.n] for _ in range(args.repeat)]
    policy = load_engine(model, llm)
    others = {p: load_engine(p, llm) for p in set(frozen.values())}
    default = llm.sampling.get("default")
    top_p = (params["joint"]["ppo"] or {}).get("top_p", 1.0)
    results = {"system": args.system, "model": model, "questions": args.n, "repeat": args.repeat,
               "backend": args.backend, "top_p": top_p, "by_temperature": {}}
    try:
        for i, t in enumerate(args.temperatures):
            sampling = {r: (llm.sampling.get(r) or default).model_copy(update={"temperature": t, "top_p": top_p,
                                                                              "n": 1}) for r in system.roles}
            sampling.update({r: llm.sampling.get(r) or default for r in frozen})
            team = Team(lambda role: others[frozen[role]] if role in frozen else policy, sampling,
                        seed=call_seed(args.seed, i), keep_token_ids=True)
            t0 = time.perf_counter()
            eps = system.annotate(system.rollout(rows, team))
            res = {**measure(eps, set(system.roles)), "seconds": round(time.perf_counter() - t0, 1)}
            results["by_temperature"][str(t)] = res
            print(f"{args.system} T {t}: F1 > 0 in {res['f1_positive_share']:.2f} of {res['episodes']} episodes "
                  f"(mean F1 {res['episode_f1_mean']:.3f}), call reward {res['call_reward_mean']}, within-question "
                  f"reward sd {res['within_question_reward_sd']} ({res['questions_with_reward_spread']} of "
                  f"{res['questions']} questions vary), format errors {res['format_error_rate']} "
                  f"({res['seconds']} s)", flush=True)
    finally:
        for e in (policy, *others.values()):
            if hasattr(e, "close"):
                e.close()
    write_json(args.out, results)


if __name__ == "__main__":
    main()
