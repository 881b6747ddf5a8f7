"""Atomic file and directory writes, and JSONL reading that names file:line on bad input."""
from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import tempfile
from collections.abc import Iterable, Iterator, Mapping, Sequence
from fnmatch import fnmatchcase
from pathlib import Path
from typing import Any


_UMASK = os.umask(0)
os.umask(_UMASK)


class DataError(ValueError):
    """Bad input data; the message names the file, the line (where there is one) and what is wrong."""


def read_jsonl(path: str | Path) -> Iterator[tuple[int, dict]]:
    """Yield (line_number, object) for each non-blank line; a malformed line raises DataError with file:line."""
    path = Path(path)
    with path.open("r", encoding="utf-8") as f:
        for lineno, line in enumerate(f, start=1):
            if not line.strip():
                continue
            try:
                obj = json.loads(line)
            except json.JSONDecodeError as e:
                raise DataError(f"{path}:{lineno}: malformed JSON line ({e.msg} at column {e.colno})") from None
            if not isinstance(obj, dict):
                raise DataError(f"{path}:{lineno}: expected a JSON object, got {type(obj).__name__}")
            yield lineno, obj


def load_jsonl(path: str | Path) -> list[dict]:
    return [obj for _, obj in read_jsonl(path)]


def _dump(obj: Any) -> str:
    return json.dumps(obj, ensure_ascii=False)



def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:             # another user's process: alive
        return True
    return True


def sweep_dead_writers(path: str | Path) -> list[Path]:
    """Remove what a killed writer of `path` left beside it: the temp file or directory `atomic_file` / `atomic_dir`
    was building (`.<name>.<pid>-XXXX.tmp`) and the previous version it was swapping out (`.<name>.old-<pid>`),
    when process <pid> is gone. A SIGKILL (an out-of-memory kill, a restarted machine) runs no cleanup, and the
    leftovers are untracked files beside a stage's output that git and DVC would show. A live pid's are kept: that
    writer is still at work (pids are this machine's: the GPU worker writes in its own checkout, never into this
    one). Returns what it removed."""
    path = Path(path)
    removed = []
    if not path.parent.is_dir():
        return removed
    for p in path.parent.iterdir():
        rest = p.name[len(path.name) + 2:] if p.name.startswith(f".{path.name}.") else None
        if rest is None:
            continue
        if rest.endswith(".tmp") and "-" in rest:
            pid = rest.split("-", 1)[0]
        elif rest.startswith("old-"):
            pid = rest[4:]
        else:
            continue
        if not pid.isdigit() or _alive(int(pid)):
            continue
        if p.is_dir() and not p.is_symlink():
            shutil.rmtree(p, ignore_errors=True)
        else:
            with contextlib.suppress(FileNotFoundError):
                p.unlink()
        removed.append(p)
    return removed


@contextlib.contextmanager
def atomic_file(path: str | Path, mode: str = "w") -> Iterator[Any]:
    """Write to a temp file beside `path`, fsync, then rename over it; on error the old file is untouched."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    sweep_dead_writers(path)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.{os.getpid()}-", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, mode, **({} if "b" in mode else {"encoding": "utf-8"})) as f:
            yield f
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, 0o666 & ~_UMASK)  # mkstemp makes 0600; give the file normal permissions
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


def save_figure(fig: Any, path: str | Path, **savefig_kw: Any) -> Path:
    """`fig.savefig` to `path` atomically (format from the suffix): a failed save leaves the old figure as it was."""
    path = Path(path)
    with atomic_file(path, "wb") as f:
        fig.savefig(f, format=path.suffix.lstrip(".") or "png", **savefig_kw)
    return path


def write_jsonl(path: str | Path, rows: Iterable[dict]) -> int:
    """Atomically write rows as JSONL (streamed: rows may be a generator). Returns the row count."""
    n = 0
    with atomic_file(path) as f:
        for row in rows:
            f.write(_dump(row) + "\n")
            n += 1
    return n


def write_json(path: str | Path, obj: Any) -> None:
    with atomic_file(path) as f:
        json.dump(obj, f, indent=2, ensure_ascii=False, default=str)
        f.write("\n")


# A stage's declared DVC metrics: the numbers people compare between runs (`dvc metrics show / diff`, `dvc exp show`).
# Its whole record (timings, counts, settings, the environment) stays in metrics/<name>.json, a plain output.
SUMMARY_DIR = "summary"


def compared_numbers(record: Mapping, keep: Sequence[str]) -> dict:
    """The numbers of `record` (nested dicts) whose dotted path (`a.b.c`) matches one of the fnmatch patterns
    `keep`, nested as in `record`. Booleans, strings and lists are never kept."""
    out: dict = {}

    def walk(x: Any, path: tuple[str, ...]) -> None:
        if isinstance(x, Mapping):
            for k, v in x.items():
                walk(v, (*path, str(k)))
        elif (isinstance(x, (int, float)) and not isinstance(x, bool)
              and any(fnmatchcase(".".join(path), pat) for pat in keep)):
            d = out
            for k in path[:-1]:
                d = d.setdefault(k, {})
            d[path[-1]] = x

    walk(record, ())
    return out


def summary_path(record_path: str | Path) -> Path:
    """metrics/<name>.json -> metrics/summary/<name>.json: where the declared metrics of that record go."""
    p = Path(record_path)
    return p.parent / SUMMARY_DIR / p.name


def write_metrics(path: str | Path, record: Mapping, keep: Sequence[str]) -> None:
    """The stage's whole record to `path` (metrics/<name>.json, a plain output) and `compared_numbers(record, keep)`
    to `summary_path(path)` (its declared metrics)."""
    write_json(path, record)
    write_json(summary_path(path), compared_numbers(record, keep))


@contextlib.contextmanager
def atomic_dir(path: str | Path) -> Iterator[Path]:
    """Build a directory in a temp sibling and swap it into place only if the block succeeds.

    On any exception the previous directory (if any) stays exactly as it was and the temp dir is removed. A file (or
    a link) at `path` is refused before the block runs (DataError): replacing an output that is not a directory
    with one is never what a stage means, and the swap would leave the file behind beside it.
    """
    path = Path(path)
    if path.is_symlink() or (path.exists() and not path.is_dir()):
        raise DataError(f"{path}: is a {'link' if path.is_symlink() else 'file'}, not a directory; refusing to "
                        f"replace it with the directory this step writes (move it away or delete it)")
    path.parent.mkdir(parents=True, exist_ok=True)
    sweep_dead_writers(path)
    tmp = Path(tempfile.mkdtemp(prefix=f".{path.name}.{os.getpid()}-", suffix=".tmp", dir=path.parent))
    os.chmod(tmp, 0o777 & ~_UMASK)
    try:
        yield tmp
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    old = path.with_name(f".{path.name}.old-{os.getpid()}")
    if path.exists():
        os.replace(path, old)
    try:
        os.replace(tmp, path)
    except BaseException:
        if old.exists():
            os.replace(old, path)
        raise
    shutil.rmtree(old, ignore_errors=True)


def sha256_file(path: str | Path, chunk: int = 1 << 20) -> str:
    h = hashlib.sha256()
    with Path(path).open("rb") as f:
        while block := f.read(chunk):
            h.update(block)
    return h.hexdigest()
