"""Seed study of a team on held-out questions: two rows of `evaluate` (by default the trained MAPS team `maps` against
`maps_untrained`, every role the base model) in runs that differ only in the MAPS training seeds, launched as DVC
experiments (profiles/maps_mirror_team.yaml runs them on real HotpotQA and 2Wiki questions):

    for s in 0 1 2; do dvc exp run -n maps-mirror-seed$s $(ragteam profile flags maps_mirror_team) \\
        $(python -m studies flags $s) evaluate; done
    python -m studies keep maps-mirror-seed0 maps-mirror-seed1 maps-mirror-seed2
    python -m studies team-summary --exp maps-mirror-seed0 --exp maps-mirror-seed1 --exp maps-mirror-seed2

Each experiment commit holds its own plain records (git-tracked): `metrics/eval.json` (each row's scores per
benchmark) and `metrics/eval_compare.json` (the pair's paired bootstrap over questions), and its `dvc.lock` pins the
per-question episodes `evaluate` wrote (`results/eval/<row>/<benchmark>.jsonl`, DVC-cached). Per benchmark, the
unweighted average over benchmarks ("avg", the report's Avg column) and metric (EM, F1, no-answer %, format-error
questions %): each row's mean ± sd over seeds; the difference a − b per seed with the interval `evaluate` gave it; its
mean ± sd and t-interval over seeds (`stats.seed_summary`: training-seed variation on these questions); the signs;
and, where every run's episodes can be read, the pooled paired bootstrap of the seed-mean difference, questions
resampled jointly for every seed (the same questions in every run, checked by id), the base row's randomness and the
trained row's both inside it.
"""
from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

from ragteam.eval import stats
from studies.replicate import (SEED_PARAMS, Run, load_eval_runs, mean_sd, per_seed, pooled_cell, signs,
                                    t_interval)
from ragteam.eval.stats import BootstrapConfig

EVAL_FILE = "metrics/eval.json"
COMPARE_FILE = "metrics/eval_compare.json"
EPISODES = "results/eval/{system}/{benchmark}.jsonl"
PAIR = ("maps", "maps_untrained")
METRICS = ("em", "f1", "no_answer", "format_error_questions")
LABELS = {"em": "EM", "f1": "F1", "no_answer": "No answer %", "format_error_questions": "Format error q %"}

# (question ids, {metric: per-question score in [0, 1]}) of one row on one benchmark at a run's commit, or None where
# the episodes cannot be read there (not in this checkout's DVC cache nor its remote)
ScoreReader = Callable[[str, str, str], "tuple[list[str], dict[str, list[float]]] | None"]


def load_runs(entries: Sequence[Mapping], read: Callable[[str, str], dict | None],
              select: Sequence[str] | None = None, pair: tuple[str, str] = PAIR) -> tuple[list[Run], list[str]]:
    """The study's runs from `dvc exp show --json`; `read(rev, path)` returns a git-tracked record at a revision.
    Each run's `metrics` is {EVAL_FILE: record, COMPARE_FILE: record}; runs must differ only in the MAPS seeds."""
    runs, notes = load_eval_runs(entries, read, SEED_PARAMS, select, EVAL_FILE, COMPARE_FILE)
    key = f"{pair[0]} vs {pair[1]}"
    for r in runs:
        if key not in r.metrics[COMPARE_FILE]:
            raise ValueError(f"{r.name} ({r.rev[:7]}): {COMPARE_FILE} has no {key!r}: the pair comes from "
                             f"eval.compare (null derives 'maps vs maps_untrained'); pairs there: "
                             f"{sorted(r.metrics[COMPARE_FILE])}")
    runs.sort(key=lambda r: (sorted(r.seeds.items()), r.name))      # per-seed columns in seed order
    return runs, notes


def _benchmarks(compare: Mapping) -> list[str]:
    return [b for b, v in compare.items() if isinstance(v, Mapping) and b != "avg"] + ["avg"]


def _score(record: Mapping, row: str, bench: str, metric: str, where: str) -> float:
    try:
        return float(record[row][bench][metric])
    except (KeyError, TypeError):
        raise ValueError(f"{where}: {EVAL_FILE} has no {row}.{bench}.{metric}") from None


def _pooled(scores: Sequence[Mapping], pair: tuple[str, str], benches: Sequence[str], metric: str,
            cfg: BootstrapConfig) -> dict:
    """Paired bootstrap of the seed-mean of a − b, resampling each benchmark's questions within itself and jointly
    for every run (`scores[i][row][bench]` = (ids, {metric: scores})); "avg" is the unweighted mean of benchmarks."""
    sizes = [len(scores[0][pair[0]][b][0]) for b in benches]
    stats_ = []
    for s in scores:
        a, b = ([x for bench in benches for x in s[row][bench][1][metric]] for row in pair)
        stats_.append((stats.mean_statistic(a, sizes), stats.mean_statistic(b, sizes)))
    return stats.difference(lambda c: sum(sa(c) for sa, _ in stats_) / len(stats_),
                            lambda c: sum(sb(c) for _, sb in stats_) / len(stats_),
                            sizes, cfg.resamples, cfg.seed, cfg.level).to_dict()


def read_run_scores(runs: Sequence[Run], pair: tuple[str, str], benches: Sequence[str],
                    read_scores: ScoreReader) -> tuple[list[dict] | None, str | None]:
    """Every run's per-question scores of both rows on every benchmark, checked to be the same questions in the same
    order in every run and row; (None, why) where some run's episodes cannot be read."""
    out, ref = [], {}
    for r in runs:
        per: dict = {}
        for row in pair:
            for b in benches:
                got = read_scores(r.rev, row, b)
                if got is None:
                    return None, (f"{r.name} ({r.rev[:7]}): {EPISODES.format(system=row, benchmark=b)} is neither "
                                  f"in this checkout's DVC cache nor in its remote (`dvc pull` at that commit), so "
                                  f"there is no pooled interval")
                ids, sc = got
                # evaluate pairs each benchmark's first min(n_a, n_b) questions; so does the pooled interval
                ref.setdefault(b, ids)
                n = min(len(ids), len(ref[b]))
                if ids[:n] != ref[b][:n]:
                    raise ValueError(f"{r.name}: {row} on {b} answered other questions than {runs[0].name}'s "
                                     f"{pair[0]}: the pooled interval needs the same questions in every run")
                per.setdefault(row, {})[b] = (ids, sc)
        out.append(per)
    for b in benches:        # cut every run and row to the questions all of them answered
        n = min(len(p[row][b][0]) for p in out for row in pair)
        for p in out:
            for row in pair:
                ids, sc = p[row][b]
                p[row][b] = (ids[:n], {k: v[:n] for k, v in sc.items()})
    return out, None


def summarize(runs: Sequence[Run], pair: tuple[str, str] = PAIR, read_scores: ScoreReader | None = None,
              cfg: BootstrapConfig = BootstrapConfig()) -> dict:
    """{"runs", "pair", "level", "pooled_note", benchmark | "avg": {metric: {"a", "b", "diff", "per_seed", "signs",
    "significant_seeds", "pooled"}}} (see the module)."""
    if not runs:
        raise ValueError("no runs to summarise")
    a, b = pair
    key = f"{a} vs {b}"
    benches = _benchmarks(runs[0].metrics[COMPARE_FILE][key])
    for r in runs[1:]:
        if _benchmarks(r.metrics[COMPARE_FILE][key]) != benches:
            raise ValueError(f"{r.name}: evaluated on {_benchmarks(r.metrics[COMPARE_FILE][key])[:-1]}, "
                             f"{runs[0].name} on {benches[:-1]}: the runs must answer the same benchmarks")
    metrics = [m for m in METRICS if all(m in r.metrics[COMPARE_FILE][key]["avg"] for r in runs)]
    scores, why = (read_run_scores(runs, pair, benches[:-1], read_scores) if read_scores is not None
                   else (None, "no episodes were read (--no-pooled)"))
    out: dict = {"runs": [{"name": r.name, "rev": r.rev, "seeds": r.seeds} for r in runs], "pair": list(pair),
                 "level": cfg.level, "pooled_note": why,
                 "questions": {bench: sorted({int(r.metrics[COMPARE_FILE][key][bench]["n"]) for r in runs})
                               for bench in benches}}
    for bench in benches:
        out[bench] = {}
        for m in metrics:
            per = []
            for r in runs:
                d = (r.metrics[COMPARE_FILE][key].get(bench) or {}).get(m)
                if d is None:
                    raise ValueError(f"{r.name}: {COMPARE_FILE} has no {key}.{bench}.{m}")
                per.append({"run": r.name, "diff": d["diff"], "lo": d["lo"], "hi": d["hi"],
                            "significant": bool(d["significant"])})
            diffs = [p["diff"] for p in per]
            pooled = None
            if scores is not None:
                pooled = _pooled(scores, pair, benches[:-1] if bench == "avg" else [bench], m, cfg)
            out[bench][m] = {
                "a": stats.seed_summary([_score(r.metrics[EVAL_FILE], a, bench, m, r.name) for r in runs],
                                        cfg.level).to_dict(),
                "b": stats.seed_summary([_score(r.metrics[EVAL_FILE], b, bench, m, r.name) for r in runs],
                                        cfg.level).to_dict(),
                "diff": stats.seed_summary(diffs, cfg.level).to_dict(), "per_seed": per,
                "signs": signs(diffs),
                "significant_seeds": sum(p["significant"] for p in per), "pooled": pooled}
    return out


def report_markdown(summary: Mapping, notes: Sequence[str] = (), cfg: BootstrapConfig = BootstrapConfig()) -> str:
    from ragteam.eval.report import display

    a, b = summary["pair"]
    runs, pct = summary["runs"], f"{100 * summary['level']:g} %"
    benches = [k for k in summary["questions"]]
    parts = [f"# {a} vs {b} over training seeds, on held-out questions", "",
             f"{len(runs)} runs of `evaluate` that differ only in the MAPS training seeds: " + "; ".join(
                 f"{r['name']} ({r['rev'][:7]}; {', '.join(f'{k}={v}' for k, v in r['seeds'].items())})"
                 for r in runs) + ".", "",
             "Questions per run: " + ", ".join(f"{'Avg' if k == 'avg' else display(k)} {'/'.join(map(str, v))}"
                                               for k, v in summary["questions"].items()) + ".", "",
             f"Difference = `{a}` − `{b}` per seed. **mean ± sd** over seeds; **t-interval**: mean ± t(n−1) · sd / √n "
             f"({pct}, training-seed variation on these questions); **per seed**: each run's paired bootstrap over "
             f"questions (`evaluate`, `metrics/eval_compare.json`), † where it excludes 0; **pooled**: paired "
             f"bootstrap of the seed-mean difference ({cfg.resamples:,} resamples, each benchmark's questions "
             f"resampled within it, jointly for every seed), bold † where it excludes 0. Avg is the unweighted mean "
             f"over benchmarks.", "",
             f"| metric | benchmark | {b} mean ± sd | {a} mean ± sd | difference mean ± sd | t-interval | per seed "
             f"| signs | pooled |", "|---|---|---:|---:|---:|---:|---|---|---:|"]
    metrics = [m for m in METRICS if m in summary["avg"]]
    for m in metrics:
        for bench in benches:
            s = summary[bench][m]
            parts.append(f"| {LABELS[m]} | {'Avg' if bench == 'avg' else display(bench)} | {mean_sd(s['b'])} | "
                         f"{mean_sd(s['a'])} | {mean_sd(s['diff'])} | {t_interval(s['diff'])} | "
                         f"{per_seed(s['per_seed'])} | {s['signs']} | {pooled_cell(s['pooled'])} |")
    parts.append("")
    if summary.get("pooled_note"):
        notes = [*notes, summary["pooled_note"]]
    if notes:
        parts += ["Notes:", "", *(f"- {n}" for n in notes), ""]
    names = sorted(r["name"] for r in runs)
    parts += ["How to rerun the summary (each run is a DVC experiment whose commit this branch keeps; its episodes "
              "come from the DVC cache or remote):", "", "```bash",
              "python -m studies team-summary " + " ".join(f"--exp {n}" for n in names), "```", ""]
    return "\n".join(parts)
