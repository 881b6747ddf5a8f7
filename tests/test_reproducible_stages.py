"""A rerun reproduces the lock: a stage run twice with the same inputs, params and seeds, in two checkouts at different
paths, writes byte-identical outputs (the md5s DVC records). Real stages on small inputs: prepare_data (synthetic),
index_bm25@bm25s and index_dense (subprocesses, as `dvc repro` runs them), and CPU training of the answer agent
(shared-prefix GRPO) and the judge (TRL SFT) on a tiny model."""
import hashlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from test_train_maps_stages import TINY, _synthesis
from test_train_trl import tiny_llm  # noqa: F401  (module fixture: a 2-layer Llama with SmolLM2's tokenizer)

from ragteam.lineage import load_stages

REPO = Path(__file__).resolve().parents[1]
STAGES = load_stages(REPO)


def md5s(root: Path, stage: str) -> dict[str, str]:
    """md5 of every file of the stage's declared outs (its metrics records and summaries excluded: the records carry
    wall time by design)."""
    s = STAGES[stage]
    out = {}
    for o in s.outs:
        if o in s.metrics or o.startswith("metrics/"):
            continue
        p = root / o
        files = sorted(f for f in p.rglob("*") if f.is_file()) if p.is_dir() else [p]
        assert files and all(f.is_file() for f in files), f"{stage}: out {o} missing under {root}"
        out.update({f.relative_to(root).as_posix(): hashlib.md5(f.read_bytes()).hexdigest() for f in files})
    return out


def _checkout(root: Path, encoder: Path) -> Path:
    root.mkdir()
    for d in ("stages", "ragteam"):
        shutil.copytree(REPO / d, root / d, ignore=shutil.ignore_patterns("__pycache__"))
    params = yaml.safe_load((REPO / "params.yaml").read_text())
    params["data"]["synthetic"] |= {"n_passages": 300, "n_train": 20, "n_dev": 10}
    params["models"]["encoder"] = {"source": str(encoder), "sha256": None}
    params["retrieval"]["dense"] |= {"shard_size": 128, "device": "cpu"}
    (root / "params.yaml").write_text(yaml.safe_dump(params))
    return root


def _stage(root: Path, module: str, *args: str) -> None:
    env = {**os.environ, "PYTHONPATH": str(root), "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"}
    r = subprocess.run([sys.executable, "-m", module, *args], cwd=root, env=env, capture_output=True, text=True)
    assert r.returncode == 0, f"{module} in {root}:\n{r.stdout[-3000:]}\n{r.stderr[-3000:]}"


@pytest.mark.slow
def test_data_and_index_stages_write_the_same_bytes_twice(tmp_path, minilm_dir):
    runs = []
    for name in ("a", "b"):
        root = _checkout(tmp_path / name, minilm_dir)
        shutil.copytree(minilm_dir, root / "models/encoder")
        _stage(root, "stages.prepare_data")
        _stage(root, "stages.index_bm25", "bm25s")
        _stage(root, "stages.index_dense")
        runs.append({s: md5s(root, s) for s in ("prepare_data", "index_bm25@bm25s", "index_dense")})
    a, b = runs
    assert len(a["prepare_data"]) >= 4 and len(a["index_bm25@bm25s"]) >= 3 and "data/indexes/dense/index.faiss" in \
        a["index_dense"]
    for stage in a:
        diff = sorted(f for f in a[stage].keys() | b[stage].keys() if a[stage].get(f) != b[stage].get(f))
        assert not diff, f"{stage}: outputs differ between two runs: {diff}"
    # each index records the libraries that built it (issue 26 §3; `ragteam lineage` prints them)
    from importlib.metadata import version

    dense = json.loads((tmp_path / "a/metrics/index_dense.json").read_text())["environment"]["packages"]
    bm25 = json.loads((tmp_path / "a/metrics/index_bm25_bm25s.json").read_text())["environment"]["packages"]
    assert (dense["faiss"], dense["torch"], bm25["bm25s"]) == (version("faiss-cpu"), version("torch"), version("bm25s"))


@pytest.mark.slow
def test_cpu_training_writes_the_same_agent_twice(tiny_llm, tmp_path, monkeypatch):  # noqa: F811
    """train_answer (shared-prefix GRPO, sampled rollouts) and train_judge (TRL SFT) from scratch in two checkouts."""
    from ragteam.agents import maps
    from ragteam.agents.maps_workflow import MapsConfig
    from ragteam.io import write_jsonl
    from ragteam.llm import LLMConfig
    from ragteam.train.grpo import GRPOParams
    from ragteam.train.sft import SFTParams
    from stages import train_answer, train_judge
    from stages.common import TrainAnswerParams, TrainJudgeParams

    llm = LLMConfig(model=str(tiny_llm), device="cpu", threads=1)
    grpo = GRPOParams(**TINY)
    tp = TrainAnswerParams(alpha=0.5, max_words=5, min_words=1, stage1=grpo, stage2=grpo)
    jp = TrainJudgeParams(sft=SFTParams(steps=2, batch_size=1, lr=1e-3, max_length=512, save_steps=1))
    runs = []
    for name in ("a", "b"):
        root = tmp_path / name
        root.mkdir()
        monkeypatch.chdir(root)
        _synthesis(root)
        t3 = [{"id": f"j{i}", "label": label, "messages": maps.judge_messages(q, "Query 1: " + q) +
               [{"role": "assistant", "content": label}]}
              for i, (q, label) in enumerate([("Where was Ann Lee born?", maps.SUFFICIENT),
                                              ("Where was Bob Ray born?", maps.INSUFFICIENT)])]
        write_jsonl(root / "data/judge/t3_judge.jsonl", t3)
        m = train_answer.run(tp, llm, MapsConfig(top_k=1, passage_words=5))
        mj = train_judge.run(jp, llm)
        assert m.get("resumed_from_step") is None and mj.get("resumed_from_step") is None  # trained from scratch
        runs.append({s: md5s(root, s) for s in ("train_answer", "train_judge")})
    a, b = runs
    assert "models/agents/answer/model.safetensors" in a["train_answer"]
    assert "models/agents/judge/model.safetensors" in a["train_judge"]
    for stage in a:
        diff = sorted(f for f in a[stage].keys() | b[stage].keys() if a[stage].get(f) != b[stage].get(f))
        assert not diff, f"{stage}: outputs differ between two runs: {diff}"
