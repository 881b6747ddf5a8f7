"""`make gpu-check` rehearsed on the CPU (DRY=1): every step of scripts/gpu_check.sh runs - OpenRLHF SFT through the
launcher, the HF engine's greedy comparison, the FAISS probe - and one results file records them. Needs
.venv-openrlhf (`make test` builds it); under CI a missing environment fails instead of skipping."""
from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest
from conftest import require_openrlhf_env

REPO = Path(__file__).resolve().parents[1]


@pytest.mark.slow
def test_gpu_check_dry_run_rehearses_every_step_and_writes_one_results_file(tmp_path):
    require_openrlhf_env()
    env = {**os.environ, "DRY": "1", "GPU_CHECK_OUT": str(tmp_path)}
    env.pop("OUT", None)
    done = subprocess.run(["bash", "scripts/gpu_check.sh"], cwd=REPO, env=env, capture_output=True, text=True,
                          timeout=600)
    assert done.returncode == 0, (done.stdout + done.stderr)[-4000:]
    files = list(tmp_path.iterdir())
    assert [f.name for f in files] == ["gpu_check.json"]
    r = json.loads(files[0].read_text())
    assert r["mode"] == "dry" and r["machine"]["gpu"] is None
    sft = r["openrlhf_sft"]
    assert sft["ok"] and sft["exit"] == 0 and sft["steps"] == 16     # 32 rows / 8 per step x 4 epochs
    assert sft["loss_last"] < sft["loss_first"]
    assert sft["launcher"].startswith("openrlhf_cpu: openrlhf.cli.train_sft on CPU: flash_attn stand-in")
    eng = r["hf_engine_greedy"]
    assert eng["ok"] and eng["device"] == "cpu" and eng["model"] == "the SFT output" and eng["prompts"] == 6
    assert eng["tokens"] > 0 and r["machine"]["sft_environment"]["openrlhf"] == "0.11.2"
    assert r["faiss_gpu"]["ran"] is False and r["faiss_gpu"]["why"]
    assert r["total_seconds"] <= 600


def test_gpu_check_refuses_to_run_without_cuda_or_wheels_unless_dry(tmp_path):
    env = {**os.environ, "GPU_CHECK_OUT": str(tmp_path)}
    env.pop("DRY", None)
    done = subprocess.run(["bash", "scripts/gpu_check.sh"], cwd=REPO, env=env, capture_output=True, text=True,
                          timeout=120)
    assert done.returncode != 0
    assert ".whl/gpu-check is missing" in done.stderr or "no CUDA device" in done.stderr, done.stderr
    assert not list(tmp_path.iterdir())
