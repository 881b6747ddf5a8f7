"""Stage benchmark: whole training stages under params variants, side by side in one run, with ratios.

`benchmarks/engines.py` times the generation half of a GRPO step; what a user waits for is the stage: model load,
engine start-up, the adapter handed to the engine every step, the loss, the rewards. This runs the stage modules
themselves (`python -m stages.<stage>`, so a stage whose params ask for vLLM re-runs itself in the worker
environment as under `dvc repro`) in a scratch workspace, once per variant, each from an empty checkpoint
directory, and reports wall time and the stage's own training metrics.

The workspace needs what the stages read: `models/llm`, `data/prepared`, `data/indexes` and the synthesis outputs
(`data/synthesis`, from `dvc repro synthesize`); train_query also reads `models/agents/answer`, which the first
train_answer variant writes (later train_answer variants write it again: train_query variants then use the last).
`ragteam/`, `stages/` and `params.yaml` are copied from this checkout.

    python -m benchmarks.train_stages --workspace /tmp/bench \
        --variant train_answer:live --variant 'train_answer:vllm:train_answer.stage1.rollout_backend=vllm,train_answer.stage2.rollout_backend=vllm' ...

A variant is `<stage>:<name>[:<key>=<value>,...]` (dotted params keys, YAML values); a foreach stage is named as
DVC names it (`train_joint@mask`, whose warm-up model `models/warmup/mask` must be there too). Writes
benchmarks/results/<name>.json and .md (`--name`, default train_stages).

A code change is compared the same way: `--code <name>=<git ref>` runs the variants called <name> with the
`ragteam/` and `stages/` of that commit (`git archive`) and the others with this checkout's, one after the other
in the same workspace:

    python -m benchmarks.train_stages --workspace /tmp/bench --code before=HEAD~1 \
        --variant warmup_joint@qagent:before --variant warmup_joint@qagent:after
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import subprocess
import sys
import time
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[1]
OUT = REPO / "benchmarks" / "results"
NEEDS = ("models/llm", "data/prepared", "data/indexes", "data/synthesis")
REPORTED = ("reward_first", "reward_last", "em_last", "steps", "seconds", "loss_first", "loss_last",
            "format_error_rate_after")


def parse_variant(text: str) -> tuple[str, str, dict[str, object]]:
    """`stage:name[:k=v,...]` -> (stage, name, {dotted key: value}); a malformed one is an error naming it."""
    parts = text.split(":", 2)
    if len(parts) < 2 or not parts[0] or not parts[1]:
        raise SystemExit(f"--variant {text!r}: expected <stage>:<name>[:<key>=<value>,...]")
    overrides = {}
    for item in (parts[2].split(",") if len(parts) == 3 and parts[2] else []):
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise SystemExit(f"--variant {text!r}: {item!r} is not <key>=<value>")
        overrides[key] = yaml.safe_load(value)
    return parts[0], parts[1], overrides


def apply(params: dict, overrides: dict[str, object]) -> dict:
    """A copy of `params` with each dotted key set; a key whose parent is missing is an error naming it."""
    out = json.loads(json.dumps(params))
    for key, value in overrides.items():
        node = out
        for part in key.split(".")[:-1]:
            if not isinstance(node.get(part), dict):
                raise SystemExit(f"override {key}: params.yaml has no section {part!r} there")
            node = node[part]
        node[key.split(".")[-1]] = value
    return out


def load_avg() -> float:
    return round(os.getloadavg()[0], 2)


def stage_command(stage: str) -> tuple[list[str], str]:
    """`train_answer` -> (module and args, the stage's metrics/checkpoint name); a foreach stage as DVC names it:
    `train_joint@mask` -> (`stages.train_joint mask`, `train_joint_mask`)."""
    module, _, item = stage.partition("@")
    return ["-m", f"stages.{module}", *([item] if item else [])], f"{module}_{item}" if item else module


def parse_code(items: list[str]) -> dict[str, str]:
    """`--code name=ref` items -> {variant name: git ref}; a malformed item is an error naming it."""
    out = {}
    for item in items:
        name, sep, ref = item.partition("=")
        if not sep or not name or not ref:
            raise SystemExit(f"--code {item!r}: expected <variant name>=<git ref>")
        out[name] = ref
    return out


def export_code(ref: str, dest: Path) -> Path:
    """`ragteam/` and `stages/` of git ref `ref` of this checkout, unpacked under `dest`."""
    dest.mkdir(parents=True, exist_ok=True)
    archive = subprocess.run(["git", "-C", str(REPO), "archive", ref, "ragteam", "stages"], capture_output=True)
    if archive.returncode != 0:
        raise SystemExit(f"--code: git archive {ref!r} failed: {archive.stderr.decode().strip()}")
    subprocess.run(["tar", "-x", "-C", str(dest)], input=archive.stdout, check=True)
    return dest


def install_code(ws: Path, source: Path) -> None:
    """The workspace's `ragteam/` and `stages/` replaced by `source`'s (the stage runs with cwd = workspace)."""
    for d in ("ragteam", "stages"):
        shutil.rmtree(ws / d, ignore_errors=True)
        shutil.copytree(source / d, ws / d, ignore=shutil.ignore_patterns("__pycache__"))


def run_variant(ws: Path, stage: str, name: str, overrides: dict, base: dict, code: Path = REPO,
                ref: str | None = None) -> dict:
    install_code(ws, code)
    (ws / "params.yaml").write_text(yaml.safe_dump(apply(base, overrides), sort_keys=False))
    args, out_name = stage_command(stage)
    shutil.rmtree(ws / "checkpoints" / out_name, ignore_errors=True)
    env = {**os.environ, "PYTHONPATH": str(ws), "OMP_WAIT_POLICY": "PASSIVE",
           "RAGTEAM_WORKER_PYTHON": str(REPO / ".venv-worker" / "bin" / "python")}
    log = ws / f"{out_name}.{name}.log"
    before, t0 = load_avg(), time.perf_counter()
    with open(log, "w") as f:
        rc = subprocess.run([sys.executable, *args], cwd=ws, env=env, stdout=f, stderr=subprocess.STDOUT).returncode
    wall = round(time.perf_counter() - t0, 1)
    if rc != 0:
        raise SystemExit(f"{stage} ({name}) failed with exit {rc}: see {log}")
    metrics = json.loads((ws / "metrics" / f"{out_name}.json").read_text())
    print(f"{stage} {name}: {wall} s", flush=True)
    return {"stage": stage, "variant": name, "overrides": overrides, "code": ref or "this checkout",
            "wall_seconds": wall,
            "load_before": before, "load_after": load_avg(),
            "metrics": {k: metrics.get(k) for k in REPORTED if k in metrics},
            "environment": metrics.get("environment", {}).get("name") or metrics.get("environment", {}).get("env")}


def table(results: list[dict]) -> str:
    lines = ["| stage | variant | code | wall s | ratio to the stage's first variant | training s | "
             "reward (SFT: loss) first → last |", "|---|---|---|---:|---:|---:|---|"]
    first: dict[str, float] = {}
    for r in results:
        base = first.setdefault(r["stage"], r["wall_seconds"])
        m = r["metrics"]
        lines.append(f"| {r['stage']} | {r['variant']} | {r.get('code', 'this checkout')} | {r['wall_seconds']} | "
                     f"{base / r['wall_seconds']:.2f}× | "
                     f"{m.get('seconds', '')} | {m.get('reward_first', m.get('loss_first', ''))} → "
                     f"{m.get('reward_last', m.get('loss_last', ''))} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--workspace", type=Path, required=True)
    ap.add_argument("--variant", action="append", required=True)
    ap.add_argument("--name", default="train_stages")
    ap.add_argument("--code", action="append", default=[], metavar="NAME=REF",
                    help="variants called NAME run the ragteam/ and stages/ of git ref REF")
    args = ap.parse_args(argv)
    variants = [parse_variant(v) for v in args.variant]
    code_refs = parse_code(args.code)
    unknown = sorted(set(code_refs) - {name for _, name, _ in variants})
    if unknown:
        raise SystemExit(f"--code names no variant: {', '.join(unknown)}")
    ws = args.workspace.resolve()
    missing = [p for p in NEEDS if not (ws / p).exists()]
    if missing:
        raise SystemExit(f"{ws}: missing {', '.join(missing)} (link them from a workspace after "
                         "`dvc repro synthesize`)")
    sources = {name: export_code(ref, ws / ".bench-code" / name) for name, ref in code_refs.items()}
    text = (REPO / "params.yaml").read_text()
    base = yaml.safe_load(text)
    own = ws / "params.yaml"
    kept = own.read_text() if own.is_file() else None
    try:
        results = [run_variant(ws, stage, name, ov, base, sources.get(name, REPO), code_refs.get(name))
                   for stage, name, ov in variants]
    finally:                              # the workspace's own params.yaml back, comments and all
        own.write_text(kept if kept is not None else text)
    out = {"machine": {"cpus": os.cpu_count(), "platform": platform.platform()}, "results": results}
    OUT.mkdir(parents=True, exist_ok=True)
    (OUT / f"{args.name}.json").write_text(json.dumps(out, indent=1) + "\n")
    md = (f"# {args.name}: training stages side by side (`python -m benchmarks.train_stages`)\n\n"
          f"{os.cpu_count()} CPUs; each variant from an empty checkpoint directory, engine start-ups included.\n\n"
          f"{table(results)}\n")
    (OUT / f"{args.name}.md").write_text(md)
    print(md)


if __name__ == "__main__":
    main()
