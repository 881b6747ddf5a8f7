"""Stage prepare_data: corpus + benchmarks + training pool (FlashRAG format) from a source, validated with GX.

Everything is built in a temp dir and swapped into data/prepared only after every input and output file
passed validation; on any failure the previous data/prepared is untouched and the report says why.
"""
from __future__ import annotations

import sys
import time
from pathlib import Path

from pydantic import field_validator, model_validator

from ragteam.config import Strict, load_params, parse_section
from ragteam.data import sources
from ragteam.data.validate import Limits, ValidationFailed, check_files
from ragteam.environment import run_record
from ragteam.io import DataError, atomic_dir, sha256_file, write_json, write_jsonl

OUT = Path("data/prepared")
REPORT = Path("reports/validation/prepare_data.json")


class SyntheticParams(Strict):
    n_passages: int
    n_train: int
    n_dev: int
    question_mix: dict[str, float] | None = None   # template -> weight (ragteam.data.synthetic.QUESTION_TYPES)


class MirrorParams(Strict):
    benchmarks: list[str]
    train_from: list[str]
    train_fraction: float

    @field_validator("train_fraction")
    @classmethod
    def _fraction(cls, v: float) -> float:
        if not 0.0 <= v < 1.0:
            raise ValueError("must be in [0, 1)")
        return v


class FlashragParams(Strict):
    repo: str
    datasets: list[str]
    train_from: list[str]
    split: str | dict[str, str]     # one split for every dataset, or dataset -> split (Bamboogle has only test)
    train_split: str
    max_eval_rows: int
    max_train_rows: int
    corpus: str

    @model_validator(mode="after")
    def _split_per_dataset(self) -> FlashragParams:
        if isinstance(self.split, dict):
            missing = [d for d in self.datasets if d not in self.split]
            if missing:
                raise ValueError(f"split: no split for datasets {missing} (a mapping must name every dataset)")
        return self


class ValidationParams(Strict):
    corpus_rows: tuple[int, int]
    corpus_contents_chars: tuple[int, int]
    benchmark_rows: tuple[int, int]
    train_rows: tuple[int, int]
    chunk_rows: int


class DataParams(Strict):
    source: str
    seed: int
    synthetic: SyntheticParams
    mirror: MirrorParams
    flashrag: FlashragParams
    validation: ValidationParams

    @field_validator("source")
    @classmethod
    def _source(cls, v: str) -> str:
        if v not in ("synthetic", "flashrag") and not v.startswith("mirror:"):
            raise ValueError("must be 'synthetic', 'flashrag' or 'mirror:<dir>'")
        return v


def input_label(p: DataParams, f: Path) -> str:
    """How the manifest names an input file: as the source spec writes it (`../shared/data/corpus/x.jsonl`), so a
    temporary experiment, which reads the same file through another path, writes the same manifest."""
    if not p.source.startswith("mirror:"):
        return str(f)
    spec = p.source[len("mirror:"):]
    root = sources.resolve_mirror_dir(spec)
    try:
        return str(Path(spec) / Path(f).relative_to(root))
    except ValueError:
        return str(f)


def build(p: DataParams, cache_dir: Path) -> sources.Prepared:
    if p.source == "synthetic":
        s = p.synthetic
        return sources.from_synthetic(s.n_passages, s.n_train, s.n_dev, p.seed, s.question_mix)
    if p.source.startswith("mirror:"):
        m = p.mirror
        return sources.from_mirror(sources.resolve_mirror_dir(p.source[len("mirror:"):]), m.benchmarks, m.train_from,
                                   m.train_fraction, p.seed)
    f = p.flashrag
    return sources.from_flashrag(f.repo, f.datasets, f.split, f.train_split, f.train_from, f.max_eval_rows,
                                 f.max_train_rows, f.corpus, cache_dir)


def run(p: DataParams, out: Path = OUT, report: Path = REPORT, cache_dir: Path = Path("data/cache")) -> dict:
    t0 = time.time()
    v = p.validation
    lim = {"corpus": Limits(v.corpus_rows, v.corpus_contents_chars, v.chunk_rows),
           "benchmark": Limits(v.benchmark_rows, chunk_rows=v.chunk_rows),
           "train": Limits(v.train_rows, chunk_rows=v.chunk_rows)}
    reports = []
    staged: list[Path] = []

    def report_dicts(rs) -> list[dict]:
        # outputs are validated in atomic_dir's randomly named temp dir: report them under their final path, so
        # the report names the file a user will find, and reruns write the same report
        ds = [r.to_dict() for r in rs]
        for d in ds:
            for tmp in staged:
                if d["file"].startswith(str(tmp)):
                    d["file"] = str(out) + d["file"][len(str(tmp)):]
        return ds

    try:
        prepared = build(p, cache_dir)
        # Inputs first, so a bad source row is reported at its own file:line.
        inputs = [(f, k, lim[k]) for k, files in prepared.inputs.items() for f in files]
        reports += check_files(inputs)
        with atomic_dir(out) as tmp:
            staged.append(tmp)
            counts = {"corpus": write_jsonl(tmp / "corpus.jsonl", prepared.corpus)}
            for name, rows in prepared.benchmarks.items():
                counts[f"benchmarks/{name}"] = write_jsonl(tmp / "benchmarks" / f"{name}.jsonl", rows)
            counts["train/pool"] = write_jsonl(tmp / "train" / "pool.jsonl", prepared.train_pool)
            outputs = [(tmp / "corpus.jsonl", "corpus", lim["corpus"])]
            outputs += [(tmp / "benchmarks" / f"{n}.jsonl", "benchmark", lim["benchmark"]) for n in prepared.benchmarks]
            outputs += [(tmp / "train" / "pool.jsonl", "train", lim["train"])]
            reports += check_files(outputs)
            manifest = {"source": p.source, "params": p.model_dump(mode="json"), "counts": counts,
                        "inputs": {input_label(p, f): sha256_file(f) for files in prepared.inputs.values()
                                   for f in files},
                        "files": {str(f.relative_to(tmp)): sha256_file(f) for f in sorted(tmp.rglob("*.jsonl"))}}
            write_json(tmp / "manifest.json", manifest)
    except ValidationFailed as e:
        write_json(report, {"success": False, "reports": report_dicts(reports + e.reports)})
        raise
    except DataError as e:
        write_json(report, {"success": False, "error": str(e), "reports": report_dicts(reports)})
        raise
    write_json(report, {"success": True, "reports": report_dicts(reports)})
    return {"source": p.source, "rows": counts, "train_sources": _by_source(prepared.train_pool),
            "seconds": round(time.time() - t0, 2)}


def _by_source(rows: list[dict]) -> dict[str, int]:
    out: dict[str, int] = {}
    for r in rows:
        out[r["metadata"].get("source", "?")] = out.get(r["metadata"].get("source", "?"), 0) + 1
    return out


def main() -> None:
    p = parse_section(load_params(), "data", DataParams)
    try:
        metrics = run(p)
    except DataError as e:
        print(f"prepare_data FAILED (previous {OUT} left untouched; report: {REPORT}):\n{e}", file=sys.stderr)
        sys.exit(1)
    # the environment that ran it, for `ragteam lineage` (the libraries' versions: issue 26 §3)
    write_json("metrics/prepare_data.json", {**metrics, **run_record()})
    print(f"prepare_data: {metrics['rows']} in {metrics['seconds']} s")


if __name__ == "__main__":
    main()
