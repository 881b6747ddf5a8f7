"""The joint trainer's update (steps 4-6 of `ragteam.train.joint.loop`) with and without `reuse_frozen_layers`, side by side.

The samples are a system's oracle traces (`data/warmup/<system>/traces.jsonl`, the prompts the rollouts send, byte
for byte): the calls of the first `--questions` questions, one rollout batch, with rewards ±1 drawn from a fixed
seed (the update's cost does not depend on them). Both runs start from the same weights (the model's, LoRA adapters
initialised from one seed) and make the same update; the report gives each run's seconds, their ratio, and the
largest difference between the two runs' trained weights and step statistics, which should be float noise.

    python -m benchmarks.ppo_update --system mask --questions 8 --minibatch-size 32 [--model models/warmup/mask]

Writes benchmarks/results/ppo_update_<system>_<questions>q.json and .md (or --out).
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import random
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def load_samples(tok, traces: Path, questions: int, seed: int = 0):
    """One Sample per trace row of the first `questions` question ids, episodes numbered by question."""
    from ragteam.records import AgentCall
    from ragteam.train.joint.batch import Sample, tokenize_call

    if not traces.is_file():
        sys.exit(f"{traces}: no oracle traces; run `dvc repro oracle_traces@<system>` first")
    rows = [json.loads(line) for line in traces.read_text().splitlines() if line.strip()]
    order: dict[str, int] = {}
    for r in rows:
        if r["question_id"] not in order and len(order) < questions:
            order[r["question_id"]] = len(order)
    rng = random.Random(seed)
    out, calls = [], {}
    for r in rows:
        ep = order.get(r["question_id"])
        if ep is None:
            continue
        call = AgentCall(role=r["role"], prompt=r["messages"], response=r["response"],
                         finish_reason="stop" if r.get("eos", True) else "length")
        prompt_ids, response_ids = tokenize_call(tok, call)
        k = calls.setdefault(ep, 0)
        calls[ep] = k + 1
        out.append(Sample(ep, k, r["role"], prompt_ids, response_ids, rng.choice([-1.0, 1.0])))
    return out


def cpu_name() -> str:
    """The CPU's model name and family/model numbers (/proc/cpuinfo): timings differ 2-3.5x between the EPYCs
    this project's machines get."""
    info = {}
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            k, _, v = line.partition(":")
            info.setdefault(k.strip(), v.strip())
    except OSError:
        return platform.machine()
    return f"{info.get('model name', '?')} (family {info.get('cpu family', '?')}, model {info.get('model', '?')})"


def run_update(system, model: str, samples_fn, p):
    """(seconds, stats, trainable weights) of one `_update` from freshly built, seeded weights."""
    from types import SimpleNamespace

    import torch

    from ragteam.train.joint.actor_critic import _build_actor_critic, make_optimizer, start_logp
    from ragteam.train.joint.update import _update

    torch.manual_seed(p.seed)
    ac = _build_actor_critic(model, p, "cpu", torch.float32, with_critic=system.critic)
    samples = samples_fn()
    accel = SimpleNamespace(backward=lambda loss: loss.backward(), clip_grad_norm_=torch.nn.utils.clip_grad_norm_)
    t0 = time.perf_counter()
    stats = _update(system, p, samples, [], ac, ac, make_optimizer(ac, p), accel,
                    lambda batch, hidden=None: start_logp(ac, None, p, batch, hidden), 0, "cpu", 0, None)
    seconds = time.perf_counter() - t0
    weights = {n: t.detach().clone() for n, t in ac.named_parameters() if t.requires_grad}
    return seconds, stats, weights, ac.split


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--system", default="mask", choices=["mask", "jade"])
    ap.add_argument("--questions", type=int, default=8, help="questions in the rollout batch (M-ASK trial: 8)")
    ap.add_argument("--minibatch-size", type=int, default=32)
    ap.add_argument("--micro-batch-size", type=int, default=4)
    ap.add_argument("--model", default=None, help="default: models/warmup/<system>, else models/llm")
    ap.add_argument("--traces", default=None, help="default: data/warmup/<system>/traces.jsonl")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out", default=None)
    a = ap.parse_args(argv)

    import torch
    import yaml
    from transformers import AutoTokenizer

    from ragteam.train.joint.params import PPOParams
    from ragteam.systems.mask import mask_system, jade_system

    torch.set_num_threads(a.threads)
    params = yaml.safe_load((REPO / "params.yaml").read_text())
    model = a.model or next((str(m) for m in (REPO / "models/warmup" / a.system, REPO / "models/llm")
                             if (m / "config.json").is_file()), None)
    if model is None:
        sys.exit("no model: run `dvc repro warmup_joint@<system>` (or prepare_models), or pass --model")
    traces = Path(a.traces or REPO / "data/warmup" / a.system / "traces.jsonl")
    tok = AutoTokenizer.from_pretrained(model)
    system = (mask_system if a.system == "mask" else jade_system)(params, None)
    base = {**params["joint"]["ppo"], **(params["joint"][a.system].get("ppo") or {}),
            "minibatch_size": a.minibatch_size, "micro_batch_size": a.micro_batch_size}
    runs = {}
    for reuse in (False, True):
        p = PPOParams(**{**base, "reuse_frozen_layers": reuse})
        seconds, stats, weights, split = run_update(system, model, lambda: load_samples(tok, traces, a.questions), p)
        runs[reuse] = {"seconds": seconds, "stats": stats, "weights": weights, "split": split}
        print(f"reuse_frozen_layers={reuse}: {seconds:.1f} s (split {split})", flush=True)
    samples = load_samples(tok, traces, a.questions)
    off, on = runs[False], runs[True]
    dw = max(float((on["weights"][n] - off["weights"][n]).abs().max()) for n in off["weights"])
    dstat = {k: max(abs(x - y) for x, y in zip(on["stats"][k], off["stats"][k])) for k in off["stats"]
             if k in on["stats"] and len(on["stats"][k]) == len(off["stats"][k])}
    report = {
        "system": a.system, "model": model, "traces": str(traces), "questions": a.questions, "calls": len(samples),
        "tokens": sum(len(s.prompt_ids) + len(s.response_ids) for s in samples),
        "minibatch_size": a.minibatch_size, "micro_batch_size": a.micro_batch_size,
        "single_pass": a.minibatch_size >= len(samples) and base.get("kl_coef", 0) == 0,
        "frozen_layers": on["split"], "threads": a.threads, "cpu": cpu_name(),
        "cores": os.cpu_count(),
        "seconds_full_forward": round(off["seconds"], 1), "seconds_reuse": round(on["seconds"], 1),
        "speedup": round(off["seconds"] / on["seconds"], 2),
        "max_abs_weight_diff": dw, "max_abs_stat_diff": dstat,
    }
    out = Path(a.out or REPO / "benchmarks/results" / f"ppo_update_{a.system}_{a.questions}q")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_suffix(".json").write_text(json.dumps(report, indent=2) + "\n")
    out.with_suffix(".md").write_text(
        f"# The joint update with and without reuse_frozen_layers ({a.system}, {a.questions} questions)\n\n"
        f"`python -m benchmarks.ppo_update {' '.join(argv if argv is not None else sys.argv[1:])}` on "
        f"{report['cpu']}, {report['cores']} cores ({a.threads} threads), model `{model}`.\n\n"
        f"| | seconds | |\n|---|---:|---|\n"
        f"| every pass runs all layers | {report['seconds_full_forward']} | |\n"
        f"| frozen layers 0-{(on['split'] or 0) - 1} once | {report['seconds_reuse']} | "
        f"**{report['speedup']}x** |\n\n"
        f"{report['calls']} calls, {report['tokens']} tokens, single pass: {report['single_pass']}. Largest "
        f"difference between the two runs: {dw:.2e} in a trained weight, "
        f"{max(dstat.values(), default=0):.2e} in a step statistic.\n")
    print(json.dumps({k: v for k, v in report.items() if k != "max_abs_stat_diff"}, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
