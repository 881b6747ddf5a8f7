"""Ray jobs through the Jobs REST API (`ragteam.ray_jobs`) against a real local Ray cluster (one per module, started
from the worker environment): CPU-sized jobs run, their logs and status come back, a failed job fails the stage
with its status and log tail, a succeeded job is not run again, a running one is waited on, a bad address is named.
And the real OpenRLHF entrypoint of a prepared answer-GRPO job, submitted as a stage does: where it stops here."""
from __future__ import annotations

import shlex
import sys
import time
from pathlib import Path

import pytest
from ray_cluster import free_port, local_ray_cluster
from test_train_openrlhf import CLUSTER, PAPER, SAMPLES

from ragteam.io import DataError
from ragteam.ray_jobs import RayJobFailed, RayJobs, RayUnreachable, submission_id
from ragteam.rewards.maps import AnswerReward
from ragteam.train.openrlhf import OpenRLHFJob, prepare_answer_grpo_job
from stages.common import OpenRLHFParams, run_openrlhf, stage_main

PY = shlex.quote(sys.executable)  # the cluster shares this filesystem: the job runs this interpreter


@pytest.fixture(scope="module")
def ray_address(tmp_path_factory):
    with local_ray_cluster(tmp_path_factory.mktemp("rayjobs")) as address:
        yield address


def marker_job(marker: Path, text: str, exit_code: int = 0, sleep_s: float = 0) -> str:
    """A CPU-sized job: appends a line to `marker`, prints `text`, sleeps, exits `exit_code`."""
    code = (f"import pathlib, sys, time; f = pathlib.Path({str(marker)!r}); f.open('a').write('ran\\n'); "
            f"print({text!r}, flush=True); time.sleep({sleep_s}); sys.exit({exit_code})")
    return f"{PY} -c {shlex.quote(code)}"


def test_a_cpu_job_runs_its_logs_come_back_and_a_rerun_does_not_submit_it_again(ray_address, tmp_path):
    marker, lines = tmp_path / "marker.txt", []
    sid = submission_id("test-ok", str(tmp_path))
    assert sid == submission_id("test-ok", str(tmp_path)) and sid.startswith("test-ok-")
    with RayJobs(ray_address) as ray:
        assert ray.version()["ray_version"] == "2.60.0"
        res = ray.run_job(marker_job(marker, "hello from ray"), submission_id=sid, metadata={"test": "ok"},
                          runtime_env={"env_vars": {"RAGTEAM_T": "1"}}, log=lines.append)
        assert res.status == "SUCCEEDED" and not res.reused
        assert "hello from ray" in res.logs and "hello from ray" in lines   # the log line, as it came
        assert f"Ray job {sid}: SUCCEEDED" in lines                           # the status changes
        assert marker.read_text() == "ran\n"
        info = ray.info(sid)
        assert info["metadata"] == {"test": "ok"} and info["runtime_env"]["env_vars"] == {"RAGTEAM_T": "1"}

        again: list[str] = []
        res = ray.run_job(marker_job(marker, "hello from ray"), submission_id=sid, log=again.append)
        assert res.reused and "hello from ray" in res.logs
        assert again == [f"Ray job {sid} already SUCCEEDED on {ray_address}: not run again"]
        assert marker.read_text() == "ran\n"                                  # not run twice
        assert ray.info("no-such-job") is None


def test_a_running_job_is_waited_on_not_submitted_twice(ray_address, tmp_path):
    marker, lines = tmp_path / "marker.txt", []
    sid = submission_id("test-running", str(tmp_path))
    with RayJobs(ray_address) as ray:
        ray.submit(marker_job(marker, "slow", sleep_s=3), submission_id=sid)
        res = ray.run_job(marker_job(marker, "slow", sleep_s=3), submission_id=sid, log=lines.append)
    assert res.status == "SUCCEEDED" and not res.reused
    assert any("is already PENDING" in ln or "is already RUNNING" in ln for ln in lines), lines
    assert marker.read_text() == "ran\n"


def _job(tmp_path: Path, cmd: str, address: str) -> tuple[OpenRLHFJob, OpenRLHFParams]:
    """An OpenRLHF job whose entrypoint is `cmd`, as a stage hands it to `run_openrlhf`."""
    (tmp_path / "data.jsonl").write_text("{}\n")
    cfg = OpenRLHFParams(project_dir=str(tmp_path), ray_address=address, dry_run=False)
    job = OpenRLHFJob(dataset=tmp_path / "data.jsonl", command=shlex.split(cmd), runtime_env={},
                      project_dir=str(tmp_path), output_dir="out")
    return job, cfg


def test_a_failed_job_fails_the_stage_with_its_status_and_log_tail_and_a_rerun_retries_it(ray_address, tmp_path,
                                                                                        monkeypatch, capsys):
    marker = tmp_path / "marker.txt"
    job, cfg = _job(tmp_path, marker_job(marker, "about to fail", exit_code=3), ray_address)
    sid = job.submission_id("train_x-0")
    with pytest.raises(DataError) as err:
        run_openrlhf([job], "train_x", cfg)
    msg = str(err.value)
    assert msg.startswith(f"train_x: OpenRLHF job 1/1: Ray job {sid} on {ray_address} ended FAILED: ")
    assert msg.endswith("ended FAILED: Job entrypoint command failed with exit code 3; last log lines: about to fail")
    assert "\n" not in msg
    assert "about to fail" in capsys.readouterr().out                          # the job's log, shown as it ran

    # through the stage entry point: one FAILED line, no metrics written
    monkeypatch.chdir(tmp_path)
    (tmp_path / "params.yaml").write_text("{}\n")
    with pytest.raises(SystemExit) as exit_:
        # a training stage's name (stage_main fails at once for a stage without declared metrics, stages.common)
        stage_main("train_judge", "x-agent", lambda params: run_openrlhf([job], "train_x", cfg))
    line = str(exit_.value.code)
    # the rerun ran it again (a retry), as the job's second attempt
    assert line == (f"train_judge FAILED (models/agents/x-agent left untouched): train_x: OpenRLHF job 1/1: Ray job "
                    f"{sid}-2 on {ray_address} ended FAILED: Job entrypoint command failed with exit code 3; last log "
                    f"lines: about to fail")
    assert not (tmp_path / "metrics").exists()
    assert marker.read_text() == "ran\nran\n"
    assert f"Ray job {sid} ended FAILED before: submitting it again as {sid}-2" in capsys.readouterr().out
    with RayJobs(ray_address) as ray:
        assert [ray.info(i)["status"] for i in (sid, f"{sid}-2")] == ["FAILED", "FAILED"]
        assert ray.latest_attempt(sid)[0] == f"{sid}-2"


def test_a_succeeded_openrlhf_job_is_trained_again_only_when_its_output_is_gone(ray_address, tmp_path, capsys):
    """DVC deletes a stage's outs before rerunning it: then the job must run again, whatever its earlier status."""
    marker = tmp_path / "marker.txt"
    code = f"import pathlib; pathlib.Path('out').mkdir(); open({str(marker)!r}, 'a').write('ran\\n')"
    job, cfg = _job(tmp_path, f"{PY} -c {shlex.quote(code)}", ray_address)
    sid = job.submission_id("train_x-0")
    run_openrlhf([job], "train_x", cfg)
    run_openrlhf([job], "train_x", cfg)   # the stage rerun (its process died, say): the job is not trained again
    assert marker.read_text() == "ran\n" and f"Ray job {sid} already SUCCEEDED" in capsys.readouterr().out
    (tmp_path / "out").rmdir()
    run_openrlhf([job], "train_x", cfg)
    assert marker.read_text() == "ran\nran\n" and (tmp_path / "out").is_dir()
    assert (f"Ray job {sid} ended SUCCEEDED before (its output {tmp_path / 'out'} is gone): submitting it again as "
            f"{sid}-2") in capsys.readouterr().out


def test_a_stopped_job_is_an_error_naming_it(ray_address, tmp_path):
    sid = submission_id("test-stop", str(tmp_path))
    with RayJobs(ray_address) as ray:
        ray.submit(marker_job(tmp_path / "marker.txt", "waiting to be stopped", sleep_s=60), submission_id=sid)
        while ray.info(sid)["status"] == "PENDING":
            time.sleep(0.2)
        assert ray.stop(sid)
        with pytest.raises(RayJobFailed, match=f"^Ray job {sid} on {ray_address} ended STOPPED: ") as err:
            ray.wait(sid, log=lambda line: None)
    assert err.value.status == "STOPPED" and err.value.submission_id == sid


def test_an_unreachable_address_is_one_error_naming_it(tmp_path):
    address = f"http://127.0.0.1:{free_port()}"
    with pytest.raises(RayUnreachable, match=f"no Ray job server answers at {address} "):
        RayJobs(address).run_job("true", submission_id="x")
    job, cfg = _job(tmp_path, "true", address)
    with pytest.raises(DataError, match=f"train_x: OpenRLHF job 1/1: no Ray job server answers at {address} "):
        run_openrlhf([job], "train_x", cfg)


def test_the_real_openrlhf_grpo_entrypoint_stops_where_openrlhf_is_missing(ray_address, tmp_path, monkeypatch,
                                                                            capsys):
    """The answer-GRPO job as train_answer prepares it (paper flags), submitted for real; this CPU machine has no
    OpenRLHF (GPU-only: DeepSpeed, vLLM CUDA), so the job's `python3 -m openrlhf.cli.train_ppo_ray` ends there."""
    monkeypatch.chdir(tmp_path)
    cluster = CLUSTER.model_copy(update={"project_dir": str(tmp_path), "ray_address": ray_address})
    job = prepare_answer_grpo_job(SAMPLES * 10, Path("jobs/openrlhf/train_answer/stage1"),
                                  model_path="/models/llama-3.1-8b-instruct", output_dir="models/agents/answer",
                                  params=PAPER, reward=AnswerReward("stage1", 0.5, 12),
                                  special_tokens=["<|eot_id|>"], cluster=cluster)
    cfg = OpenRLHFParams(**cluster.model_dump(), dry_run=False)
    with pytest.raises(DataError) as err:
        run_openrlhf([job], "train_answer", cfg)
    msg = str(err.value)
    sid = job.submission_id("train_answer-0")
    assert f"Ray job {sid} on {ray_address} ended FAILED: Job entrypoint command failed with exit code 1; " in msg
    # the job's last log line: python3 (the cluster's, on its PATH) cannot find the module
    assert msg.endswith("python3: Error while finding module specification for 'openrlhf.cli.train_ppo_ray' "
                        "(ModuleNotFoundError: No module named 'openrlhf')"), msg
    with RayJobs(ray_address) as ray:
        info = ray.info(sid)
    # what ran is command.sh's entrypoint and runtime env, in the project dir
    assert info["entrypoint"] == f"cd {shlex.quote(str(tmp_path))} && {shlex.join(job.entrypoint)}"
    assert job.entrypoint[:3] == ["python3", "-m", "openrlhf.cli.train_ppo_ray"]
    assert info["runtime_env"] == job.runtime_env and job.runtime_env["env_vars"]["PYTHONPATH"] == str(tmp_path)
    assert not (tmp_path / "models/agents/answer").exists()
    print(f"\nwhere the real OpenRLHF job stops on this machine: {info['message'].splitlines()[0]} | "
          f"{msg.rsplit('| ', 1)[-1]}", file=sys.__stdout__)
