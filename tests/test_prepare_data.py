import hashlib
import http.server
import json
import shutil
import threading
from pathlib import Path

import pytest

from ragteam.config import ParamsError, deep_merge, load_params, parse_section
from ragteam.data.sources import download_resumable, fetch_corpus
from ragteam.data.validate import ValidationFailed
from ragteam.io import DataError, load_jsonl, sha256_file
from stages.prepare_data import DataParams, run

REPO = Path(__file__).resolve().parents[1]


def _params(**overlay) -> DataParams:
    return parse_section({"data": deep_merge(load_params(REPO / "params.yaml")["data"], overlay)}, "data", DataParams)


def _small_synth():
    return _params(synthetic={"n_passages": 300, "n_train": 30, "n_dev": 10})


def _hashes(d: Path) -> dict:
    return {str(p.relative_to(d)): sha256_file(p) for p in sorted(d.rglob("*")) if p.is_file()}


def test_synthetic_outputs_and_manifest(tmp_path):
    m = run(_small_synth(), tmp_path / "out", tmp_path / "report.json", tmp_path / "cache")
    assert m["rows"] == {"corpus": 300, "benchmarks/synthetic": 10, "train/pool": 30}
    man = json.loads((tmp_path / "out/manifest.json").read_text())
    assert man["files"]["corpus.jsonl"] == sha256_file(tmp_path / "out/corpus.jsonl")
    assert json.loads((tmp_path / "report.json").read_text())["success"] is True


def test_mirror_split_is_disjoint_and_deterministic(tmp_path, shared_data):
    p = _params(source=f"mirror:{shared_data}")
    run(p, tmp_path / "a", tmp_path / "ra.json", tmp_path / "c")
    run(p, tmp_path / "b", tmp_path / "rb.json", tmp_path / "c")
    assert _hashes(tmp_path / "a") == _hashes(tmp_path / "b")
    pool = load_jsonl(tmp_path / "a/train/pool.jsonl")
    evals = {n: load_jsonl(tmp_path / f"a/benchmarks/{n}.jsonl") for n in p.mirror.benchmarks}
    eval_ids = {r["id"] for rows in evals.values() for r in rows}
    pool_ids = {r["id"] for r in pool}
    assert pool_ids and not pool_ids & eval_ids
    assert {r["metadata"]["source"] for r in pool} == set(p.mirror.train_from)
    source_rows = sum(len(load_jsonl(shared_data / f"benchmarks/{n}/dev.jsonl")) for n in p.mirror.benchmarks)
    assert len(pool) + sum(map(len, evals.values())) == source_rows  # nothing lost, nothing duplicated
    assert 0.35 < len(pool) / 600 < 0.65  # hotpotqa + 2wiki = 600 rows at fraction 0.5
    assert len(load_jsonl(tmp_path / "a/corpus.jsonl")) == 9005


def _mirror_copy(tmp_path, shared_data) -> Path:
    m = tmp_path / "mirror"
    (m / "corpus").mkdir(parents=True)
    rows = load_jsonl(shared_data / "corpus/mini_wiki.jsonl")[:200]
    (m / "corpus/c.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    for b in ("hotpotqa", "bamboogle"):
        (m / "benchmarks" / b).mkdir(parents=True)
        shutil.copy(shared_data / f"benchmarks/{b}/dev.jsonl", m / "benchmarks" / b / "dev.jsonl")
    return m


def _mirror_params(m: Path) -> DataParams:
    return _params(source=f"mirror:{m}", mirror={"benchmarks": ["hotpotqa", "bamboogle"], "train_from": ["hotpotqa"]})


def test_corrupted_line_fails_naming_file_line_and_keeps_old_outputs(tmp_path, shared_data):
    m = _mirror_copy(tmp_path, shared_data)
    out, rep = tmp_path / "out", tmp_path / "report.json"
    run(_mirror_params(m), out, rep, tmp_path / "c")
    before = _hashes(out)
    lines = (m / "corpus/c.jsonl").read_text().splitlines()
    lines[41] = lines[41][:30]  # truncate line 42 mid-JSON
    (m / "corpus/c.jsonl").write_text("\n".join(lines) + "\n")
    with pytest.raises(DataError, match=rf"{m}/corpus/c.jsonl:42: malformed JSON"):
        run(_mirror_params(m), out, rep, tmp_path / "c")
    assert _hashes(out) == before
    assert "c.jsonl:42" in json.loads(rep.read_text())["error"]
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".out.")]  # no temp dir left behind


def test_rule_violation_fails_with_report_and_keeps_old_outputs(tmp_path, shared_data):
    m = _mirror_copy(tmp_path, shared_data)
    out, rep = tmp_path / "out", tmp_path / "report.json"
    run(_mirror_params(m), out, rep, tmp_path / "c")
    before = _hashes(out)
    lines = (m / "corpus/c.jsonl").read_text().splitlines()
    row = json.loads(lines[9])
    lines[9] = json.dumps({"id": row["id"], "contents": "no title line"})
    (m / "corpus/c.jsonl").write_text("\n".join(lines) + "\n")
    with pytest.raises(ValidationFailed) as e:
        run(_mirror_params(m), out, rep, tmp_path / "c")
    assert "contents has a title line and non-empty text" in str(e.value) and "c.jsonl:10" in str(e.value)
    report = json.loads(rep.read_text())
    bad = [r for f in report["reports"] for r in f["rules"] if not r["success"]]
    assert report["success"] is False and bad[0]["examples"][0]["line"] == 10
    assert _hashes(out) == before


def test_bad_params_name_the_key():
    base = load_params(REPO / "params.yaml")
    bad = deep_merge(base, {"data": {"synthetic": {"n_passages": "many"}}})
    with pytest.raises(ParamsError, match=r"data\.synthetic\.n_passages"):
        parse_section(bad, "data", DataParams)
    bad = deep_merge(base, {"data": {"mirror": {"train_fractoin": 0.3}}})
    with pytest.raises(ParamsError, match=r"data\.mirror\.train_fractoin"):
        parse_section(bad, "data", DataParams)
    with pytest.raises(ParamsError, match=r"data\.source"):
        parse_section(deep_merge(base, {"data": {"source": "s3://x"}}), "data", DataParams)


class _RangeHandler(http.server.SimpleHTTPRequestHandler):
    """Serves files with Range support; the first full request is cut off halfway (a dropped connection)."""
    cut_once = {"done": False}

    def log_message(self, *a):
        pass

    def do_GET(self):
        data = Path(self.directory, self.path.lstrip("/")).read_bytes()
        rng = self.headers.get("Range")
        start = int(rng.split("=")[1].split("-")[0]) if rng else 0
        self.send_response(206 if rng else 200)
        self.send_header("Content-Length", str(len(data) - start))
        if rng:
            self.send_header("Content-Range", f"bytes {start}-{len(data) - 1}/{len(data)}")
        self.end_headers()
        if not rng and not self.cut_once["done"]:
            self.cut_once["done"] = True
            self.wfile.write(data[: len(data) // 2])
            self.wfile.flush()
            self.connection.shutdown(2)
            return
        self.wfile.write(data[start:])


def test_flashrag_source_from_local_paths_with_resumable_download(tmp_path, shared_data):
    repo = tmp_path / "flashrag"
    for name, split in (("hotpotqa", "dev"), ("bamboogle", "test")):  # FlashRAG's layout: Bamboogle has only test
        (repo / name).mkdir(parents=True)
        rows = load_jsonl(shared_data / f"benchmarks/{name}/dev.jsonl")
        (repo / name / f"{split}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows[:20]))
        (repo / name / "train.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows[20:60]))
    served = tmp_path / "www"
    served.mkdir()
    shutil.copy(shared_data / "corpus/mini_wiki.jsonl", served / "wiki.jsonl")
    handler = lambda *a, **k: _RangeHandler(*a, directory=str(served), **k)
    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{srv.server_address[1]}/wiki.jsonl"
    try:
        with pytest.raises(Exception):  # first attempt is cut off mid-body
            download_resumable(url, tmp_path / "cache/wiki.jsonl")
        part = tmp_path / "cache/wiki.jsonl.part"
        assert 0 < part.stat().st_size < (served / "wiki.jsonl").stat().st_size
        p = _params(source="flashrag", flashrag={"repo": str(repo), "datasets": ["hotpotqa", "bamboogle"],
                                                  "train_from": ["hotpotqa"], "corpus": url})
        m = run(p, tmp_path / "out", tmp_path / "r.json", tmp_path / "cache")  # resumes the .part
    finally:
        srv.shutdown()
    assert sha256_file(tmp_path / "cache/wiki.jsonl") == sha256_file(served / "wiki.jsonl")
    assert m["rows"] == {"corpus": 9005, "benchmarks/hotpotqa": 20, "benchmarks/bamboogle": 20, "train/pool": 40}


def _flashrag_dir(tmp_path, shared_data, layout: dict[str, str]) -> Path:
    repo = tmp_path / "flashrag"
    for name, split in layout.items():
        (repo / name).mkdir(parents=True)
        rows = load_jsonl(shared_data / f"benchmarks/{name}/dev.jsonl")[:10]
        (repo / name / f"{split}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return repo


def test_flashrag_split_per_dataset_or_one_for_all(tmp_path, shared_data):
    from ragteam.data.sources import from_flashrag

    corpus = shared_data / "corpus/mini_wiki.jsonl"
    repo = _flashrag_dir(tmp_path, shared_data, {"hotpotqa": "dev", "bamboogle": "test", "musique": "test"})
    args = dict(train_split="dev", train_from=[], max_eval_rows=5, max_train_rows=5, corpus=str(corpus),
                cache_dir=tmp_path / "c")
    got = from_flashrag(str(repo), ["hotpotqa", "bamboogle"], {"hotpotqa": "dev", "bamboogle": "test"}, **args)
    assert {n: len(r) for n, r in got.benchmarks.items()} == {"hotpotqa": 5, "bamboogle": 5}
    assert got.benchmarks["bamboogle"][0]["id"] == "bamboogle_0"
    got = from_flashrag(str(repo), ["bamboogle", "musique"], "test", **args)  # one split for all still works
    assert sorted(got.benchmarks) == ["bamboogle", "musique"]
    with pytest.raises(DataError, match=r"bamboogle/dev\.jsonl not found"):  # the old single `dev` split
        from_flashrag(str(repo), ["hotpotqa", "bamboogle"], "dev", **args)
    with pytest.raises(DataError, match="no split for dataset 'bamboogle'"):
        from_flashrag(str(repo), ["hotpotqa", "bamboogle"], {"hotpotqa": "dev"}, **args)


def test_flashrag_split_mapping_must_name_every_dataset():
    base = load_params(REPO / "params.yaml")
    assert base["data"]["flashrag"]["split"]["bamboogle"] == "test"
    bad = deep_merge(base, {"data": {"flashrag": {"datasets": ["hotpotqa", "popqa"]}}})
    with pytest.raises(ParamsError, match=r"data\.flashrag.*no split for datasets \['popqa'\]"):
        parse_section(bad, "data", DataParams)
    ok = deep_merge(base, {"data": {"flashrag": {"datasets": ["popqa"], "split": "test"}}})
    assert parse_section(ok, "data", DataParams).flashrag.split == "test"


def test_mirror_benchmark_with_only_a_test_split(tmp_path, shared_data):
    m = _mirror_copy(tmp_path, shared_data)
    (m / "benchmarks/bamboogle/dev.jsonl").rename(m / "benchmarks/bamboogle/test.jsonl")
    run(_mirror_params(m), tmp_path / "out", tmp_path / "r.json", tmp_path / "c")
    assert len(load_jsonl(tmp_path / "out/benchmarks/bamboogle.jsonl")) == 125
    manifest = json.loads((tmp_path / "out/manifest.json").read_text())
    assert str(m / "benchmarks/bamboogle/test.jsonl") in manifest["inputs"]
    (m / "benchmarks/bamboogle/test.jsonl").unlink()
    with pytest.raises(DataError, match=r"'bamboogle' not found at .*dev\.jsonl or .*test\.jsonl"):
        run(_mirror_params(m), tmp_path / "out2", tmp_path / "r2.json", tmp_path / "c")


def test_a_relative_mirror_is_found_from_a_dvc_experiments_temporary_copy(tmp_path, shared_data, monkeypatch):
    """`dvc exp run --temp` / `--queue` run in <checkout>/.dvc/tmp/exps/...: `mirror:../shared` still means the
    directory beside the checkout, and the manifest is the one a workspace run writes."""
    from ragteam.data.sources import checkout_root, resolve_mirror_dir

    checkout = tmp_path / "project"
    temp = checkout / ".dvc/tmp/exps/standalone/tmpab12cd"
    temp.mkdir(parents=True)
    _mirror_copy(tmp_path, shared_data)                        # tmp_path/mirror, beside the checkout
    assert checkout_root(temp) == checkout and checkout_root(checkout) == checkout
    assert resolve_mirror_dir("../mirror", temp) == checkout / "../mirror"
    assert resolve_mirror_dir("../mirror", checkout) == Path("../mirror")           # unchanged outside experiments
    assert resolve_mirror_dir(tmp_path / "mirror", temp) == tmp_path / "mirror"

    manifests = []
    for cwd in (checkout, temp):
        monkeypatch.chdir(cwd)
        run(_mirror_params("../mirror"), tmp_path / f"out-{cwd.name}", tmp_path / "r.json", tmp_path / "c")
        manifests.append(json.loads((tmp_path / f"out-{cwd.name}/manifest.json").read_text()))
    assert manifests[0] == manifests[1]
    assert all(k.startswith("../mirror/") for k in manifests[0]["inputs"])


# ---- issue 71, finding 5: corpus downloads are checked against a sha256, and a 416 on resume is not "complete" ----

class _Refuses416(http.server.BaseHTTPRequestHandler):
    """Serves one payload; every Range request is answered 416 with the payload's true length (`bytes */N`), as a
    server does when the range starts at or past the end of the file it has."""
    payload = b""
    ranges: list = []

    def log_message(self, *a):
        pass

    def do_GET(self):
        rng = self.headers.get("Range")
        type(self).ranges.append(rng)
        if rng:
            self.send_response(416)
            self.send_header("Content-Range", f"bytes */{len(self.payload)}")
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        self.send_response(200)
        self.send_header("Content-Length", str(len(self.payload)))
        self.end_headers()
        self.wfile.write(self.payload)


@pytest.fixture()
def serve_416():
    payload = b"".join(b'{"id": "%d", "contents": "passage %d"}\n' % (i, i) for i in range(2000))
    handler = type("H", (_Refuses416,), {"payload": payload, "ranges": []})
    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{srv.server_address[1]}/wiki.jsonl", payload, handler
    finally:
        srv.shutdown()
        srv.server_close()


def test_a_416_on_resume_with_a_partial_file_is_not_taken_as_complete(tmp_path, serve_416):
    url, payload, handler = serve_416
    dest = tmp_path / "cache/wiki.jsonl"
    dest.parent.mkdir()
    (tmp_path / "cache/wiki.jsonl.part").write_bytes(payload[: len(payload) // 3])   # an interrupted download
    download_resumable(url, dest)
    assert dest.read_bytes() == payload                         # fetched again from the start, not the third
    assert handler.ranges == [f"bytes={len(payload) // 3}-", None]
    assert not (tmp_path / "cache/wiki.jsonl.part").exists()


def test_a_416_for_a_part_of_the_full_length_is_complete_once_its_hash_checks(tmp_path, serve_416):
    url, payload, handler = serve_416
    dest = tmp_path / "cache/wiki.jsonl"
    dest.parent.mkdir()
    (tmp_path / "cache/wiki.jsonl.part").write_bytes(payload)      # interrupted after the last byte
    download_resumable(url + "#sha256=" + hashlib.sha256(payload).hexdigest(), dest)
    assert dest.read_bytes() == payload and handler.ranges == [f"bytes={len(payload)}-"]


def test_a_corrupted_download_is_refused_naming_the_file_and_both_hashes(tmp_path, serve_416):
    url, payload, _ = serve_416
    dest = tmp_path / "cache/wiki.jsonl"
    wrong = hashlib.sha256(b"another corpus").hexdigest()
    with pytest.raises(DataError) as err:
        download_resumable(url, dest, sha256=wrong)
    msg = str(err.value)
    assert str(dest) in msg and wrong in msg and hashlib.sha256(payload).hexdigest() in msg
    assert not dest.exists() and not (tmp_path / "cache/wiki.jsonl.part").exists()    # nothing half-written stays
    # the same through the URL's own pin and the corpus fetch of prepare_data
    with pytest.raises(DataError, match=wrong):
        fetch_corpus(f"{url}#sha256={wrong}", tmp_path / "cache")
    assert not dest.exists()


def test_without_an_expected_hash_the_computed_one_is_recorded_and_reported(tmp_path, serve_416, caplog):
    url, payload, _ = serve_416
    digest = hashlib.sha256(payload).hexdigest()
    with caplog.at_level("WARNING", logger="ragteam.data.sources"):
        files = fetch_corpus(url, tmp_path / "cache")
    assert files == [tmp_path / "cache/wiki.jsonl"] and files[0].read_bytes() == payload
    assert (tmp_path / "cache/wiki.jsonl.sha256").read_text().split() == [digest, "wiki.jsonl"]
    assert "no expected sha256" in caplog.text and f"#sha256={digest}" in caplog.text
    # a pin added later is checked against the file already downloaded
    assert fetch_corpus(f"{url}#sha256={digest}", tmp_path / "cache") == files
    (tmp_path / "cache/wiki.jsonl").write_bytes(payload[:-1] + b"X")
    (tmp_path / "cache/wiki.jsonl.sha256").unlink()
    with pytest.raises(DataError, match=f"wiki.jsonl .*has sha256 .*expected {digest}"):
        fetch_corpus(f"{url}#sha256={digest}", tmp_path / "cache")
