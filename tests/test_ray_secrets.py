"""What a Ray job is sent (`ragteam.ray_jobs`, `flows.subprocesses.repro_on_ray`), checked on the wire against a
local fake of Ray's Jobs REST API: no credential reaches a job's runtime env, whatever its prefix; requests go to
https or to a loopback host only; Ray's token authentication is spoken (Authorization: Bearer), and a refusal says
how to pass the token. (The flow's own check of `ray_address` is in tests/test_flow.py.)"""
from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from flows import subprocesses as sp
from ragteam.ray_jobs import RayJobError, RayJobs, check_address, is_secret_env

# variables a developer's shell holds: none may reach a job, although several match an allowed prefix (HF_, DVC_,
# RAGTEAM_, VLLM_)
SECRETS = {
    "HF_TOKEN": "hf_secret_value",
    "HF_TOKEN_PATH": "/home/me/.cache/huggingface/token",
    "DVC_STUDIO_TOKEN": "isat_secret_value",
    "RAGTEAM_FOO_TOKEN": "ragteam-token-value",
    "RAGTEAM_API_KEY": "ragteam-key-value",
    "RAGTEAM_DB_PASSWORD": "hunter2",
    "VLLM_API_KEY": "vllm-key-value",
    "DVC_REMOTE_SECRET": "dvc-secret-value",
    "AWS_ACCESS_KEY_ID": "AKIAEXAMPLEEXAMPLE00",
    "AWS_SECRET_ACCESS_KEY": "aws-secret-value",
    "AWS_SESSION_TOKEN": "aws-session-value",
    "GOOGLE_APPLICATION_CREDENTIALS": "/home/me/gcp.json",
    "RAY_AUTH_TOKEN": "ray-cluster-token",
}
ALLOWED = {"RAGTEAM_WORKER_PYTHON": "/opt/w/bin/python", "HF_HUB_OFFLINE": "1", "DVC_NO_ANALYTICS": "1",
           "VLLM_CPU_KVCACHE_SPACE": "4", "OMP_NUM_THREADS": "2", "TOKENIZERS_PARALLELISM": "false"}
NOT_ALLOWED = {"SOME_OTHER_SETTING": "x", "PREFECT_API_URL": "http://127.0.0.1:4200/api"}


class FakeJobServer:
    """Ray's Jobs REST API as `RayJobs` uses it, on 127.0.0.1: records every request (headers, JSON body); a
    submitted job SUCCEEDS at once. With `token`, requests without `Authorization: Bearer <token>` get 401 (none)
    or 403 (another), as Ray's dashboard answers."""

    def __init__(self, token: str | None = None) -> None:
        self.token, self.requests, self.jobs = token, [], {}
        server = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args) -> None:
                pass

            def _send(self, status: int, body) -> None:
                data = (body if isinstance(body, str) else json.dumps(body)).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json" if not isinstance(body, str) else "text/plain")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def _handle(self, method: str) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                raw = self.rfile.read(length) if length else b""
                server.requests.append({"method": method, "path": self.path, "headers": dict(self.headers),
                                        "raw": raw.decode(), "json": json.loads(raw) if raw else None})
                auth = self.headers.get("Authorization")
                if server.token and not auth:
                    return self._send(401, "Unauthorized: Missing authentication token")
                if server.token and auth != f"Bearer {server.token}":
                    return self._send(403, "Forbidden: Invalid authentication token")
                parts = self.path.strip("/").split("/")
                if self.path == "/api/version":
                    return self._send(200, {"version": "4", "ray_version": "2.60.0"})
                if method == "POST" and self.path == "/api/jobs/":
                    body = json.loads(raw)
                    server.jobs[body["submission_id"]] = body
                    return self._send(200, {"submission_id": body["submission_id"]})
                if method == "GET" and len(parts) >= 3 and parts[:2] == ["api", "jobs"]:
                    job = server.jobs.get(parts[2])
                    if job is None:
                        return self._send(404, "no such job")
                    if parts[3:] == ["logs"]:
                        return self._send(200, {"logs": "ran\n"})
                    return self._send(200, {**job, "status": "SUCCEEDED", "message": "done"})
                return self._send(404, f"unknown {method} {self.path}")

            def do_GET(self) -> None:
                self._handle("GET")

            def do_POST(self) -> None:
                self._handle("POST")

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.address = f"http://127.0.0.1:{self.httpd.server_address[1]}"

    def posted_jobs(self) -> list[dict]:
        return [r for r in self.requests if r["method"] == "POST" and r["path"] == "/api/jobs/"]


@contextmanager
def fake_job_server(token: str | None = None) -> Iterator[FakeJobServer]:
    server = FakeJobServer(token)
    thread = threading.Thread(target=server.httpd.serve_forever, daemon=True)
    thread.start()
    try:
        yield server
    finally:
        server.httpd.shutdown()
        server.httpd.server_close()
        thread.join()


@pytest.fixture
def clean_env(monkeypatch, tmp_path) -> Path:
    """No Ray token from this machine (its variables, ~/.ray/auth_token) unless a test sets one."""
    for name in ("RAY_AUTH_TOKEN", "RAY_AUTH_TOKEN_PATH"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    return tmp_path


def test_no_credential_reaches_a_stage_jobs_runtime_env(clean_env, monkeypatch):
    """A stage submitted as a Ray job (`repro_on_ray`, as the flow does) with a developer's credentials in the
    environment: what is POSTed carries the allow-listed variables and no credential, by name or by value."""
    for name, value in {**SECRETS, **ALLOWED, **NOT_ALLOWED}.items():
        monkeypatch.setenv(name, value)
    with fake_job_server(token=SECRETS["RAY_AUTH_TOKEN"]) as server:
        sid = sp.repro_on_ray(clean_env, "make", False, server.address, "run-1", 2.0, log=None)
    (post,) = server.posted_jobs()
    assert post["json"]["submission_id"] == sid and post["json"]["entrypoint_num_cpus"] == 2.0
    env_vars = post["json"]["runtime_env"]["env_vars"]
    assert not set(SECRETS) & set(env_vars), sorted(set(SECRETS) & set(env_vars))
    for value in SECRETS.values():  # nor their values anywhere in the request body
        assert value not in post["raw"], value
    assert {k: env_vars[k] for k in ALLOWED} == ALLOWED
    assert not set(NOT_ALLOWED) & set(env_vars)
    assert env_vars["PYTHONUNBUFFERED"] == "1" and env_vars["PATH"].split(":")[0].endswith("/bin")
    # the cluster's token travels as the header Ray's dashboard reads, on every request
    assert {r["headers"].get("Authorization") for r in server.requests} == {f"Bearer {SECRETS['RAY_AUTH_TOKEN']}"}


def test_a_job_whose_runtime_env_holds_a_credential_is_not_submitted(clean_env):
    with fake_job_server() as server, RayJobs(server.address) as ray:
        with pytest.raises(RayJobError, match=r"not submitting job-1 to http://127\.0\.0\.1:\d+: its "
                                              r"runtime_env\.env_vars hold DVC_STUDIO_TOKEN, HF_TOKEN, which look "
                                              r"like credentials"):
            ray.submit("true", submission_id="job-1",
                       runtime_env={"env_vars": {"HF_TOKEN": "x", "DVC_STUDIO_TOKEN": "y", "HF_HOME": "/h"}})
    assert server.posted_jobs() == []


def test_secret_names():
    for name in SECRETS:
        assert is_secret_env(name), name
    for name in (*ALLOWED, "HF_HOME", "RAGTEAM_RESULT_STORAGE", "PATH", "PYTHONUNBUFFERED"):
        assert not is_secret_env(name), name
    assert set(sp.ray_job_env({**SECRETS, **ALLOWED, **NOT_ALLOWED, "PATH": "/bin"})) == {
        *ALLOWED, "PATH", "PYTHONUNBUFFERED"}


@pytest.mark.parametrize("address, why", [
    ("head:8265", "'head:8265' has no scheme and head is not a loopback host: write https://head:8265"),
    ("10.0.0.5:8265", "has no scheme and 10.0.0.5 is not a loopback host"),
    ("http://head:8265", "'http://head:8265': plain http to head, which is not a loopback host; use https"),
    ("http://192.168.1.20:8265", "plain http to 192.168.1.20, which is not a loopback host"),
    ("ray://head:10001", "must be https://<host>\\[:port\\] \\(or http:// to a loopback host\\), not ray://"),
    ("http://me:pw@127.0.0.1:8265", "no user:password@, query or fragment"),
    ("", "empty"),
    # names a resolver may send to DNS (review of the guards): not literal loopback, so not plain http
    ("http://evil.localhost:8265", "plain http to evil.localhost, which is not a loopback host"),
    ("http://localhost.:8265", "plain http to localhost., which is not a loopback host"),
    ("http://127.0.0.1.:8265", "plain http to 127.0.0.1., which is not a loopback host"),
])
def test_an_address_that_would_go_in_clear_to_another_host_is_refused_naming_it(clean_env, address, why):
    with pytest.raises(RayJobError, match=f"^Ray job server address .*{why}"):
        RayJobs(address)
    with pytest.raises(ValueError, match=why):
        check_address(address)


@pytest.mark.parametrize("address, url", [
    ("https://head.example:8265/", "https://head.example:8265"), ("http://127.0.0.1:8265", "http://127.0.0.1:8265"),
    ("127.0.0.1:8265", "http://127.0.0.1:8265"), ("localhost:8265", "http://localhost:8265"),
    ("http://[::1]:8265", "http://[::1]:8265"), ("https://10.0.0.5:8443", "https://10.0.0.5:8443"),
])
def test_https_anywhere_and_http_on_loopback_are_taken(clean_env, address, url):
    assert check_address(address) == url
    with RayJobs(address) as ray:
        assert ray.address == url


def test_token_auth_token_from_the_variable_or_a_file_and_a_refusal_says_how_to_pass_it(clean_env, monkeypatch):
    token = "3f1c0f4e-ray-token"
    with fake_job_server(token=token) as server:
        # none: Ray's 401, and the way to pass the token (never "disable authentication")
        with RayJobs(server.address) as ray, pytest.raises(RayJobError) as err:
            ray.version()
        msg = str(err.value)
        assert msg.startswith(f"the Ray job server at {server.address} refused GET /api/version (401: Unauthorized: "
                              f"Missing authentication token): it requires Ray's token authentication and no token "
                              f"was sent; pass the cluster's token (`ray get-auth-token` on its head node) as "
                              f"$RAY_AUTH_TOKEN, or in a file named by $RAY_AUTH_TOKEN_PATH, or in ~/.ray/auth_token")
        assert "disable" not in msg.lower() and "RAY_AUTH_MODE" not in msg

        monkeypatch.setenv("RAY_AUTH_TOKEN", "not-the-token")
        with RayJobs(server.address) as ray, pytest.raises(RayJobError, match=r"\(403: Forbidden: Invalid "
                                                           r"authentication token\): .* the token from "
                                                           r"\$RAY_AUTH_TOKEN was refused"):
            ray.version()

        monkeypatch.setenv("RAY_AUTH_TOKEN", token)
        with RayJobs(server.address) as ray:
            assert ray.version()["ray_version"] == "2.60.0"

        monkeypatch.delenv("RAY_AUTH_TOKEN")
        (clean_env / "token").write_text(token + "\n")
        monkeypatch.setenv("RAY_AUTH_TOKEN_PATH", str(clean_env / "token"))
        with RayJobs(server.address) as ray:
            assert ray.version()["ray_version"] == "2.60.0"

        monkeypatch.delenv("RAY_AUTH_TOKEN_PATH")
        (clean_env / "home/.ray").mkdir(parents=True)
        (clean_env / "home/.ray/auth_token").write_text(token)   # where `ray get-auth-token --generate` puts it
        with RayJobs(server.address) as ray:
            assert ray.version()["ray_version"] == "2.60.0"
    assert [r["headers"].get("Authorization") for r in server.requests] == [
        None, "Bearer not-the-token", f"Bearer {token}", f"Bearer {token}", f"Bearer {token}"]

    monkeypatch.setenv("RAY_AUTH_TOKEN_PATH", str(clean_env / "missing"))
    with pytest.raises(RayJobError, match=f"cannot read the Ray token file {clean_env / 'missing'} named by "
                                          r"\$RAY_AUTH_TOKEN_PATH"):
        RayJobs("http://127.0.0.1:8265")


def test_credentials_whose_words_run_together_or_that_hide_in_a_url_are_caught():
    """Review of the guards: joined words (APIKEY, ACCESSTOKEN, PASSPHRASE...) and URLs with user:password@
    slipped through under an allowed prefix."""
    joined = ["RAGTEAM_APIKEY", "HF_APIKEY", "RAGTEAM_APITOKEN", "HF_HUB_ACCESSTOKEN", "DVC_STUDIO_ACCESSTOKEN",
              "RAGTEAM_SECRETKEY", "RAGTEAM_PRIVATEKEY", "RAGTEAM_DB_PASSPHRASE", "RAGTEAM_JWT", "RAGTEAM_BEARER",
              "RAGTEAM_PAT"]
    for name in joined:
        assert is_secret_env(name), name
    env = {**{n: "x" for n in joined}, "HF_ENDPOINT": "https://user:pw@hf.internal", "RAGTEAM_DB": "ok",
           "TOKENIZERS_PARALLELISM": "false", "HF_HUB_OFFLINE": "1", "PATH": "/bin"}
    assert set(sp.ray_job_env(env)) == {"RAGTEAM_DB", "TOKENIZERS_PARALLELISM", "HF_HUB_OFFLINE", "PATH",
                                        "PYTHONUNBUFFERED"}
    assert not is_secret_env("HF_ENDPOINT", "https://hf.internal")
