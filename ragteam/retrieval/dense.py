"""Dense retrieval: an encoder that follows each model family's conventions, sharded resumable corpus encoding,
FAISS indexes (Flat / HNSW / IVF-PQ, inner product on L2-normalised vectors) and a `Retriever` over them.

Row i of a FAISS index is row i of the corpus file, the convention of FlashRAG and Search-R1, so their prebuilt
`e5_Flat.index` opens here with their wiki-18 JSONL and e5-base-v2.
"""
from __future__ import annotations

import dataclasses
import json
import math
import re
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ragteam.io import DataError, atomic_file, sha256_file, write_json
from ragteam.retrieval.base import Hit
from ragteam.retrieval.corpus import Corpus
from ragteam.retrieval.meta import META, corpus_record


@dataclass(frozen=True)
class Convention:
    """How a model family expects text: prefixes, pooling, normalisation and token windows."""

    name: str
    query_prefix: str
    passage_prefix: str
    pooling: str  # "mean" (masked mean of the last hidden states) or "cls"
    normalize: bool
    query_max_length: int
    passage_max_length: int


CONVENTIONS = {
    # intfloat/e5-*: trained with these prefixes; mean pooling. Query window as FlashRAG
    # (retrieval_query_max_length 128), passages up to the model's 512 positions.
    "e5": Convention("e5", "query: ", "passage: ", "mean", True, 128, 512),
    # BAAI/bge-*-en-v1.5: instruction on queries only, CLS pooling.
    "bge": Convention("bge", "Represent this sentence for searching relevant passages: ", "", "cls", True, 128, 512),
    # sentence-transformers all-* models (all-MiniLM-L6-v2, all-mpnet-base-v2): symmetric, no prefixes,
    # mean pooling, and the 256-token max_seq_length their sentence_bert_config.json sets.
    "sentence-transformers": Convention("sentence-transformers", "", "", "mean", True, 256, 256),
}
_FAMILY_PATTERNS = (  # matched against model ids / source URIs / directory names, lower-cased
    ("e5", re.compile(r"(^|[^a-z0-9])e5([^a-z0-9]|$)")),
    ("bge", re.compile(r"(^|[^a-z0-9])bge([^a-z0-9]|$)")),
    ("sentence-transformers", re.compile(r"minilm|mpnet|sentence-transformers")),
)


def _model_hints(model_path: str | Path) -> list[str]:
    hints = [str(model_path)]
    manifest = Path(model_path) / "ragteam-manifest.json"  # written by prepare_models: records the source URI
    if manifest.is_file():
        hints.insert(0, str(json.loads(manifest.read_text()).get("source", "")))
    return hints


def resolve_convention(setting: str, model_path: str | Path, *hints: str,
                       query_max_length: int | None = None, passage_max_length: int | None = None) -> Convention:
    """A convention by name, or with "auto" the first of `hints`, the model dir's recorded source and its path
    that names a known family (e5, bge, all-MiniLM...). Max lengths may be overridden."""
    if setting == "auto":
        for hint in [*hints, *_model_hints(model_path)]:
            found = next((name for name, pat in _FAMILY_PATTERNS if pat.search(hint.lower())), None)
            if found:
                setting = found
                break
        else:
            raise ValueError(f"cannot tell the encoder family of {model_path!s} (hints {list(hints)}); set "
                             f"retrieval.dense.convention to one of {sorted(CONVENTIONS)}")
    if setting not in CONVENTIONS:
        raise ValueError(f"unknown encoder convention {setting!r}; known: {sorted(CONVENTIONS)}")
    conv = CONVENTIONS[setting]
    return dataclasses.replace(conv, query_max_length=query_max_length or conv.query_max_length,
                               passage_max_length=passage_max_length or conv.passage_max_length)


class Encoder:
    """Text -> float32 vectors with a model's conventions; fp16 on CUDA, batches sorted by length."""

    def __init__(self, model_path: str | Path, convention: Convention, *, device: str | None = None,
                 fp16: bool = True, batch_size: int = 64):
        import torch
        from transformers import AutoModel, AutoTokenizer

        self.model_path, self.convention, self.batch_size = str(model_path), convention, batch_size
        self.device = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
        self.tokenizer = AutoTokenizer.from_pretrained(self.model_path)
        self.model = AutoModel.from_pretrained(self.model_path, use_safetensors=True).eval().to(self.device)
        self.fp16 = fp16 and self.device.type == "cuda"  # CPU half precision is slower, not faster
        if self.fp16:
            self.model.half()
        self.dim = int(self.model.config.hidden_size)

    def encode_queries(self, texts: list[str]) -> np.ndarray:
        c = self.convention
        return self._encode([c.query_prefix + t for t in texts], c.query_max_length)

    def encode_passages(self, texts: list[str], progress=None) -> np.ndarray:
        c = self.convention
        return self._encode([c.passage_prefix + t for t in texts], c.passage_max_length, progress)

    def _encode(self, texts: list[str], max_length: int, progress=None) -> np.ndarray:
        import torch

        out = np.empty((len(texts), self.dim), dtype=np.float32)
        # Longest first: batches of similar length waste little on padding, and an OOM shows up at once.
        order = np.argsort([-len(t) for t in texts], kind="stable")
        for lo in range(0, len(texts), self.batch_size):
            idx = order[lo:lo + self.batch_size]
            enc = self.tokenizer([texts[i] for i in idx], padding=True, truncation=True, max_length=max_length,
                                 return_tensors="pt").to(self.device)
            with torch.inference_mode():
                h = self.model(**enc).last_hidden_state
                if self.convention.pooling == "mean":
                    m = enc["attention_mask"].unsqueeze(-1).to(h.dtype)
                    e = (h * m).sum(1) / m.sum(1).clamp(min=1)
                else:
                    e = h[:, 0]
                e = e.float()
                if self.convention.normalize:
                    e = torch.nn.functional.normalize(e, dim=-1)
            out[idx] = e.cpu().numpy()
            if progress is not None:
                progress.update(len(idx))
        return out


# ---- sharded corpus encoding ------------------------------------------------------------------------------

def _shard_path(shard_dir: Path, i: int) -> Path:
    return shard_dir / f"shard_{i:05d}.npy"


def _shard_ok(path: Path, rows: int, dim: int) -> bool:
    try:
        arr = np.load(path, mmap_mode="r")
    except (OSError, ValueError):
        return False
    return arr.shape == (rows, dim) and arr.dtype == np.float32


_WEIGHTS_SHA256: dict[tuple, str] = {}


def weights_sha256(path: str | Path) -> str:
    """sha256 of a model file, hashed once per version of the file in a process (an encoder's ~90 MB take ~0.3 s;
    the corpus is hashed beside it anyway). The cache key is the file's identity and its stat: device, inode, size,
    mtime and ctime; no tool can set a ctime back, so a rewritten or replaced file is always hashed again."""
    path = Path(path)
    st = path.stat()
    key = (str(path.resolve()), st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)
    if key not in _WEIGHTS_SHA256:
        _WEIGHTS_SHA256[key] = sha256_file(path)
    return _WEIGHTS_SHA256[key]


def encoding_fingerprint(corpus: Corpus, encoder: Encoder) -> dict:
    """What the shards depend on; a change invalidates every finished shard. The model is every file of its
    directory (weights, tokenizer, config, pooling), each by relative path, size and sha256: another model of the
    same size and file names (a retrained or re-pulled encoder, a changed tokenizer) gives other embeddings, which
    the persisted shards (a `persist: true` DVC output) must not be mistaken for."""
    root = Path(encoder.model_path)
    files = sorted(p for p in root.rglob("*") if p.is_file()) if root.is_dir() else []
    return {"corpus_sha256": sha256_file(corpus.path), "n_docs": len(corpus),
            "model": [(p.relative_to(root).as_posix(), p.stat().st_size, weights_sha256(p)) for p in files]
            or encoder.model_path,
            "convention": dataclasses.asdict(encoder.convention), "dim": encoder.dim}


def encode_corpus(corpus: Corpus, encoder: Encoder, shard_dir: str | Path, *, shard_size: int,
                  show_progress: bool = True) -> tuple[list[Path], int]:
    """Encode every passage into `shard_dir/shard_#####.npy` (each written atomically); returns the shard paths
    and how many passages this call encoded.

    Finished shards are kept: after an interruption the next call encodes only the missing ones. Shards made
    for another corpus, model, convention or shard size are deleted first.
    """
    from tqdm import tqdm

    shard_dir = Path(shard_dir)
    shard_dir.mkdir(parents=True, exist_ok=True)
    want = {"fingerprint": encoding_fingerprint(corpus, encoder), "shard_size": shard_size}
    manifest = shard_dir / "manifest.json"
    have = json.loads(manifest.read_text()) if manifest.is_file() else None
    if have != json.loads(json.dumps(want)):
        for p in shard_dir.glob("shard_*.npy"):
            p.unlink()
        write_json(manifest, want)
    n = len(corpus)
    n_shards = math.ceil(n / shard_size)
    rows = [min(shard_size, n - i * shard_size) for i in range(n_shards)]
    todo = [i for i in range(n_shards) if not _shard_ok(_shard_path(shard_dir, i), rows[i], encoder.dim)]
    done_rows = n - sum(rows[i] for i in todo)
    with tqdm(total=n, initial=done_rows, desc="encode passages", unit="psg", disable=not show_progress) as bar:
        for i in todo:
            lo = i * shard_size
            texts = [corpus[j][1] for j in range(lo, lo + rows[i])]
            emb = encoder.encode_passages(texts, progress=bar)
            with atomic_file(_shard_path(shard_dir, i), "wb") as f:
                np.save(f, emb)
    return [_shard_path(shard_dir, i) for i in range(n_shards)], n - done_rows


def load_shards(paths: list[Path]) -> np.ndarray:
    return np.concatenate([np.load(p) for p in paths]) if paths else np.empty((0, 0), np.float32)


# ---- FAISS ---------------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class FaissSpec:
    kind: str = "flat"          # flat | hnsw | ivfpq
    hnsw_m: int = 32
    ef_construction: int = 200
    ef_search: int = 128
    nlist: int = 0              # IVF cells; 0: 4*sqrt(n); capped so each cell gets >= 39 training points
    pq_m: int = 0               # PQ sub-quantisers (8 bits each); 0: dim/8, i.e. dim bytes/8 per vector
    nprobe: int = 32
    train_size: int = 200_000   # IVF-PQ training sample


def ivfpq_shape(spec: FaissSpec, n: int, dim: int) -> tuple[int, int, int]:
    """(nlist, pq_m, pq_bits): FAISS's k-means wants >= 39 training points per centroid, for the IVF cells and
    for the 2**bits centroids of each PQ codebook, so small corpora get fewer cells and bits; from ~10k passages
    on, codes are the usual 8 bits."""
    train = min(n, spec.train_size)
    nlist = max(1, min(spec.nlist or int(4 * math.sqrt(n)), train // 39))
    pq_m = spec.pq_m or dim // 8
    if dim % pq_m:
        raise ValueError(f"retrieval.dense.faiss.pq_m={pq_m} must divide the embedding dimension {dim}")
    bits = max(1, min(8, int(math.log2(max(2, train // 39)))))
    return nlist, pq_m, bits


def gpu_available() -> bool:
    import faiss

    return hasattr(faiss, "StandardGpuResources") and faiss.get_num_gpus() > 0


def _to_gpu(index, use_gpu: bool):
    """Flat and IVF indexes move to all GPUs (fp16 storage, as Search-R1 serves wiki-18); HNSW has no GPU form."""
    import faiss

    if not use_gpu or not gpu_available() or isinstance(index, faiss.IndexHNSW):
        return index
    co = faiss.GpuMultipleClonerOptions()
    co.useFloat16 = True
    co.shard = True
    return faiss.index_cpu_to_all_gpus(index, co=co)


def build_faiss_index(shard_paths: list[Path], dim: int, spec: FaissSpec, *, use_gpu: bool = False,
                      show_progress: bool = True):
    """Build an inner-product index from embedding shards (added shard by shard: never all in RAM for Flat/HNSW)."""
    import faiss
    from tqdm import tqdm

    n = sum(np.load(p, mmap_mode="r").shape[0] for p in shard_paths)
    if spec.kind == "flat":
        index = faiss.IndexFlatIP(dim)
    elif spec.kind == "hnsw":
        index = faiss.IndexHNSWFlat(dim, spec.hnsw_m, faiss.METRIC_INNER_PRODUCT)
        index.hnsw.efConstruction = spec.ef_construction
        index.hnsw.efSearch = spec.ef_search
    elif spec.kind == "ivfpq":
        nlist, pq_m, bits = ivfpq_shape(spec, n, dim)
        index = faiss.index_factory(dim, f"IVF{nlist},PQ{pq_m}x{bits}", faiss.METRIC_INNER_PRODUCT)
        # The factory turns on polysemous training (an annealing pass for Hamming-distance filtering that
        # inner-product search never uses); it made training ~3x slower and 300x slower on tiny corpora.
        index.do_polysemous_training = False
    else:
        raise ValueError(f"unknown FAISS index kind {spec.kind!r}; use flat, hnsw or ivfpq")
    index = _to_gpu(index, use_gpu)
    if spec.kind == "ivfpq":
        rng = np.random.default_rng(0)
        take = np.sort(rng.choice(n, size=min(n, spec.train_size), replace=False))
        index.train(_gather(shard_paths, take))
    for p in tqdm(shard_paths, desc=f"faiss {spec.kind}: add", unit="shard", disable=not show_progress):
        index.add(np.load(p))
    if use_gpu and gpu_available() and spec.kind != "hnsw":
        index = faiss.index_gpu_to_cpu(index)  # only CPU indexes can be written
    if spec.kind == "ivfpq":
        faiss.extract_index_ivf(index).nprobe = spec.nprobe
    return index


def _gather(shard_paths: list[Path], rows: np.ndarray) -> np.ndarray:
    out, base = [], 0
    for p in shard_paths:
        arr = np.load(p, mmap_mode="r")
        sel = rows[(rows >= base) & (rows < base + len(arr))] - base
        out.append(np.asarray(arr[sel]))
        base += len(arr)
    return np.concatenate(out)


def write_dense_index(out_dir: str | Path, index, *, spec: FaissSpec, corpus: Corpus, encoder: Encoder,
                      stats: dict) -> None:
    import faiss

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    faiss.write_index(index, str(out_dir / "index.faiss"))
    write_json(out_dir / META, {
        "kind": "dense", "faiss": dataclasses.asdict(spec), "dim": encoder.dim,
        "encoder": {"path": encoder.model_path, "convention": dataclasses.asdict(encoder.convention)},
        "corpus": corpus_record(corpus.path, len(corpus)), **stats})


def describe_index(index) -> str:
    import faiss

    if isinstance(index, faiss.IndexHNSW):
        return f"{type(index).__name__}(M={index.hnsw.nb_neighbors(1)}, efSearch={index.hnsw.efSearch})"
    if isinstance(index, faiss.IndexIVFPQ):
        return f"IndexIVFPQ(nlist={index.nlist}, m={index.pq.M}, bits={index.pq.nbits}, nprobe={index.nprobe})"
    return type(index).__name__


def set_search_params(index, *, ef_search: int | None = None, nprobe: int | None = None) -> None:
    import faiss

    if ef_search and isinstance(index, faiss.IndexHNSW):
        index.hnsw.efSearch = ef_search
    ivf = faiss.try_extract_index_ivf(index)
    if nprobe and ivf is not None:
        ivf.nprobe = nprobe


class DenseRetriever:
    """`Retriever` over a FAISS index (a file, e.g. FlashRAG's `e5_Flat.index`, or an index object) whose row i
    is corpus row i."""

    def __init__(self, index, corpus: Corpus, encoder: Encoder, *, ef_search: int | None = None,
                 nprobe: int | None = None, use_gpu: bool = True):
        import faiss

        where = "in-memory index"
        if isinstance(index, (str, Path)):
            where = str(index)
            if not Path(index).is_file():
                raise DataError(f"{index}: FAISS index file not found")
            index = faiss.read_index(str(index))
        if index.ntotal != len(corpus):
            raise DataError(f"{where}: index holds {index.ntotal} vectors but corpus {corpus.path} has "
                            f"{len(corpus)} rows; row i must be passage i")
        if index.d != encoder.dim:
            raise DataError(f"{where}: index dimension {index.d} != encoder dimension {encoder.dim}")
        set_search_params(index, ef_search=ef_search, nprobe=nprobe)
        self.index = _to_gpu(index, use_gpu)
        self.corpus, self.encoder = corpus, encoder

    def search_vectors(self, q: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
        return self.index.search(np.ascontiguousarray(q, dtype=np.float32), min(k, self.index.ntotal))

    def batch_search(self, queries: list[str], k: int) -> list[list[Hit]]:
        if not queries:
            return []
        scores, rows = self.search_vectors(self.encoder.encode_queries(queries), k)
        # -1 marks an empty slot (HNSW/IVF can return fewer than k).
        return [[Hit(*self.corpus[r], s) for r, s in zip(rr, ss) if r >= 0]
                for rr, ss in zip(rows.tolist(), scores.tolist())]

    def search(self, query: str, k: int) -> list[Hit]:
        return self.batch_search([query], k)[0]


def open_dense(index_path: str | Path, *, corpus: Corpus | str | Path | None = None,
               encoder_path: str | Path | None = None, convention: str = "auto", device: str | None = None,
               fp16: bool = True, batch_size: int = 64, ef_search: int | None = None, nprobe: int | None = None,
               use_gpu: bool = True) -> DenseRetriever:
    """Open our index dir (meta.json supplies corpus/encoder) or a bare FAISS file (both must then be given)."""
    p = Path(index_path)
    meta = json.loads((p / META).read_text()) if p.is_dir() and (p / META).is_file() else None
    if meta is not None:
        index_file = p / "index.faiss"
        corpus = corpus or meta["corpus"]["path"]
        encoder_path = encoder_path or meta["encoder"]["path"]
        conv = Convention(**meta["encoder"]["convention"]) if convention == "auto" else \
            resolve_convention(convention, encoder_path)
    else:
        if corpus is None or encoder_path is None:
            raise DataError(f"{p}: a FAISS file without our meta.json needs --corpus and --encoder "
                            "(e.g. FlashRAG's e5_Flat.index with wiki-18.jsonl and intfloat/e5-base-v2)")
        index_file = p
        conv = resolve_convention(convention, encoder_path)
    corpus = corpus if isinstance(corpus, Corpus) else Corpus(corpus)
    enc = Encoder(encoder_path, conv, device=device, fp16=fp16, batch_size=batch_size)
    return DenseRetriever(index_file, corpus, enc, ef_search=ef_search, nprobe=nprobe, use_gpu=use_gpu)


def build_dense_index(corpus_path: str | Path, encoder: Encoder, shard_dir: str | Path, out_dir: str | Path, *,
                      spec: FaissSpec, shard_size: int, use_gpu: bool = True, show_progress: bool = True) -> dict:
    """Encode (resumably) then index; writes `out_dir/index.faiss` + meta.json and returns build and timing stats.

    meta.json records how the index was built (device, fp16, GPU FAISS: they change its bytes); what describes
    this run only (timings, shards reused from an interrupted run) is returned for the stage's metrics.
    """
    corpus = Corpus(corpus_path)
    t0 = time.perf_counter()
    shards, encoded = encode_corpus(corpus, encoder, shard_dir, shard_size=shard_size, show_progress=show_progress)
    t1 = time.perf_counter()
    index = build_faiss_index(shards, encoder.dim, spec, use_gpu=use_gpu, show_progress=show_progress)
    t2 = time.perf_counter()
    built = {"n_docs": len(corpus), "faiss_index": describe_index(index), "device": str(encoder.device),
             "fp16": encoder.fp16, "faiss_gpu": bool(use_gpu and gpu_available())}
    write_dense_index(out_dir, index, spec=spec, corpus=corpus, encoder=encoder, stats=built)
    return {**built, "encoded_now": encoded, "reused_from_shards": len(corpus) - encoded,
            "encode_seconds": round(t1 - t0, 3), "passages_per_s": round(encoded / (t1 - t0), 1) if encoded else None,
            "index_seconds": round(t2 - t1, 3)}
