"""Team study (issue 10): trained MAPS vs untrained MAPS in the `evaluate` stage on `mirror:../shared/data`, per
training seed with the paired bootstrap, and pooled over seeds.

Superseded for new runs by the same study through DVC (`profiles/maps_mirror_team.yaml`, `dvc exp run` per seed,
`python -m studies team-summary`; docs/maps.md), whose experiments `ragteam lineage --rev` traces: it reproduced
studies/team_mirror_fallback/ to the digit. This script stays for the studies it made.

Per seed K, a workspace OUT/work/seed<K> gets this checkout's `ragteam/` and `stages/`, the seed's `params.yaml` and
shared inputs from AGENTS/work/seed<K> (a run of studies/judge_pools/judge_pools.py: the seed's answer agent from
train_answer and its judge from label_judge with the 128 extra candidates + train_judge, which is what
`label_judge.extra_candidates=128` gives), and links to both agents. Then, with the stage modules:
  1. `train_query` (GRPO, ΔF1 of that seed's frozen answer agent), unless --query-from names a trained one;
  2. `evaluate` with eval.benchmarks = HotpotQA + 2Wiki, `--n` questions each (held out from the training pool) and
     eval.systems = {maps_untrained (every role the base model), maps (the three trained agents)}; the untrained
     row uses no trained weights and greedy decoding, so later seeds run `maps` only and are paired with the first
     seed's untrained episodes (checked: same question ids in the same order).

Kept per seed in OUT/seed<K>/: the stage metrics, the query agent's card, the report and `scores.json` (per question:
id, final answer, EM, F1, no answer). Summary (`--summarize`): per seed and pooled (mean over seeds of the per-seed difference, questions resampled
jointly for every seed; and mean ± sd with a t-interval over seeds, `ragteam.eval.stats.seed_summary`), EM and F1 of maps − maps_untrained with the 95 % paired bootstrap, into OUT/team.json and
OUT/team.md.

    python studies/team_mirror/team_mirror.py --agents studies/judge_pools --out ../team --seeds 0 1 2
    python studies/team_mirror/team_mirror.py --out ../team --seeds 0 1 2 --summarize
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[2]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

LINKED = ("data/prepared", "data/indexes", "data/synthesis", "data/judge", "models/llm")
BENCHMARKS = ["hotpotqa", "2wikimultihopqa"]
UNTRAINED, TRAINED = "maps_untrained", "maps"
# no_answer: the final answer is empty; format_error_questions: some call broke its format (issue 27); paired like
# the scores
# resampled: the answer came from the answer fallback's draws (llm.answer_fallback; the model's own output, continued,
# gave none)
KEYS = ("em", "f1", "no_answer", "format_error_questions", "resampled")
LABEL = {"em": "EM", "f1": "F1", "no_answer": "No answer %", "format_error_questions": "Format error q %",
         "resampled": "Answered by resampling %"}


def workspace(agents: Path, work: Path, seed: int, n: int, first: bool, query_from: Path | None) -> Path:
    src = agents / "work" / f"seed{seed}"
    for rel in ("params.yaml", "models/agents/answer/config.json", "models/agents/judge/config.json"):
        if not (src / rel).is_file():
            sys.exit(f"{src / rel}: missing (run studies/judge_pools/judge_pools.py for seed {seed} first)")
    if work.exists():
        shutil.rmtree(work)
    work.mkdir(parents=True)
    for d in ("ragteam", "stages"):
        shutil.copytree(REPO / d, work / d, ignore=shutil.ignore_patterns("__pycache__"))
    for rel in (*LINKED, "models/agents/answer", "models/agents/judge"):
        (work / rel).parent.mkdir(parents=True, exist_ok=True)
        (work / rel).symlink_to((src / rel).resolve())
    if query_from is not None:
        if not (query_from / "config.json").is_file():
            sys.exit(f"--query-from {query_from}: no trained query agent there")
        (work / "models/agents/query").symlink_to(query_from.resolve())
    params = yaml.safe_load((src / "params.yaml").read_text())
    systems = {TRAINED: {"workflow": "maps", "trained_agents": True}}
    if first:
        systems = {UNTRAINED: {"workflow": "maps"}, **systems}
    params["eval"].update(benchmarks=BENCHMARKS, n_questions=n, systems=systems,
                          compare=[[TRAINED, UNTRAINED]] if first else [])
    (work / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    return work


def run_seed(work: Path, logs: Path, train_query: bool) -> None:
    env = {**os.environ, "PYTHONPATH": str(work), "OMP_WAIT_POLICY": os.environ.get("OMP_WAIT_POLICY", "PASSIVE")}
    logs.mkdir(parents=True, exist_ok=True)
    for stage in (("train_query",) if train_query else ()) + ("evaluate",):
        print(f"{work.name}: {stage} ...", flush=True)
        with open(logs / f"{stage}.log", "w") as log:
            done = subprocess.run([sys.executable, "-m", f"stages.{stage}"], cwd=work, stdout=log,
                                  stderr=subprocess.STDOUT, env=env)
        if done.returncode:
            sys.exit(f"{work.name}: stage {stage} failed (exit {done.returncode}); log: {logs / f'{stage}.log'}")
    shutil.copytree(work / "metrics", logs / "metrics", dirs_exist_ok=True)
    write_scores(work / "results/eval", logs / "scores.json")
    for rel in ("reports/eval.md", "models/agents/query/README.md"):
        if (work / rel).is_file():
            shutil.copy2(work / rel, logs / Path(rel).name.replace("README", "query_agent"))


def write_scores(results: Path, out: Path) -> dict:
    """The per-question record kept in git (the Episodes stay in the work dir: ~3 MB per system): for every system
    and benchmark of an evaluate run, each question's id, final answer, EM, F1, no answer, a format error in any call
    and an answer from the answer fallback's draws (0-1)."""
    from ragteam.eval.evaluate import question_scores
    from ragteam.records import read_episodes

    kept: dict = {}
    for sdir in sorted(p for p in results.iterdir() if p.is_dir()):
        for b in BENCHMARKS:
            path = sdir / f"{b}.jsonl"
            if not path.is_file():
                sys.exit(f"{path}: missing (the seed's evaluate did not finish)")
            eps = read_episodes(path)
            q = question_scores(eps)
            q["resampled"] = [float(any(c.meta.get("resampled", {}).get("draw", 0) > 0 for c in e.calls))
                              for e in eps]
            kept.setdefault(sdir.name, {})[b] = [
                {"id": e.question_id, "answer": e.final_answer, **{k: q[k][i] for k in KEYS}}
                for i, e in enumerate(eps)]
    out.write_text(json.dumps(kept, indent=0))
    return kept


def load_scores(scores_file: Path, system: str) -> tuple[list[str], dict[str, list[float]], list[int]]:
    """Question ids and per-question EM / F1 / no answer (0-1) of `system`, benchmarks in BENCHMARKS order."""
    from ragteam.metrics import has_answer

    if not scores_file.is_file():
        sys.exit(f"{scores_file}: missing (run the seed's evaluate first)")
    kept = json.loads(scores_file.read_text())
    if system not in kept:
        sys.exit(f"{scores_file}: no {system} rows")
    ids, scores, sizes = [], {k: [] for k in KEYS}, []
    for b in BENCHMARKS:
        rows = kept[system][b]
        ids += [f"{b}/{r['id']}" for r in rows]
        for k in KEYS:   # scores.json written before no_answer existed: derived from the kept final answer
            scores[k] += [r[k] if k in r else float(not has_answer(r["answer"])) if k == "no_answer" else None
                          for r in rows]
        sizes.append(len(rows))
    # format errors cannot be derived from an old scores.json (it kept no calls): left out there
    return ids, {k: v for k, v in scores.items() if None not in v}, sizes


def top_answer(scores_file: Path, system: str) -> dict:
    """The system's most common final answer over both benchmarks (normalised as EM normalises it) and the share of
    questions that got it: a stub that replaced silence ("The answer is 1" on a fifth of the questions) has the
    same answer for unrelated questions, which no score column shows."""
    from collections import Counter

    from ragteam.metrics import normalize_answer

    kept = json.loads(scores_file.read_text())[system]
    answers = [normalize_answer(r["answer"] or "") for b in BENCHMARKS for r in kept[b]]
    answer, count = Counter(answers).most_common(1)[0]
    return {"answer": answer, "count": count, "n": len(answers), "share": round(100 * count / len(answers), 2)}


def summarize(out: Path, seeds: list[int], resamples: int = 10_000) -> dict:
    import numpy as np

    from ragteam.eval.stats import difference, mean_statistic, seed_summary, statistic_interval

    have = sorted(p.parent for p in out.glob("seed*/scores.json") if UNTRAINED in json.loads(p.read_text()))
    if not have:
        sys.exit(f"{out}: no seed*/scores.json with {UNTRAINED} rows (the first seed evaluates it)")
    base_ids, base, sizes = load_scores(have[0] / "scores.json", UNTRAINED)
    result_from = have[0].name
    trained = {}
    for s in seeds:
        ids, sc, _ = load_scores(out / f"seed{s}" / "scores.json", TRAINED)
        if ids != base_ids:
            sys.exit(f"seed {s}: maps was scored on other questions than {result_from}'s maps_untrained")
        trained[s] = sc
    groups = {"avg": (0, sum(sizes), sizes)}
    start = 0
    for b, n in zip(BENCHMARKS, sizes):
        groups[b] = (start, start + n, [n])
        start += n

    def triple(iv) -> list[float]:
        return [iv.estimate, iv.lo, iv.hi]

    keys = [k for k in KEYS if k in base and all(k in t for t in trained.values())]
    result: dict = {"seeds": seeds, "benchmarks": BENCHMARKS, "n": sizes, "untrained_from": result_from,
                    "keys": keys, "per_seed": {}, "pooled": {}}
    for name, (lo, hi, gs) in groups.items():
        for k in keys:
            b_stat = mean_statistic(base[k][lo:hi], gs)
            t_stats = {s: mean_statistic(trained[s][k][lo:hi], gs) for s in seeds}
            for s in seeds:
                d = difference(t_stats[s], b_stat, gs, resamples)
                result["per_seed"].setdefault(str(s), {}).setdefault(name, {})[k] = {
                    "untrained": triple(statistic_interval(b_stat, gs, resamples)),
                    "trained": triple(statistic_interval(t_stats[s], gs, resamples)),
                    "diff": [d.diff, d.lo, d.hi], "diff_excludes_zero": d.significant}

            def pooled(idx, k=k):
                return np.mean([t(idx) for t in t_stats.values()], axis=0)

            d = difference(pooled, b_stat, gs, resamples)
            per = [result["per_seed"][str(s)][name][k]["diff"][0] for s in seeds]
            result["pooled"].setdefault(name, {})[k] = {
                "untrained": triple(statistic_interval(b_stat, gs, resamples)),
                "trained": triple(statistic_interval(pooled, gs, resamples)),
                "diff": [d.diff, d.lo, d.hi], "diff_excludes_zero": d.significant,
                "diff_per_seed": per, "over_seeds": seed_summary(per).to_dict()}  # mean ± sd, t-interval
    result["top_answer"] = {f"{UNTRAINED} ({result_from})": top_answer(have[0] / "scores.json", UNTRAINED),
                            **{f"{TRAINED} (seed{s})": top_answer(out / f"seed{s}" / "scores.json", TRAINED)
                               for s in seeds}}
    (out / "team.json").write_text(json.dumps(result, indent=1))
    (out / "team.md").write_text(table(result))
    return result


def table(r: dict) -> str:
    names = {"hotpotqa": "HotpotQA", "2wikimultihopqa": "2Wiki", "avg": "Avg"}

    def iv(v: list[float], bold: bool = False) -> str:
        s = f"{v[0]:+.2f} [{v[1]:.2f}, {v[2]:.2f}]".replace("-", "−")
        return f"**{s}** †" if bold else s

    def over_seeds(g: dict) -> str:
        if g["sd"] is None:
            return "–"
        return f"{g['mean']:+.2f} ± {g['sd']:.2f} [{g['lo']:.2f}, {g['hi']:.2f}]".replace("-", "−")

    lines = ["| metric | benchmark | maps_untrained | maps (trained), mean over seeds | gain per seed | "
             "gain over seeds: mean ± sd [t-interval] | pooled gain [95 % CI] |", "|---|---|---:|---:|---|---:|---:|"]
    for k in r.get("keys", KEYS[:2]):
        for b in (*r["benchmarks"], "avg"):
            p = r["pooled"][b][k]
            per = ", ".join(f"{x:+.2f}" for x in p["diff_per_seed"]).replace("-", "−")
            lines.append(f"| {LABEL[k]} | {names[b]} | {p['untrained'][0]:.2f} | {p['trained'][0]:.2f} | {per} | "
                         f"{over_seeds(p['over_seeds'])} | {iv(p['diff'], p['diff_excludes_zero'])} |")
    if r.get("top_answer"):
        lines += ["", "| run | most common final answer (normalised) | questions with it |", "|---|---|---:|"]
        for run, t in r["top_answer"].items():
            shown = repr(t["answer"]) if t["answer"] else "(none)"
            lines.append(f"| {run} | {shown} | {t['count']} of {t['n']} ({t['share']:.1f} %) |")
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--agents", type=Path, help="a judge_pools OUT dir (work/seed<K> with answer + judge agents)")
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--n", type=int, default=100, help="held-out questions per benchmark")
    ap.add_argument("--query-from", type=Path, nargs="*", default=[],
                    help="per seed, in --seeds order: an already trained query agent (skips train_query)")
    ap.add_argument("--with-untrained", action="store_true",
                    help="evaluate maps_untrained in the first of --seeds (on by default when OUT has none yet)")
    ap.add_argument("--summarize", action="store_true", help="only summarise OUT/seed<K>/scores.json")
    a = ap.parse_args()
    if not a.summarize:
        if a.agents is None:
            ap.error("--agents is required (except with --summarize)")
        if a.query_from and len(a.query_from) != len(a.seeds):
            ap.error("--query-from needs one path per seed")
        a.out.mkdir(parents=True, exist_ok=True)
        for i, seed in enumerate(a.seeds):
            first = a.with_untrained or (i == 0 and not any(
                UNTRAINED in json.loads(p.read_text()) for p in a.out.glob("seed*/scores.json")))
            q = a.query_from[i] if a.query_from else None
            work = workspace(a.agents.resolve(), a.out.resolve() / "work" / f"seed{seed}", seed, a.n, first, q)
            run_seed(work, a.out / f"seed{seed}", train_query=q is None)
        return
    print(table(summarize(a.out, a.seeds)))


if __name__ == "__main__":
    main()
