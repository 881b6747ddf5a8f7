"""The evaluation report: a MAPS-Table-1 style markdown table with cost columns, cost/accuracy plots, and the same
table as a Prefect artifact when running inside a Prefect flow or task run.

Input everywhere is the metrics dict written to metrics/eval.json: {system: {benchmark | "avg": summary}}.
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

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
    """Rows = systems; EM / F1 per benchmark, then their averages, accuracy, and cost per question (averaged)."""
    head = ["Method"]
    for b in benchmarks:
        head += [f"{display(b)} EM", f"{display(b)} F1"]
    head += ["Avg EM", "Avg F1", "Avg Acc", "LLM calls/q", "Tokens/q", "Retrievals/q", "Seconds/q"]
    lines = ["| " + " | ".join(head) + " |", "|" + "|".join(["---"] + ["---:"] * (len(head) - 1)) + "|"]
    for system, per in metrics.items():
        cells = [system]
        for b in benchmarks:
            m = per.get(b)
            cells += [_num(m["em"]), _num(m["f1"])] if m else ["–", "–"]
        a = per["avg"]
        cells += [_num(a["em"]), _num(a["f1"]), _num(a["acc"]), _num(a["llm_calls"], 1), _num(a["tokens"], 0),
                  _num(a["retrieval_calls"], 1), _num(a["seconds"], 2)]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


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
                    plots: Sequence[str] = ()) -> str:
    """The whole reports/eval.md: the table, how it was made, and the plots (paths relative to the report)."""
    n = {b: int(next(iter(metrics.values()))[b]["n"]) for b in benchmarks} if metrics else {}
    parts = ["# Evaluation", "",
             "EM / F1 / Acc in percent (FlashRAG normalisation, max over golden answers; Acc = a gold answer is "
             "contained in the prediction). Averages are unweighted over benchmarks, as in MAPS Table 1. Cost "
             "columns are means per question over all benchmarks: LLM calls, prompt + completion tokens, retrieval "
             "calls, wall seconds.", "",
             table_markdown(metrics, benchmarks), "",
             "Questions per benchmark: " + ", ".join(f"{display(b)} {n[b]}" for b in benchmarks) + ".", ""]
    parts += efficiency_markdown(metrics)
    if context:
        parts += ["| setting | value |", "|---|---|"]
        parts += [f"| {k} | {v} |" for k, v in context.items()]
        parts.append("")
    for p in plots:
        parts += [f"![{Path(p).stem}]({p})", ""]
    return "\n".join(parts)


def plot_cost_accuracy(metrics: Mapping, out_path: str | Path) -> Path:
    """Average F1 and EM against tokens and seconds per question, one point per system."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out_path = Path(out_path)
    out_path.parent.mkdir(parents=True, exist_ok=True)
    fig, axes = plt.subplots(1, 2, figsize=(10, 4))
    for ax, (cost, label) in zip(axes, [("tokens", "tokens per question"), ("seconds", "seconds per question")]):
        for system, per in metrics.items():
            a = per["avg"]
            ax.scatter(a[cost], a["f1"], marker="o", label=f"{system} F1")
            ax.scatter(a[cost], a["em"], marker="x", color=ax.collections[-1].get_facecolor())
            ax.annotate(system, (a[cost], a["f1"]), textcoords="offset points", xytext=(4, 4), fontsize=8)
        ax.set_xlabel(label)
        ax.set_ylabel("average score (%)  o F1, x EM")
        ax.grid(alpha=0.3)
    axes[0].set_title("accuracy vs token cost")
    axes[1].set_title("accuracy vs wall time")
    fig.tight_layout()
    fig.savefig(out_path, dpi=110)
    plt.close(fig)
    return out_path


def plot_scores(metrics: Mapping, benchmarks: Sequence[str], out_path: str | Path) -> Path:
    """Grouped bars: F1 per benchmark and system."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out_path = Path(out_path)
    out_path.parent.mkdir(parents=True, exist_ok=True)
    systems = list(metrics)
    cols = list(benchmarks) + ["avg"]
    width = 0.8 / max(1, len(systems))
    fig, ax = plt.subplots(figsize=(max(6, 1.6 * len(cols)), 4))
    for k, system in enumerate(systems):
        ax.bar([i + k * width for i in range(len(cols))], [metrics[system][c]["f1"] for c in cols], width,
               label=system)
    ax.set_xticks([i + width * (len(systems) - 1) / 2 for i in range(len(cols))])
    ax.set_xticklabels([display(c) if c != "avg" else "Average" for c in cols])
    ax.set_ylabel("F1 (%)")
    ax.legend(fontsize=8)
    ax.grid(axis="y", alpha=0.3)
    fig.tight_layout()
    fig.savefig(out_path, dpi=110)
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
