"""Cancelling the pipeline stops its stages: SIGINT or SIGTERM to a running `ragteam flow run` (what Ctrl-C or a
Prefect cancel sends the orchestrator) must leave no stage process running and no output written after the flow
has stopped (issue 71, finding 4: the stage ran on and wrote its out after DVC's lock was free).

Each stage command runs in its own process group (`flows.subprocesses.run_command`); on cancel, interrupt or error
the whole group gets SIGINT, then SIGTERM, then SIGKILL (`stop_process_group`)."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from test_flow import make_repo, prefect_section

from flows import subprocesses as sp

SLOW_S = 12  # how long the stage sleeps before writing its output (long after the test has cancelled it)

# slow.py: records its pid and process group, sleeps, then writes its out: a stage that would write "later"
SLOW_PY = """\
import os, pathlib, sys, time
pathlib.Path("log").mkdir(exist_ok=True)
with open("log/slow.runs", "a") as f:
    f.write(f"{os.getpid()}\\n")
pathlib.Path("log/slow.pid.tmp").write_text(f"{os.getpid()} {os.getpgid(0)} {time.time()}")
os.replace("log/slow.pid.tmp", "log/slow.pid")
time.sleep(float(sys.argv[1]))
pathlib.Path("out").mkdir(exist_ok=True); pathlib.Path("out/slow.txt").write_text("written after the cancel")
"""

SLOW_DVC = f"""\
stages:
  slow:
    cmd: python slow.py {SLOW_S}
    deps: [slow.py]
    outs: [out/slow.txt]
"""


def alive(pid: int) -> bool:
    """The process exists and is not a zombie."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def group_members(pgid: int) -> list[int]:
    """Live (non-zombie) processes whose process group is `pgid`."""
    out = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            fields = (proc / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if fields[0] != "Z" and int(fields[2]) == pgid:
            out.append(int(proc.name))
    return out


@pytest.mark.slow
@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGKILL],
                         ids=["SIGINT", "SIGTERM", "SIGHUP", "SIGKILL"])
def test_a_cancelled_flow_stops_the_stage_and_its_output_never_appears(tmp_path, sig):
    """SIGINT (Ctrl-C, `kill -INT`), SIGTERM (what a Prefect worker sends a flow run it cancels: Prefect's engine
    turns it into TerminationSignal), SIGHUP (a closed terminal) or SIGKILL (no handler runs: the watchdog acts) to
    a running `ragteam flow run` whose stage sleeps, then writes its out."""
    repo = make_repo(tmp_path / "toy", SLOW_DVC, {"slow.py": SLOW_PY}, {"prefect": prefect_section(retries=2)})
    env = {k: v for k, v in os.environ.items() if not k.startswith("PREFECT_API")}
    env.update(PREFECT_HOME=str(tmp_path / "prefect-home"), RAGTEAM_RESULT_STORAGE=str(tmp_path / "results"),
               DVC_NO_ANALYTICS="1")
    ragteam = Path(sys.executable).parent / "ragteam"
    log = (tmp_path / "flow.log").open("w")
    # its own session: the signal below reaches the orchestrator alone, as `kill -INT <pid>` or a Prefect cancel does
    orch = subprocess.Popen([str(ragteam), "flow", "run"], cwd=repo, env=env, stdout=log, stderr=subprocess.STDOUT,
                            start_new_session=True, preexec_fn=_default_signals)
    pid_file = repo / "log/slow.pid"
    stage_pid = stage_pgid = None
    try:
        deadline = time.monotonic() + 90
        while not pid_file.exists():
            assert orch.poll() is None, f"the flow ended first:\n{(tmp_path / 'flow.log').read_text()[-3000:]}"
            assert time.monotonic() < deadline, "the stage did not start within 90 s"
            time.sleep(0.1)
        stage_pid, stage_pgid, started = pid_file.read_text().split()
        stage_pid, stage_pgid, started = int(stage_pid), int(stage_pgid), float(started)
        assert alive(stage_pid)
        assert stage_pgid != os.getpgid(orch.pid)   # the stage runs in a process group of its own

        orch.send_signal(sig)
        t0 = time.monotonic()
        try:
            rc = orch.wait(timeout=SLOW_S)
        except subprocess.TimeoutExpired:
            log_tail = (tmp_path / 'flow.log').read_text()[-3000:]
            pytest.fail(f"the flow still runs {SLOW_S} s after {sig.name}:\n{log_tail}")
        assert rc != 0
        # stopped within the grace periods (plus Prefect's own shutdown), not when the stage would have ended;
        # after a SIGKILL the orchestrator is gone at once and the group's watchdog stops the stage
        while sig == signal.SIGKILL and group_members(stage_pgid) and time.monotonic() - t0 < SLOW_S:
            time.sleep(0.1)
        assert time.monotonic() - t0 < sp.STOP_GRACE_INT_S + sp.STOP_GRACE_TERM_S + 5
        # when the orchestrator has exited, nothing of the stage runs on
        assert not alive(stage_pid), f"stage process {stage_pid} still runs after the flow was cancelled"
        assert group_members(stage_pgid) == [], f"processes of the stage's group {stage_pgid} still run"
        # past the time the stage would have written its output: it never appears, nor does a dvc.lock entry
        time.sleep(max(0.0, started + SLOW_S + 2 - time.time()))
        assert not (repo / "out/slow.txt").exists()
        assert (repo / "log/slow.runs").read_text() == f"{stage_pid}\n"   # the task's retries started no new run
        assert "slow" not in ((repo / "dvc.lock").read_text() if (repo / "dvc.lock").exists() else "")
    finally:
        if orch.poll() is None:
            os.killpg(orch.pid, signal.SIGKILL)
            orch.wait()
        for pgid in {stage_pgid, orch.pid} - {None}:  # whatever the old code left behind
            try:
                os.killpg(pgid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        log.close()


def _default_signals() -> None:
    """Run in the child before exec: SIGINT and SIGHUP back to their defaults. A shell starts a background job with
    SIGINT ignored, and nohup ignores SIGHUP; a child inherits that, so a suite launched that way (`nohup make test &`)
    would test an inherited disposition instead of the code's own handling."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    signal.signal(signal.SIGHUP, signal.SIG_DFL)


def _ignoring(signals: str) -> list[str]:
    """A python process that ignores `signals` (comma-separated names), prints 'ready', then sleeps, and a child
    of its own (same group) that sleeps too."""
    code = (f"import signal, subprocess, sys, time\n"
            f"for s in {signals!r}.split(','):\n"
            f"    s and signal.signal(getattr(signal, s), signal.SIG_IGN)\n"
            f"child = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)'])\n"
            f"print('ready', child.pid, flush=True)\n"
            f"time.sleep(60)\n")
    return [sys.executable, "-c", code]


@pytest.mark.parametrize("ignores, stopped_by", [("", "SIGINT"), ("SIGINT", "SIGTERM"),
                                                 ("SIGINT,SIGTERM", "SIGKILL")])
def test_a_process_group_is_stopped_by_sigint_then_sigterm_then_sigkill(ignores, stopped_by):
    proc = subprocess.Popen(_ignoring(ignores), stdout=subprocess.PIPE, text=True, start_new_session=True,
                            preexec_fn=_default_signals)
    try:
        line = proc.stdout.readline().split()
        assert line[0] == "ready"
        child = int(line[1])
        t0 = time.monotonic()
        sent = sp.stop_process_group(proc, grace_int_s=1.0, grace_term_s=1.0)
        took = time.monotonic() - t0
        assert sent[-1] == stopped_by, sent
        assert not alive(proc.pid) and not alive(child) and group_members(proc.pid) == []
        assert took < {"SIGINT": 1.0, "SIGTERM": 2.0, "SIGKILL": 3.0}[stopped_by]
    finally:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        proc.wait()


def test_run_command_stops_its_group_when_the_caller_is_interrupted(tmp_path):
    """An exception in the thread reading the command's output (here: the log callback raising KeyboardInterrupt,
    as a task's cancellation does) stops the whole group, grandchildren included, before it propagates."""
    pids = tmp_path / "pids"
    code = (f"import os, subprocess, sys, time\n"
            f"c = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)'])\n"
            f"open({str(pids)!r}, 'w').write(f'{{os.getpid()}} {{c.pid}}')\n"
            f"print('started', flush=True); time.sleep(60)\n")

    def log_then_interrupt(line: str) -> None:
        raise KeyboardInterrupt

    class Log:
        info = staticmethod(log_then_interrupt)

    t0 = time.monotonic()
    with pytest.raises(KeyboardInterrupt):
        sp.run_command([sys.executable, "-c", code], tmp_path, Log())
    assert time.monotonic() - t0 < 30
    parent, child = map(int, pids.read_text().split())
    assert not alive(parent) and not alive(child) and group_members(parent) == []
    assert sp.live_groups() == []


def test_after_an_interrupt_no_stage_command_starts(tmp_path):
    """`stages_stopped_on_exit`: a block ended by KeyboardInterrupt stops the groups running and refuses new
    commands (a task's retry after its command was stopped) until the next run enters it again."""
    import threading

    results: list = []
    started = threading.Event()

    class Log:
        @staticmethod
        def info(line: str) -> None:
            started.set()

    def task() -> None:
        try:
            results.append(sp.run_command([sys.executable, "-c", "print('up', flush=True); import time; "
                                           "time.sleep(60)"], tmp_path, Log()))
        except BaseException as e:  # noqa: BLE001
            results.append(e)

    thread = threading.Thread(target=task)
    with pytest.raises(KeyboardInterrupt):
        with sp.stages_stopped_on_exit():
            thread.start()
            assert started.wait(30)
            raise KeyboardInterrupt
    thread.join(30)
    assert not thread.is_alive() and results[0][0] != 0 and sp.live_groups() == []
    with pytest.raises(sp.Cancelled, match="not starting `.*`: the flow run was cancelled or interrupted"):
        sp.run_command(["true"], tmp_path)
    with sp.stages_stopped_on_exit():   # the next run starts commands again
        assert sp.run_command(["true"], tmp_path) == (0, "")
