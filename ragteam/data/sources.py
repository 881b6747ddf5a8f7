"""Data sources for prepare_data: synthetic (offline default), mirror:<dir> (a local copy in the layout of
shared/data) and flashrag (the public FlashRAG datasets + Dec-2018 Wikipedia through `datasets` / HTTP).

Each source yields the same three things: corpus rows, evaluation benchmarks {name: rows} and the training
question pool (rows tagged with metadata.source), plus the input files it read (for validation and lineage).
"""
from __future__ import annotations

import hashlib
import logging
import os
import re
import shutil
import zipfile
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from ragteam.data import synthetic
from ragteam.data.formats import iter_qa
from ragteam.io import DataError, atomic_file, read_jsonl, sha256_file

log = logging.getLogger(__name__)


@dataclass
class Prepared:
    corpus: Iterable[dict]
    benchmarks: dict[str, list[dict]]
    train_pool: list[dict]
    inputs: dict[str, list[Path]] = field(default_factory=dict)  # kind -> source files (validated as inputs)


def from_synthetic(n_passages: int, n_train: int, n_dev: int, seed: int,
                   question_mix: dict[str, float] | None = None) -> Prepared:
    _, passages, train, dev = synthetic.generate(n_passages, n_train, n_dev, seed, question_mix)
    for row in train:
        row["metadata"]["source"] = "synthetic"
    return Prepared(corpus=passages, benchmarks={"synthetic": dev}, train_pool=train)


def in_train_split(row_id: str, fraction: float, seed: int) -> bool:
    """Deterministic, order-independent split: a row goes to training iff its hash falls below `fraction`."""
    h = int(hashlib.sha256(f"{seed}:{row_id}".encode()).hexdigest()[:12], 16)
    return h / float(1 << 48) < fraction


def _corpus_rows(paths: list[Path]) -> Iterator[dict]:
    for path in paths:
        for _, row in read_jsonl(path):  # malformed JSON -> DataError naming file:line
            yield row


def split_benchmarks(rows_by_name: dict[str, list[dict]], train_from: list[str], fraction: float,
                     seed: int) -> tuple[dict[str, list[dict]], list[dict]]:
    """Move a deterministic `fraction` of each `train_from` benchmark into the training pool (disjoint from eval)."""
    benchmarks, pool = {}, []
    for name, rows in rows_by_name.items():
        keep = []
        for row in rows:
            if name in train_from and in_train_split(row["id"], fraction, seed):
                pool.append({**row, "metadata": {**row["metadata"], "source": name}})
            else:
                keep.append(row)
        benchmarks[name] = keep
    return benchmarks, pool


MIRROR_SPLITS = ("dev", "test")  # the first that exists is a mirror benchmark's evaluation split
EXPERIMENT_DIRS = (".dvc", "tmp", "exps")  # DVC runs temporary and queued experiments in <checkout>/.dvc/tmp/exps/...


def checkout_root(cwd: str | Path | None = None) -> Path:
    """The checkout a stage runs for: the working directory, or, inside a DVC temporary or queued experiment
    (`dvc exp run --temp` / `--queue` run in `<checkout>/.dvc/tmp/exps/<kind>/tmpXXXX`), that checkout."""
    here = Path(os.path.abspath(cwd or os.getcwd()))
    parts = here.parts
    for i in range(len(parts) - len(EXPERIMENT_DIRS) + 1):
        if parts[i:i + len(EXPERIMENT_DIRS)] == EXPERIMENT_DIRS:
            return Path(*parts[:i])
    return here


def resolve_mirror_dir(spec: str | Path, cwd: str | Path | None = None) -> Path:
    """The directory of `mirror:<spec>`. A relative spec means relative to the checkout (the README's
    `mirror:../shared/data` is the directory beside it), also when the stage runs in an experiment's temporary copy
    of the checkout, where the same relative path would point into `.dvc/tmp`. Unchanged outside experiments."""
    p = Path(spec)
    here = Path(os.path.abspath(cwd or os.getcwd()))
    root = checkout_root(here)
    if p.is_absolute() or root == here:
        return p
    return root / p


def from_mirror(root: str | Path, benchmarks: list[str], train_from: list[str], train_fraction: float,
                seed: int) -> Prepared:
    root = Path(root)
    corpus_files = sorted((root / "corpus").glob("*.jsonl"))
    if not corpus_files:
        raise DataError(f"mirror {root}: no corpus/*.jsonl found")
    missing = [b for b in train_from if b not in benchmarks]
    if missing:
        raise DataError(f"mirror: train_from names benchmarks not in data.mirror.benchmarks: {missing}")
    bench_files = {}
    for name in benchmarks:
        # dev, as MAPS evaluates; a benchmark published only as a test split (FlashRAG's Bamboogle, NQ) has test
        tried = [root / "benchmarks" / name / f"{split}.jsonl" for split in MIRROR_SPLITS]
        path = next((p for p in tried if p.exists()), None)
        if path is None:
            raise DataError(f"mirror {root}: benchmark {name!r} not found at {' or '.join(map(str, tried))}")
        bench_files[name] = path
    rows = {name: list(iter_qa(path)) for name, path in bench_files.items()}
    evals, pool = split_benchmarks(rows, train_from, train_fraction, seed)
    return Prepared(corpus=_corpus_rows(corpus_files), benchmarks=evals, train_pool=pool,
                    inputs={"corpus": corpus_files, "benchmark": list(bench_files.values())})


# Expected sha256 of known corpus downloads (URL without a fragment -> hex). A URL may also carry its own, as pip's
# URLs do: `...wiki18_100w.zip#sha256=<hex>` (data.flashrag.corpus). Without either, the computed sha256 is logged
# and recorded beside the file (`<file>.sha256`), to be pinned.
KNOWN_SHA256: dict[str, str] = {}


def _split_hash(url: str) -> tuple[str, str | None]:
    """(the URL without its fragment, the sha256 the fragment names or None)."""
    base, _, frag = url.partition("#")
    if not frag:
        return base, None
    key, _, value = frag.partition("=")
    if key != "sha256" or not re.fullmatch(r"[0-9a-fA-F]{64}", value):
        raise DataError(f"{url}: the only URL fragment understood is #sha256=<64 hex digits>")
    return base, value.lower()


def expected_sha256(url: str) -> str | None:
    base, pinned = _split_hash(url)
    return pinned or KNOWN_SHA256.get(base)


def _range_total(content_range: str | None) -> int | None:
    """The complete length from a Content-Range header (`bytes */N`, `bytes A-B/N`), None where it gives none."""
    m = re.fullmatch(r"\s*bytes\s+(?:\*|\d+-\d+)/(\d+)\s*", content_range or "")
    return int(m.group(1)) if m else None


def _record_sha256(path: Path, digest: str) -> None:
    with atomic_file(path.with_name(path.name + ".sha256")) as f:
        f.write(f"{digest}  {path.name}\n")


def _recorded_sha256(path: Path) -> str | None:
    side = path.with_name(path.name + ".sha256")
    try:
        return side.read_text().split()[0]
    except (OSError, IndexError):
        return None


def download_resumable(url: str, dest: Path, chunk: int = 1 << 20, timeout: float = 60.0,
                       sha256: str | None = None) -> Path:
    """HTTP(S) download to `dest` that resumes from `dest.part` with a Range request after an interruption.

    The finished file is checked against `sha256` (else the URL's `#sha256=` or KNOWN_SHA256) before it becomes
    `dest`: a mismatch removes the download and raises, naming the file and both hashes. Without an expected hash
    the computed one is logged and recorded in `dest.sha256`. A 416 answer to the resume (the range starts at or
    past the end) counts as complete only where the part's size is the total the server's Content-Range gives;
    otherwise the part is discarded and the file fetched again from the start."""
    import httpx
    from tqdm import tqdm

    url, pinned = _split_hash(url)
    expected = (sha256 or pinned or KNOWN_SHA256.get(url) or "").lower() or None
    dest.parent.mkdir(parents=True, exist_ok=True)
    part = dest.with_name(dest.name + ".part")
    have = part.stat().st_size if part.exists() else 0
    headers = {"Range": f"bytes={have}-"} if have else {}
    restart = False
    with httpx.stream("GET", url, headers=headers, follow_redirects=True, timeout=timeout) as r:
        if r.status_code == 416:
            total = _range_total(r.headers.get("content-range"))
            if total != have:   # not the whole file: a part of another version, or a server that says nothing
                log.warning("download %s: the server refused the resume at byte %d (HTTP 416, total %s); "
                            "%s is discarded and the file fetched again", url, have,
                            "unknown" if total is None else total, part)
                restart = True
        else:
            if r.status_code not in (200, 206):
                raise DataError(f"download {url}: HTTP {r.status_code}")
            if r.status_code == 206:
                m = re.match(r"\s*bytes\s+(\d+)-", r.headers.get("content-range", ""))
                if not m or int(m.group(1)) != have:
                    raise DataError(f"download {url}: asked for bytes {have}- of {part}, the server sent "
                                    f"{r.headers.get('content-range')!r}")
            mode = "ab" if r.status_code == 206 else "wb"  # a server ignoring Range restarts from zero
            total = int(r.headers.get("content-length", 0)) + (have if mode == "ab" else 0)
            with part.open(mode) as f, tqdm(total=total or None, initial=have if mode == "ab" else 0, unit="B",
                                             unit_scale=True, desc=dest.name) as bar:
                for block in r.iter_bytes(chunk):
                    f.write(block)
                    bar.update(len(block))
    if restart:
        part.unlink(missing_ok=True)
        return download_resumable(url, dest, chunk, timeout, sha256=expected)
    actual = sha256_file(part)
    if expected is not None and actual != expected:
        part.unlink(missing_ok=True)
        raise DataError(f"download {url}: {dest} has sha256 {actual}, expected {expected}; the download was removed "
                        f"(rerun to fetch it again)")
    part.rename(dest)
    _record_sha256(dest, actual)
    if expected is None:
        log.warning("download %s: no expected sha256 for it; %s has sha256 %s (recorded in %s.sha256): pin it by "
                    "ending the URL with #sha256=%s", url, dest, actual, dest.name, actual)
    return dest


def fetch_corpus(url_or_path: str, cache_dir: Path) -> list[Path]:
    """Local path, or a URL downloaded (resumably, checked against its sha256: `download_resumable`) into
    cache_dir; a .zip is extracted. Returns jsonl files. A file downloaded before is checked once against an
    expected sha256 that its recorded one (`<file>.sha256`) does not match."""
    if "://" not in url_or_path:
        path = Path(url_or_path)
        if not path.exists():
            raise DataError(f"flashrag corpus {path} does not exist")
    else:
        expected = expected_sha256(url_or_path)
        path = cache_dir / Path(url_or_path.split("#")[0].split("?")[0]).name
        if not path.exists():
            download_resumable(url_or_path, path)
        elif expected is not None and _recorded_sha256(path) != expected:
            actual = sha256_file(path)
            if actual != expected:
                raise DataError(f"flashrag corpus {path} (from {url_or_path}) has sha256 {actual}, expected "
                                f"{expected}: remove it to download it again")
            _record_sha256(path, actual)
    if path.suffix == ".zip":
        out = cache_dir / (path.stem + "_unzipped")
        if not out.exists():
            tmp = out.with_name(out.name + ".tmp")
            shutil.rmtree(tmp, ignore_errors=True)
            with zipfile.ZipFile(path) as z:
                z.extractall(tmp)
            tmp.rename(out)
        path = out
    files = sorted(path.rglob("*.jsonl")) if path.is_dir() else [path]
    if not files:
        raise DataError(f"flashrag corpus {url_or_path}: no .jsonl file found")
    return files


def _load_flashrag_split(repo: str, name: str, split: str, limit: int) -> list[dict]:
    """One FlashRAG dataset split through `datasets`: the hub repo, or a local dir laid out as <name>/<split>.jsonl."""
    import datasets

    local = Path(repo)
    if local.is_dir():
        path = local / name / f"{split}.jsonl"
        if not path.exists():
            raise DataError(f"flashrag: {path} not found")
        ds = datasets.load_dataset("json", data_files=str(path), split="train")
        where = str(path)
    else:
        ds = datasets.load_dataset(repo, name, split=split)
        where = f"{repo}[{name}/{split}]"
    rows = []
    for i, row in enumerate(ds.select(range(min(limit, len(ds))))):
        golds = row.get("golden_answers")
        if not isinstance(golds, list) or not golds or not all(isinstance(g, str) and g for g in golds):
            raise DataError(f"{where}: row {i + 1} ({row.get('id')!r}) has no valid golden_answers")
        rows.append({"id": str(row["id"]), "question": row["question"], "golden_answers": golds,
                     "metadata": row.get("metadata") or {}})
    return rows


def split_of(split: str | Mapping[str, str], name: str) -> str:
    """The evaluation split of dataset `name`: one split for all, or a mapping dataset -> split."""
    if isinstance(split, str):
        return split
    if name not in split:
        raise DataError(f"data.flashrag.split names no split for dataset {name!r} (has {sorted(split)})")
    return split[name]


def from_flashrag(repo: str, datasets_: list[str], split: str | Mapping[str, str], train_split: str,
                  train_from: list[str], max_eval_rows: int, max_train_rows: int, corpus: str,
                  cache_dir: Path) -> Prepared:
    """`split` may differ per dataset: FlashRAG publishes Bamboogle (and NQ) only as `test`, the others as `dev`."""
    benchmarks = {name: _load_flashrag_split(repo, name, split_of(split, name), max_eval_rows) for name in datasets_}
    pool = []
    for name in train_from:
        for row in _load_flashrag_split(repo, name, train_split, max_train_rows):
            pool.append({**row, "metadata": {**row["metadata"], "source": name}})
    files = fetch_corpus(corpus, cache_dir)
    return Prepared(corpus=_corpus_rows(files), benchmarks=benchmarks, train_pool=pool,
                    inputs={"corpus": files})
