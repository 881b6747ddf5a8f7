"""Seed study of the joint systems (issue 25 §3): each system's base model, format warm-up only and warm-up + RL,
scored by `evaluate` (the 12 joint rows on 40 questions each, `eval.systems`) in runs that differ only in the joint
training seeds, launched as DVC experiments (seed 0 is the default run's own seeds):

    for s in 0 1 2; do dvc exp run --queue -n joint-seed$s $(python -m studies flags $s --kind joint); done
    dvc queue start --jobs 1                  # or: dvc exp run --run-all
    python -m studies joint-summary --exp joint-seed0 --exp joint-seed1 --exp joint-seed2

Every experiment commit holds its own plain records (git-tracked): `metrics/eval.json` (each row's scores),
`metrics/eval_compare.json` (each compared pair's paired-bootstrap difference over questions) and the training
records of `warmup_joint@<system>` and `train_joint@<system>`; the summary reads them at each run's revision, so each
number it states traces to an experiment commit and, through its `dvc.lock`, to data, code and params.

Per system and metric (EM, F1, and the system's own training reward x100 where every run's rows have it, JADE,
DECOR and QAgent from e76f5a8 on, M-ASK from 54254a3 on): each row's mean ± sd over seeds; per compared pair
(warm-up − base, RL over warm-up, warm-up + RL − base) the seed-mean difference with its t-interval over seeds
(`stats.seed_summary`), each seed's paired bootstrap interval as `evaluate` computed it, the signs and how many
seeds' own intervals exclude 0. The training side: the warm-up's held-out format error rate where it stopped, and RL's team reward and format error rate
at its first and last steps (quarter means, `train.curves.summarize`), per seed.
"""
from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

from ragteam.eval import stats
from studies.replicate import Run, load_eval_runs, mean_sd, per_seed, signs, t_interval

# What a joint study varies: the warm-up's SFT and RL's sampling, for every system at once. A system that pins its
# own seed (`joint.<system>.ppo.seed`, an override) is not varied by these flags: keep the study's systems on the
# shared seed (check_runs refuses runs that differ in such an override, but not a pin they all share).
SEEDS = ("warmup.sft.seed", "joint.ppo.seed")
EVAL_FILE = "metrics/eval.json"
COMPARE_FILE = "metrics/eval_compare.json"
TRAIN_FILE = "metrics/train_joint_{system}.json"
WARMUP_FILE = "metrics/warmup_joint_{system}.json"
METRICS = ("em", "f1")
# the system's own training reward x100 (`ragteam.rewards.team`): reported where every run's rows and pairs have it
# (JADE, DECOR, QAgent rows of runs from e76f5a8 on; M-ASK's rows, which answer after every turn, from 54254a3 on)
OPTIONAL_METRICS = ("team_reward",)
LABELS = {"em": "EM", "f1": "F1", "team_reward": "team reward ×100"}
ROWS = {"base": "{s}", "warm-up": "{s}_warmup", "warm-up + RL": "{s}_trained"}   # eval.systems names per system
PAIRS = {"warm-up − base": ("{s}_warmup", "{s}"), "RL over warm-up": ("{s}_trained", "{s}_warmup"),
         "warm-up + RL − base": ("{s}_trained", "{s}")}
TRAINING = {"warm-up format errors (held out, at the stop)": (WARMUP_FILE, "format_error_rate_after"),
            "RL reward, first steps": (TRAIN_FILE, "reward_first"),
            "RL reward, last steps": (TRAIN_FILE, "reward_last"),
            "RL format errors, first steps": (TRAIN_FILE, "format_error_rate_first"),
            "RL format errors, last steps": (TRAIN_FILE, "format_error_rate_last")}


def seed_flags(seed: int) -> list[str]:
    """`dvc exp run -S` flags setting the joint training seeds (every system's warm-up and RL) to `seed`."""
    return [f"-S {k}={seed}" for k in SEEDS]


def load_runs(entries: Sequence[Mapping], read: Callable[[str, str], dict | None],
              select: Sequence[str] | None = None) -> tuple[list[Run], list[str]]:
    """The study's runs from `dvc exp show --json`: `read(rev, path)` returns a git-tracked record at a revision.
    Each run's `metrics` is {path: record} of the evaluation records and every system's training records."""
    runs, notes = load_eval_runs(entries, read, SEEDS, select, EVAL_FILE, COMPARE_FILE)
    for r in runs:
        systems = r.params.get("joint.systems") or []
        for s in systems:
            for path in (TRAIN_FILE, WARMUP_FILE):
                p = path.format(system=s)
                r.metrics[p] = read(r.rev, p) or {}
    return runs, notes


def _row(record: Mapping, row: str, metric: str, where: str) -> float:
    try:
        return float(record[row]["avg"][metric])
    except (KeyError, TypeError):
        raise ValueError(f"{where}: {EVAL_FILE} has no {row}.avg.{metric}: add the row to eval.systems") from None


def summarize(runs: Sequence[Run], systems: Sequence[str], level: float = 0.95) -> dict:
    """{"runs": [{name, rev, seeds}], "<system>": {"questions", "rows", "pairs", "training"}} (see the module)."""
    if not runs:
        raise ValueError("no runs to summarise")
    out: dict = {"runs": [{"name": r.name, "rev": r.rev, "seeds": r.seeds} for r in runs], "level": level}
    for s in systems:
        rows, pairs, training = {}, {}, {}
        metrics = _metrics(runs, s)
        for label, row in ROWS.items():
            name = row.format(s=s)
            rows[label] = {"row": name, **{m: stats.seed_summary(
                [_row(r.metrics[EVAL_FILE], name, m, r.name) for r in runs], level).to_dict() for m in metrics}}
        questions = {int(r.metrics[EVAL_FILE][ROWS["base"].format(s=s)]["avg"].get("n", 0)) for r in runs}
        for label, (a, b) in PAIRS.items():
            key = f"{a.format(s=s)} vs {b.format(s=s)}"
            pairs[label] = {"pair": key}
            for m in metrics:
                per = []
                for r in runs:
                    d = ((r.metrics[COMPARE_FILE].get(key) or {}).get("avg") or {}).get(m)
                    if d is None:
                        raise ValueError(f"{r.name}: {COMPARE_FILE} has no {key!r} ({m}): the pair comes from "
                                         f"eval.compare, which derives it from the rows {a.format(s=s)} and "
                                         f"{b.format(s=s)}")
                    per.append({"run": r.name, "diff": d["diff"], "lo": d["lo"], "hi": d["hi"],
                                "significant": bool(d["significant"])})
                diffs = [p["diff"] for p in per]
                pairs[label][m] = {**stats.seed_summary(diffs, level).to_dict(), "per_seed": per,
                                   "signs": signs(diffs),
                                   "significant_seeds": sum(p["significant"] for p in per)}
        for label, (path, key) in TRAINING.items():
            vals = [r.metrics.get(path.format(system=s), {}).get(key) for r in runs]
            # rates in [0, 1] and rewards: 4 decimals (seed_summary's default 2 suits scores in percent)
            training[label] = (stats.seed_summary([float(v) for v in vals], level, digits=4).to_dict()
                               | {"per_seed": vals} if all(isinstance(v, (int, float)) for v in vals)
                               else {"per_seed": vals})
        out[s] = {"questions": sorted(questions), "metrics": list(metrics), "rows": rows, "pairs": pairs,
                  "training": training}
    return out


def _metrics(runs: Sequence[Run], system: str) -> tuple[str, ...]:
    """METRICS, and each OPTIONAL_METRICS key that every run's rows of `system` and their pairs have."""
    def has(m: str) -> bool:
        for r in runs:
            ev, cmp = r.metrics[EVAL_FILE], r.metrics[COMPARE_FILE]
            if not all(m in ((ev.get(row.format(s=system)) or {}).get("avg") or {}) for row in ROWS.values()):
                return False
            if not all(m in ((cmp.get(f"{a.format(s=system)} vs {b.format(s=system)}") or {}).get("avg") or {})
                       for a, b in PAIRS.values()):
                return False
        return True
    return (*METRICS, *(m for m in OPTIONAL_METRICS if has(m)))


def report_markdown(summary: Mapping, systems: Sequence[str], notes: Sequence[str] = ()) -> str:
    runs, pct = summary["runs"], f"{100 * summary['level']:g} %"
    parts = ["# Joint systems over training seeds: base, warm-up only, warm-up + RL", "",
             f"{len(runs)} runs of `evaluate` that differ only in {_varied(runs)}: " + "; ".join(
                 f"{r['name']} ({r['rev'][:7]}; {', '.join(f'{k}={v}' for k, v in r['seeds'].items())})"
                 for r in runs) + ".", "",
             f"**mean ± sd** over seeds; **t-interval**: mean ± t(n−1) · sd / √n ({pct}, training-seed "
             f"variation on these questions); **per seed**: each run's paired bootstrap over questions (`evaluate`, "
             f"`metrics/eval_compare.json`), † where it excludes 0; **signs**: each seed's difference.", ""]
    for s in systems:
        x = summary[s]
        ms = x.get("metrics", METRICS)
        parts += [f"## {s}", "", f"Questions per run: {', '.join(map(str, x['questions']))}.", "",
                  "| row | eval row | " + " | ".join(f"{LABELS[m]} mean ± sd" for m in ms) + " |",
                  "|---|---|" + "---:|" * len(ms)]
        parts += [f"| {label} | `{r['row']}` | " + " | ".join(mean_sd(r[m]) for m in ms) + " |"
                  for label, r in x["rows"].items()]
        parts += ["", "| difference | metric | mean ± sd | t-interval | per seed | signs |",
                  "|---|---|---:|---:|---|---|"]
        for label, p in x["pairs"].items():
            for m in ms:
                d = p[m]
                parts.append(f"| {label} | {LABELS[m]} | {mean_sd(d)} | {t_interval(d)} | {per_seed(d['per_seed'])} | "
                             f"{d['signs']} |")
        parts += ["", "| training | mean ± sd | per seed |", "|---|---:|---|"]
        for label, t in x["training"].items():
            per = ", ".join("–" if v is None else f"{v:g}" for v in t["per_seed"])
            parts.append(f"| {label} | {mean_sd(t) if 'mean' in t else '–'} | {per} |")
        parts.append("")
    if notes:
        parts += ["Left out:", "", *(f"- {n}" for n in notes), ""]
    parts += ["How to rerun them (the seeds are params; each run is a DVC experiment; add the flags of any profile the "
              "runs share, which every run's params.yaml holds):", "", "```bash", *_launch(runs),
              "dvc queue start --jobs 1",
              "python -m studies joint-summary " + " ".join(f"--exp {n}" for n in sorted(r["name"] for r in runs)),
              "```", ""]
    return "\n".join(parts)


def _varied(runs: Sequence[Mapping]) -> str:
    """The seed params whose values differ between the runs, as the report names them."""
    keys = [k for k in SEEDS if len({r["seeds"].get(k) for r in runs}) > 1] or list(SEEDS)
    return ", ".join(f"`{k}`" for k in keys)


def _launch(runs: Sequence[Mapping]) -> list[str]:
    """The `dvc exp run --queue` lines that name and seed these runs as they were run. Seeds every run shares are
    fixed flags; the ones that vary are set per run. Where every varied seed of a run takes one value and each name
    is a common prefix plus it (`team-seed0`, ...), one loop; where that value also sets every seed of the study,
    the loop uses `python -m studies flags`; otherwise one line per run with each seed's own `-S` flag."""
    keys = [k for k in SEEDS if any(k in r["seeds"] for r in runs)]
    fixed = {k for k in keys if all(k in r["seeds"] for r in runs) and len({r["seeds"][k] for r in runs}) == 1}
    varied = [k for k in keys if k not in fixed]
    const = "".join(f" -S {k}={runs[0]['seeds'][k]}" for k in keys if k in fixed)
    value = {r["name"]: {r["seeds"].get(k) for k in varied} for r in runs}
    if varied and all(len(v) == 1 and None not in v for v in value.values()):
        seed = {n: next(iter(v)) for n, v in value.items()}
        prefixes = {n.removesuffix(str(v)) if n.endswith(str(v)) else None for n, v in seed.items()}
        flags = ("$(python -m studies flags {s} --kind joint)" if not fixed
                 else const.lstrip() + "".join(f" -S {k}={{s}}" for k in varied))
        if len(prefixes) == 1 and None not in prefixes:
            seeds = " ".join(str(v) for v in sorted(seed.values()))
            return [f"for s in {seeds}; do dvc exp run --queue -n {prefixes.pop()}$s {flags.format(s='$s')}; done"]
        return [f"dvc exp run --queue -n {n} {flags.format(s=v)}" for n, v in sorted(seed.items())]
    return [f"dvc exp run --queue -n {r['name']}"
            + "".join(f" -S {k}={r['seeds'][k]}" for k in keys if k in r["seeds"])
            for r in sorted(runs, key=lambda r: r["name"])]
