"""Seed replication of the MAPS training stages: per agent and benchmark, base vs trained over several training
seeds (the runs' `evaluate_agents` outputs), as mean ± sd over seeds of the gain, a t-interval over seeds, the sign
of each seed's gain, and a paired bootstrap pooled over seeds.

Launch the seeds as DVC experiments (`seed_flags`), then summarise `dvc exp show --json`:

    for s in 1 2; do dvc exp run --queue -n seed$s $(python -m studies flags $s); done
    dvc exp run --run-all
    python -m studies summarize          # -> reports/replicate.md, metrics/replicate.json

Each experiment re-runs train_answer, train_query, label_judge, train_judge and everything downstream of them
(evaluate, evaluate_agents); synthesize (its data) is shared unless `synthesize.seed` is varied too. The pooled
interval needs each run's per-question scores (results/eval_agents/questions.json, git-tracked, so every
experiment commit holds its own).
"""
from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from ragteam.eval import stats
from ragteam.eval.agents import MODELS, TESTED, metric_statistic
from ragteam.eval.stats import BootstrapConfig

# The MAPS training seeds (params.yaml); synthesize.seed is a seed too when a user varies it.
SEED_PARAMS = ("train_answer.stage1.seed", "train_answer.stage2.seed", "train_query.grpo.seed", "label_judge.seed",
               "train_judge.sft.seed", "synthesize.seed")
TRAINING_SEEDS = SEED_PARAMS[:5]
METRICS_FILE = "metrics/eval_agents.json"
QUESTIONS_FILE = "results/eval_agents/questions.json"


def seed_flags(seed: int) -> list[str]:
    """`dvc exp run -S` flags setting every MAPS training seed to `seed`."""
    return [f"-S {k}={seed}" for k in TRAINING_SEEDS]


@dataclass
class Run:
    """One replicate: its name, git revision, flattened params, evaluate_agents metrics and per-question scores."""

    name: str
    rev: str = ""
    params: dict = field(default_factory=dict)
    metrics: dict = field(default_factory=dict)
    questions: dict | None = None

    seed_params: Sequence[str] = SEED_PARAMS    # the params this study varies (a joint study: joint_study.SEEDS)

    @property
    def seeds(self) -> dict:
        return {k: self.params[k] for k in self.seed_params if k in self.params}


def _flatten(d: Mapping, prefix: str = "") -> dict:
    out = {}
    for k, v in d.items():
        key = f"{prefix}{k}"
        out.update(_flatten(v, key + ".") if isinstance(v, Mapping) else {key: v})
    return out


def runs_from_exp_show(entries: Sequence[Mapping], read_questions: Callable[[str], dict | None] | None = None,
                       metrics_file: str = METRICS_FILE, select: Iterable[str] | None = None,
                       read_record: Callable[[str], dict | None] | None = None) -> tuple[list[Run], list[str]]:
    """Runs from `dvc exp show --json` (DVC 3: baseline commits, each with its "experiments"), skipping the
    workspace row; `select` keeps only those names or revisions. Returns (runs with metrics, notes on the rest).

    `metrics_file` is the stage's whole record, a plain git-tracked output: `dvc exp show` lists only the declared
    metrics (metrics/summary/, averages without the per-benchmark rows or `significant` flags), so `read_record(rev)`
    reads it from the run's own commit; an `exp show` row that still declares it (older runs) is read from there."""
    wanted = set(select or ())
    rows = []
    for entry in entries:
        if entry.get("rev") == "workspace":
            continue
        rows.append(entry)
        for exp in entry.get("experiments") or []:
            rows += exp.get("revs") or []
    runs, notes = [], []
    for row in rows:
        name, rev = row.get("name") or row.get("rev", "")[:7], row.get("rev", "")
        if wanted and not ({name, rev, rev[:7]} & wanted):
            continue
        data = row.get("data") or {}
        metric = ((data.get("metrics") or {}).get(metrics_file) or {}).get("data")
        if not metric and read_record is not None and not row.get("error"):
            metric = read_record(rev)
        if row.get("error") or not metric:
            notes.append(f"{name}: no {metrics_file}" + (f" ({row['error']})" if row.get("error") else ""))
            continue
        params = _flatten(((data.get("params") or {}).get("params.yaml") or {}).get("data") or {})
        runs.append(Run(name, rev, params, metric, read_questions(rev) if read_questions else None))
    return runs, notes


def check_runs(runs: Sequence[Run], what: str = "evaluate_agents metrics") -> list[str]:
    """Raise when the runs differ in anything but their seeds (`Run.seed_params`), or repeat a seed combination
    (dropped, with a note); returns the notes."""
    if not runs:
        raise ValueError(f"no runs with {what} to summarise")
    notes, seen, keep = [], {}, []
    for r in runs:
        key = tuple(sorted(r.seeds.items())) if r.seeds else (r.name,)
        if key in seen:
            notes.append(f"{r.name}: same seeds as {seen[key]}, left out")
            continue
        seen[key] = r.name
        keep.append(r)
    ref = keep[0]
    for r in keep[1:]:
        diff = sorted(k for k in set(ref.params) | set(r.params)
                      if k not in ref.seed_params and ref.params.get(k) != r.params.get(k))
        if diff:
            raise ValueError(f"runs {ref.name!r} and {r.name!r} differ in more than seeds: {diff[:8]}; select the "
                             f"replicates with --exp")
    runs[:] = keep
    return notes


def _pooled(runs: Sequence[Run], agent: str, metric: str, bench: str, cfg: BootstrapConfig) -> dict | None:
    """Paired bootstrap of the seed-mean of trained - base, resampling questions jointly across seeds."""
    if any(r.questions is None for r in runs):
        return None
    per = [r.questions["benchmarks"] for r in runs]
    benches = list(per[0]) if bench == "avg" else [bench]
    for p in per[1:]:
        for b in benches:
            if p.get(b, {}).get("ids") != per[0][b]["ids"]:
                raise ValueError(f"replicates were evaluated on different questions ({b}): pooled interval undefined")
    sizes = [len(per[0][b]["ids"]) for b in benches]

    def cat(p, name):
        qs = [p[b][agent][name] for b in benches]
        return {k: [x for q in qs for x in q[k]] for k, v in qs[0].items() if isinstance(v, list)}

    st = [(metric_statistic(agent, metric, cat(p, "trained"), sizes),
           metric_statistic(agent, metric, cat(p, "base"), sizes)) for p in per]
    iv = stats.statistic_interval(lambda c: sum(t(c) - b(c) for t, b in st) / len(st), sizes, cfg.resamples,
                                  cfg.seed, cfg.level)
    return stats.Difference(iv.estimate, iv.lo, iv.hi, iv.n, iv.excludes_zero()).to_dict()


def summarize_replicates(runs: Sequence[Run], cfg: BootstrapConfig = BootstrapConfig()) -> dict:
    """{"runs": [...], benchmark | "avg": {agent: {metric: {base, trained, gain: mean/sd/t-interval, per_seed,
    signs, significant_seeds, pooled}}}}."""
    benches = [b for b in runs[0].metrics if isinstance(runs[0].metrics[b], Mapping)]
    out: dict = {"runs": [{"name": r.name, "rev": r.rev, "seeds": r.seeds} for r in runs]}
    for b in benches:
        out[b] = {}
        for agent in (a for a in TESTED if a in runs[0].metrics[b]):
            out[b][agent] = {}
            for metric in TESTED[agent]:
                try:
                    blocks = [r.metrics[b][agent] for r in runs]
                except KeyError as e:
                    raise ValueError(f"run metrics disagree: {b}.{agent} missing ({e})") from None
                if not all(metric in x["diff"] for x in blocks):   # runs made before the metric existed
                    continue
                gains = [x["diff"][metric]["diff"] for x in blocks]
                out[b][agent][metric] = {
                    **{name: stats.seed_summary([x[name][metric] for x in blocks], cfg.level).to_dict()
                       for name in MODELS},
                    "gain": stats.seed_summary(gains, cfg.level).to_dict(),
                    "per_seed": gains,
                    "signs": signs(gains),
                    "significant_seeds": sum(x["diff"][metric]["significant"] for x in blocks),
                    "pooled": _pooled(runs, agent, metric, b, cfg)}
    return out


def load_eval_runs(entries: Sequence[Mapping], read: Callable[[str, str], dict | None], seed_params: Sequence[str],
                   select: Sequence[str] | None = None, eval_file: str = "metrics/eval.json",
                   compare_file: str = "metrics/eval_compare.json") -> tuple[list[Run], list[str]]:
    """The runs of an `evaluate` seed study from `dvc exp show --json`: `read(rev, path)` returns a git-tracked
    record at a revision. Each run's `metrics` is {eval_file: record, compare_file: record}; the runs must differ
    only in `seed_params` (`check_runs`)."""
    runs, notes = runs_from_exp_show(entries, metrics_file=eval_file, select=select,
                                     read_record=lambda rev: read(rev, eval_file))
    for r in runs:
        r.seed_params = seed_params
        compare = read(r.rev, compare_file)
        if compare is None:
            raise ValueError(f"{r.name} ({r.rev[:7]}): no {compare_file} at that commit (evaluate writes it with "
                             f"{eval_file}): the run is incomplete")
        r.metrics = {eval_file: r.metrics, compare_file: compare}
    notes += check_runs(runs, what=eval_file)
    return runs, notes


def signs(values: Sequence[float]) -> str:
    """Each seed's sign: `+-0`."""
    return "".join("+" if x > 0 else "-" if x < 0 else "0" for x in values)


def mean_sd(s: Mapping) -> str:
    """`mean ± sd` of a seed summary (`stats.seed_summary`), the mean alone where there is no sd (one seed)."""
    return f"{s['mean']:.2f}" + (f" ± {s['sd']:.2f}" if s.get("sd") is not None else "")


def t_interval(s: Mapping) -> str:
    """A seed summary's t-interval, `–` where there is none (one seed)."""
    return f"[{s['lo']:.2f}, {s['hi']:.2f}]" if s.get("lo") is not None else "–"


def per_seed(diffs: Sequence[Mapping]) -> str:
    """Each seed's paired-bootstrap difference with its interval, † where it excludes 0."""
    return "; ".join(f"{q['diff']:+.2f} [{q['lo']:.2f}, {q['hi']:.2f}]" + (" †" if q["significant"] else "")
                     for q in diffs)


def pooled_cell(p: Mapping | None) -> str:
    """A pooled paired-bootstrap difference, bold † where its interval excludes 0; `–` where there is none."""
    if p is None:
        return "–"
    text = f"{p['diff']:+.2f} [{p['lo']:.2f}, {p['hi']:.2f}]"
    return f"**{text}** †" if p["significant"] else text


def report_markdown(summary: Mapping, notes: Sequence[str] = (), cfg: BootstrapConfig = BootstrapConfig()) -> str:
    from ragteam.eval.agents import LABELS
    from ragteam.eval.report import display

    runs = summary["runs"]
    pct = f"{100 * cfg.level:g} %"
    parts = ["# Seed replication: each MAPS agent, base vs trained", "",
             f"{len(runs)} replicates (evaluate_agents on each): " + "; ".join(
                 f"{r['name']} ({', '.join(f'{k}={v}' for k, v in r['seeds'].items()) or 'seeds unknown'})"
                 for r in runs) + ".", "",
             f"Gain = trained − base per seed. **mean ± sd** over seeds; **t-interval**: mean ± t(n−1) · sd / √n "
             f"({pct}; it speaks for training-seed variation on these questions); **signs**: each seed's gain; "
             f"**seeds †**: seeds whose own paired bootstrap excludes 0; **pooled**: paired bootstrap over questions "
             f"of the seed-mean gain ({cfg.resamples:,} resamples, questions resampled jointly for all seeds), "
             f"bold † when 0 lies outside it. The base model is the same in every run.", ""]
    for agent in TESTED:
        rows = [(b, m) for b in summary if b != "runs" for m in TESTED[agent]
                if agent in summary[b] and m in summary[b][agent]]
        if not rows:
            continue
        parts += [f"## {agent} agent", "",
                  "| metric | benchmark | base | trained | gain mean ± sd | t-interval | signs | seeds † | pooled |",
                  "|---|---|---:|---:|---:|---:|---|---:|---:|"]
        for b, m in rows:
            s = summary[b][agent][m]
            g = s["gain"]
            parts.append(f"| {LABELS[m]} | {'Avg' if b == 'avg' else display(b)} | {mean_sd(s['base'])} | "
                         f"{mean_sd(s['trained'])} | {mean_sd(g)} | {t_interval(g)} | {s['signs']} | "
                         f"{s['significant_seeds']}/{g['n']} | {pooled_cell(s['pooled'])} |")
        parts.append("")
    if notes:
        parts += ["Left out:", "", *(f"- {n}" for n in notes), ""]
    parts += ["How the replicates were launched (the training seeds are params):", "", "```bash",
              "for s in 1 2; do dvc exp run --queue -n seed$s $(python -m studies flags $s); done",
              "dvc exp run --run-all", "python -m studies summarize", "```", ""]
    return "\n".join(parts)
