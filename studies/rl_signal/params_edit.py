"""params.yaml for one phase of studies/rl_signal/run.sh (issue 25 §3: RL with more answer signal).

    params_edit.py train <system> <seed> <threads> [key=value ...]
        the RL seed (joint.ppo.seed) and the system's RL at T 0.7, 8 questions a step, 8 steps, from its warm-up
        model; `threads` torch threads (1 when seeds train side by side); extra `joint.<system>.ppo` keys as
        key=value (YAML values), e.g. actor_lr=1e-3 steps=16 kl_coef=0.01
    params_edit.py evaluate <system> <seed> [<seed> ...]
        `evaluate` restricted to <system>_warmup (models/warmup/<system>) and one row per RL seed,
        <system>_rl_seed<k> (models/rl_signal/<system>_seed<k>), each compared with the warm-up row, on the first 40
        questions (the default run's joint rows)
    params_edit.py device <questions> <batch>
        for a GPU host without vLLM (studies/rl_signal/gpu/run.sh): every stage on the HF engine, every eval row
        on the first <questions> questions, <batch> prompts per forward pass
    params_edit.py only <row>
        `evaluate` of the eval row <row> alone, with no comparison (rows scored in parallel processes are compared
        afterwards from their per-question records: studies/rl_signal/gpu/summarize.py)
    params_edit.py dry <system>
        a rehearsal of the GPU harness on a CPU: a 2-step warm-up probed at step 2, one RL step of 2 questions
    params_edit.py warmup <system> <steps> <probe_every>
        the system's warm-up trained to <steps> optimiser steps whatever its format error rate (threshold 0: the
        probes, every <probe_every> steps from warmup.probe_from, are measured and stop nothing)
"""
import sys
from pathlib import Path

import yaml

RECIPE = {"temperature": 0.7, "questions_per_step": 8, "steps": 8}


def _value(text: str):
    """A key=value's value as YAML reads it, except that 1e-3 is a number (YAML 1.1 wants 1.0e-3)."""
    v = yaml.safe_load(text)
    if isinstance(v, str):
        try:
            return float(v)
        except ValueError:
            pass
    return v


PHASES = ("train", "evaluate", "device", "only", "dry", "warmup")


def main(argv: list[str]) -> None:
    phase = argv[0]
    if phase not in PHASES:
        sys.exit(f"params_edit.py: phase {phase!r} is not one of {', '.join(PHASES)}")
    p = Path("params.yaml")
    d = yaml.safe_load(p.read_text())
    system = argv[1]
    if phase in ("train", "evaluate", "dry", "warmup") and system not in d["joint"]["systems"]:
        sys.exit(f"params_edit.py: {system!r} is not in joint.systems {d['joint']['systems']}")
    if phase == "device":
        n, batch = int(argv[1]), int(argv[2])
        d["llm"]["stages"] = dict.fromkeys(d["llm"]["stages"], "hf")
        d["llm"]["batch_size"] = batch
        for row in d["eval"]["systems"].values():
            row["n_questions"] = n
    elif phase == "only":
        if system not in d["eval"]["systems"]:
            sys.exit(f"params_edit.py: {system!r} is not an eval row ({', '.join(d['eval']['systems'])})")
        d["eval"]["systems"] = {system: d["eval"]["systems"][system]}
        d["eval"]["compare"] = []
    elif phase == "dry":
        d["warmup"]["sft"]["steps"] = 2
        d["warmup"]["probe_from"] = d["warmup"]["probe_every"] = 2
        d["joint"][system]["ppo"] = {**(d["joint"][system].get("ppo") or {}), "steps": 1, "questions_per_step": 2}
    elif phase == "warmup":
        steps, every = int(argv[2]), int(argv[3])
        own = d["warmup"].setdefault("systems", {}).setdefault(system, {}) or {}
        own.update({"format_threshold": 0.0, "probe_every": every, "sft": {**own.get("sft", {}), "steps": steps}})
        d["warmup"]["systems"][system] = own
    elif phase == "train":
        seed, threads = int(argv[2]), int(argv[3])
        extra = {k: _value(v) for k, v in (a.split("=", 1) for a in argv[4:])}
        d["joint"]["ppo"]["seed"] = seed
        d["joint"][system]["ppo"] = {**(d["joint"][system].get("ppo") or {}), **RECIPE, **extra}
        d["llm"]["threads"] = threads
    else:  # evaluate
        warm = f"{system}_warmup"
        rows = {warm: {"workflow": system, "model": f"models/warmup/{system}", "n_questions": 40}}
        for seed in argv[2:]:
            rows[f"{system}_rl_seed{seed}"] = {"workflow": system, "model": f"models/rl_signal/{system}_seed{seed}",
                                                "n_questions": 40}
        d["eval"]["systems"] = rows
        d["eval"]["compare"] = [[name, warm] for name in rows if name != warm]
    p.write_text(yaml.safe_dump(d, sort_keys=False))


if __name__ == "__main__":
    main(sys.argv[1:])
