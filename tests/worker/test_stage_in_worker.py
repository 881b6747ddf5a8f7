"""A pipeline stage started the way `dvc repro` and the Prefect flow start it (`python -m stages.evaluate` under the
orchestrator's interpreter) runs its engines on vLLM when params say so: the stage replaces itself with the worker
interpreter (`ensure_engine_environment`), generates with vLLM, writes its outputs, and says in its report which
environment and versions produced them."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[2]
MAIN_PY = REPO / ".venv" / "bin" / "python"


def test_the_evaluate_stage_from_the_orchestrator_runs_on_vllm_in_the_worker(tmp_path, smollm2_dir, shared_data):
    from importlib.metadata import version

    from ragteam.data.formats import load_qa
    from ragteam.io import write_jsonl

    assert MAIN_PY.is_file(), f"{MAIN_PY}: the orchestrator environment (make setup-dev) runs the stage"
    params = yaml.safe_load((REPO / "params.yaml").read_text())
    params["llm"]["stages"] = {"evaluate": "vllm"}
    params["llm"]["vllm"].update(enforce_eager=True, max_model_len=2048)
    params["eval"].update(systems={"native": {"workflow": "native"}}, compare=None, n_questions=2)
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(params))
    (tmp_path / "models").mkdir()
    (tmp_path / "models" / "llm").symlink_to(smollm2_dir)
    write_jsonl(tmp_path / "data/prepared/benchmarks/hotpotqa.jsonl",
                load_qa(shared_data / "benchmarks" / "hotpotqa" / "dev.jsonl")[:2])
    env = {**os.environ, "PYTHONPATH": str(REPO), "RAGTEAM_WORKER_PYTHON": str(REPO / ".venv-worker/bin/python"),
           "VLLM_CPU_KVCACHE_SPACE": "1"}
    env.pop("VIRTUAL_ENV", None)
    r = subprocess.run([str(MAIN_PY), "-m", "stages.evaluate"], cwd=tmp_path, env=env, capture_output=True,
                       text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "evaluate: llm.stages.evaluate: vllm: running in the worker environment" in r.stdout
    metrics = json.loads((tmp_path / "metrics/eval.json").read_text())
    assert metrics["native"]["avg"]["n"] == 2
    report = (tmp_path / "reports/eval.md").read_text()
    assert "vllm (worker environment: Python" in report and f"vllm-cpu {version('vllm-cpu')}" in report
    episodes = (tmp_path / "results/eval/native/hotpotqa.jsonl").read_text().splitlines()
    assert len(episodes) == 2 and all(json.loads(e)["calls"] for e in episodes)
    shutil.rmtree(tmp_path / "results", ignore_errors=True)
