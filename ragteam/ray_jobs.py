"""Ray jobs over HTTP: submit a shell command to a Ray cluster, follow it, bring its status and logs back.

The main environment, where stages and the Prefect orchestrator run, cannot hold `ray` (the worker environment
has it), so this talks to the job server on the cluster's head node (the dashboard port, 8265 by default) through
Ray's documented Jobs REST API with httpx: POST /api/jobs/, GET /api/jobs/{id}, GET /api/jobs/{id}/logs,
POST /api/jobs/{id}/stop, GET /api/jobs/ (docs.ray.io: cluster/running-applications/job-submission/api.html; Jobs
API version 4 in Ray 2.60). The job runs on the cluster: every path in its command must be valid there.

Submission ids are deterministic (`submission_id`), so a rerun finds its earlier job: `run_job` reuses one that
SUCCEEDED (not run again) and waits on one PENDING/RUNNING (not run twice). After a FAILED/STOPPED one it submits
attempt `<id>-2`, `<id>-3`, ...: Ray refuses an id it knows, and deleting the old job to reuse its id raced with its
supervisor actor's teardown (the new job died with it) and appended the new log to the old one.

Security: the address must be https, or plain http to a loopback host only (`check_address`): requests carry the
job's command and environment and, where the cluster uses Ray's token authentication (`RAY_AUTH_MODE=token`, or a
token present when the head node starts, in Ray 2.60), its token, which must not travel in clear over a network.
The token is read as Ray's own clients read it (`auth_token`): $RAY_AUTH_TOKEN, else the file $RAY_AUTH_TOKEN_PATH,
else ~/.ray/auth_token, and sent as `Authorization: Bearer <token>`. A job's runtime env is stored on the cluster
and shown on its dashboard: `submit` refuses env vars that look like credentials (`is_secret_env`).

Ray's own `JobSubmissionClient` would do the HTTP part, but it comes with `ray` itself, which the orchestrator
environment cannot hold (the worker environment has it); this client needs httpx only.
"""
from __future__ import annotations

import hashlib
import ipaddress
import json
import os
import re
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httpx

TERMINAL = ("SUCCEEDED", "FAILED", "STOPPED")
TAIL_LINES = 8  # log lines a failure message carries
# lines Ray itself puts at the top of a job's log (its own log lines, the entrypoint echoed): not the job's output
_RAY_PREAMBLE = re.compile(r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d+\s+\w+ job_manager\.py:|Running entrypoint for job )")


class RayJobError(RuntimeError):
    """The job server refused a request, or answered something this client does not understand."""


class RayUnreachable(RayJobError):
    """No job server answers at the address (cluster down, wrong host/port, not the dashboard port)."""


class RayJobFailed(RayJobError):
    """A job ended FAILED or STOPPED; the one-line message names the job, its status message and its log tail."""

    def __init__(self, address: str, submission_id: str, status: str, message: str, logs: str) -> None:
        self.submission_id, self.status, self.logs = submission_id, status, logs
        self.tail = [ln for ln in logs.splitlines() if ln.strip() and not _RAY_PREAMBLE.match(ln)][-TAIL_LINES:]
        # Ray's message for a failed entrypoint goes on with ", last available logs ...:" and the logs: the tail
        # has those
        first = (message or "").strip().splitlines()[0] if (message or "").strip() else "no status message"
        self.message = first.split(", last available logs")[0]
        super().__init__(f"Ray job {submission_id} on {address} ended {status}: {self.message}; last log lines: "
                         + (" | ".join(self.tail) or "(no logs)"))


@dataclass
class JobResult:
    submission_id: str # the attempt that ran: the id asked for, or `<id>-<n>` after n-1 failed attempts
    status: str        # SUCCEEDED
    logs: str
    reused: bool       # True: an earlier submission with this id had already succeeded; nothing was run


# Ray's token authentication, as its own clients find the token (ray/_private/authentication): the variable, then
# the file the second one names, then ~/.ray/auth_token (what `ray get-auth-token --generate` writes)
TOKEN_ENV = "RAY_AUTH_TOKEN"
TOKEN_PATH_ENV = "RAY_AUTH_TOKEN_PATH"
DEFAULT_TOKEN_PATH = Path("~/.ray/auth_token")
HOW_TO_PASS_TOKEN = (f"pass the cluster's token (`ray get-auth-token` on its head node) as ${TOKEN_ENV}, or in a file "
                     f"named by ${TOKEN_PATH_ENV}, or in {DEFAULT_TOKEN_PATH}")

# names of variables that hold credentials: never put in a job's runtime env. A part of the name (between "_")
# that is a secret's word, or a cloud account's prefix; e.g. HF_TOKEN, DVC_STUDIO_TOKEN, RAGTEAM_API_KEY,
# AWS_SECRET_ACCESS_KEY, GOOGLE_APPLICATION_CREDENTIALS (TOKENIZERS_PARALLELISM is not one)
_SECRET_WORD = re.compile(r"(^|_)(TOKEN|TOKENS|KEY|KEYS|SECRET|SECRETS|PASSWORD|PASSWD|PASS|PWD|CREDENTIAL|"
                          r"CREDENTIALS|AUTH|AUTHORIZATION|COOKIE|PRIVATE|PAT|JWT|BEARER|CERT|CERTS)(_|$)", re.I)
# ... and the same words run together with others (HF_HUB_ACCESSTOKEN, RAGTEAM_APIKEY, *_PASSPHRASE, *_SECRETKEY);
# TOKENIZERS (TOKENIZERS_PARALLELISM) is the one word that holds one of them and is no credential
_SECRET_PART = re.compile(r"TOKEN(?!IZER)|SECRET|PASSW|PASSPHRASE|APIKEY|ACCESSKEY|PRIVATEKEY|SIGNINGKEY|"
                          r"CREDENTIAL|BEARER|JWT|COOKIE|SESSIONID", re.I)
# a value that is a URL with user:password@ (HF_ENDPOINT, *_DATABASE_URL) carries its credential in the clear
_URL_WITH_USERINFO = re.compile(r"[a-z][a-z0-9+.-]*://[^/\s@]+@", re.I)
_SECRET_PREFIXES = ("AWS_", "GOOGLE_", "GCP_", "GCLOUD_", "CLOUDSDK_", "AZURE_", "RAY_AUTH_", "MINIO_", "S3_",
                    "GITHUB_", "GH_", "GIT_ASKPASS", "SSH_", "KUBE", "DOCKER_", "NETRC", "WANDB_", "OPENAI_",
                    "ANTHROPIC_")
_LOOPBACK_NAMES = ("localhost",)


def is_secret_env(name: str, value: str | None = None) -> bool:
    """Whether the environment variable `name` (with `value`, when given) may hold a credential: a token, key,
    secret, password, a cloud account's settings, or a URL with user:password@. Such a variable never goes into a
    Ray job's runtime env."""
    upper = name.upper()
    return (bool(_SECRET_WORD.search(upper) or _SECRET_PART.search(upper)) or upper.startswith(_SECRET_PREFIXES)
            or (value is not None and bool(_URL_WITH_USERINFO.search(value))))


def _is_loopback(host: str) -> bool:
    """A literal loopback address, or exactly `localhost`: not `localhost.`, `x.localhost` or `127.0.0.1.`, names
    a resolver may send to DNS, whose answer would then decide where the command and the token go in clear."""
    host = host.lower()
    if host in _LOOPBACK_NAMES:
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def check_address(address: str) -> str:
    """A job server address as requests go to it: `https://<host>[:port]`, or `http://` to a loopback host
    (127.0.0.0/8, ::1, localhost) only; an address without a scheme is taken as http only where its host is a
    loopback one. No user:password@, query or fragment. ValueError naming the address otherwise."""
    if not isinstance(address, str) or not address.strip():
        raise ValueError(f"Ray job server address {address!r}: empty; give https://<head>:8265")
    raw = address.strip().rstrip("/")
    url = raw if "://" in raw else "http://" + raw
    try:
        parts = urlsplit(url)
        host, _ = parts.hostname, parts.port   # .port raises ValueError on a bad port
    except ValueError as e:
        raise ValueError(f"Ray job server address {address!r}: not a URL ({e})") from None
    if parts.scheme not in ("http", "https") or not host:
        raise ValueError(f"Ray job server address {address!r}: must be https://<host>[:port] (or http:// to a "
                         f"loopback host), not {parts.scheme}://")
    if parts.username is not None or parts.password is not None or parts.query or parts.fragment:
        raise ValueError(f"Ray job server address {address!r}: no user:password@, query or fragment (a token goes "
                         f"in ${TOKEN_ENV})")
    if parts.scheme == "http" and not _is_loopback(host):
        if "://" not in raw:
            raise ValueError(f"Ray job server address {address!r} has no scheme and {host} is not a loopback host: "
                             f"write https://{raw} (requests would otherwise go in clear over the network)")
        raise ValueError(f"Ray job server address {address!r}: plain http to {host}, which is not a loopback host; "
                         f"use https (e.g. behind a TLS proxy), or an SSH tunnel to http://127.0.0.1:<port>: the job's "
                         f"command, environment and token would go in clear over the network")
    return url


def auth_token(env: dict[str, str] | None = None) -> tuple[str | None, str]:
    """(token, where it came from) as Ray's clients find it: ${TOKEN_ENV}, else the file ${TOKEN_PATH_ENV} names,
    else ~/.ray/auth_token if it exists; (None, "") if none. ValueError naming the place if it is set but empty or
    unreadable."""
    env = os.environ if env is None else env
    if env.get(TOKEN_ENV) is not None:
        token = env[TOKEN_ENV].strip()
        if not token:
            raise ValueError(f"${TOKEN_ENV} is set but empty: {HOW_TO_PASS_TOKEN}")
        return token, f"${TOKEN_ENV}"
    if env.get(TOKEN_PATH_ENV):
        path, where = Path(env[TOKEN_PATH_ENV]).expanduser(), f"${TOKEN_PATH_ENV} ({env[TOKEN_PATH_ENV]})"
    else:
        path, where = DEFAULT_TOKEN_PATH.expanduser(), str(DEFAULT_TOKEN_PATH)
        if not path.is_file():
            return None, ""
    try:
        token = path.read_text(encoding="utf-8").strip()
    except (OSError, UnicodeDecodeError) as e:
        raise ValueError(f"cannot read the Ray token file {path} named by {where}: {e}") from None
    if not token:
        raise ValueError(f"the Ray token file {path} ({where}) is empty: {HOW_TO_PASS_TOKEN}")
    return token, where


def submission_id(prefix: str, *parts: Any) -> str:
    """`<prefix>-<16 hex>`: the same prefix and parts (JSON-encoded) always give the same id. The prefix is cut to
    the characters Ray's dashboard and file names take well."""
    digest = hashlib.sha256(json.dumps(parts, sort_keys=True, default=str).encode()).hexdigest()[:16]
    return f"{re.sub(r'[^A-Za-z0-9_.-]+', '-', prefix).strip('-')[:80]}-{digest}"


def _first_line(text: str) -> str:
    lines = [ln.strip() for ln in text.strip().splitlines() if ln.strip()]
    return lines[-1] if lines and lines[0].startswith("Traceback") else (lines[0] if lines else "no details")


class RayJobs:
    """A client for one cluster's job server, e.g. `RayJobs("http://127.0.0.1:8265")` or
    `RayJobs("https://head.example:8265")` (`check_address`). `token`: Ray's authentication token; default: as Ray's
    clients find it (`auth_token`). RayJobError naming the address or the token's place if either is refused."""

    def __init__(self, address: str, timeout_s: float = 30.0, token: str | None = None) -> None:
        try:
            self.address = check_address(address)
            self.token_from = "the token argument" if token else ""
            if not token:
                token, self.token_from = auth_token()
        except ValueError as e:
            raise RayJobError(str(e)) from None
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        self._http = httpx.Client(base_url=self.address, timeout=timeout_s, headers=headers)

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> RayJobs:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _call(self, method: str, path: str, *, missing_ok: bool = False, **kw) -> httpx.Response | None:
        try:
            resp = self._http.request(method, path, **kw)
        except httpx.TransportError as e:
            raise RayUnreachable(f"no Ray job server answers at {self.address} ({type(e).__name__}: {e}): is the "
                                 f"cluster up, and is this its dashboard address (`ray start --head "
                                 f"--dashboard-port`, default 8265)?") from None
        if resp.status_code == 404 and missing_ok:
            return None
        if resp.status_code in (401, 403):
            sent = (f"the token from {self.token_from} was refused: it is not this cluster's" if self.token_from
                    else "no token was sent")
            raise RayJobError(f"the Ray job server at {self.address} refused {method} {path} ({resp.status_code}: "
                              f"{_first_line(resp.text)}): it requires Ray's token authentication and {sent}; "
                              f"{HOW_TO_PASS_TOKEN}")
        if resp.status_code >= 400:
            raise RayJobError(f"the Ray job server at {self.address} answered {method} {path} with "
                              f"{resp.status_code}: {_first_line(resp.text)}")
        return resp

    def version(self) -> dict:
        """{"version": Jobs API version, "ray_version": ..., ...}: also a cheap check that the server is there."""
        return self._call("GET", "/api/version").json()

    def info(self, sid: str) -> dict | None:
        """The job's details (status, message, entrypoint, metadata, ...), or None if the server has no such job."""
        resp = self._call("GET", f"/api/jobs/{sid}", missing_ok=True)
        return None if resp is None else resp.json()

    def list(self) -> list[dict]:
        return self._call("GET", "/api/jobs/").json()

    def logs(self, sid: str) -> str:
        return self._call("GET", f"/api/jobs/{sid}/logs").json()["logs"]

    def submit(self, entrypoint: str, *, runtime_env: dict | None = None, submission_id: str | None = None,
               metadata: dict[str, str] | None = None, entrypoint_num_cpus: float | None = None) -> str:
        """Submit `entrypoint` (a shell command); returns the submission id. Does not wait. `entrypoint_num_cpus`:
        CPUs Ray reserves for the command (it waits PENDING until a node has them; by default it reserves none and
        runs on the head node)."""
        secrets = sorted(k for k, v in ((runtime_env or {}).get("env_vars") or {}).items() if is_secret_env(k, str(v)))
        if secrets:  # Ray stores a job's runtime env on the cluster and shows it on the dashboard
            raise RayJobError(f"not submitting {submission_id or 'a job'} to {self.address}: its runtime_env.env_vars "
                              f"hold {', '.join(secrets)}, which look like credentials (Ray stores and shows a job's "
                              f"runtime env); the cluster's nodes must have them of their own")
        body = {"entrypoint": entrypoint, "runtime_env": runtime_env or {}, "metadata": metadata or {}}
        if submission_id:
            body["submission_id"] = submission_id
        if entrypoint_num_cpus is not None:
            body["entrypoint_num_cpus"] = entrypoint_num_cpus
        return self._call("POST", "/api/jobs/", json=body).json()["submission_id"]

    def stop(self, sid: str) -> bool:
        return bool(self._call("POST", f"/api/jobs/{sid}/stop").json().get("stopped"))

    def wait(self, sid: str, *, log: Callable[[str], None] = print, poll_s: float = 0.5,
             max_poll_s: float = 5.0) -> JobResult:
        """Follow a job to its end: status changes and new log lines go to `log` as they come. Returns its result
        if it SUCCEEDED; RayJobFailed (status message + log tail) if it ended FAILED or STOPPED."""
        status, shown, delay = None, 0, poll_s
        while True:
            info = self.info(sid)
            if info is None:
                raise RayJobError(f"Ray job {sid} vanished from {self.address} while being waited on")
            logs = self.logs(sid)
            if len(logs) > shown:  # the server returns the whole log each time; show what is new
                for line in logs[shown:].splitlines():
                    if line.strip():
                        log(line)
                shown = len(logs)
            if info["status"] != status:
                status = info["status"]
                log(f"Ray job {sid}: {status}")
            if status in TERMINAL:
                break
            time.sleep(delay)
            delay = min(delay * 1.5, max_poll_s)  # long trainings: fewer whole-log fetches
        if status != "SUCCEEDED":
            raise RayJobFailed(self.address, sid, status, info.get("message") or "", logs)
        return JobResult(sid, status, logs, reused=False)

    def latest_attempt(self, base: str) -> tuple[str, dict | None, int]:
        """(id, details, n) of the last attempt the server knows of job `base` (`base`, `base-2`, ...);
        (base, None, 0) if none."""
        sid, info, n = base, self.info(base), 1
        if info is None:
            return base, None, 0
        while (later := self.info(f"{base}-{n + 1}")) is not None:
            sid, info, n = f"{base}-{n + 1}", later, n + 1
        return sid, info, n

    def run_job(self, entrypoint: str, *, submission_id: str, runtime_env: dict | None = None,
                metadata: dict[str, str] | None = None, entrypoint_num_cpus: float | None = None,
                log: Callable[[str], None] = print, rerun_reason: str | None = None) -> JobResult:
        """Run `entrypoint` as job `submission_id` and wait for it, without running it twice: if an attempt of it
        SUCCEEDED it is reused (unless `rerun_reason` says why it must run again), one PENDING/RUNNING is waited on,
        after one FAILED/STOPPED the command is submitted again as the next attempt (`<id>-<n>`)."""
        sid, info, n = self.latest_attempt(submission_id)
        if info is not None and info["status"] == "SUCCEEDED" and not rerun_reason:
            log(f"Ray job {sid} already SUCCEEDED on {self.address}: not run again")
            return JobResult(sid, "SUCCEEDED", self.logs(sid), reused=True)
        if info is not None and info["status"] not in TERMINAL:
            log(f"Ray job {sid} is already {info['status']} on {self.address}: waiting on it")
            return self.wait(sid, log=log)
        if info is not None:
            why = f" ({rerun_reason})" if info["status"] == "SUCCEEDED" else ""
            log(f"Ray job {sid} ended {info['status']} before{why}: submitting it again as {submission_id}-{n + 1}")
            sid = f"{submission_id}-{n + 1}"
        try:
            self.submit(entrypoint, runtime_env=runtime_env, submission_id=sid, metadata=metadata,
                        entrypoint_num_cpus=entrypoint_num_cpus)
            log(f"Ray job {sid} submitted to {self.address}: {entrypoint}")
        except RayJobError:
            if self.info(sid) is None:  # not a concurrent submitter that got there first
                raise
        return self.wait(sid, log=log)
