"""How the flow runs a stage's command: here, as a subprocess in a process group of its own, or as a Ray job with an
allow-listed environment.

Here (`run_command`): `dvc` starts in a new session (`start_new_session=True`), so it, the stage command it runs and
whatever that starts share one process group that the orchestrator's own signals do not reach. When the caller is
cancelled, interrupted or fails while the command runs (an exception in the task thread, or `stop_all_groups` from
the flow's main thread on SIGINT/SIGTERM), the whole group is stopped (`stop_process_group`): SIGINT (DVC ignores
it while its command runs and lets the command end; a Python stage gets KeyboardInterrupt), SIGTERM after
`STOP_GRACE_INT_S`, SIGKILL after `STOP_GRACE_TERM_S` more. So a cancelled stage never runs on, nor writes its outs
after DVC's lock is free, where a rerun could overlap it.

As a Ray job (`repro_on_ray`): the job's runtime env is stored on the cluster and shown on its dashboard, so it
carries an allow-list of this process's variables (`ray_job_env`) and never a credential
(`ragteam.ray_jobs.is_secret_env`), whatever prefix it has.
"""
from __future__ import annotations

import os
import shlex
import signal
import subprocess
import sys
import threading
import time
from collections import deque
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from ragteam.orchestration_env import subprocess_env
from ragteam.ray_jobs import TERMINAL, RayJobError, RayJobs, is_secret_env, submission_id

# Grace periods of `stop_process_group`: after SIGINT, how long the group has to exit (a stage's KeyboardInterrupt,
# DVC's cleanup) before SIGTERM; after SIGTERM, how long before SIGKILL. Small: a cancelled flow should end within
# seconds (a Prefect worker SIGKILLs the flow run itself after its own grace, 30 s by default).
STOP_GRACE_INT_S = 5.0
STOP_GRACE_TERM_S = 3.0
_POLL_S = 0.05


class StageFailed(RuntimeError):
    """A stage's dvc command exited non-zero; the message names the stage and ends with the output tail."""


class Cancelled(StageFailed):
    """The flow run is being cancelled: no stage command starts any more (a task's retry included)."""


# ---------------------------------------------------------------- process groups

_live: dict[int, subprocess.Popen] = {}   # process group id -> its leader, while `run_command` runs it
_live_ray: set[tuple[str, str]] = set()   # (address, submission id) of the Ray jobs `repro_on_ray` waits on
_live_lock = threading.Lock()
_cancelled = threading.Event()            # set by `stages_stopped_on_exit` when its run ends by an exception


def _refuse_if_cancelled(what: str) -> None:
    if _cancelled.is_set():
        raise Cancelled(f"not starting {what}: the flow run was cancelled or interrupted")


def live_groups() -> list[int]:
    """The process groups `run_command` is running now."""
    with _live_lock:
        return sorted(_live)


def _group_alive(pgid: int) -> bool:
    """Whether a process of group `pgid` still runs (zombies not counted: a reaped-later grandchild is done)."""
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    for stat in Path("/proc").glob("[0-9]*/stat"):  # zombies still answer kill(0): look closer where /proc is
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[2]) == pgid and fields[0] != "Z":
            return True
    return not Path("/proc/self/stat").exists()


def _wait_group(proc: subprocess.Popen, pgid: int, seconds: float) -> bool:
    """Reap the leader and wait up to `seconds` for the group to empty; True if it did."""
    deadline = time.monotonic() + seconds
    while True:
        proc.poll()
        if not _group_alive(pgid):
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(_POLL_S)


def stop_process_group(proc: subprocess.Popen, grace_int_s: float = STOP_GRACE_INT_S,
                       grace_term_s: float = STOP_GRACE_TERM_S) -> list[str]:
    """Stop the process group `proc` leads (it was started with `start_new_session=True`): SIGINT, then SIGTERM
    after `grace_int_s`, then SIGKILL after `grace_term_s`, each only while a process of the group is left.
    Returns the signals sent (empty: the group had already ended). The leader is reaped."""
    pgid, sent = proc.pid, []
    for sig, grace in ((signal.SIGINT, grace_int_s), (signal.SIGTERM, grace_term_s), (signal.SIGKILL, 5.0)):
        proc.poll()
        if not _group_alive(pgid):
            break
        try:
            os.killpg(pgid, sig)
        except (ProcessLookupError, PermissionError):  # gone, or (pgid reused) not ours to signal
            break
        sent.append(sig.name)
        if _wait_group(proc, pgid, grace):
            break
    try:
        proc.wait(timeout=5.0)
    except subprocess.TimeoutExpired:  # a leader SIGKILL did not end within 5 s (uninterruptible I/O): leave it
        pass
    return sent


def _stop_ray_job(address: str, base: str, say) -> None:
    try:
        with RayJobs(address) as ray:
            sid, info, _ = ray.latest_attempt(base)
            if info is not None and info["status"] not in TERMINAL:
                ray.stop(sid)
                say(f"stopped Ray job {sid} on {address}")
    except RayJobError as e:
        say(f"could not stop Ray job {base} on {address}: {e}")


def stop_all_groups(log=None) -> None:
    """Stop every group `run_command` is running, and every Ray job `repro_on_ray` waits on (the flow calls this
    when its run is cancelled or interrupted: the task threads that run the commands do not see the main thread's
    KeyboardInterrupt). The groups are stopped side by side, each by `stop_process_group`."""
    say = log or (lambda line: None)
    with _live_lock:
        procs, jobs = list(_live.values()), sorted(_live_ray)
    threads = [threading.Thread(target=stop_process_group, args=(p,), daemon=True) for p in procs]
    threads += [threading.Thread(target=_stop_ray_job, args=(*j, say), daemon=True) for j in jobs]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if procs:
        say(f"stopped {len(procs)} running stage command(s) (process groups {', '.join(str(p.pid) for p in procs)})")


def _interrupt(signum, _frame):
    raise KeyboardInterrupt(f"{signal.Signals(signum).name}")


@contextmanager
def stages_stopped_on_exit(log=None) -> Iterator[None]:
    """Run stages inside: if the block ends by an exception (KeyboardInterrupt from SIGINT, Prefect's
    TerminationSignal on a cancel's SIGTERM, an error), no stage command starts any more (`Cancelled`) and every
    running one is stopped (`stop_all_groups`) before the exception goes on. SIGHUP (a closed terminal or SSH
    session) and SIGQUIT end the block as SIGINT does: their default would end this process at once and leave the
    stages, which run in sessions of their own, running. (A SIGKILL leaves no chance: each group's watchdog stops
    it then, `_start_watchdog`.)"""
    with _live_lock:
        _cancelled.clear()
    previous = {}
    if threading.current_thread() is threading.main_thread():
        for sig in (signal.SIGHUP, signal.SIGQUIT):
            previous[sig] = signal.signal(sig, _interrupt)
    try:
        yield
    except BaseException:
        with _live_lock:
            _cancelled.set()
        stop_all_groups(log)
        raise
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


# A process per running group, in a session of its own, that outlives this one: when this process is gone (killed
# with SIGKILL, which no handler sees) it stops the group as `stop_process_group` would; it exits with the group.
_WATCHDOG = """\
import os, signal, sys, time
parent, pgid, grace_int, grace_term = int(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3]), float(sys.argv[4])
def alive(pg):
    try:
        os.killpg(pg, 0)
        return True
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
while alive(pgid):
    if os.getppid() != parent:      # the orchestrator is gone: this process was handed to init
        for sig, grace in ((signal.SIGINT, grace_int), (signal.SIGTERM, grace_term), (signal.SIGKILL, 0)):
            try:
                os.killpg(pgid, sig)
            except ProcessLookupError:
                break
            end = time.monotonic() + grace
            while alive(pgid) and time.monotonic() < end:
                time.sleep(0.1)
        break
    time.sleep(0.5)
"""


def _start_watchdog(pgid: int) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", _WATCHDOG, str(os.getpid()), str(pgid), str(STOP_GRACE_INT_S),
                             str(STOP_GRACE_TERM_S)], stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, start_new_session=True)


def run_command(args: list[str], root: Path, log=None) -> tuple[int, str]:
    """Run a command in `root`, in a process group of its own, streaming its output to `log`; return (exit code,
    last 40 lines). If this is interrupted or fails before the command ends (the task was cancelled), the whole
    group is stopped (`stop_process_group`) before the exception goes on."""
    tail: deque[str] = deque(maxlen=40)
    with _live_lock:  # refused, or started and registered, before `stop_all_groups` can look: none slips through
        _refuse_if_cancelled(f"`{shlex.join(args)}`")
        proc = subprocess.Popen(args, cwd=root, env=subprocess_env(), stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, text=True, start_new_session=True)
        _live[proc.pid] = proc
    watchdog = _start_watchdog(proc.pid)
    try:
        assert proc.stdout is not None
        for line in proc.stdout:
            line = line.rstrip()
            tail.append(line)
            if log and line:
                log.info(line)
        rc = proc.wait()
        if _group_alive(proc.pid):  # the command exited, leaving processes behind: they must not run on either
            stop_process_group(proc)
        return rc, "\n".join(tail)
    finally:
        if proc.poll() is None or _group_alive(proc.pid):
            stop_process_group(proc)
        if proc.stdout is not None:
            proc.stdout.close()
        with _live_lock:
            _live.pop(proc.pid, None)
        try:   # it exits by itself within half a second of the group; do not leave a zombie
            watchdog.wait(timeout=2.0)
        except subprocess.TimeoutExpired:
            watchdog.kill()
            watchdog.wait()


# ---------------------------------------------------------------- dvc


def dvc_command(*args: str) -> list[str]:
    """`dvc --wait-for-lock <args>` with this interpreter."""
    return [sys.executable, "-m", "dvc", "--wait-for-lock", *args]


def dvc(root: Path, *args: str, log=None) -> None:
    """Run `dvc_command(*args)` in `root`; StageFailed on a non-zero exit."""
    rc, tail = run_command(dvc_command(*args), root, log)
    if rc != 0:
        raise StageFailed(f"`dvc {' '.join(args)}` exited {rc} in {root}:\n{tail}")


def repro_args(name: str, force: bool) -> list[str]:
    """The dvc arguments that run one stage, here (`repro`) or as a Ray job (`repro_on_ray`)."""
    return ["repro", "--single-item", *(["--force"] if force else []), name]


def repro(root: Path, name: str, force: bool, log=None) -> None:
    try:
        dvc(root, *repro_args(name, force), log=log)
    except StageFailed as e:
        raise StageFailed(f"stage '{name}' failed: {e}") from None


# ---------------------------------------------------------------- Ray jobs

# What a Ray job gets of this process's environment: enough to run the stage as `repro` would (its PATH, the
# project's settings), not the rest: a job's runtime env is stored on the cluster and shown on its dashboard.
# Allowed: these names, and names with these prefixes, unless `ragteam.ray_jobs.is_secret_env` (a *_TOKEN, *_KEY,
# *_SECRET, *_PASSWORD, credentials, cloud accounts' variables: HF_TOKEN, DVC_STUDIO_TOKEN, AWS_*...), which never go.
RAY_JOB_ENV_NAMES = ("PATH", "PYTHONUNBUFFERED", "LANG", "LC_ALL", "TZ", "TOKENIZERS_PARALLELISM", "MKL_NUM_THREADS",
                     "TRANSFORMERS_OFFLINE")
RAY_JOB_ENV_PREFIXES = ("RAGTEAM_", "DVC_", "HF_", "VLLM_", "OMP_")


def ray_job_env(env: dict[str, str] | None = None) -> dict[str, str]:
    """The allow-listed part of `env` (default: what `repro` would give the stage, `subprocess_env`)."""
    env = subprocess_env() if env is None else env
    keep = {k: v for k, v in env.items()
            if (k in RAY_JOB_ENV_NAMES or k.startswith(RAY_JOB_ENV_PREFIXES)) and not is_secret_env(k, v)}
    return {**keep, "PYTHONUNBUFFERED": "1"}


def repro_on_ray(root: Path, name: str, force: bool, address: str, run_key: str, cpus: float, log=None) -> str:
    """Run the stage's `dvc repro --single-item` as a Ray job at `address`, in `root` (a path the cluster shares),
    reserving `cpus`; wait for it, its log going to `log`. Returns the job's submission id: derived from the
    stage, command and `run_key` (the flow run), so a task retry after a failed job submits its next attempt
    (`<id>-2`) and never runs a second copy of one still running. StageFailed, naming the stage, if it fails."""
    entrypoint = f"cd {shlex.quote(str(root))} && {shlex.join(dvc_command(*repro_args(name, force)))}"
    sid = submission_id(f"ragteam-{name}", str(root), entrypoint, run_key)
    say = log.info if log else print
    with _live_lock:
        _refuse_if_cancelled(f"stage '{name}' as a Ray job")
        _live_ray.add((address, sid))
    try:
        with RayJobs(address) as ray:
            return ray.run_job(entrypoint, submission_id=sid, runtime_env={"env_vars": ray_job_env()},
                               metadata={"ragteam_stage": name, "ragteam_run": run_key}, entrypoint_num_cpus=cpus,
                               log=say).submission_id
    except RayJobError as e:
        raise StageFailed(f"stage '{name}' failed as a Ray job: {e}") from None
    finally:
        with _live_lock:
            _live_ray.discard((address, sid))


__all__ = ["STOP_GRACE_INT_S", "STOP_GRACE_TERM_S", "StageFailed", "Cancelled", "live_groups",
           "stop_process_group", "stop_all_groups", "stages_stopped_on_exit", "run_command", "dvc_command", "dvc",
           "repro_args", "repro", "RAY_JOB_ENV_NAMES", "RAY_JOB_ENV_PREFIXES", "ray_job_env", "repro_on_ray"]
