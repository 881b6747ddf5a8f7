"""The GPU work-pool path end to end, on this machine: a real `prefect server`, a `process` work pool named `gpu`,
this project's prefect.yaml `gpu` deployment deployed with `prefect deploy` (its pull steps: git_clone of a branch,
set_working_directory, the `dvc remote add` shell step), and a real `prefect worker` running the stage.

The orchestrator (`ragteam flow run` in a toy checkout at commit A) runs `make` itself and sends `count` to the
deployment. The branch the deployment clones has moved on to commit B, whose count.py would write another number:
the worker must fetch and check out A, persist its record in the shared result storage, and push its out to the
DVC remote; the orchestrator reads that record from the flow run's result (not from an artifact) and pulls the out.
"""
from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
import yaml
from test_flow import CHAIN_DVC, COUNT_PY, MAKE_PY, REPO, dvc, make_repo, prefect_section, sh

BIN = Path(sys.executable).parent  # this environment's prefect and dvc (a worker host runs from its .venv too)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def child_env(home: Path, api_url: str) -> dict[str, str]:
    """The environment of every child: one PREFECT_HOME, the server's API, this venv's bin first on PATH (`dvc` for
    the deployment's shell step), this checkout's ragteam (the toy repo has only flows/)."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("PREFECT_", "RAGTEAM_")) and k not in ("VIRTUAL_ENV", "PYTHONPATH")}
    env.update({
        "PREFECT_HOME": str(home), "PREFECT_API_URL": api_url, "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
        "PREFECT_SERVER_UI_ENABLED": "false", "PREFECT_UI_ENABLED": "false", "DVC_NO_ANALYTICS": "1",
        "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}", "PYTHONPATH": str(REPO), "PYTHONUNBUFFERED": "1",
        "PREFECT_LOGGING_LEVEL": "INFO",
    })
    return env


def start(args: list[str], cwd: Path, env: dict, log: Path) -> subprocess.Popen:
    """A child in its own process group (so stopping it stops what it started: a worker's flow-run processes)."""
    return subprocess.Popen(args, cwd=cwd, env=env, stdout=log.open("w"), stderr=subprocess.STDOUT,
                            start_new_session=True)


def stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(5)


def tail(log: Path, n: int = 40) -> str:
    return "\n".join(log.read_text(errors="replace").splitlines()[-n:]) if log.exists() else "(no log)"


@pytest.fixture
def prefect_server(tmp_path):
    """`prefect server start` on a free localhost port, SQLite under tmp_path; stopped even if the test fails."""
    port = free_port()
    url = f"http://127.0.0.1:{port}/api"
    env = child_env(tmp_path / "prefect-home", url)
    log = tmp_path / "server.log"
    server = start([str(BIN / "prefect"), "server", "start", "--host", "127.0.0.1", "--port", str(port),
                    "--no-services", "--no-ui"], tmp_path, env, log)
    try:
        deadline = time.monotonic() + 120
        while True:
            if server.poll() is not None:
                pytest.fail(f"prefect server exited {server.returncode}:\n{tail(log)}")
            try:
                with urllib.request.urlopen(f"{url}/health", timeout=2) as r:
                    if r.status == 200:
                        break
            except OSError:
                pass
            if time.monotonic() > deadline:
                pytest.fail(f"prefect server not healthy at {url} after 120 s:\n{tail(log)}")
            time.sleep(0.5)
        yield env
    finally:
        stop(server)


def run(args: list[str], cwd: Path, env: dict, timeout: float = 120) -> subprocess.CompletedProcess:
    r = subprocess.run(args, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    assert r.returncode == 0, f"{args} exited {r.returncode}:\n{r.stdout[-4000:]}\n{r.stderr[-4000:]}"
    return r


@pytest.mark.slow
@pytest.mark.timeout(400)
def test_gpu_stage_runs_on_a_real_worker_at_the_orchestrators_commit(prefect_server, tmp_path):
    t0 = time.monotonic()
    env = prefect_server
    remote, results = tmp_path / "dvc-remote", tmp_path / "results"
    params = {"toy": {"n": 3, "scale": 2},
              "prefect": prefect_section(gpu_stages=["count"], gpu_mode="deployment", result_storage=str(results))}
    files = {"make.py": MAKE_PY, "count.py": COUNT_PY, "prefect.yaml": (REPO / "prefect.yaml").read_text(),
             "flows/pipeline.py": (REPO / "flows/pipeline.py").read_text()}
    orch = make_repo(tmp_path / "orchestrator", CHAIN_DVC, files, params, remote)
    commit_a = sh(["git", "rev-parse", "HEAD"], orch).strip()
    origin = tmp_path / "origin.git"
    sh(["git", "clone", "-q", "--bare", str(orch), str(origin)], tmp_path)
    sh(["git", "remote", "add", "origin", f"file://{origin}"], orch)
    # the branch moves on: B's count.py writes a thousand times more; a worker running the branch head would show it
    dev = tmp_path / "dev"
    sh(["git", "clone", "-q", str(origin), str(dev)], tmp_path)
    (dev / "count.py").write_text(COUNT_PY.replace("* scale\n", "* scale * 1000\n"))
    sh(["git", "-c", "user.email=t@example.com", "-c", "user.name=t", "commit", "-q", "-am", "B"], dev)
    sh(["git", "push", "-q", "origin", "main"], dev)
    commit_b = sh(["git", "rev-parse", "HEAD"], dev).strip()
    assert commit_b != commit_a

    prefect = str(BIN / "prefect")
    run([prefect, "work-pool", "create", "gpu", "--type", "process"], tmp_path, env)
    host = tmp_path / "gpu-host"
    host.mkdir()
    worker_log = tmp_path / "worker.log"
    worker = start([prefect, "worker", "start", "--pool", "gpu", "--type", "process", "--limit", "1"], host,
                   {**env, "PREFECT_WORKER_QUERY_SECONDS": "1", "PREFECT_WORKER_PREFETCH_SECONDS": "5"}, worker_log)
    try:
        deploy_env = {**env, "RAGTEAM_GIT_URL": f"file://{origin}", "RAGTEAM_GIT_BRANCH": "main",
                      "RAGTEAM_DVC_REMOTE": str(remote)}
        run([prefect, "--no-prompt", "deploy", "--name", "gpu"], orch, deploy_env)
        assert not sh(["git", "status", "--porcelain", "--untracked-files=no"], orch).strip()  # deploy left it clean
        t_setup = time.monotonic() - t0

        try:
            flow = subprocess.run([sys.executable, "-m", "ragteam.cli", "flow", "run"], cwd=orch, env=env,
                                  capture_output=True, text=True, timeout=300)
        except subprocess.TimeoutExpired as e:
            pytest.fail(f"flow run still running after 300 s:\n{e.stdout}\nworker:\n{tail(worker_log, 80)}")
        out = flow.stdout + flow.stderr
        assert flow.returncode == 0, \
            f"flow run exited {flow.returncode}:\n{out[-6000:]}\nworker:\n{tail(worker_log, 80)}"
    finally:
        stop(worker)
    wlog = worker_log.read_text(errors="replace")

    # the worker ran A's count.py (B's would write 12000), on a clone of the branch head B that it moved to A
    moved = f"checked out {commit_a}, the orchestrator's commit (the clone was at {commit_b})"
    assert moved in wlog, tail(worker_log, 80)
    assert "count: done in" in out and f"(deployment, commit {commit_a})" in out, out[-3000:]
    assert (orch / "out/count.txt").read_text() == "12"
    assert (orch / "log/runs.log").read_text().split() == ["make"]          # count did not run here
    assert json.loads((orch / "metrics/count.json").read_text()) == {"total": 12, "files": 3}
    # the dvc.lock entry came back from the worker and matches this workspace; every out is in the DVC remote
    assert json.loads(dvc(orch, "status", "--json")) == {}
    assert json.loads(dvc(orch, "status", "--cloud", "--json")) == {}
    outs = yaml.safe_load((orch / "dvc.lock").read_text())["stages"]["count"]["outs"]
    count_md5 = next(o["md5"] for o in outs if o["path"] == "out/count.txt")
    assert (remote / "files" / "md5" / count_md5[:2] / count_md5[2:]).read_text() == "12"
    # the record the orchestrator adopted is the worker's persisted return value (JSON in the shared storage)
    persisted = [json.loads(p.read_text()) for p in results.iterdir()]
    worker_runs = [r for r in persisted if r.get("plan") == [["count"]]]
    assert len(worker_runs) == 1 and worker_runs[0]["stages"]["count"]["git_commit"] == commit_a
    assert worker_runs[0]["stages"]["count"]["lock"] == yaml.safe_load((orch / "dvc.lock").read_text())["stages"][
        "count"]
    print(f"setup (repos, pool, worker, deploy) {t_setup:.0f} s, flow run {time.monotonic() - t0 - t_setup:.0f} s")


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_on_a_server_two_runs_share_the_hosts_slots(prefect_server, tmp_path):
    """On a real Prefect server the host's concurrency limit spans runs: while another run holds the only slot
    (`prefect.max_parallel_stages: 1`), a `ragteam flow run` process waits, and its stage starts after the release."""
    from prefect.client.orchestration import get_client
    from prefect.concurrency.sync import concurrency
    from prefect.settings import PREFECT_API_URL, temporary_settings
    from test_flow import BRANCHES_DVC, STEP_PY

    env = prefect_server
    prefix = "toy-stages-shared"
    repo = make_repo(tmp_path / "toy", BRANCHES_DVC, {"step.py": STEP_PY, "flows/pipeline.py":
                     (REPO / "flows/pipeline.py").read_text()},
                     {"prefect": prefect_section(max_parallel_stages=1, concurrency_limit=prefix)})
    name = f"{prefix}-{socket.gethostname()}"
    with temporary_settings(updates={PREFECT_API_URL: env["PREFECT_API_URL"]}):
        with get_client(sync_client=True) as client:
            from prefect.client.schemas.actions import GlobalConcurrencyLimitCreate

            client.create_global_concurrency_limit(GlobalConcurrencyLimitCreate(name=name, limit=1, active=True))
        with concurrency(name, occupy=1, strict=True):                   # the other run's stage
            flow = subprocess.Popen([sys.executable, "-m", "ragteam.cli", "flow", "run", "left", "--single"],
                                    cwd=repo, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
            time.sleep(20)
            assert flow.poll() is None and not (repo / "log/left.attempts").exists(), "the stage did not wait"
            released = time.time()
        out, _ = flow.communicate(timeout=200)
        assert flow.returncode == 0, out[-4000:]
        assert f"global concurrency limit '{name}' (1 slot(s))" in out, out[-4000:]
        assert json.loads((repo / "log/left.json").read_text())["start"] >= released
        with get_client(sync_client=True) as client:
            limit = client.read_global_concurrency_limit_by_name(name)
            assert (limit.limit, limit.active_slots) == (1, 0)            # released when the stage ended
