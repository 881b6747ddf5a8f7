"""Training curves: rows from a TRL log history (or a trainer's own steps), logged with DVCLive for `dvc plots` and as
TensorBoard event files, a PNG for the report, a metrics summary."""
from __future__ import annotations

import math
import shutil
from collections.abc import Sequence
from pathlib import Path

from ragteam.io import atomic_dir, atomic_file, save_figure

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


def write_curves(rows: Sequence[dict], directory: str | Path, png_path: str | Path | None = None, title: str = "",
                 panels: Sequence[Panel] | None = None, tensorboard_dir: str | Path | None = None) -> None:
    """The curves of a training run, from its rows (x = `step`), logged with DVCLive and TensorBoard:

    - `directory`: a DVCLive directory, one TSV per column under `plots/metrics/` for `dvc plots show` / `dvc plots
      diff`, and DVCLive's summary `metrics.json` (each column's last value). A `/` in a column's name becomes `.`
      (`reward/mask_answer` -> `reward.mask_answer.tsv`): DVCLive nests names at `/`, and a name that is both a
      curve and a group (`reward` beside `reward/<role>`) breaks its summary;
    - `tensorboard_dir`: the same scalars as TensorBoard event files (`tensorboard --logdir tensorboard`); they carry
      wall times and the host name, so they are rebuilt on every run and never versioned;
    - `png_path`: a PNG of reward / loss / KL (or of `panels`) for the reports.

    Wall-clock columns (they belong in metrics), strings (tags such as `stage`) and non-finite values are not logged,
    so a rerun with the same inputs and seeds writes the same curve bytes. The DVCLive directory is built beside its
    place and swapped in whole: a failure leaves the previous curves as they were."""
    rows = [{k: v for k, v in r.items() if not is_wall_clock(k)} for r in rows]
    scalars = [(int(r["step"]), {k: float(v) for k, v in r.items() if k != "step" and _is_number(v)}) for r in rows]
    from dvclive import Live

    with atomic_dir(directory) as tmp:
        # DVCLive as a logger only: the directory is a declared stage output, so no experiment, no dvc.yaml of its own,
        # no report. Its path is absolute: under `dvc exp run`, DVCLive `git add`s the untracked files below a
        # repository-relative dir that no stage declares, which the temp dir is until it is swapped in.
        with Live(dir=str(tmp.resolve()), resume=False, report=None, save_dvc_exp=False, dvcyaml=None,
                  monitor_system=False) as live:
            for step, values in scalars:
                live.step = step
                for name, value in values.items():
                    live.log_metric(name.replace("/", "."), value)
    if tensorboard_dir is not None:
        _write_tensorboard(scalars, Path(tensorboard_dir))
    if png_path is not None:
        if panels is None:
            _plot(rows, Path(png_path), title)
        else:
            _plot_panels(rows, Path(png_path), title, panels)


def _is_number(v: object) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def _write_tensorboard(scalars: Sequence[tuple[int, dict[str, float]]], logdir: Path) -> None:
    """The scalars as one TensorBoard event file in `logdir` (emptied first: a rerun replaces the run, not adds one)."""
    from tensorboardX import SummaryWriter

    shutil.rmtree(logdir, ignore_errors=True)
    logdir.mkdir(parents=True)
    with SummaryWriter(logdir=str(logdir)) as writer:
        for step, values in scalars:
            for name, value in values.items():
                writer.add_scalar(name, value, global_step=step)


def read_curves(directory: str | Path) -> dict[str, list[tuple[int, float]]]:
    """A DVCLive directory's curves back: {name as logged (`reward.mask_answer`): [(step, value), ...]}."""
    root = Path(directory) / "plots" / "metrics"
    if not root.is_dir():
        raise FileNotFoundError(f"{directory}: no DVCLive curves (plots/metrics/ is missing)")
    out = {}
    for f in sorted(root.rglob("*.tsv")):
        lines = f.read_text().splitlines()[1:]
        out[f.relative_to(root).with_suffix("").as_posix()] = [(int(a), float(b)) for a, b in
                                                                 (ln.split("\t")[:2] for ln in lines)]
    return out


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
