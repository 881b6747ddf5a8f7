"""The real prepare_data stage under `dvc repro` in a throwaway git+dvc repo."""
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import yaml

from ragteam.config import deep_merge

REPO = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent


def _sh(cmd, cwd, check=True):
    env = {**os.environ, "PATH": f"{BIN}:{os.environ['PATH']}", "DVC_NO_ANALYTICS": "1"}
    r = subprocess.run(cmd, cwd=cwd, shell=True, capture_output=True, text=True, env=env)
    if check:
        assert r.returncode == 0, r.stdout + r.stderr
    return r


def _mirror_project(tmp_path: Path, shared_data: Path, stage_names: tuple[str, ...],
                    **params_over) -> tuple[Path, list[str]]:
    """A checkout (copies of stages/ and ragteam/) whose dvc.yaml has the real `stage_names` and whose params read a
    300-passage mirror of the shared data with HotpotQA; returns the checkout and the mirror corpus' lines."""
    root = tmp_path / "proj"
    root.mkdir()
    for d in ("stages", "ragteam"):
        shutil.copytree(REPO / d, root / d, ignore=shutil.ignore_patterns("__pycache__"))
    stages = yaml.safe_load((REPO / "dvc.yaml").read_text())["stages"]
    (root / "dvc.yaml").write_text(yaml.safe_dump({"stages": {n: stages[n] for n in stage_names}}, sort_keys=False))
    params = yaml.safe_load((REPO / "params.yaml").read_text())
    mirror = tmp_path / "mirror"
    (mirror / "corpus").mkdir(parents=True)
    lines = (shared_data / "corpus/mini_wiki.jsonl").read_text().splitlines()[:300]
    (mirror / "corpus/c.jsonl").write_text("\n".join(lines) + "\n")
    (mirror / "benchmarks/hotpotqa").mkdir(parents=True)
    shutil.copy(shared_data / "benchmarks/hotpotqa/dev.jsonl", mirror / "benchmarks/hotpotqa/dev.jsonl")
    params["data"]["source"] = f"mirror:{mirror}"
    params["data"]["mirror"] |= {"benchmarks": ["hotpotqa"], "train_from": ["hotpotqa"]}
    for section, values in params_over.items():
        params[section] = deep_merge(params[section], values)
    (root / "params.yaml").write_text(yaml.safe_dump(params))
    return root, lines


def test_prepare_data_repro_noop_and_failed_run_restorable_from_the_cache(tmp_path, shared_data):
    root, lines = _mirror_project(tmp_path, shared_data, ("prepare_data",))
    mirror = tmp_path / "mirror"
    _sh("git init -q && git config user.email t@t && git config user.name t && dvc init -q && "
        "dvc config core.analytics false && git add -A && git commit -qm init", root)

    first = _sh("dvc repro", root)
    assert "Running stage 'prepare_data'" in first.stdout
    corpus = root / "data/prepared/corpus.jsonl"
    before = corpus.read_bytes()
    assert len(before.splitlines()) == 300
    assert "didn't change, skipping" in _sh("dvc repro", root).stdout  # second run is a no-op

    lines[99] = '{"id": "broken", "contents": '  # corrupt line 100 of the source corpus
    (mirror / "corpus/c.jsonl").write_text("\n".join(lines) + "\n")
    failed = _sh("dvc repro -f", root, check=False)
    assert failed.returncode != 0
    assert f"{mirror}/corpus/c.jsonl:100: malformed JSON" in failed.stderr + failed.stdout
    rep = json.loads((root / "reports/validation/prepare_data.json").read_text())
    assert rep["success"] is False and "c.jsonl:100" in rep["error"]
    # no `persist` on a cached output (the stage does not resume from it): DVC removed it before the run, the stage
    # wrote nothing, and the last good version is in the cache
    assert not corpus.exists()
    _sh("dvc checkout data/prepared", root)
    assert corpus.read_bytes() == before


def test_persist_is_set_only_on_outputs_a_stage_resumes_from():
    """`persist` keeps an output through a rerun, for a stage that resumes from it: only index_dense's embedding shards
    (uncached, a rerun resumes from the finished ones). Every other output is removed by DVC before its stage runs and
    restored by `dvc checkout` from the cache."""
    persistent = []
    for name, stage in yaml.safe_load((REPO / "dvc.yaml").read_text())["stages"].items():
        for out in stage.get("do", stage).get("outs", []):
            if isinstance(out, dict):
                (path, opts), = out.items()
                if (opts or {}).get("persist"):
                    persistent.append((name, path))
    assert persistent == [("index_dense", "data/indexes/dense_shards")]


def test_every_output_the_lock_names_reaches_a_fresh_clone():
    """A fresh clone gets an output either from git (uncached outs: the records, reports, curves) or from the remote
    (`dvc pull`: cached outs). An uncached out that git ignores reaches neither, so the pulled clone's `dvc status`
    lists it as deleted and `dvc repro` recomputes its stage (index_dense's embedding shards were such an out)."""
    from dvc.repo import Repo

    tracked = subprocess.run(["git", "ls-files"], cwd=REPO, capture_output=True, text=True, check=True).stdout.split()
    with Repo(str(REPO)) as repo:
        uncached = [(stage.addressing, out.def_path) for stage in repo.index.stages for out in stage.outs
                    if not out.use_cache]
    assert len(uncached) > 20  # the records, reports and curves of every stage
    lost = [(stage, path) for stage, path in uncached
            if path not in tracked and not any(t.startswith(path.rstrip("/") + "/") for t in tracked)]
    assert lost == [], f"uncached outputs git does not track (cache them, or commit them): {lost}"


def test_the_real_index_stages_push_and_pull_into_a_fresh_clone_that_recomputes_nothing(tmp_path, shared_data,
                                                                                         minilm_dir):
    """prepare_data and index_dense as dvc.yaml has them (a 300-passage mirror, the MiniLM encoder added as data):
    `dvc repro`, `dvc push` to a directory remote, then a fresh `git clone` + `dvc pull` has every output the lock
    names, `dvc status` is clean and `dvc repro` runs nothing. With index_dense's shards uncached and git-ignored
    the pulled clone lacked them, listed index_dense as changed, and recomputed the index."""
    root, _ = _mirror_project(tmp_path, shared_data, ("prepare_data", "index_dense"),
                              retrieval={"dense": {"shard_size": 100}})   # 3 shards
    shutil.copytree(minilm_dir, root / "models/encoder")
    remote = tmp_path / "remote"
    _sh("git init -q && git config user.email t@t && git config user.name t && dvc init -q && "
        f"dvc config core.analytics false && dvc remote add -d local {remote} && dvc add -q models/encoder && "
        "git add -A && git commit -qm init", root)
    _sh("dvc repro && git add -A && git commit -qm run && dvc push", root)
    assert len(list((root / "data/indexes/dense_shards").iterdir())) >= 3

    clone = tmp_path / "clone"
    _sh(f"git clone -q {root} {clone}", tmp_path)
    _sh("dvc pull", clone)
    assert sorted(p.name for p in (clone / "data/indexes/dense_shards").iterdir()) == \
        sorted(p.name for p in (root / "data/indexes/dense_shards").iterdir())
    assert json.loads(_sh("dvc status --json", clone).stdout) == {}
    again = _sh("dvc repro", clone).stdout
    assert "Running stage" not in again, again
