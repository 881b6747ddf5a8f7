"""Replicate the MAPS training stages over seeds where DVC is not installed (e.g. a bare GPU worker).

What `dvc exp run $(python -m studies flags SEED)` does for each seed, run by hand: every seed gets a workspace
(this checkout's `ragteam/`, `stages/` and `params.yaml` with the seed flags and `--set` overrides applied; the
shared inputs `data/prepared`, `data/indexes`, `data/synthesis` and `models/llm` linked read-only from SOURCE),
and runs the stages downstream of `synthesize` in DAG order: train_answer, train_query, label_judge, train_judge,
evaluate_agents. Seeds run in parallel (`--jobs`). Each seed's metrics land in OUT/seed<K>/ and its evaluate_agents
output as OUT/seed<K>.json + OUT/seed<K>.questions.json, the layout `python -m studies summarize --metrics` reads;
the summary goes to OUT/replicate.md and OUT/replicate.json.

    python studies/replicate_mirror/replicate_maps_seeds.py --source . --out /tmp/rep --seeds 0 1 2 --jobs 3

A stage that fails stops its seed (its log is OUT/seed<K>/<stage>.log) and the script exits 1 naming it.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from studies.replicate import TRAINING_SEEDS  # noqa: E402

STAGES = ("train_answer", "train_query", "label_judge", "train_judge", "evaluate_agents")
OPTIONAL = ("evaluate",)          # the team: MAPS rows of the evaluate stage with this seed's agents (--stages)
SHARED = ("data/prepared", "data/indexes", "data/synthesis", "models/llm")
KEEP = ("metrics", "reports/eval_agents.md", "reports/eval.md", "reports/training", "data/judge/t3_judge.jsonl",
        "models/agents/answer/README.md", "models/agents/query/README.md", "models/agents/judge/README.md")


def set_key(params: dict, dotted: str, value) -> None:
    node = params
    *path, last = dotted.split(".")
    for k in path:
        if not isinstance(node.get(k), dict):
            raise SystemExit(f"--set {dotted}: {k!r} is not a section of params.yaml")
        node = node[k]
    if last not in node:
        raise SystemExit(f"--set {dotted}: no such key in params.yaml")
    node[last] = value


def workspace(source: Path, work: Path, seed: int, overrides: list[tuple[str, object]]) -> Path:
    if work.exists():
        shutil.rmtree(work)
    work.mkdir(parents=True)
    for d in ("ragteam", "stages"):
        shutil.copytree(REPO / d, work / d, ignore=shutil.ignore_patterns("__pycache__"))
    for rel in SHARED:
        (work / rel).parent.mkdir(parents=True, exist_ok=True)
        if not (source / rel).exists():
            raise SystemExit(f"{source / rel}: missing (run the upstream stages first: dvc repro synthesize)")
        (work / rel).symlink_to((source / rel).resolve())
    params = yaml.safe_load((REPO / "params.yaml").read_text())
    for k in TRAINING_SEEDS:
        set_key(params, k, seed)
    for k, v in overrides:
        set_key(params, k, v)
    (work / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    return work


def run_seed(source: Path, out: Path, seed: int, overrides, env: dict,
             stages: tuple[str, ...] = STAGES) -> tuple[int, str | None, float]:
    t0 = time.perf_counter()
    work = workspace(source, out / "work" / f"seed{seed}", seed, overrides)
    logs = out / f"seed{seed}"
    logs.mkdir(parents=True, exist_ok=True)
    for stage in stages:
        with open(logs / f"{stage}.log", "w") as log:
            print(f"seed {seed}: {stage} ...", flush=True)
            done = subprocess.run([sys.executable, "-m", f"stages.{stage}"], cwd=work, stdout=log,
                                  stderr=subprocess.STDOUT, env={**env, "PYTHONPATH": f"{work}{os.pathsep}"
                                                                 f"{env.get('PYTHONPATH', '')}"})
        if done.returncode:
            return seed, stage, time.perf_counter() - t0
    for rel in KEEP:
        src = work / rel
        if src.is_dir():
            shutil.copytree(src, logs / rel, dirs_exist_ok=True)
        elif src.is_file():
            (logs / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, logs / rel)
    if "evaluate_agents" in stages:
        shutil.copy2(work / "metrics/eval_agents.json", out / f"seed{seed}.json")
        shutil.copy2(work / "results/eval_agents/questions.json", out / f"seed{seed}.questions.json")
    if "evaluate" in stages:
        shutil.copy2(work / "metrics/eval.json", out / f"seed{seed}.eval.json")
        if (work / "metrics/eval_compare.json").exists():
            shutil.copy2(work / "metrics/eval_compare.json", out / f"seed{seed}.eval_compare.json")
    return seed, None, time.perf_counter() - t0


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--source", type=Path, default=Path("."), help="workspace with the shared inputs (after synthesize)")
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--jobs", type=int, default=1, help="seeds run at once")
    ap.add_argument("--stages", nargs="+", default=list(STAGES), choices=[*STAGES, *OPTIONAL],
                    help="stages to run, in this order (default: the five up to evaluate_agents); add `evaluate` for "
                         "the team rows, restricted with --set eval.systems=... / eval.benchmarks=...")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                    help="a params.yaml override for every seed (YAML value), e.g. eval_agents.n_questions=100")
    a = ap.parse_args(argv)
    overrides = []
    for item in a.set:
        k, sep, v = item.partition("=")
        if not sep:
            raise SystemExit(f"--set {item!r}: expected KEY=VALUE")
        overrides.append((k, yaml.safe_load(v)))
    a.out.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "OMP_WAIT_POLICY": os.environ.get("OMP_WAIT_POLICY", "PASSIVE")}
    with ThreadPoolExecutor(a.jobs) as pool:
        results = list(pool.map(lambda s: run_seed(a.source.resolve(), a.out, s, overrides, env, tuple(a.stages)),
                                a.seeds))
    for seed, failed, secs in results:
        print(f"seed {seed}: {'FAILED at ' + failed if failed else 'done'} in {secs:.0f} s", flush=True)
    (a.out / "runs.json").write_text(json.dumps(
        {"seeds": a.seeds, "overrides": a.set, "stages": a.stages,
         "results": [{"seed": s, "failed_stage": f, "seconds": round(t, 1)} for s, f, t in results]}, indent=1))
    failed = [(s, f) for s, f, _ in results if f]
    if failed:
        sys.exit(f"failed: {', '.join(f'seed {s} at {f} (log: {a.out}/seed{s}/{f}.log)' for s, f in failed)}")
    if "evaluate_agents" not in a.stages:
        return
    subprocess.run([sys.executable, "-m", "studies", "summarize",
                    *[x for s in a.seeds for x in ("--metrics", str(a.out / f"seed{s}.json"))],
                    "--out-md", str(a.out / "replicate.md"), "--out-json", str(a.out / "replicate.json")],
                   check=True, cwd=REPO)


if __name__ == "__main__":
    main()
