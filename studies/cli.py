"""The study tools: seed replicates of the MAPS training stages and of the joint systems, and what keeps a study's
experiment commits traceable. Run from the repository root as `python -m studies <command>` (`--help` lists them):

    dvc exp run --queue $(python -m studies flags 1) -n seed1      # a seed run, as a DVC experiment
    python -m studies summarize                                     # MAPS agents: base vs trained over seeds
    python -m studies joint-summary                                 # joint systems: base / warm-up / RL over seeds
    python -m studies team-summary                                  # the MAPS team, trained vs untrained
    python -m studies keep seed1 seed2                              # keep the experiment commits in this branch

Not part of the `ragteam` package: the library holds what the pipeline runs; the studies live here, one folder
each (studies/README.md).
"""
from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Optional

import typer

from ragteam.cli import App, fail

app = App(no_args_is_help=True, add_completion=False, help="Seed studies: summaries over DVC experiments, and keeping "
          "their commits.")




@app.command("flags")
def replicate_flags(seed: int, kind: str = typer.Option("maps", "--kind", help="maps: every MAPS training seed; "
                                                        "joint: the joint systems' warm-up and RL seeds")) -> None:
    """Print `-S` flags setting a study's seeds, for `dvc exp run --queue $(python -m studies flags 1)`."""
    from studies import joint_study, replicate

    flags = {"maps": replicate.seed_flags, "joint": joint_study.seed_flags}
    if kind not in flags:
        raise fail(ValueError(f"--kind {kind!r}: one of {', '.join(flags)}"))
    typer.echo(" ".join(flags[kind](seed)))


def _exp_show(exp_json: Optional[Path]) -> list:
    """`dvc exp show --json` entries: from a saved file, or run here."""
    import subprocess

    if exp_json:
        return json.loads(exp_json.read_text())
    done = subprocess.run([sys.executable, "-m", "dvc", "exp", "show", "--json"], capture_output=True, text=True)
    if done.returncode:
        raise ValueError(f"dvc exp show --json failed: {done.stderr.strip()[-500:]}")
    return json.loads(done.stdout)


def _at_rev(rev: str, path: str) -> dict | None:
    """A git-tracked record as commit `rev` of the checkout here holds it (None where it does not)."""
    from ragteam.lineage import json_at

    return json_at(".", rev, path)


def _write_report(out_md: Path, out_json: Path, md: str, summary: dict) -> None:
    """A study's summary as JSON and its report as markdown (each written atomically); the report is echoed."""
    from ragteam.io import atomic_file, write_json

    write_json(out_json, summary)
    with atomic_file(out_md) as f:
        f.write(md)
    typer.echo(md)


@app.command("joint-summary")
def replicate_joint_summary(
    exp_json: Optional[Path] = typer.Option(None, "--exp-json", help="saved `dvc exp show --json` output "
                                            "(default: run it here)"),
    exp: Optional[list[str]] = typer.Option(None, "--exp", help="only these experiments (names or revisions)"),
    systems: Optional[list[str]] = typer.Option(None, "--system", help="joint systems to report (default: the "
                                                "runs' joint.systems)"),
    out_md: Path = typer.Option(Path("reports/joint_study.md"), help="the report"),
    out_json: Path = typer.Option(Path("metrics/joint_study.json"), help="the summary as JSON"),
) -> None:
    """Each joint system's base / warm-up / warm-up + RL rows over seed runs (DVC experiments differing only in
    the joint seeds): mean ± sd, t-interval over seeds, each seed's paired bootstrap -> reports/joint_study.md and
    metrics/joint_study.json."""
    from studies import joint_study

    try:
        runs, notes = joint_study.load_runs(_exp_show(exp_json), _at_rev, select=exp)
        names = list(systems or runs[0].params.get("joint.systems") or [])
        if not names:
            raise ValueError("no joint systems: the runs' joint.systems is empty and no --system was given")
        summary = joint_study.summarize(runs, names)
    except (ValueError, OSError) as e:
        raise fail(e)
    _write_report(out_md, out_json, joint_study.report_markdown(summary, names, notes), summary)


def _episode_scores(rev: str, system: str, benchmark: str) -> tuple[list[str], dict[str, list[float]]] | None:
    """(question ids, per-question scores) of `evaluate`'s episodes of one row and benchmark at commit `rev`, read
    through DVC (this checkout's cache, else its default remote); None where neither holds them."""
    import tempfile

    import dvc.api
    from dvc.exceptions import DvcException
    from dvc_data.index import DataIndexError

    from ragteam.eval.evaluate import question_scores
    from studies.team_study import EPISODES
    from ragteam.records import read_episodes

    path = EPISODES.format(system=system, benchmark=benchmark)
    try:   # not there at that commit, or its listing / file in neither the cache nor the remote
        text = dvc.api.read(path, repo=".", rev=rev, mode="r", encoding="utf-8")
    except (DvcException, DataIndexError, FileNotFoundError):
        return None
    with tempfile.TemporaryDirectory() as tmp:      # read_episodes names file:line of a bad row
        local = Path(tmp) / f"{rev[:7]}-{system}-{benchmark}.jsonl"
        local.write_text(text, encoding="utf-8")
        episodes = read_episodes(local)
    return [e.question_id for e in episodes], question_scores(episodes)


@app.command("team-summary")
def replicate_team_summary(
    exp_json: Optional[Path] = typer.Option(None, "--exp-json", help="saved `dvc exp show --json` output "
                                            "(default: run it here)"),
    exp: Optional[list[str]] = typer.Option(None, "--exp", help="only these experiments (names or revisions)"),
    pair: tuple[str, str] = typer.Option(("maps", "maps_untrained"), "--pair", help="the two eval.systems rows "
                                         "compared, a − b"),
    pooled: bool = typer.Option(True, "--pooled/--no-pooled", help="pool the seeds' per-question scores (read "
                                "through DVC at each run's commit) into one paired bootstrap"),
    out_md: Path = typer.Option(Path("reports/team_study.md"), help="the report"),
    out_json: Path = typer.Option(Path("metrics/team_study.json"), help="the summary as JSON"),
    resamples: int = typer.Option(10_000, help="bootstrap resamples of the pooled interval"),
    seed: int = typer.Option(0, help="bootstrap seed"),
) -> None:
    """Two rows of `evaluate` (the trained MAPS team vs the untrained one) over seed runs (DVC experiments differing
    only in the MAPS training seeds): per benchmark, mean ± sd, t-interval over seeds, each seed's paired bootstrap
    and the pooled one -> reports/team_study.md and metrics/team_study.json."""
    from studies import team_study
    from ragteam.eval.stats import BootstrapConfig
    from ragteam.io import DataError

    cfg = BootstrapConfig(resamples=resamples, seed=seed)
    try:
        runs, notes = team_study.load_runs(_exp_show(exp_json), _at_rev, select=exp, pair=pair)
        summary = team_study.summarize(runs, pair, _episode_scores if pooled else None, cfg)
    except (ValueError, OSError, DataError) as e:
        raise fail(e)
    _write_report(out_md, out_json, team_study.report_markdown(summary, notes, cfg), summary)


@app.command("keep")
def replicate_keep(
    experiments: list[str] = typer.Argument(..., help="DVC experiment names (or commits) whose records a study "
                                            "reports"),
    message: Optional[str] = typer.Option(None, "-m", "--message", help="the merge commit's message"),
) -> None:
    """Keep a study's experiment commits in the current branch's history (a merge that changes no file), so a clone
    of the branch can rerun its summary and `ragteam lineage --rev <commit>` can trace its numbers: DVC keeps
    experiments under refs/exps, which `git clone` does not fetch."""
    from ragteam.lineage import LineageError, find_root, keep_commits

    msg = message or f"keep the experiment commits of {', '.join(experiments)} in this branch's history (no file changes)"
    try:
        head, kept = keep_commits(find_root(), experiments, msg)
    except LineageError as e:
        raise fail(e)
    if not kept:
        typer.echo(f"nothing to keep: {len(experiments)} experiment commit(s) already in the history of {head[:7]}")
        return
    typer.echo(f"kept {len(kept)} experiment commit(s) ({', '.join(k[:7] for k in kept)}) in {head[:7]}")


@app.command("summarize")
def replicate_summarize(
    exp_json: Optional[Path] = typer.Option(None, "--exp-json", help="saved `dvc exp show --json` output "
                                            "(default: run it here)"),
    exp: Optional[list[str]] = typer.Option(None, "--exp", help="only these experiments (names or revisions)"),
    metrics: Optional[list[Path]] = typer.Option(None, "--metrics", help="instead of experiments: eval_agents "
                                                 "metrics files, one per replicate (per-question scores read from "
                                                 "<file>.questions.json beside each, when present)"),
    out_md: Path = typer.Option(Path("reports/replicate.md"), help="the report"),
    out_json: Path = typer.Option(Path("metrics/replicate.json"), help="the summary as JSON"),
    resamples: int = typer.Option(10_000, help="bootstrap resamples of the pooled interval"),
    seed: int = typer.Option(0, help="bootstrap seed"),
) -> None:
    """Per agent and benchmark, base vs trained over seed replicates: mean ± sd of the gain, t-interval, signs,
    pooled paired bootstrap -> reports/replicate.md and metrics/replicate.json."""
    from studies import replicate as rep
    from ragteam.eval.stats import BootstrapConfig

    def read_json(path: Path) -> dict:
        return json.loads(path.read_text())

    cfg = BootstrapConfig(resamples=resamples, seed=seed)
    try:
        if metrics:
            runs = [rep.Run(str(m), metrics=read_json(m), questions=read_json(m.with_suffix(".questions.json"))
                            if m.with_suffix(".questions.json").is_file() else None) for m in metrics]
            notes: list[str] = []
        else:
            runs, notes = rep.runs_from_exp_show(_exp_show(exp_json), lambda rev: _at_rev(rev, rep.QUESTIONS_FILE),
                                                 select=exp, read_record=lambda rev: _at_rev(rev, rep.METRICS_FILE))
        notes += rep.check_runs(runs)
        summary = rep.summarize_replicates(runs, cfg)
    except (ValueError, OSError) as e:
        raise fail(e)
    _write_report(out_md, out_json, rep.report_markdown(summary, notes, cfg), summary)
