"""Stage index_dense: encode data/prepared/corpus.jsonl with models/encoder, then build the FAISS index.

Embeddings go to data/indexes/dense_shards (a persistent DVC out, one .npy per shard written atomically): a
rerun after an interruption encodes only the missing shards. The FAISS index is swapped in when complete.
"""
from __future__ import annotations

import sys
from pathlib import Path

from pydantic import BaseModel, ConfigDict

from ragteam.config import ParamsError, load_params, parse_section
from ragteam.environment import run_record
from ragteam.io import DataError, atomic_dir, write_json
from ragteam.retrieval.config import DenseParams
from ragteam.timing import timed

CORPUS = Path("data/prepared/corpus.jsonl")
ENCODER = Path("models/encoder")
SHARDS = Path("data/indexes/dense_shards")
OUT = Path("data/indexes/dense")


class EncoderSource(BaseModel):
    # Only the source URI is read here (it names the model family); prepare_models owns the other keys.
    model_config = ConfigDict(extra="ignore")
    source: str


@timed("retrieval")
def run(p: DenseParams, source: str, corpus: Path = CORPUS, encoder_dir: Path = ENCODER, shards: Path = SHARDS,
        out: Path = OUT) -> dict:
    from ragteam.retrieval.dense import Encoder, FaissSpec, build_dense_index, resolve_convention

    conv = resolve_convention(p.convention, encoder_dir, source, query_max_length=p.query_max_length,
                              passage_max_length=p.passage_max_length)
    enc = Encoder(encoder_dir, conv, device=None if p.device == "auto" else p.device, fp16=p.fp16,
                  batch_size=p.batch_size)
    with atomic_dir(out) as tmp:
        stats = build_dense_index(corpus, enc, shards, tmp, spec=FaissSpec(**p.faiss.model_dump()),
                                  shard_size=p.shard_size, use_gpu=p.faiss_gpu)
    size = (out / "index.faiss").stat().st_size
    return {**stats, "convention": conv.name, "faiss": p.faiss.kind, "dim": enc.dim, "index_bytes": size}


def main() -> None:
    try:
        params = load_params()
        p = parse_section(params, "retrieval.dense", DenseParams)
        src = parse_section(params, "models.encoder", EncoderSource).source
        metrics = run(p, src)
    except (ParamsError, DataError, ValueError) as e:
        sys.exit(f"index_dense FAILED: {e}")
    write_json("metrics/index_dense.json", {**metrics, **run_record()})
    print(f"index_dense: {metrics}")


if __name__ == "__main__":
    main()
