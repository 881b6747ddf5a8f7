"""Training curves from a TRL log history: CSV and JSON for `dvc plots`, a PNG for the report, a metrics summary."""
from __future__ import annotations

import csv
import io
import math
from collections.abc import Sequence
from pathlib import Path

from ragteam.io import atomic_file, save_figure, write_json

# TRL log keys -> curve columns (GRPO: reward, kl, em; SFT: loss, mean_token_accuracy)
CURVE_KEYS = {
    "reward": "reward", "reward_std": "reward_std", "loss": "loss", "kl": "kl", "em": "em", "words": "words",
    "completions/mean_length": "completion_tokens", "entropy": "entropy", "mean_token_accuracy": "token_accuracy",
    "grad_norm": "grad_norm", "learning_rate": "lr", "step_time": "step_seconds", "delta_f1_zero": "delta_f1_zero",
    "clipped": "clipped", "delta_f1_positive": "delta_f1_positive", "query_malformed": "query_malformed",
    "query_no_new_chunks": "query_no_new_chunks",
}


def curve_rows(log_history: Sequence[dict], step_offset: int = 0, **tags: object) -> list[dict]:
    """One row per logged training step (the end-of-train summary entry is dropped); `tags` add columns (stage).

    `step_offset` continues the x axis across stages (stage 2 of the answer agent starts where stage 1 ended).
    """
    rows = []
    for h in log_history:
        if "step" not in h or "train_runtime" in h:
            continue
        row = {"step": int(h["step"]) + step_offset, **tags}
        for key, col in CURVE_KEYS.items():
            if key in h and h[key] is not None:
                row[col] = float(h[key])
        rows.append(row)
    return rows


# Columns that measure the machine, not the training: kept in the rows (metrics sum them) but never written to a
# curve file, so a rerun with the same inputs and seeds writes the same curve bytes.
WALL_CLOCK_COLUMNS = frozenset({"step_seconds"})
Panel = str | tuple[str, Sequence[str]]   # a column, or (title, columns drawn together)


def is_wall_clock(key: str) -> bool:
    """A metric/column name that holds wall time (`seconds`, `step_seconds`, `stage1_seconds`, ...)."""
    return key in WALL_CLOCK_COLUMNS or key == "seconds" or key.endswith("_seconds") or "seconds_" in key


def write_curves(rows: Sequence[dict], csv_path: str | Path, json_path: str | Path | None = None,
                 png_path: str | Path | None = None, title: str = "", panels: Sequence[Panel] | None = None) -> None:
    """CSV (x = step) for `dvc plots`, optional JSON of the same rows, optional PNG of reward / loss / KL (or of
    `panels`).

    Wall-clock columns are left out (they belong in metrics); every file is written atomically."""
    rows = [{k: v for k, v in r.items() if not is_wall_clock(k)} for r in rows]
    cols = list(dict.fromkeys(k for r in rows for k in r))
    buf = io.StringIO()
    w = csv.DictWriter(buf, fieldnames=cols, lineterminator="\n")
    w.writeheader()
    w.writerows(rows)
    with atomic_file(csv_path) as f:
        f.write(buf.getvalue())
    if json_path is not None:
        write_json(json_path, list(rows))
    if png_path is not None:
        if panels is None:
            _plot(rows, Path(png_path), title)
        else:
            _plot_panels(rows, Path(png_path), title, panels)


def _plot_panels(rows: Sequence[dict], path: Path, title: str, panels: Sequence[Panel], ncols: int = 4) -> None:
    """One panel per entry; a (title, columns) panel draws several columns (e.g. the reward of every role)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    specs = [(p, [p]) if isinstance(p, str) else (p[0], list(p[1])) for p in panels]
    specs = [(t, [c for c in cols if any(c in r for r in rows)]) for t, cols in specs]
    specs = [(t, cols) for t, cols in specs if cols]
    n = max(len(specs), 1)
    nrows = (n + ncols - 1) // ncols
    fig, axes = plt.subplots(nrows, min(n, ncols), figsize=(3.6 * min(n, ncols), 2.8 * nrows), squeeze=False)
    for ax in axes.flat[len(specs):]:
        ax.set_visible(False)
    for ax, (name, cols) in zip(axes.flat, specs):
        for col in cols:
            xs = [r["step"] for r in rows if col in r and r[col] is not None and r[col] == r[col]]
            ys = [r[col] for r in rows if col in r and r[col] is not None and r[col] == r[col]]
            ax.plot(xs, ys, lw=1.5, marker="." if len(ys) < 30 else None, label=col.split("/")[-1])
        if len(cols) > 1:
            ax.legend(fontsize=6)
        ax.set_title(name, fontsize=9)
        ax.set_xlabel("step")
        ax.grid(alpha=0.3)
    if title:
        fig.suptitle(title, fontsize=9)
    fig.tight_layout()
    with atomic_file(path, "wb") as f:
        fig.savefig(f, format="png", dpi=110)
    plt.close(fig)


def collapsed(rows: Sequence[dict], score: str = "episode_f1", length: str = "response_tokens", window: int = 3,
              drop: float = 0.5) -> bool:
    """Did training collapse (the failure M-ASK Table 2 counts)? True when, over windows of `window` steps, the last
    window's mean `score` fell below (1 - drop) x the best earlier window's AND its mean `length` fell below
    (1 - drop) x that window's: reward and response length falling off a cliff together. Needs two windows."""
    ys = [(r[score], r[length]) for r in rows if score in r and length in r]
    if len(ys) < 2 * window:
        return False
    means = [(sum(a for a, _ in ys[i:i + window]) / window, sum(b for _, b in ys[i:i + window]) / window)
             for i in range(0, len(ys) - window + 1)]
    last_s, last_l = means[-1]
    best_s, best_l = max(means[:-window] or means[:1], key=lambda m: m[0])
    return best_s > 0 and last_s < (1 - drop) * best_s and last_l < (1 - drop) * best_l


def _plot(rows: Sequence[dict], path: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = [c for c in ("reward", "em", "loss", "kl", "token_accuracy") if any(c in r for r in rows)]
    fig, axes = plt.subplots(1, max(len(panels), 1), figsize=(3.6 * max(len(panels), 1), 3), squeeze=False)
    # global x so that a two-stage run reads left to right
    for ax, col in zip(axes[0], panels):
        xs = [i + 1 for i, r in enumerate(rows) if col in r]
        ys = [r[col] for r in rows if col in r]
        ax.plot(xs, ys, lw=1, alpha=0.5, label=col)
        if len(ys) >= 5:  # moving average: GRPO rewards are noisy at small batch sizes
            k = max(len(ys) // 10, 3)
            ma = [sum(ys[max(0, i - k + 1): i + 1]) / len(ys[max(0, i - k + 1): i + 1]) for i in range(len(ys))]
            ax.plot(xs, ma, lw=2, label=f"mean of {k}")
        ax.set_title(col)
        ax.set_xlabel("step")
        ax.grid(alpha=0.3)
    if title:
        fig.suptitle(title, fontsize=9)
    fig.tight_layout()
    save_figure(fig, path, dpi=110)
    plt.close(fig)


def summarize(rows: Sequence[dict], seconds: float, steps: int) -> dict[str, float]:
    """Training metrics for the model card and `metrics/*.json`: first/last-quarter means, time per step."""
    out: dict[str, float] = {"steps": float(steps), "seconds": round(seconds, 1),
                             "seconds_per_step": round(seconds / steps, 2) if steps else math.nan}
    for col in ("reward", "em", "loss", "kl", "words", "token_accuracy"):
        ys = [r[col] for r in rows if col in r]
        if ys:
            q = max(len(ys) // 4, 1)
            out[f"{col}_first"] = round(sum(ys[:q]) / q, 4)
            out[f"{col}_last"] = round(sum(ys[-q:]) / q, 4)
    return out
