"""Stages reach the worker environment (vLLM) by themselves: `ensure_engine_environment` replaces a stage's process
with the worker interpreter when its params ask for vLLM, so `dvc repro` and the Prefect flow start every stage the
same way. And the trainer's side of vLLM rollouts: the engine's log-probs travel with its samples, the mismatch is
measured, and truncated importance sampling (TIS) weighs the loss."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from ragteam.llm.environment import vllm_reasons

REPO = Path(__file__).resolve().parents[1]
WORKER_PY = REPO / ".venv-worker" / "bin" / "python"


def test_the_params_that_need_vllm_are_named():
    assert vllm_reasons({"llm": {"backend": "hf"}}, "evaluate") == []
    assert vllm_reasons({"llm": {"backend": "vllm"}}, "evaluate") == ["llm.backend: vllm"]
    per_stage = {"llm": {"backend": "hf", "stages": {"evaluate": "vllm", "train_joint": "vllm",
                                                     "train_joint_jade": "hf"}}}
    assert vllm_reasons(per_stage, "evaluate") == ["llm.stages.evaluate: vllm"]
    assert vllm_reasons(per_stage, "synthesize") == []
    assert vllm_reasons(per_stage, "train_joint_mask", "mask") == ["llm.stages.train_joint: vllm"]   # the family
    assert vllm_reasons(per_stage, "train_joint_jade", "jade") == []                                 # its own
    joint = {"llm": {"backend": "hf"}, "joint": {"ppo": {"rollout_backend": "vllm"},
                                                 "jade": {"ppo": {"rollout_backend": "live"}}}}
    assert vllm_reasons(joint, "evaluate") == []                                   # not a joint stage
    assert vllm_reasons(joint, "train_joint_mask", "mask") == ["joint.ppo.rollout_backend: vllm"]
    assert vllm_reasons(joint, "train_joint_jade", "jade") == []                   # the system's override wins
    joint["joint"]["ppo"]["rollout_backend"] = "live"
    joint["joint"]["decor"] = {"ppo": {"rollout_backend": "vllm"}}
    assert vllm_reasons(joint, "train_joint_decor", "decor") == ["joint.decor.ppo.rollout_backend: vllm"]
    # a GRPO run's groups sampled by vLLM: its own section names it, wherever it sits
    grpo = {"llm": {"backend": "hf"}, "train_answer": {"stage1": {"rollout_backend": "live"},
                                                       "stage2": {"rollout_backend": "vllm"}},
            "train_query": {"grpo": {"rollout_backend": "live"}}}
    assert vllm_reasons(grpo, "train_answer") == ["train_answer.stage2.rollout_backend: vllm"]
    assert vllm_reasons(grpo, "train_query") == []
    # train_answer's only engine is its rollouts': llm.backend alone does not move it (train_query's answers do)
    grpo["llm"]["backend"] = "vllm"
    grpo["train_answer"]["stage2"]["rollout_backend"] = "live"
    assert vllm_reasons(grpo, "train_answer", rollouts_only=True) == []
    assert vllm_reasons(grpo, "train_query") == ["llm.backend: vllm"]


def test_a_stage_gets_the_engine_llm_stages_names_for_it():
    from ragteam.llm import LLMConfig

    llm = LLMConfig(backend="hf", stages={"evaluate": "vllm", "train_joint": "vllm", "train_joint_qagent": "hf"})
    assert llm.for_stage("evaluate").backend == "vllm" and llm.backend == "hf"
    assert llm.for_stage("label_judge") is llm
    assert llm.for_stage("train_joint_mask").backend == "vllm"
    assert llm.for_stage("train_joint_qagent").backend == "hf"
    with pytest.raises(ValueError, match="stages"):
        LLMConfig(stages={"evaluate": "sglang"})


PROBE = ("import json, os, sys; print(json.dumps({'pid': os.getpid()}), flush=True); "
         "from ragteam.environment import lineage_environment; from ragteam.llm.environment import ensure_engine_environment; "
         "ensure_engine_environment('probe', {'llm': {'backend': sys.argv[1]}}); "
         "print(json.dumps({'pid': os.getpid(), 'env': lineage_environment()['env'], 'exe': sys.executable}))")


def _probe(backend: str, **env) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", PROBE, backend], cwd=REPO, capture_output=True, text=True,
                          timeout=300, env={**os.environ, **env})


@pytest.mark.slow   # needs .venv-worker, which `make test` builds and `make test-fast` does not
def test_a_stage_that_asks_for_vllm_becomes_the_worker_interpreter_in_the_same_process():
    """The worker environment is built by `make test` (and `make setup-worker`) before this suite runs."""
    assert WORKER_PY.is_file(), f"{WORKER_PY} is missing: build the worker environment with `make setup-worker`"
    r = _probe("vllm")
    assert r.returncode == 0, r.stderr[-2000:]
    lines = [json.loads(x) for x in r.stdout.splitlines() if x.startswith("{")]
    assert len(lines) == 3, r.stdout          # the probe's first line twice (once per interpreter), then the result
    before, again, after = lines
    assert before["pid"] == again["pid"] == after["pid"]      # exec, not a child: DVC and Prefect see one process
    assert after["env"] == "worker" and ".venv-worker" in after["exe"]
    assert "probe: llm.backend: vllm: running in the worker environment" in r.stdout
    r = _probe("hf")                                          # nothing asks for vLLM: it stays where it is
    assert r.returncode == 0 and json.loads(r.stdout.splitlines()[-1])["env"] == "main"


def test_without_a_worker_environment_the_stage_says_how_to_build_it(tmp_path):
    r = _probe("vllm", RAGTEAM_WORKER_PYTHON=str(tmp_path / "none" / "python"))
    assert r.returncode == 1
    assert "probe FAILED: llm.backend: vllm needs vLLM, which only the worker environment has" in r.stderr
    assert "make setup-worker" in r.stderr and str(tmp_path / "none" / "python") in r.stderr


def test_a_real_stage_checks_before_it_writes_anything(tmp_path):
    """stages.label_judge on vLLM (llm.stages) and no worker environment: one line, nothing written."""
    import yaml

    params = yaml.safe_load((REPO / "params.yaml").read_text())
    params["llm"]["stages"] = {"label_judge": "vllm"}
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(params))
    r = subprocess.run([sys.executable, "-m", "stages.label_judge"], cwd=tmp_path, capture_output=True, text=True,
                       timeout=300, env={**os.environ, "PYTHONPATH": str(REPO),
                                         "RAGTEAM_WORKER_PYTHON": str(tmp_path / "no-worker" / "python")})
    assert r.returncode == 1 and "label_judge FAILED: llm.stages.label_judge: vllm needs vLLM" in r.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["params.yaml"]


# ---- the trainer's side: the engine's log-probs, their mismatch, TIS -------------------------------------------

def test_truncated_is_weights_are_the_capped_ratio_of_old_to_engine_probabilities():
    from ragteam.train.pg import truncated_is_weights

    old = torch.log(torch.tensor([[0.5, 0.2, 0.9]]))
    eng = torch.log(torch.tensor([[0.25, 0.4, 0.1]]))
    mask = torch.tensor([[1.0, 1.0, 0.0]])
    w = truncated_is_weights(old, eng, mask, cap=1.5)
    assert torch.allclose(w, torch.tensor([[1.5, 0.5, 0.0]]))     # 2.0 capped at 1.5; 0.5; masked
    with pytest.raises(ValueError, match="cap must be > 0"):
        truncated_is_weights(old, eng, mask, cap=0)


def test_is_weights_scale_each_tokens_policy_gradient_and_get_none_themselves():
    from ragteam.train.pg import policy_loss

    logp = torch.log(torch.tensor([[0.3, 0.6]])).requires_grad_()
    adv, mask = torch.tensor([[1.0, 1.0]]), torch.ones(1, 2)
    w = torch.tensor([[2.0, 0.5]], requires_grad=True)
    loss, _ = policy_loss(logp, logp.detach(), adv, mask, is_weights=w)
    loss.backward()
    # ratio 1, nothing clipped: d/dlogp_t of -(A w_t ratio_t)/2 = -A w_t / 2
    assert torch.allclose(logp.grad, torch.tensor([[-1.0, -0.25]]))
    assert w.grad is None
    plain = logp.detach().clone().requires_grad_()
    policy_loss(plain, plain.detach(), adv, mask)[0].backward()
    assert torch.allclose(plain.grad, torch.tensor([[-0.5, -0.5]]))


def _call(**kw):
    from ragteam.records import AgentCall

    base = dict(role="r", prompt=[{"role": "user", "content": "q"}], response="a b", reward=1.0)
    return AgentCall(**{**base, **kw})


def test_samples_carry_the_engines_log_probs_only_for_the_engines_own_ids():
    from ragteam.records import Episode
    from ragteam.train.joint.batch import episode_samples

    tok = None       # every call carries the engine's ids: nothing is re-tokenised
    ep = Episode(question_id="q1", question="q", golden_answers=["a"], system="s")
    ep.calls = [_call(prompt_ids=[1, 2], response_ids=[5, 6], logprobs=[-0.1, -0.2]),
                _call(prompt_ids=[1, 2], response_ids=[5, 6], logprobs=None),
                _call(prompt_ids=[1, 2], response_ids=[5, 6, 7], logprobs=[-0.1])]   # misaligned: dropped
    s = episode_samples(tok, [ep])
    assert [x.engine_logp for x in s] == [[-0.1, -0.2], None, None]


def test_engine_mismatch_is_the_mean_and_max_gap_over_loss_tokens():
    from ragteam.train.joint.batch import Sample, engine_mismatch

    a = Sample(0, 0, "r", [1], [5, 6], 0.0, engine_logp=[-1.0, -2.0])
    a.old_logp = torch.tensor([-1.1, -2.0])
    b = Sample(0, 1, "r", [1], [5, 6], 0.0, mask=[1, 0], engine_logp=[-0.5, -9.0])
    b.old_logp = torch.tensor([-0.2, -1.0])           # the masked token's gap (8) does not count
    c = Sample(0, 2, "r", [1], [5], 0.0)              # no engine log-probs (the live HF policy)
    c.old_logp = torch.tensor([-3.0])
    m = engine_mismatch([a, b, c])
    assert m["engine_logp_abs_diff"] == pytest.approx((0.1 + 0.0 + 0.3) / 3)
    assert m["engine_logp_max_abs_diff"] == pytest.approx(0.3)
    assert engine_mismatch([c]) == {}


def test_worker_main_runs_a_module_as_python_m_would_and_keeps_its_exit_status(tmp_path):
    """The worker's entry point for a stage: `-m ragteam.llm.worker_main <module> [args]` = `-m <module> [args]`,
    then every vLLM engine still open is closed (none here), whatever the exit status."""
    ok = subprocess.run([sys.executable, "-m", "ragteam.llm.worker_main", "json.tool", "--sort-keys"],
                        input='{"b": 1, "a": 2}', capture_output=True, text=True, timeout=120)
    assert ok.returncode == 0 and json.loads(ok.stdout) == {"a": 2, "b": 1}
    assert ok.stdout.index('"a"') < ok.stdout.index('"b"')                  # its arguments reached it
    bad = subprocess.run([sys.executable, "-m", "ragteam.llm.worker_main", "json.tool", str(tmp_path / "none.json")],
                         capture_output=True, text=True, timeout=120)
    assert bad.returncode != 0 and "none.json" in bad.stderr
