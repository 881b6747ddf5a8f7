"""The evaluation report: a MAPS-Table-1 style markdown table with cost columns, cost/accuracy plots, and the same
table as a Prefect artifact when running inside a Prefect flow or task run.

Input everywhere is the metrics dict written to metrics/eval.json: {system: {benchmark | "avg": summary}}.
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

from ragteam.io import save_figure

DISPLAY = {"hotpotqa": "HotpotQA", "2wikimultihopqa": "2Wiki", "musique": "MuSiQue", "bamboogle": "Bamboogle",
           "nq": "NQ", "popqa": "PopQA", "ambigqa": "AmbigQA", "triviaqa": "TriviaQA", "synthetic": "Synthetic"}
ORDER = list(DISPLAY)  # the paper's column order first, then anything else alphabetically


def display(bench: str) -> str:
    return DISPLAY.get(bench, bench)


def order_benchmarks(names: Sequence[str]) -> list[str]:
    return sorted(names, key=lambda b: (ORDER.index(b) if b in ORDER else len(ORDER), b))


def _num(x: float, digits: int = 2) -> str:
    return f"{x:.{digits}f}"


def table_markdown(metrics: Mapping[str, Mapping[str, Mapping[str, float]]], benchmarks: Sequence[str]) -> str:
    """Rows = systems; EM / F1 per benchmark, then their averages, accuracy (and LJ where a system has it: DECOR's
    judge; the joint systems' own training reward x100, `ragteam.rewards.team`; "–" elsewhere), and cost per
    question (averaged)."""
    with_lj = any("lj" in per["avg"] for per in metrics.values())
    with_reward = any("team_reward" in per["avg"] for per in metrics.values())
    head = ["Method"]
    for b in benchmarks:
        head += [f"{display(b)} EM", f"{display(b)} F1"]
    head += ["Avg EM", "Avg F1", "Avg Acc"] + (["Avg LJ"] if with_lj else [])
    head += ["Team reward ×100"] if with_reward else []
    head += ["No answer %", "Format error q %"]
    head += ["LLM calls/q", "Tokens/q", "Retrievals/q", "Seconds/q", "Passages/q"]
    lines = ["| " + " | ".join(head) + " |", "|" + "|".join(["---"] + ["---:"] * (len(head) - 1)) + "|"]
    for system, per in metrics.items():
        cells = [system]
        for b in benchmarks:
            m = per.get(b)
            cells += [_num(m["em"]), _num(m["f1"])] if m else ["–", "–"]
        a = per["avg"]
        cells += [_num(a["em"]), _num(a["f1"]), _num(a["acc"])]
        cells += ([_num(a["lj"]) if "lj" in a else "–"] if with_lj else [])
        cells += ([_num(a["team_reward"]) if "team_reward" in a else "–"] if with_reward else [])
        cells += [_num(a[k], 1) if k in a else "–" for k in ("no_answer", "format_error_questions")]
        cells += [_num(a["llm_calls"], 1), _num(a["tokens"], 0), _num(a["retrieval_calls"], 1), _num(a["seconds"], 2),
                  _num(a["passages"], 1) if "passages" in a else "–"]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def _with_ci(m: Mapping, key: str) -> str:
    ci = m.get(f"{key}_ci")
    return f"{_num(m[key])} [{_num(ci[0])}, {_num(ci[1])}]" if ci else _num(m[key])


def interval_table_markdown(metrics: Mapping, benchmarks: Sequence[str]) -> str:
    """Rows = systems; "EM [lo, hi]" and "F1 [lo, hi]" per benchmark and on the average (bootstrap interval)."""
    cols = [*benchmarks, "avg"]
    head = ["Method", "n"] + [f"{display(b) if b != 'avg' else 'Avg'} {k}" for b in cols for k in ("EM", "F1")]
    lines = ["| " + " | ".join(head) + " |", "|" + "|".join(["---"] + ["---:"] * (len(head) - 1)) + "|"]
    for system, per in metrics.items():
        cells = [system, "/".join(str(int(per[b]["n"])) for b in benchmarks if b in per)]
        for b in cols:
            cells += [_with_ci(per[b], "em"), _with_ci(per[b], "f1")] if b in per else ["–", "–"]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def workflow_table(metrics: Mapping[str, Mapping[str, Mapping[str, float]]]) -> str:
    """JADE's own figures (App. D) for the systems that record them (`meta["workflow"]`), averaged over benchmarks:
    rounds, retrievals and DS calls per question, DS calls per round, the share of plans that decompose (the rest
    solve directly), of questions whose root was decomposed, of episodes stopped by the round limit, and R_global."""
    rows = {system: per["avg"] for system, per in metrics.items() if "plans" in per["avg"]}
    if not rows:
        return ""
    lines = ["| Method | Rounds/q | Retrievals/q | DS calls/q | DS/round | Decomposing plans % | Decomposed q % "
             "| Round limit % | R_global |", "|---|" + "---:|" * 8]
    for system, a in rows.items():
        share = lambda x, y: _num(100 * x / y, 1) if y else "–"  # noqa: E731
        cells = [system, _num(a["rounds"]), _num(a["retrievals"]), _num(a["ds_calls"]),
                 _num(a["ds_calls"] / a["rounds"]) if a["rounds"] else "–", share(a["plans_decompose"], a["plans"]),
                 _num(100 * a["decomposed"], 1), _num(100 * a["max_rounds_hit"], 1),
                 _num(a["r_global"], 3) if "r_global" in a else "–"]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def silence_markdown(metrics: Mapping, benchmarks: Sequence[str], reasons: Mapping[str, Mapping[str, int]]
                     ) -> str:
    """Rows = systems: the share of questions with no answer and of questions with a format error in any call, per
    benchmark and on the average, with their intervals; the share answered by the answer fallback's draws
    (`llm.answer_fallback`: the model's own output gave none); then why the unanswered questions have no answer
    (the most frequent reasons, with counts)."""
    cols = [*benchmarks, "avg"]
    head = (["Method", "n"] + [f"{display(b) if b != 'avg' else 'Avg'} no answer %" for b in cols]
            + ["Avg format error q %", "Avg answered by resampling %", "why no answer (questions)"])
    lines = ["| " + " | ".join(head) + " |", "|" + "|".join(["---", "---:"] + ["---:"] * (len(cols) + 2) + ["---"])
             + "|"]
    for system, per in metrics.items():
        if "no_answer" not in per["avg"]:
            continue
        why = reasons.get(system) or {}
        text = "; ".join(f"{r} ({k})" for r, k in list(why.items())[:3]) + (" …" if len(why) > 3 else "")
        cells = [system, str(int(per["avg"]["n"]))]
        cells += [_with_ci(per[b], "no_answer") if b in per else "–" for b in cols]
        fallback = _num(per["avg"]["resampled_answered"], 1) if "resampled_answered" in per["avg"] else "–"
        cells += [_with_ci(per["avg"], "format_error_questions"), fallback, text.replace("|", "/") or "–"]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def _diff_cell(d: Mapping) -> str:
    sign = "+" if d["diff"] > 0 else ""
    text = f"{sign}{_num(d['diff'])} [{_num(d['lo'])}, {_num(d['hi'])}]"
    return f"**{text}** †" if d["significant"] else text


def differences_markdown(differences: Mapping, benchmarks: Sequence[str]) -> str:
    """One row per (pair, benchmark | avg): ΔEM and ΔF1 = a - b with the paired-bootstrap interval (and the
    difference of the systems' own training reward x100 where both rows have it); † = 0 is outside it."""
    with_reward = any("team_reward" in res.get("avg", {}) for res in differences.values())
    lines = ["| a − b | benchmark | n | ΔEM [CI] | ΔF1 [CI] | Δno answer [CI] |"
             + (" Δteam reward ×100 [CI] |" if with_reward else ""),
             "|---|---|---:|---:|---:|---:|" + ("---:|" if with_reward else "")]
    for res in differences.values():
        for b in [*benchmarks, "avg"]:
            if b in res:
                d = res[b]
                lines.append(f"| {res['a']} − {res['b']} | {display(b) if b != 'avg' else 'Avg'} | {d['n']} | "
                             f"{_diff_cell(d['em'])} | {_diff_cell(d['f1'])} | "
                             f"{_diff_cell(d['no_answer']) if 'no_answer' in d else '–'} |"
                             + (f" {_diff_cell(d['team_reward']) if 'team_reward' in d else '–'} |"
                                if with_reward else ""))
    return "\n".join(lines)


def differences_rule(resamples: int, seed: int, level: float) -> str:
    pct = f"{100 * level:g} %"
    return (f"Paired bootstrap over questions ({resamples:,} resamples, seed {seed}): both systems are scored on the "
            f"same resampled questions, and the interval is the central {pct} of the resampled mean difference "
            f"a − b (percentage points). **Bold †**: 0 lies outside the interval, the only case where this report "
            f"claims a difference. Avg: each benchmark resampled within itself, unweighted mean of the "
            f"per-benchmark differences. With n questions one question moves EM by 100/n points; with fewer than "
            f"~20 questions the percentile bootstrap tends to be too narrow rather than too wide, and the pairs are "
            f"not corrected for multiple comparisons.")


def efficiency_markdown(metrics: Mapping) -> list[str]:
    """Search turns and searches per question for the systems that count turns (M-ASK's efficiency figures)."""
    rows = [(name, per["avg"]) for name, per in metrics.items() if "turns" in per.get("avg", {})]
    if not rows:
        return []
    lines = ["Search turns and searches per question (means over all benchmarks):", "",
             "| system | turns/q | searches/q | LLM calls/q | tokens/q |", "|---|---:|---:|---:|---:|"]
    lines += [f"| {name} | {_num(a['turns'])} | {_num(a['retrieval_calls'])} | {_num(a['llm_calls'], 1)} | "
              f"{_num(a['tokens'], 0)} |" for name, a in rows]
    return lines + [""]


def report_markdown(metrics: Mapping, benchmarks: Sequence[str], context: Mapping[str, object],
                    plots: Sequence[str] = (), differences: Mapping | None = None,
                    bootstrap: Mapping | None = None, reasons: Mapping[str, Mapping[str, int]] | None = None) -> str:
    """The whole reports/eval.md: the table, how it was made, the intervals, the questions without an answer (and
    why: `reasons`, system -> reason -> questions), the paired differences (when given), and the plots (paths
    relative to the report)."""
    counts = {system: tuple(int(per[b]["n"]) for b in benchmarks) for system, per in metrics.items()}
    if len(set(counts.values())) <= 1:
        n = next(iter(counts.values()), ())
        questions = "Questions per benchmark: " + ", ".join(f"{display(b)} {k}" for b, k in zip(benchmarks, n)) + "."
    else:  # systems with their own eval.systems.<name>.n_questions answer the first n of each benchmark
        groups: dict[tuple, list[str]] = {}
        for system, n in counts.items():
            groups.setdefault(n, []).append(system)
        questions = "Questions per benchmark (each system answers the first n): " + "; ".join(
            f"{', '.join(names)}: " + ", ".join(f"{display(b)} {k}" for b, k in zip(benchmarks, n))
            for n, names in groups.items()) + "."
    parts = ["# Evaluation", "",
             "EM / F1 / Acc in percent (FlashRAG normalisation, max over golden answers; Acc = a gold answer is "
             "contained in the prediction). Averages are unweighted over benchmarks, as in MAPS Table 1. Cost "
             "columns are means per question over all benchmarks: LLM calls, prompt + completion tokens, retrieval "
             "calls, wall seconds, and (where a workflow records it) passages handed to the answering model. No "
             "answer %: questions whose final answer is empty (nothing to score); format error q %: questions "
             "where any call broke its role's format (a fallback may still have answered).", "",
             table_markdown(metrics, benchmarks), "", questions, ""]
    boot = {"resamples": 10_000, "seed": 0, "level": 0.95, **(bootstrap or {})}
    if metrics and "em_ci" in next(iter(metrics.values()))["avg"]:
        parts += [f"## Scores with {100 * boot['level']:g} % intervals", "",
                  f"Percentile bootstrap over questions ({boot['resamples']:,} resamples, seed {boot['seed']}); "
                  f"Avg resamples each benchmark within itself.", "",
                  interval_table_markdown(metrics, benchmarks), ""]
    if metrics and "no_answer_ci" in next(iter(metrics.values()))["avg"]:
        parts += ["## Questions without an answer", "",
                  "A question has no answer when its final answer is empty after normalisation: EM and F1 are 0 by "
                  "construction, so a low score can be silence rather than wrong answers. Intervals as above. The "
                  "last column gives the most frequent reasons: a workflow's documented fallback (empty by "
                  "construction), or the role whose output could not be parsed and what was wrong with it. Answered "
                  "by resampling: questions whose answering call gave no answer, even continued, and one of the "
                  "answer fallback's fresh samples (`llm.answer_fallback`) did; they count as format errors.", "",
                  silence_markdown(metrics, benchmarks, reasons or {}), ""]
    if differences:
        parts += ["## Differences", "", differences_markdown(differences, benchmarks), "",
                  differences_rule(boot["resamples"], boot["seed"], boot["level"]), ""]
    if workflow_table(metrics):
        parts += ["Workflow figures (JADE App. D), means per question over all benchmarks:", "",
                  workflow_table(metrics), ""]
    parts += efficiency_markdown(metrics)
    if context:
        parts += ["| setting | value |", "|---|---|"]
        parts += [f"| {k} | {v} |" for k, v in context.items()]
        parts.append("")
    for p in plots:
        parts += [f"![{Path(p).stem}]({p})", ""]
    return "\n".join(parts)


def _groups(metrics: Mapping, groups: Mapping[str, Sequence[str]] | None, max_series: int = 8) -> dict[str, list[str]]:
    """`groups` restricted to the systems `metrics` has (a group with none is dropped), or the systems in metrics
    order, `max_series` at a time; a group over `max_series` systems is an error (unreadable)."""
    if groups is None:
        names = list(metrics)
        return {f"systems {i + 1}-{i + len(names[i: i + max_series])}": names[i: i + max_series]
                for i in range(0, len(names), max_series)}
    out = {g: [n for n in names if n in metrics] for g, names in groups.items()}
    big = {g: len(n) for g, n in out.items() if len(n) > max_series}
    if big:
        raise ValueError(f"figure groups with more than {max_series} systems: {big}")
    return {g: n for g, n in out.items() if n}


def plot_cost_accuracy(metrics: Mapping, out_path: str | Path,
                       groups: Mapping[str, Sequence[str]] | None = None) -> Path:
    """Average F1 (o) and EM (x) against tokens and seconds per question, one point per system, one colour per group
    (`groups`: family -> systems, `ragteam.eval.evaluate.system_groups`), each point named."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out_path = Path(out_path)
    out_path.parent.mkdir(parents=True, exist_ok=True)
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.5))
    colours = plt.get_cmap("tab10").colors
    for ax, (cost, label) in zip(axes, [("tokens", "tokens per question"), ("seconds", "seconds per question")]):
        for k, (group, systems) in enumerate(_groups(metrics, groups).items()):
            c = colours[k % len(colours)]
            xs = [metrics[s]["avg"][cost] for s in systems]
            ax.scatter(xs, [metrics[s]["avg"]["f1"] for s in systems], marker="o", color=c, label=group)
            ax.scatter(xs, [metrics[s]["avg"]["em"] for s in systems], marker="x", color=c)
            for s, x in zip(systems, xs):
                ax.annotate(s, (x, metrics[s]["avg"]["f1"]), textcoords="offset points", xytext=(4, 4), fontsize=7)
        ax.set_xlabel(label)
        ax.set_ylabel("average score (%)  o F1, x EM")
        ax.grid(alpha=0.3)
    axes[0].set_title("accuracy vs token cost")
    axes[1].set_title("accuracy vs wall time")
    axes[1].legend(fontsize=8)
    fig.tight_layout()
    save_figure(fig, out_path, dpi=110)
    plt.close(fig)
    return out_path


def plot_scores(metrics: Mapping, benchmarks: Sequence[str], out_path: str | Path,
                groups: Mapping[str, Sequence[str]] | None = None) -> Path:
    """F1 per benchmark (and the average), one panel per group of at most 8 systems (`groups`: family -> systems,
    else the systems 8 at a time), bars grouped by benchmark, each with its 95 % bootstrap interval (`f1_ci`) as an
    error bar where the metrics have one."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out_path = Path(out_path)
    out_path.parent.mkdir(parents=True, exist_ok=True)
    panels = _groups(metrics, groups)
    cols = list(benchmarks) + ["avg"]
    ncols = 2 if len(panels) > 1 else 1
    nrows = -(-len(panels) // ncols)
    fig, axes = plt.subplots(nrows, ncols, figsize=(max(6, 1.6 * len(cols)) * ncols, 3.6 * nrows), squeeze=False)
    for ax, (group, systems) in zip(axes.flat, panels.items()):
        ax.set_title(group)
        width = 0.8 / len(systems)
        for k, system in enumerate(systems):
            f1 = [metrics[system][c]["f1"] for c in cols]
            ci = [metrics[system][c].get("f1_ci") for c in cols]
            err = None
            if all(ci):
                err = [[max(0.0, f - lo) for f, (lo, _) in zip(f1, ci)], [max(0.0, hi - f) for f, (_, hi) in zip(f1, ci)]]
            ax.bar([i + k * width for i in range(len(cols))], f1, width, yerr=err, capsize=2, label=system,
                   error_kw={"elinewidth": 0.8})
        ax.set_xticks([i + width * (len(systems) - 1) / 2 for i in range(len(cols))])
        ax.set_xticklabels([display(c) if c != "avg" else "Average" for c in cols])
        ax.set_ylabel("F1 (%), 95 % CI")
        ax.legend(fontsize=7)
        ax.grid(axis="y", alpha=0.3)
    for ax in list(axes.flat)[len(panels):]:
        ax.axis("off")
    fig.tight_layout()
    save_figure(fig, out_path, dpi=110)
    plt.close(fig)
    return out_path


def in_prefect_run() -> bool:
    try:
        from prefect.context import FlowRunContext, TaskRunContext
    except ImportError:
        return False
    return FlowRunContext.get() is not None or TaskRunContext.get() is not None


def publish_prefect_artifact(markdown: str, key: str = "eval-report", description: str | None = None) -> bool:
    """Attach `markdown` to the current Prefect flow/task run; a no-op (False) outside one.

    A DVC stage run as a subprocess of a Prefect task has no run context: the flow publishes reports/eval.md itself
    by calling this after the `evaluate` task.
    """
    if not in_prefect_run():
        return False
    from prefect.artifacts import create_markdown_artifact

    create_markdown_artifact(markdown=markdown, key=key, description=description or "ragteam evaluate: Table 1")
    return True
