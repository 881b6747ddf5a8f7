"""The joint systems on `mirror:../shared/data`: train each with its own stage, then untrained vs trained on held-out
dev questions of HotpotQA and 2Wiki, with 95 % bootstrap intervals and the paired difference (issues 12-15).

Run in a workspace whose params.yaml has `data.source: mirror:<dir>` and whose `prepare_models`, `prepare_data` and
`index_bm25@bm25s` outputs exist (`dvc repro index_bm25@bm25s prepare_models`):

    python studies/joint_mirror/joint_mirror.py --systems jade mask decor qagent --n 100 --out studies/joint_mirror

Per system it runs `python -m stages.train_joint <system>` (the DAG's own stage and params: `joint.*`, the system's
section, `llm`), then the `evaluate` stage's `run()` on the pair (`<system>` on the base model vs `<system>_trained`;
QAgent in the plug-in setting of its Table 2, both with the same frozen generator), writing
`<out>/<system>/{eval.md, eval.json, compare.json, train.json}` and `<out>/summary.json`.

Before evaluating the trained system it compares the trained weights with the base model's: when every training
rollout failed the format gate, rewards are constant and a critic-free estimator (DECOR's per-role groups, QAgent's
GRPO groups) gives every call advantage 0, so the update is exactly zero and the checkpoint IS the base model. Greedy
decoding then gives the same outputs by construction; with `--skip-identical` that pair is not evaluated twice and
the summary records why.
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

PAIRS = {"mask": ("mask", "mask_trained"), "jade": ("jade", "jade_trained"), "decor": ("decor", "decor_trained"),
         "qagent": ("qagent_plugin", "qagent_plugin_trained")}


def max_weight_diff(a: Path, b: Path) -> float:
    """Largest absolute difference over the tensors two safetensors checkpoints share (inf if their names differ)."""
    from safetensors.torch import load_file

    wa, wb = load_file(str(a / "model.safetensors")), load_file(str(b / "model.safetensors"))
    if set(wa) - {"lm_head.weight"} != set(wb) - {"lm_head.weight"}:
        return float("inf")
    return max(float((wa[k].float() - wb[k].float()).abs().max()) for k in wa if k in wb)


def lj_intervals(results: Path, system: str, benchmarks: list[str], resamples: int = 10_000) -> dict:
    """95 % bootstrap interval of LJ per benchmark and of their unweighted average, from the per-question
    `metrics.lj` of results/<system>/<benchmark>.jsonl (the evaluate report gives intervals for EM and F1 only);
    {} for a system without LJ (LJ is scored for DECOR systems by default)."""
    from ragteam.eval.stats import mean_ci
    from ragteam.io import load_jsonl

    per = {}
    for b in benchmarks:
        rows = load_jsonl(results / system / f"{b}.jsonl")
        if not rows or any("lj" not in r["metrics"] for r in rows):
            return {}
        per[b] = [float(r["metrics"]["lj"]) for r in rows]
    ivs = {b: mean_ci(x, resamples=resamples) for b, x in per.items()}
    ivs["avg"] = mean_ci([v for b in benchmarks for v in per[b]], [len(per[b]) for b in benchmarks],
                         resamples=resamples)
    return {b: [iv.lo, iv.hi] for b, iv in ivs.items()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--systems", nargs="+", default=list(PAIRS), choices=list(PAIRS))
    ap.add_argument("--n", type=int, default=100, help="held-out dev questions per benchmark")
    ap.add_argument("--benchmarks", nargs="+", default=["hotpotqa", "2wikimultihopqa"])
    ap.add_argument("--out", type=Path, default=Path("studies/joint_mirror"))
    ap.add_argument("--skip-train", action="store_true", help="use the existing models/agents/<system>")
    ap.add_argument("--skip-identical", action="store_true",
                    help="do not evaluate a trained checkpoint whose weights equal the base model's")
    args = ap.parse_args()

    from ragteam.config import load_params, parse_section
    from ragteam.eval.evaluate import EvalConfig, WorkflowConfigs
    from ragteam.llm import EnginePool, LLMConfig
    from stages import evaluate

    params = load_params()
    if not str(params["data"]["source"]).startswith("mirror:"):
        sys.exit(f"params.yaml data.source is {params['data']['source']!r}: this study runs on mirror:<dir>")
    llm = parse_section(params, "llm", LLMConfig)
    base = parse_section(params, "eval", EvalConfig)
    summary_path = args.out / "summary.json"
    summary = json.loads(summary_path.read_text()) if summary_path.exists() else {}
    engines = EnginePool(llm)
    for system in args.systems:
        untrained, trained = PAIRS[system]
        out = args.out / system
        out.mkdir(parents=True, exist_ok=True)
        t0 = time.perf_counter()
        if not args.skip_train:
            subprocess.run([sys.executable, "-m", "stages.train_joint", system], check=True)
        train_seconds = round(time.perf_counter() - t0, 1)
        train_metrics = json.loads(Path(f"metrics/train_joint_{system}.json").read_text())
        (out / "train.json").write_text(json.dumps(train_metrics, indent=1))
        ckpt = Path(f"models/agents/{system}")
        diff = max_weight_diff(Path(llm.model), ckpt)
        identical = diff == 0.0
        systems = {untrained: base.systems[untrained]}
        if not (identical and args.skip_identical):
            systems[trained] = base.systems[trained]
        ev = base.model_copy(update={"benchmarks": args.benchmarks, "n_questions": args.n, "systems": systems,
                                     "compare": None})
        t1 = time.perf_counter()
        metrics = evaluate.run(llm, WorkflowConfigs.from_params(params, ev.baselines), ev,
                               results=out / "results", report=out / "eval.md", figures=out / "figures",
                               engines=engines, differences=out / "compare.json")
        (out / "eval.json").write_text(json.dumps(metrics, indent=1))
        summary[system] = {
            "untrained": untrained, "trained": trained, "n_per_benchmark": args.n, "benchmarks": args.benchmarks,
            "train_seconds_wall": train_seconds, "eval_seconds_wall": round(time.perf_counter() - t1, 1),
            "max_abs_weight_diff_vs_base": diff, "trained_weights_identical_to_base": identical,
            "trained_evaluated": trained in systems,
            "format_error_rate_train_first_last": [train_metrics.get("format_error_rate_first"),
                                                   train_metrics.get("format_error_rate_last")],
            "scores": {s: {b: {k: metrics[s][b].get(k) for k in ("n", "em", "f1", "em_ci", "f1_ci", "acc", "lj",
                                                                   "retrieval_calls", "llm_calls",
                                                                   "format_error_rate")}
                           for b in metrics[s]} for s in metrics},
            "compare": json.loads((out / "compare.json").read_text()),
        }
        for s in systems:
            for b, ci in lj_intervals(out / "results", s, args.benchmarks).items():
                summary[system]["scores"][s][b]["lj_ci"] = ci
        summary_path.write_text(json.dumps(summary, indent=1))
        print(f"joint_mirror: {system} done: weights diff {diff:.3g}, {json.dumps(summary[system]['scores'])[:300]}",
              flush=True)


if __name__ == "__main__":
    main()
