"""Why DECOR's RL step drops every group, and whether a lower rollout temperature would give it signal (issue 25).

DECOR's rollouts sample at `joint.ppo.temperature` (1.0). After the format warm-up the greedy format error rate on
held-out questions is 17 %, but the lock's `train_joint@decor` saw 73-80 % of sampled calls fail the format gate
and dynamic sampling kept no group: every trajectory of a group failed the same way, so no role's return varied.
This rolls the warm-up model out exactly as the trainer does (`decor_system`: G = decor.group_size trajectories per
question, a malformed call truncates its trajectory, Eq. 2-3 rewards with the params' judge, the frozen summarizer on
the base model) on the training questions at several temperatures, and reports per temperature: the sampled format
error rate per role, the share of trajectories that pass the gate end to end, the share of groups dynamic sampling
keeps (`ragteam.train.decor_adv.dynamic_sampling`), and the mean team reward.

    .venv-worker/bin/python studies/decor_temperature/decor_temperature.py --model models/warmup/decor --n 16 \\
        --temperatures 1.0 0.7 0.5 --out studies/decor_temperature/decor_temperature.json     # in a checkout after `dvc repro`
"""
from __future__ import annotations

import argparse
import os
import time
from collections import Counter
from pathlib import Path

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

from ragteam.config import load_params, parse_section  # noqa: E402
from ragteam.data.formats import load_qa  # noqa: E402
from ragteam.io import write_json  # noqa: E402
from ragteam.llm import LLMConfig, Team, call_seed, load_engine  # noqa: E402
from ragteam.retrieval import open_retriever  # noqa: E402
from ragteam.systems.decor import roles as D  # noqa: E402
from ragteam.systems.decor import decor_system  # noqa: E402
from ragteam.train.decor_adv import dynamic_sampling, role_returns  # noqa: E402


def measure(episodes) -> dict:
    calls = [c for e in episodes for c in e.calls if c.role in D.POLICY_ROLES]
    per_role = {}
    for role in D.POLICY_ROLES:
        rc = [c for c in calls if c.role == role]
        why = Counter(c.format_error for c in rc if c.format_error)
        cut = sum(c.finish_reason == "length" for c in rc if c.format_error)   # ran out of its token budget
        per_role[role] = {"calls": len(rc), "format_error_rate": round(sum(why.values()) / len(rc), 4) if rc else None,
                          "errors_cut_at_budget": cut, "reasons": dict(why.most_common(3))}
    groups = {e.question_id for e in episodes}
    kept = {e.question_id for e in dynamic_sampling(episodes, lambda e: role_returns(e, D.POLICY_ROLES))}
    clean = [e for e in episodes if not any(c.format_error for c in e.calls)]
    return {"calls": len(calls), "format_error_rate": round(sum(bool(c.format_error) for c in calls) / len(calls), 4),
            "per_role": per_role, "trajectories": len(episodes),
            "trajectories_without_format_error": round(len(clean) / len(episodes), 4),
            "groups": len(groups), "groups_kept": len(kept), "groups_kept_share": round(len(kept) / len(groups), 4),
            "mean_team_reward": round(sum(e.meta["reward"]["team"] for e in episodes) / len(episodes), 4),
            "format_ok_share": round(sum(bool(e.meta["reward"]["format_ok"]) for e in episodes) / len(episodes), 4)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="models/warmup/decor", help="the policy (the warm-up's model)")
    ap.add_argument("--questions", type=Path, default=Path("data/prepared/train/pool.jsonl"))
    ap.add_argument("--n", type=int, default=16, help="the first n training questions (what RL rolls out)")
    ap.add_argument("--temperatures", type=float, nargs="+", default=[1.0, 0.7, 0.5])
    ap.add_argument("--params", type=Path, default=Path("params.yaml"))
    ap.add_argument("--backend", default="vllm", choices=["vllm", "hf"])
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args()

    params = load_params(args.params)
    llm = parse_section(params, "llm", LLMConfig).model_copy(update={"backend": args.backend})
    joint = params["joint"]
    system = decor_system(params, open_retriever(joint["retriever"]))
    rows = load_qa(args.questions)[: args.n]
    policy, base = load_engine(args.model, llm), load_engine(llm.model, llm)
    default = llm.sampling.get("default")
    results = {"model": args.model, "questions": args.n, "group_size": params["decor"]["group_size"],
               "backend": args.backend, "top_p": joint["ppo"].get("top_p", 1.0), "by_temperature": {}}
    try:
        for i, t in enumerate(args.temperatures):
            sampling = {r: (llm.sampling.get(r) or default).model_copy(update={"temperature": t, "top_p": 1.0, "n": 1})
                        for r in D.POLICY_ROLES}
            sampling[D.SUMMARIZER] = llm.sampling.get(D.SUMMARIZER) or default
            team = Team(lambda role: base if role == D.SUMMARIZER else policy, sampling,
                        seed=call_seed(args.seed, i), keep_token_ids=True)
            t0 = time.perf_counter()
            eps = system.annotate(system.rollout(rows, team))
            res = {**measure(eps), "seconds": round(time.perf_counter() - t0, 1)}
            results["by_temperature"][str(t)] = res
            roles = ", ".join(f"{r} {v['format_error_rate']}" for r, v in res["per_role"].items())
            print(f"T {t}: sampled format errors {res['format_error_rate']:.2f} ({roles}), "
                  f"clean trajectories {res['trajectories_without_format_error']:.2f}, groups kept "
                  f"{res['groups_kept']}/{res['groups']}, mean R_team {res['mean_team_reward']:.3f} "
                  f"({res['seconds']} s)", flush=True)
    finally:
        for e in (policy, base):
            if hasattr(e, "close"):
                e.close()
    write_json(args.out, results)


if __name__ == "__main__":
    main()
