"""The RL curves of a joint seed study, read at each run's own experiment commit (issue 25 §3: "training curves per
system ... the step where reward stops rising").

`train_joint@<system>` logs one DVCLive TSV per curve under `reports/training/train_joint_<system>/plots/metrics/`
(git-tracked, `cache: false`), so every experiment commit holds its run's curves. This reads them with `git show
<rev>:<path>`, from the runs a saved `dvc exp show --json` names (the same runs `python -m studies joint-summary
--exp-json` reads, refused alike where they differ in more than their seeds), and writes per seed the step-by-step table of what the issue asks to see: team reward, episode
F1 of the sampled rollouts, format errors per call, policy and critic grad norms, KL to the start model (`kl_start`,
k3 estimate before each step's update), clip fraction, explained variance, and, where a run logged them (from
39fe282), the mean |advantage| before whitening and, for a recipe that rolls each question out several times, the
reward's sd within a question's group and the share of groups with any spread, and the optimiser steps a step took
(at 1 the update is on-policy and the clip fraction is 0 by construction); then the seeds' mean per step.

The step where reward stops rising: the last step of the highest 3-step moving mean of the reward (the mean of steps
k-2..k, from k = 3), per seed. With 8 questions a step, each step's reward is largely which questions it drew, so
the moving mean, not a single step, is what is read.

    python studies/joint_curves.py --exp-json studies/mask_rl_recipe/exp_show.json --system mask \
        --exp mask-recipe-seed0 --exp mask-recipe-seed1 --exp mask-recipe-seed2 \
        --out-md studies/mask_rl_recipe/curves.md --out-json studies/mask_rl_recipe/curves.json
"""
from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:      # the study tools (`studies`) live at the repository root, outside the package
    sys.path.insert(0, str(REPO))

CURVE_DIR = "reports/training/train_joint_{system}/plots/metrics"
CURVES = {                         # column -> TSV (DVCLive writes `a/b` as `a.b`)
    "reward": "reward",
    "episode F1": "episode_f1",
    "format errors": "format_error_rate",
    "grad norm (policy)": "grad_norm.policy",
    "grad norm (critic)": "grad_norm.critic",
    "KL to start": "kl_start",
    "clip fraction": "clip_frac",
    "explained variance": "explained_variance",
    "reward sd in group": "reward_group_std",      # only where a question has several rollouts
    "groups with spread": "groups_with_spread",
    "|advantage| before whitening": "advantage_abs_raw",
    "optimiser steps": "optimizer_steps",          # ppo_epochs x minibatches a step (logged since 2026-12-03)
}
WINDOW = 3


def parse_tsv(text: str, where: str) -> dict[int, float]:
    """{step: value} of a DVCLive TSV (`step<TAB>name` header, then one row a step)."""
    lines = [line for line in text.splitlines() if line.strip()]
    if not lines or lines[0].split("\t")[0] != "step":
        raise ValueError(f"{where}: not a DVCLive curve (no 'step' header)")
    out: dict[int, float] = {}
    for n, line in enumerate(lines[1:], 2):
        cells = line.split("\t")
        try:
            out[int(cells[0])] = float(cells[-1])
        except (ValueError, IndexError):
            raise ValueError(f"{where}:{n}: not 'step<TAB>value': {line!r}") from None
    return out


def plateau_step(reward: Mapping[int, float], window: int = WINDOW) -> int | None:
    """The last step of the highest `window`-step moving mean (the first such window on ties); None when the run
    has fewer steps than the window."""
    steps = sorted(reward)
    if len(steps) < window:
        return None
    best, at = None, None
    for i in range(window - 1, len(steps)):
        m = sum(reward[s] for s in steps[i - window + 1:i + 1]) / window
        if best is None or m > best + 1e-12:
            best, at = m, steps[i]
    return at


def study_runs(entries: Sequence[Mapping], select: Sequence[str], root: str | Path = ".") -> list[tuple[str, str]]:
    """(name, rev) of the selected experiments, in the order asked: the runs `python -m studies joint-summary`
    reads (`joint_study.load_runs`, which refuses runs that differ in anything but their seeds)."""
    from studies import joint_study
    from ragteam.lineage import json_at

    runs, _ = joint_study.load_runs(entries, lambda rev, path: json_at(root, rev, path), select=select)
    found = {r.name: r.rev for r in runs}
    missing = [s for s in select if s not in found]
    if missing:
        raise ValueError(f"not among the study's runs: {', '.join(missing)} (it has {', '.join(sorted(found))})")
    return [(s, found[s]) for s in select]


def study_curves(runs: Sequence[tuple[str, str]], system: str,
                 read: Callable[[str, str], str | None]) -> dict:
    """Every run's curves, its plateau step, and the per-step mean over runs."""
    out: dict = {"system": system, "runs": [], "mean": {}}
    for name, rev in runs:
        curves = {}
        for col, stem in CURVES.items():
            path = f"{CURVE_DIR.format(system=system)}/{stem}.tsv"
            text = read(rev, path)
            if text is not None:
                curves[col] = parse_tsv(text, f"{rev[:7]}:{path}")
        if "reward" not in curves:
            raise ValueError(f"{name} ({rev[:7]}): no reward curve at {CURVE_DIR.format(system=system)}")
        out["runs"].append({"name": name, "rev": rev, "plateau_step": plateau_step(curves["reward"]),
                            "curves": {c: {str(k): v for k, v in sorted(vals.items())} for c, vals in curves.items()}})
    steps = sorted({int(s) for r in out["runs"] for s in r["curves"]["reward"]})
    for col in CURVES:
        per_step = {}
        for s in steps:
            vals = [r["curves"][col][str(s)] for r in out["runs"] if str(s) in r["curves"].get(col, {})]
            if vals:
                per_step[str(s)] = sum(vals) / len(vals)
        if per_step:
            out["mean"][col] = per_step
    out["mean_plateau_step"] = plateau_step({int(k): v for k, v in out["mean"]["reward"].items()})
    return out


def _table(curves: Mapping[str, Mapping[str, float]]) -> list[str]:
    cols = [c for c in CURVES if c in curves]
    steps = sorted({int(s) for c in cols for s in curves[c]})
    lines = ["| step | " + " | ".join(cols) + " |", "|---:|" + "---:|" * len(cols)]
    for s in steps:
        cells = [f"{curves[c][str(s)]:.4f}" if str(s) in curves[c] else "–" for c in cols]
        lines.append(f"| {s} | " + " | ".join(cells) + " |")
    return lines


def report_markdown(study: Mapping) -> str:
    s = study["system"]
    lines = [f"# RL curves of `train_joint@{s}` over seeds", "",
             f"Read at each run's experiment commit from `{CURVE_DIR.format(system=s)}/*.tsv` "
             f"(`studies/joint_curves.py`). Plateau: the last step of the highest {WINDOW}-step moving mean of "
             f"the reward.", ""]
    plateaus = ", ".join(f"{r['name']} {r['plateau_step']}" for r in study["runs"])
    lines += [f"Reward stops rising at step: {plateaus}; the seeds' mean curve at {study['mean_plateau_step']}.", ""]
    lines += [f"## Mean over {len(study['runs'])} seeds", "", *_table(study["mean"]), ""]
    for r in study["runs"]:
        lines += [f"## {r['name']} ({r['rev'][:7]})", "", *_table(r["curves"]), ""]
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--exp-json", type=Path, required=True, help="saved `dvc exp show --json`")
    ap.add_argument("--exp", action="append", required=True, help="experiment names, in order")
    ap.add_argument("--system", required=True)
    ap.add_argument("--out-md", type=Path, required=True)
    ap.add_argument("--out-json", type=Path, required=True)
    a = ap.parse_args(argv)
    try:
        from ragteam.lineage import git_show

        study = study_curves(study_runs(json.loads(a.exp_json.read_text()), a.exp), a.system,
                             lambda rev, path: git_show(".", rev, path))
    except (ValueError, OSError) as e:
        print(f"joint_curves: {e}", file=sys.stderr)
        return 2
    from ragteam.io import atomic_file, write_json

    write_json(a.out_json, study)
    md = report_markdown(study)
    with atomic_file(a.out_md) as f:
        f.write(md)
    print(md)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
