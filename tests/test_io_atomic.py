"""ragteam.io.atomic_dir: a stage's output directory is swapped in whole, kept whole on failure, and never replaces a
file or a link that stands where the directory belongs."""
import os

import pytest

from ragteam.io import DataError, atomic_dir


def _leftovers(parent, name):
    return sorted(p.name for p in parent.iterdir() if p.name.startswith(f".{name}."))


def test_the_block_s_directory_replaces_the_previous_one_whole(tmp_path):
    out = tmp_path / "deep" / "out"
    with atomic_dir(out) as tmp:
        (tmp / "a.txt").write_text("1")
        (tmp / "stale.txt").write_text("old")
    with atomic_dir(out) as tmp:
        assert not (tmp / "a.txt").exists()            # built from nothing, not on top of the previous version
        (tmp / "a.txt").write_text("2")
    assert sorted(p.name for p in out.iterdir()) == ["a.txt"] and (out / "a.txt").read_text() == "2"
    assert _leftovers(out.parent, "out") == []


def test_a_failing_block_leaves_the_previous_directory_as_it_was(tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    (out / "kept.txt").write_text("kept")
    with pytest.raises(RuntimeError, match="half-way"):
        with atomic_dir(out) as tmp:
            (tmp / "new.txt").write_text("new")
            raise RuntimeError("half-way")
    assert sorted(p.name for p in out.iterdir()) == ["kept.txt"]
    assert _leftovers(tmp_path, "out") == []


@pytest.mark.parametrize("kind", ["file", "link to a directory", "dangling link"])
def test_a_file_or_link_where_the_directory_belongs_is_refused_before_the_block_runs(tmp_path, kind):
    out = tmp_path / "out"
    if kind == "file":
        out.write_text("someone's file")
    else:
        target = tmp_path / "elsewhere"
        if kind == "link to a directory":
            target.mkdir()
            (target / "theirs.txt").write_text("theirs")
        os.symlink(target, out)
    ran = []
    with pytest.raises(DataError, match=r"out: is a (file|link), not a directory; refusing to replace it"):
        with atomic_dir(out):
            ran.append(True)
    assert ran == []                                     # no work done that would then be thrown away
    if kind == "file":
        assert out.read_text() == "someone's file"
    else:
        assert out.is_symlink() and os.readlink(out) == str(tmp_path / "elsewhere")
    if kind == "link to a directory":
        assert (tmp_path / "elsewhere" / "theirs.txt").read_text() == "theirs"
    assert _leftovers(tmp_path, "out") == []


def _dead_pid() -> int:
    import subprocess
    import sys

    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


@pytest.mark.parametrize("writer", ["dir", "file"])
def test_a_killed_writers_leftovers_are_swept_and_a_live_ones_kept(tmp_path, writer):
    """A SIGKILL runs no cleanup: the next writer of the same output removes the dead one's temp and swapped-out
    copies (the environment restart of 2026-12-06 left results/.eval.*.tmp behind), and leaves a live writer's."""
    from ragteam.io import atomic_file, sweep_dead_writers

    dead, live = _dead_pid(), os.getpid()
    out = tmp_path / ("out" if writer == "dir" else "out.json")
    (tmp_path / f".{out.name}.{dead}-abc123.tmp").mkdir()
    (tmp_path / f".{out.name}.{dead}-abc123.tmp" / "half.jsonl").write_text("{")
    (tmp_path / f".{out.name}.{dead}-zz.tmp").write_text("half")
    (tmp_path / f".{out.name}.old-{dead}").mkdir()
    (tmp_path / f".{out.name}.{live}-busy.tmp").write_text("being written")
    (tmp_path / f".{out.name}.abc.tmp").write_text("no pid: not ours to judge")
    (tmp_path / f".{out.name}x.{dead}-q.tmp").write_text("another output's")
    if writer == "dir":
        with atomic_dir(out) as tmp:
            (tmp / "a.txt").write_text("1")
    else:
        with atomic_file(out) as fh:
            fh.write("{}")
    assert sorted(_leftovers(tmp_path, out.name)) == sorted([f".{out.name}.{live}-busy.tmp", f".{out.name}.abc.tmp"])
    assert (tmp_path / f".{out.name}x.{dead}-q.tmp").exists()
    assert sweep_dead_writers(tmp_path / "nothing" / "here") == []
