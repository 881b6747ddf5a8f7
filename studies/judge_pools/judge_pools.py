"""Judge study (issue 10): does the judge reach > 60 % balanced accuracy when it is trained on more candidates that
look like the ones it is tested on?

Why this lever. `evaluate_agents` tests the judge on held-out questions with ONE retrieval pool each (the question
as the query, top 3), and the reference is whether the trained answer agent's greedy answer over that pool is right.
On `mirror:../shared/data` the positives are mostly comparison questions ("Who is older, A or B?", whose answer is in
the question). The judge was trained on synthesis' 64 candidates: 51 debate snapshots of the hard questions (Q1,
almost all `Insufficient`) and only 13 single-retrieval pools (T2, of the medium / easy questions) - 13 examples of
the distribution it is tested on, 5 of them `Sufficient`. MAPS' own T2 has 10,000 questions; the 64-question
synthesis budget of the CPU profile leaves it 13.

What it does. A SOURCE workspace (after `synthesize`) is copied by links into OUT/source, with one change:
`data/synthesis/judge_candidates.jsonl` = synthesis' candidates + single-retrieval pools (top `--top-k`, the T2
builder `ragteam.train.synthesis.query_samples`) of the first `--extra` training-pool questions that synthesis did
not use (source `extra/single_retrieval`). Then `studies/replicate_mirror/replicate_maps_seeds.py` runs, per seed, the stages
train_answer -> label_judge -> train_judge -> evaluate_agents (judge only, HotpotQA + 2Wiki, `--n` questions each)
with the checkout's code and params, so the labels come from each seed's own trained answer agent.

    python studies/judge_pools/judge_pools.py --source ../m0 --out studies/judge_pools --extra 128 --seeds 0 1 2
    python studies/judge_pools/judge_pools.py --source ../m0 --out studies/judge_pools --seeds 0 1 2 --control

Side by side (`--control`, after the run): for each seed, the judge is trained again on the same seed's labels minus
the extra rows (the synthesis candidates alone, labelled by the same answer agent in the same run) and evaluated the
same way, into OUT/control/; both sets are summarised by `python -m studies summarize` (OUT/replicate.md and
OUT/control/replicate.md), so the two judges differ only in their training rows.

The lever is now the stage param `label_judge.extra_candidates` (its builder `stages.label_judge.extra_candidates`
makes the extra rows here too; it gives the same 128 rows the study first built by hand).
"""
from __future__ import annotations

import argparse
import contextlib
import json
import subprocess
import sys
from collections import Counter
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

LINKED = ("data/prepared", "data/indexes", "models/llm")
SYNTHESIS = "data/synthesis"


def build_source(source: Path, dest: Path, extra: int, top_k: int, retriever_dir: str) -> dict:
    from ragteam.io import DataError, load_jsonl, write_jsonl
    from stages.label_judge import ExtraParams, extra_candidates

    for rel in (*LINKED, SYNTHESIS):
        if not (source / rel).exists():
            sys.exit(f"{source / rel}: missing (run `dvc repro synthesize` in {source} first)")
    dest.mkdir(parents=True, exist_ok=True)
    for rel in LINKED:
        link = dest / rel
        link.parent.mkdir(parents=True, exist_ok=True)
        if link.is_symlink() or link.exists():
            link.unlink()
        link.symlink_to((source / rel).resolve())
    syn = dest / SYNTHESIS
    syn.mkdir(parents=True, exist_ok=True)
    for f in (source / SYNTHESIS).iterdir():
        if f.name != "judge_candidates.jsonl":
            target = syn / f.name
            if target.is_symlink() or target.exists():
                target.unlink()
            target.symlink_to(f.resolve())
    cands = load_jsonl(source / SYNTHESIS / "judge_candidates.jsonl")
    with contextlib.chdir(dest):  # an index names its corpus relative to the workspace
        # the stage's own builder (label_judge.extra_candidates); the study ran before it existed, with the same rows
        try:
            added = extra_candidates(extra, ExtraParams(retriever=retriever_dir, t2_top_k=top_k))
        except DataError as e:
            sys.exit(f"--extra {extra}: {e}")
    write_jsonl(syn / "judge_candidates.jsonl", cands + added)
    return {"synthesis_candidates": len(cands), "extra_candidates": len(added),
            "by_source": dict(Counter(c["source"] for c in cands + added))}


def control(out: Path, seed: int, env: dict) -> None:
    """The judge of seed `seed` retrained without the extra rows (same answer agent, same labels otherwise)."""
    import shutil

    from ragteam.io import load_jsonl, write_jsonl

    run = out / "work" / f"seed{seed}"
    if not (run / "data/judge/t3_judge.jsonl").is_file():
        sys.exit(f"{run}: no data/judge/t3_judge.jsonl (run the study for seed {seed} first)")
    work = out / "control" / "work" / f"seed{seed}"
    if work.exists():
        shutil.rmtree(work)
    work.mkdir(parents=True)
    for d in ("ragteam", "stages"):
        shutil.copytree(run / d, work / d, ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy2(run / "params.yaml", work / "params.yaml")
    for rel in (*LINKED, SYNTHESIS, "models/agents/answer"):
        (work / rel).parent.mkdir(parents=True, exist_ok=True)
        (work / rel).symlink_to((run / rel).resolve())
    rows = [r for r in load_jsonl(run / "data/judge/t3_judge.jsonl") if not r["source"].startswith("extra/")]
    write_jsonl(work / "data/judge/t3_judge.jsonl", rows)
    logs = out / "control" / f"seed{seed}"
    logs.mkdir(parents=True, exist_ok=True)
    for stage in ("train_judge", "evaluate_agents"):
        print(f"control seed {seed}: {stage} ...", flush=True)
        with open(logs / f"{stage}.log", "w") as log:
            subprocess.run([sys.executable, "-m", f"stages.{stage}"], cwd=work, stdout=log, stderr=subprocess.STDOUT,
                           env={**env, "PYTHONPATH": str(work)}, check=True)
    shutil.copytree(work / "metrics", logs / "metrics", dirs_exist_ok=True)
    shutil.copy2(work / "metrics/eval_agents.json", out / "control" / f"seed{seed}.json")
    shutil.copy2(work / "results/eval_agents/questions.json", out / "control" / f"seed{seed}.questions.json")


def summarize(out: Path, seeds: list[int]) -> None:
    subprocess.run([sys.executable, "-m", "studies", "summarize",
                    *[x for s in seeds for x in ("--metrics", str(out / f"seed{s}.json"))],
                    "--out-md", str(out / "replicate.md"), "--out-json", str(out / "replicate.json")],
                   check=True, cwd=REPO)


def side_by_side(out: Path, seeds: list[int], benchmarks: list[str], resamples: int = 10_000) -> dict:
    """Balanced accuracy of the judge trained with the extra rows (OUT/seed<K>) vs without (OUT/control/seed<K>), per
    seed and pooled (the mean over seeds of the per-seed difference), with a paired bootstrap over questions: both
    judges of a seed are scored against the same reference (that seed's answer agent) on the same questions."""
    import numpy as np

    from ragteam.eval.stats import balanced_accuracy_statistic, difference, statistic_interval

    def load(path: Path) -> dict:
        if not path.is_file():
            sys.exit(f"{path}: missing (run the study and --control for every seed first)")
        return json.loads(path.read_text())["benchmarks"]

    runs, ids = {}, None
    for seed in seeds:
        ext, ctl = load(out / f"seed{seed}.questions.json"), load(out / "control" / f"seed{seed}.questions.json")
        for b in benchmarks:
            if ext[b]["ids"] != ctl[b]["ids"] or ext[b]["judge"]["trained"]["reference"] != \
                    ctl[b]["judge"]["trained"]["reference"]:
                sys.exit(f"seed {seed}, {b}: the two judges were not scored on the same questions and reference")
        seed_ids = [ext[b]["ids"] for b in benchmarks]
        if ids is not None and seed_ids != ids:  # pooling resamples one set of questions for every seed
            sys.exit(f"seed {seed}: scored on other questions than seed {seeds[0]}; seeds cannot be pooled")
        ids = seed_ids
        runs[seed] = {k: [x for b in benchmarks for x in q[b]["judge"]["trained"][f]]
                      for k, q, f in (("extra", ext, "right"), ("control", ctl, "right"), ("reference", ext,
                                                                                          "reference"))}
        sizes = [len(ext[b]["ids"]) for b in benchmarks]
    result: dict = {"seeds": seeds, "benchmarks": benchmarks, "per_seed": {}, "pooled": {}}
    groups = {"avg": (0, sum(sizes), sizes)}
    start = 0
    for b, n in zip(benchmarks, sizes):
        groups[b] = (start, start + n, [n])
        start += n
    for name, (lo, hi, gs) in groups.items():
        stats = {}
        for seed, r in runs.items():
            ref = r["reference"][lo:hi]
            stats[seed] = {k: balanced_accuracy_statistic(r[k][lo:hi], ref, gs) for k in ("extra", "control")}
            iv = {k: statistic_interval(stats[seed][k], gs, resamples) for k in ("extra", "control")}
            d = difference(stats[seed]["extra"], stats[seed]["control"], gs, resamples)
            result["per_seed"].setdefault(str(seed), {})[name] = {
                "extra": [iv["extra"].estimate, iv["extra"].lo, iv["extra"].hi],
                "control": [iv["control"].estimate, iv["control"].lo, iv["control"].hi],
                "diff": [d.diff, d.lo, d.hi]}

        def pooled(k: str):
            return lambda idx, k=k: np.mean([stats[s][k](idx) for s in stats], axis=0)

        ivs = {k: statistic_interval(pooled(k), gs, resamples) for k in ("extra", "control")}
        d = difference(pooled("extra"), pooled("control"), gs, resamples)
        result["pooled"][name] = {"extra": [ivs["extra"].estimate, ivs["extra"].lo, ivs["extra"].hi],
                                  "control": [ivs["control"].estimate, ivs["control"].lo, ivs["control"].hi],
                                  "diff": [d.diff, d.lo, d.hi], "diff_excludes_zero": d.significant}
    (out / "side_by_side.json").write_text(json.dumps(result, indent=1))
    return result


def table(out: Path) -> str:
    """The README's table: per seed the label counts and the two judges' balanced accuracy, then the pooled rows
    (from OUT/side_by_side.json and each seed's label_judge metrics); written to OUT/side_by_side.md."""
    sb = json.loads((out / "side_by_side.json").read_text())
    names = {"hotpotqa": "HotpotQA", "2wikimultihopqa": "2Wiki", "avg": "Avg"}

    def iv(v: list[float]) -> str:
        return f"{v[0]:.2f} [{v[1]:.2f}, {v[2]:.2f}]".replace("-", "−")

    lines = ["| seed | labels with extra (S / I) | labels without (S / I) | judge without extra | judge with extra | "
             "with − without |", "|---|---|---|---:|---:|---:|"]
    for seed in sb["seeds"]:
        lab = json.loads((out / f"seed{seed}/metrics/label_judge.json").read_text())
        own = [v for k, v in lab["by_source"].items() if not k.startswith("extra/")]
        s_, i_ = (sum(v.get(x, 0) for v in own) for x in ("Sufficient Information", "Insufficient Information"))
        r = sb["per_seed"][str(seed)]["avg"]
        lines.append(f"| {seed} | {lab['Sufficient Information']} / {lab['Insufficient Information']} | {s_} / {i_} "
                     f"| {iv(r['control'])} | {iv(r['extra'])} | {iv(r['diff'])} |")
    for b in (*sb["benchmarks"], "avg"):
        r = sb["pooled"][b]
        diff = f"**{iv(r['diff'])}** †" if r["diff_excludes_zero"] else iv(r["diff"])
        lines.append(f"| pooled, {names.get(b, b)} | | | {iv(r['control'])} | {iv(r['extra'])} | {diff} |")
    text = "\n".join(lines) + "\n"
    (out / "side_by_side.md").write_text(text)
    return text


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--source", type=Path, help="workspace after `synthesize` (mirror data); not with --control")
    ap.add_argument("--out", type=Path, default=Path("studies/judge_pools"))
    ap.add_argument("--extra", type=int, default=128, help="single-retrieval pools of unsynthesised pool questions")
    ap.add_argument("--top-k", type=int, default=3, help="passages per extra pool (synthesize.t2_top_k)")
    ap.add_argument("--retriever", default="data/indexes/bm25/bm25s")
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--n", type=int, default=100, help="held-out questions per benchmark for the judge")
    ap.add_argument("--benchmarks", nargs="+", default=["hotpotqa", "2wikimultihopqa"])
    ap.add_argument("--build-only", action="store_true", help="write OUT/source and stop")
    ap.add_argument("--control", action="store_true",
                    help="after a run: retrain and evaluate each seed's judge without the extra rows (OUT/control)")
    a = ap.parse_args()
    a.out.mkdir(parents=True, exist_ok=True)
    if a.control:
        import os

        env = {**os.environ, "OMP_WAIT_POLICY": os.environ.get("OMP_WAIT_POLICY", "PASSIVE")}
        for seed in a.seeds:
            control(a.out.resolve(), seed, env)
        summarize(a.out / "control", a.seeds)
        side_by_side(a.out, a.seeds, a.benchmarks)
        print(table(a.out))
        return
    if a.source is None:
        ap.error("--source is required (except with --control)")
    info = build_source(a.source.resolve(), a.out / "source", a.extra, a.top_k, a.retriever)
    print(f"judge_pools: candidates {info}", flush=True)
    (a.out / "candidates.json").write_text(json.dumps(info, indent=1))
    if a.build_only:
        return
    subprocess.run([sys.executable, str(REPO / "studies/replicate_mirror/replicate_maps_seeds.py"), "--source",
                    str(a.out / "source"), "--out", str(a.out), "--seeds", *map(str, a.seeds), "--stages",
                    "train_answer", "label_judge", "train_judge", "evaluate_agents",
                    "--set", "eval_agents.agents=[judge]", "--set", f"eval_agents.benchmarks=[{', '.join(a.benchmarks)}]",
                    "--set", f"eval_agents.n_questions={a.n}"], check=True)


if __name__ == "__main__":
    main()
