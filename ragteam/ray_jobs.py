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
"""
from __future__ import annotations

import hashlib
import json
import re
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

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


def submission_id(prefix: str, *parts: Any) -> str:
    """`<prefix>-<16 hex>`: the same prefix and parts (JSON-encoded) always give the same id. The prefix is cut to
    the characters Ray's dashboard and file names take well."""
    digest = hashlib.sha256(json.dumps(parts, sort_keys=True, default=str).encode()).hexdigest()[:16]
    return f"{re.sub(r'[^A-Za-z0-9_.-]+', '-', prefix).strip('-')[:80]}-{digest}"


def _first_line(text: str) -> str:
    lines = [ln.strip() for ln in text.strip().splitlines() if ln.strip()]
    return lines[-1] if lines and lines[0].startswith("Traceback") else (lines[0] if lines else "no details")


class RayJobs:
    """A client for one cluster's job server, e.g. `RayJobs("http://127.0.0.1:8265")`."""

    def __init__(self, address: str, timeout_s: float = 30.0) -> None:
        address = address.strip().rstrip("/")
        if "://" not in address:
            address = "http://" + address
        self.address = address
        self._http = httpx.Client(base_url=address, timeout=timeout_s)

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
            raise RayJobError(f"the Ray job server at {self.address} refused {method} {path} ({resp.status_code}): "
                              f"its token authentication is on (Ray 2.60); start the cluster with "
                              f"RAY_AUTH_MODE=disabled on a trusted network")
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
