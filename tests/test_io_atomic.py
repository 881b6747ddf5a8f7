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
