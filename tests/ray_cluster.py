"""A local Ray cluster for tests: one head node from the worker environment, its own temp dir and free ports, stopped
by killing exactly the processes it started.

Never `ray stop`: it stops every Ray process of the user, other people's clusters and tests included
(../shared/notes/stack.md, Ray). `ray start` runs in a new session, so the daemons it leaves behind share its process
group: teardown signals that group, then any process still naming this cluster's temp dir (workers), nothing else.
Ray 2.60's token auth is off for the test cluster (`RAY_AUTH_MODE=disabled`), which listens on 127.0.0.1 only.
"""
from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
import pytest

REPO = Path(__file__).resolve().parents[1]


def ray_binary() -> Path:
    """`ray` of the worker environment ($RAGTEAM_WORKER_PYTHON's bin dir, else .venv-worker); a test FAILS without it
    (`make test` builds the worker environment first), it is not skipped."""
    python = Path(os.environ.get("RAGTEAM_WORKER_PYTHON", REPO / ".venv-worker" / "bin" / "python"))
    ray = python.parent / "ray"
    if not ray.is_file():
        pytest.fail(f"no Ray at {ray}: the Ray tests need the worker environment (`make setup-worker`, or "
                    f"RAGTEAM_WORKER_PYTHON=<worker env>/bin/python)", pytrace=False)
    return ray


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _pids(pgid: int, temp_dir: Path) -> list[int]:
    """Live processes of the cluster: in its process group, or naming its temp dir on their command line."""
    out = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            stat = (proc / "stat").read_text()
            cmd = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        fields = stat.rsplit(")", 1)[1].split()
        if fields[0] == "Z":  # exited, not yet reaped
            continue
        if int(fields[2]) == pgid or str(temp_dir) in cmd:
            out.append(int(proc.name))
    return out


def _kill(pgid: int, temp_dir: Path, sig: int) -> None:
    try:
        os.killpg(pgid, sig)
    except ProcessLookupError:
        pass
    for pid in _pids(pgid, temp_dir):
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            pass


# `ray start` gives the raylet a fixed 30 s to register with the GCS (ray/_private/node.py); on 2 busy cores (the
# main and worker suites side by side) that can run out. One more try, after the first one's processes are gone.
RAY_START_TRIES = 2
RAY_SLOW_START = "timed out during startup"


def _stop(pgid: int, temp_dir: Path) -> list[int]:
    """SIGTERM the cluster's processes, SIGKILL those left after 3 s; the pids still alive after that."""
    _kill(pgid, temp_dir, signal.SIGTERM)
    deadline = time.monotonic() + 3  # gcs_server and raylet may ignore it
    while _pids(pgid, temp_dir) and time.monotonic() < deadline:
        time.sleep(0.2)
    if _pids(pgid, temp_dir):
        _kill(pgid, temp_dir, signal.SIGKILL)
        time.sleep(0.5)
    return _pids(pgid, temp_dir)


@contextmanager
def local_ray_cluster(tmp: Path, num_cpus: int = 1) -> Iterator[str]:
    """Start a head node with its state under `tmp`/ray; yield its job server address (http://127.0.0.1:<port>)."""
    ray = ray_binary()
    temp_dir = tmp / "ray"
    # Unix socket paths (<temp_dir>/session_<date>_<time>_<pid>/sockets/plasma_store) must stay under 108 bytes
    if len(str(temp_dir)) > 40:
        temp_dir = Path(tempfile.mkdtemp(prefix="ragteam-ray-"))
    temp_dir.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "RAY_AUTH_MODE": "disabled", "RAY_USAGE_STATS_ENABLED": "0"}
    env.pop("RAY_ADDRESS", None)
    log_path = tmp / "ray-start.log"
    for attempt in range(1, RAY_START_TRIES + 1):
        dashboard = free_port()
        args = [str(ray), "start", "--head", "--temp-dir", str(temp_dir), "--node-ip-address", "127.0.0.1",
                "--port", str(free_port()), "--dashboard-host", "127.0.0.1", "--dashboard-port", str(dashboard),
                "--include-dashboard", "true", "--ray-client-server-port", str(free_port()),
                "--dashboard-agent-listen-port", str(free_port()), "--num-cpus", str(num_cpus),
                "--disable-usage-stats"]
        log = log_path.open("w")
        proc = subprocess.Popen(args, env=env, cwd=tmp, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        pgid = proc.pid
        try:
            rc = proc.wait(timeout=120)
        except subprocess.TimeoutExpired:
            rc = None
        log.close()
        if rc == 0:
            break
        left = _stop(pgid, temp_dir)
        text = log_path.read_text()
        if attempt == RAY_START_TRIES or RAY_SLOW_START not in text or left:
            pytest.fail(f"`ray start` {'exited ' + str(rc) if rc is not None else 'ran past 120 s'} (try {attempt}"
                        f"{', processes left: ' + str(left) if left else ''}):\n{text[-3000:]}")
    address = f"http://127.0.0.1:{dashboard}"
    try:
        deadline = time.monotonic() + 90
        while True:  # the job server answers a little after `ray start` returns
            try:
                if httpx.get(f"{address}/api/version", timeout=5).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            if time.monotonic() > deadline:
                pytest.fail(f"Ray's job server at {address} did not come up within 90 s")
            time.sleep(0.5)
        yield address
    finally:
        left = _stop(pgid, temp_dir)
        if temp_dir.parent != tmp:
            shutil.rmtree(temp_dir, ignore_errors=True)
        assert not left, f"Ray processes of the test cluster still alive: {left}"
