"""Plots are written like every other output: to a temp file swapped in on success; a failed save keeps the old
figure and leaves no partial or temp file behind."""
import json
from pathlib import Path

import pytest

from ragteam.eval import report
from ragteam.train.curves import read_curves, write_curves

REPO = Path(__file__).resolve().parents[1]
METRICS = {s: {b: {"f1": f, "em": f / 2, "tokens": 100.0 * (i + 1), "seconds": 1.0 + i}
               for b in ("hotpotqa", "avg")} for i, (s, f) in enumerate([("maps", 30.0), ("standard_rag", 20.0)])}


def _broken_savefig(monkeypatch):
    """Figure.savefig writes part of the image, then fails (disk full, killed, a backend error)."""
    from matplotlib.figure import Figure

    def savefig(self, fname, **kw):
        if hasattr(fname, "write"):
            fname.write(b"\x89PNG partial")
        else:  # a path: what a direct save would leave behind
            with open(fname, "wb") as f:
                f.write(b"\x89PNG partial")
        raise OSError("disk full")

    monkeypatch.setattr(Figure, "savefig", savefig)


@pytest.mark.parametrize("plot", [
    lambda p: report.plot_cost_accuracy(METRICS, p),
    lambda p: report.plot_scores(METRICS, ["hotpotqa"], p),
    lambda p: write_curves([{"step": 1, "reward": 0.5}, {"step": 2, "reward": 0.7}], p.parent / "curves",
                           png_path=p),
], ids=["eval_cost", "eval_scores", "training_curve"])
def test_a_failed_plot_save_keeps_the_previous_figure(plot, tmp_path, monkeypatch):
    out = tmp_path / "figures" / "fig.png"
    plot(out)
    before = out.read_bytes()
    assert before.startswith(b"\x89PNG") and len(before) > 1000
    _broken_savefig(monkeypatch)
    with pytest.raises(OSError, match="disk full"):
        plot(out)
    assert out.read_bytes() == before
    assert sorted(p.name for p in out.parent.iterdir()) == sorted(p.name for p in [out, out.parent / "curves"]
                                                                  if p.exists())


def test_curves_leave_wall_clock_columns_out_of_the_plot_files(tmp_path):
    rows = [{"step": 1, "reward": 0.5, "step_seconds": 3.2}, {"step": 2, "reward": 0.7, "step_seconds": 2.9}]
    write_curves(rows, tmp_path / "c")
    assert read_curves(tmp_path / "c") == {"reward": [(1, 0.5), (2, 0.7)]}
    assert "step_seconds" not in (tmp_path / "c/metrics.json").read_text()
    assert rows[0]["step_seconds"] == 3.2   # the caller's rows keep it (the stage metrics sum it)


def _tensorboard_scalars(logdir):
    """(tag, step, value) of every scalar in a TensorBoard event file (TFRecord framing: length, crc, data, crc)."""
    import struct

    from tensorboardX.proto import event_pb2

    (path,) = logdir.iterdir()
    data, out, i = path.read_bytes(), [], 0
    while i < len(data):
        (n,) = struct.unpack("<Q", data[i:i + 8])
        event = event_pb2.Event.FromString(data[i + 12:i + 12 + n])
        i += 12 + n + 4
        out += [(v.tag, event.step, round(v.simple_value, 6)) for v in event.summary.value]
    return out


def test_curves_are_dvclive_plots_and_tensorboard_scalars_and_a_rerun_writes_the_same_bytes(tmp_path):
    rows = [{"step": 1, "stage": "stage1", "reward": -1.0, "reward/planner": 0.25, "kl": float("nan"),
             "step_seconds": 4.0},
            {"step": 2, "stage": "stage1", "reward": -0.5, "reward/planner": 0.5, "kl": 0.001, "step_seconds": 4.0}]
    write_curves(rows, tmp_path / "curves", tensorboard_dir=tmp_path / "tb")
    files = sorted(p.relative_to(tmp_path / "curves").as_posix() for p in (tmp_path / "curves").rglob("*")
                   if p.is_file())
    # one TSV per numeric column (a role's reward beside the team's: `/` -> `.`); the string tag and wall time are
    # not curves
    assert files == ["metrics.json", "plots/metrics/kl.tsv", "plots/metrics/reward.planner.tsv",
                     "plots/metrics/reward.tsv"]
    assert (tmp_path / "curves/plots/metrics/reward.tsv").read_text() == "step\treward\n1\t-1.0\n2\t-0.5\n"
    # NaN is not logged: the KL curve starts where it was measured
    assert read_curves(tmp_path / "curves")["kl"] == [(2, 0.001)]
    assert json.loads((tmp_path / "curves/metrics.json").read_text()) == {
        "step": 2, "reward": -0.5, "reward.planner": 0.5, "kl": 0.001}
    assert sorted(_tensorboard_scalars(tmp_path / "tb")) == [
        ("kl", 2, 0.001), ("reward", 1, -1.0), ("reward", 2, -0.5), ("reward/planner", 1, 0.25),
        ("reward/planner", 2, 0.5)]
    before = {p: p.read_bytes() for p in (tmp_path / "curves").rglob("*") if p.is_file()}
    write_curves(rows, tmp_path / "curves", tensorboard_dir=tmp_path / "tb")
    assert {p: p.read_bytes() for p in (tmp_path / "curves").rglob("*") if p.is_file()} == before
    assert len(list((tmp_path / "tb").iterdir())) == 1    # the rerun replaced the run, it did not add a second


def test_curves_written_under_dvc_exp_run_touch_neither_git_nor_dvc(tmp_path, monkeypatch):
    """Inside `dvc exp run` (DVC sets DVC_ROOT and DVC_EXP_BASELINE_REV) DVCLive would `git add` its directory's files:
    the stage's curves are a declared output, so the index must stay as it was and no dvc.yaml appears."""
    import subprocess
    import sys

    def git(*args):
        return subprocess.run(["git", *args], cwd=tmp_path, check=True, capture_output=True, text=True).stdout

    git("init", "-q")
    git("-c", "user.name=t", "-c", "user.email=t@t", "commit", "-q", "--allow-empty", "-m", "base")
    subprocess.run([sys.executable, "-m", "dvc", "init", "-q"], cwd=tmp_path, check=True)
    status = git("status", "--porcelain")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("DVC_ROOT", str(tmp_path))
    monkeypatch.setenv("DVC_EXP_BASELINE_REV", git("rev-parse", "HEAD").strip())
    write_curves([{"step": 1, "reward": 0.5}], "reports/training/stage")
    assert read_curves(tmp_path / "reports/training/stage") == {"reward": [(1, 0.5)]}
    assert git("status", "--porcelain") == status + "?? reports/\n"      # untracked, nothing staged
    assert not (tmp_path / "reports/training/stage/dvc.yaml").exists()


def test_every_training_stage_declares_its_dvclive_curves_and_dvc_plots_renders_them(tmp_path, monkeypatch):
    import subprocess
    import sys

    import yaml

    from stages.common import CURVES

    stages = yaml.safe_load((REPO / "dvc.yaml").read_text())["stages"]
    for name in ("train_answer", "train_query", "train_judge", "warmup_joint", "train_joint"):
        body = stages[name].get("do", stages[name])
        stage = name if "do" not in stages[name] else f"{name}_${{item}}"
        plots = [next(iter(p)) if isinstance(p, dict) else p for p in body["plots"]]
        outs = [next(iter(o)) if isinstance(o, dict) else o for o in body["outs"]]
        assert f"{CURVES}/{stage}/plots/metrics" in plots, name
        assert f"{CURVES}/{stage}/metrics.json" in outs, name
        assert not any(str(p).endswith(".csv") for p in plots), name
    # what `dvc plots show` makes of such a declaration: one plot per curve, x = step
    subprocess.run(["git", "init", "-q"], cwd=tmp_path, check=True)
    subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-q", "--allow-empty", "-m", "base"],
                   cwd=tmp_path, check=True)
    subprocess.run([sys.executable, "-m", "dvc", "init", "-q"], cwd=tmp_path, check=True)
    (tmp_path / "dvc.yaml").write_text(yaml.safe_dump({"stages": {"train_judge": {
        "cmd": "true", "outs": [{"reports/training/train_judge/metrics.json": {"cache": False}}],
        "plots": [{"reports/training/train_judge/plots/metrics": {"x": "step", "cache": False}}]}}}))
    monkeypatch.chdir(tmp_path)
    write_curves([{"step": 1, "loss": 2.0, "grad_norm/policy": 0.1}, {"step": 2, "loss": 1.5}],
                 CURVES / "train_judge")
    shown = json.loads(subprocess.run([sys.executable, "-m", "dvc", "plots", "show", "--json"], cwd=tmp_path,
                                      check=True, capture_output=True, text=True).stdout)["data"]
    base = "reports/training/train_judge/plots/metrics"
    assert sorted(shown) == [f"{base}/grad_norm.policy.tsv", f"{base}/loss.tsv"]
    spec = shown[f"{base}/loss.tsv"][0]["content"]
    assert spec["encoding"]["x"]["field"] == "step"
    assert [(v["step"], v["loss"]) for v in spec["data"]["values"]] == [("1", "2.0"), ("2", "1.5")]


def test_dvclive_posts_nothing_to_studio_here_even_for_a_user_logged_in(tmp_path, monkeypatch):
    """The project's .dvc/config sets `studio.offline`: a training stage's DVCLive sends no events to DVC Studio
    even where a token is configured (`dvc studio login` writes one to the user's global config)."""
    import shutil
    import subprocess

    import dvclive.studio

    sent = []
    monkeypatch.setattr(dvclive.studio, "post_live_metrics", lambda *a, **kw: sent.append(kw) or True)
    monkeypatch.setenv("DVC_STUDIO_TOKEN", "isat_not-a-real-token")
    monkeypatch.setenv("DVC_STUDIO_URL", "http://127.0.0.1:9")
    monkeypatch.delenv("DVC_STUDIO_OFFLINE", raising=False)
    subprocess.run(["git", "init", "-q"], cwd=tmp_path, check=True)
    subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-q", "--allow-empty", "-m", "b"],
                   cwd=tmp_path, check=True)
    subprocess.run(["git", "remote", "add", "origin", "https://example.com/team/ragteam.git"], cwd=tmp_path, check=True)
    (tmp_path / ".dvc").mkdir()
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("DVC_ROOT", str(tmp_path))           # inside `dvc repro`, where DVCLive would post
    (tmp_path / ".dvc/config").write_text("[core]\n    analytics = false\n")
    write_curves([{"step": 1, "reward": 0.5}], "reports/training/stage")
    assert sent, "control: without studio.offline DVCLive posts (else this test cannot see a post)"
    sent.clear()
    shutil.copy(REPO / ".dvc/config", tmp_path / ".dvc/config")
    write_curves([{"step": 1, "reward": 0.5}], "reports/training/stage")
    assert sent == []
