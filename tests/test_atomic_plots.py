"""Plots are written like every other output: to a temp file swapped in on success; a failed save keeps the old
figure and leaves no partial or temp file behind."""
import pytest

from ragteam.eval import report
from ragteam.train.curves import write_curves

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
    lambda p: write_curves([{"step": 1, "reward": 0.5}, {"step": 2, "reward": 0.7}], p.with_suffix(".csv"),
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
    assert sorted(p.name for p in out.parent.iterdir()) == sorted(p.name for p in [out, out.with_suffix(".csv")]
                                                                  if p.exists())


def test_curves_leave_wall_clock_columns_out_of_the_plot_files(tmp_path):
    rows = [{"step": 1, "reward": 0.5, "step_seconds": 3.2}, {"step": 2, "reward": 0.7, "step_seconds": 2.9}]
    write_curves(rows, tmp_path / "c.csv", tmp_path / "c.json")
    assert (tmp_path / "c.csv").read_text() == "step,reward\n1,0.5\n2,0.7\n"
    assert "step_seconds" not in (tmp_path / "c.json").read_text()
    assert rows[0]["step_seconds"] == 3.2   # the caller's rows keep it (the stage metrics sum it)
