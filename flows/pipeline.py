"""The Prefect flow that runs the DVC pipeline: one task per `dvc.yaml` stage, `dvc repro --single-item <stage>`.

The graph comes from dvc.yaml via `ragteam.lineage` (no second copy). A stage is submitted as soon as all its
upstreams have completed, so independent branches run concurrently (DVC releases its repo lock while a stage's
command runs; `--wait-for-lock` queues the short lock/commit phases). A failed stage is retried per
`params.yaml: prefect`; if it still fails, its downstream stages are not run, other branches finish, and the flow
fails naming the stage. Each stage records a Prefect markdown artifact `stage-<name>` (git commit, dep/out md5s
from dvc.lock, locked params, metrics) for people to read; the flow returns the records, and Prefect persists that
return value (JSON) under `params.yaml: prefect.result_storage`.

How many stages run at once: a flow run submits at most `prefect.max_parallel_stages` (null: the cores one LLM
stage leaves room for). On a Prefect server (`PREFECT_API_URL`), every stage that runs on a host also holds a slot
of that host's global concurrency limit (`prefect.concurrency_limit`, `<name>-<host>`), created with that many
slots, so two flow runs, or a flow and a deployment, on one server never together run more stages on a machine than
it has slots.

Remote mode (`remote=True`, used on GPU workers): before the stage runs, `dvc pull` the deps that upstream stages
produced; after it, `dvc push` its outs. With `prefect.gpu_mode: deployment` the orchestrating flow sends GPU
stages to the `gpu` deployment instead of running them: it pushes their deps, ships the small git-tracked files
the worker needs (dvc.lock, params files, uncached upstream outs) and its own commit (`git_commit`: the worker checks
it out, detached, whatever its branch head is; uncommitted changes to tracked code are refused first, since the worker
could not see them), waits, reads the worker's record from the run's persisted result (the result storage both
share), then adopts the worker's dvc.lock entry and uncached outs and `dvc pull`s the stage's outs.

Ray mode (`prefect.ray_address` or `ragteam flow run --ray-address URL`): each stage that would run here runs its
same `dvc repro --single-item` command as a Ray job on that cluster instead (`ragteam.ray_jobs`, the Jobs REST API),
so Ray schedules the stages on the cluster's nodes (each job reserves `llm.threads` CPUs; Ray queues the rest) and
this flow only waits: the job's log goes to the task's log, a failed job fails the task and the flow, naming the
stage. The cluster must share this checkout's filesystem at the same path (the job `cd`s into it, runs this
interpreter, and writes the outs and dvc.lock there); without a shared filesystem use the GPU work pool
(`gpu_mode: deployment`), which moves data through the DVC remote. A job gets an allow-list of this process's
environment, never a credential; the address must be https or a loopback host; Ray's token is sent if set
(`flows.subprocesses.ray_job_env`, `ragteam.ray_jobs.check_address`, `auth_token`).

Cancelling: each stage command runs in a process group of its own; when the run is interrupted or cancelled
(SIGINT, a Prefect cancel's SIGTERM) or fails, every running group gets SIGINT, then SIGTERM, then SIGKILL, running
Ray jobs are stopped, and no stage starts after (`flows.subprocesses.stages_stopped_on_exit`).
"""
from __future__ import annotations

import json
import os
import re
import socket
import sys
import time
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any, Literal

PROJECT = Path(__file__).resolve().parents[1]
if str(PROJECT) not in sys.path:  # a deployment loads this file by path: use the ragteam of this checkout
    sys.path.insert(0, str(PROJECT))

from pydantic import Field, field_validator  # noqa: E402

from ragteam.orchestration_env import configure_prefect_env  # noqa: E402

configure_prefect_env(PROJECT)  # before prefect is imported: PREFECT_HOME in the project, analytics off

from prefect import flow, get_run_logger, task  # noqa: E402
from prefect.artifacts import create_markdown_artifact  # noqa: E402
from prefect.cache_policies import NO_CACHE  # noqa: E402
from prefect.futures import as_completed  # noqa: E402

from flows.subprocesses import StageFailed, dvc, repro, repro_on_ray, stages_stopped_on_exit  # noqa: E402, F401
from flows.remote import (CommitUnavailable, FileBody, UncommittedChanges, checkout_commit,  # noqa: E402, F401
                          dispatch_to_deployment, locked_stage_record, orchestrator_commit, pull_targets,
                          run_stage_remote, sendable_files, submit_to_deployment, upstream_uncached_outs, write_files)
from flows.storage import (DEFAULT_RESULT_STORAGE, RESULT_STORAGE_ENV, Storage,  # noqa: E402, F401
                           check_result_storage, is_url, result_storage_for, save_storage_block, storage_block)
from ragteam import lineage as lin  # noqa: E402
from ragteam.config import ParamsError, Strict, load_params, parse_section  # noqa: E402
from ragteam.ray_jobs import RayJobError, RayJobs, check_address  # noqa: E402, F401  (RayJobError: re-exported)

FLOW_NAME = "ragteam-pipeline"
DEFAULT_CONCURRENCY_LIMIT = "ragteam-stages"  # prefect.concurrency_limit


class PrefectParams(Strict):
    retries: int = Field(ge=0)
    retry_delay_s: float = Field(ge=0)
    gpu_stages: list[str]
    gpu_mode: Literal["local", "deployment"]
    gpu_deployment: str = Field(pattern=r"^[^/]+/[^/]+$")  # "<flow name>/<deployment name>"
    max_parallel_stages: int | None = Field(default=None, ge=1)  # None: auto (`parallel_stages`)
    # the Prefect global concurrency limits (one per host: `host_limit`) that every stage run on a host takes a slot
    # of (`stage_slot`), so flow runs and deployments on one Prefect server share a machine's room; None: each flow
    # run's own cap only
    concurrency_limit: str | None = Field(default=DEFAULT_CONCURRENCY_LIMIT, min_length=1, pattern=r"^[A-Za-z0-9_.-]+$")
    # where Prefect persists flow results: a directory (relative to the project root, or absolute), which GPU
    # workers on other hosts must mount at the same path, or an s3://<bucket>[/<prefix>] URL both sides can reach
    result_storage: str = DEFAULT_RESULT_STORAGE
    # a Ray cluster's job server (https://<head>:8265, or http:// to a loopback host only: `check_address`):
    # stages that would run here run there as Ray jobs; the cluster must share this checkout's filesystem. None: off
    ray_address: str | None = None

    @field_validator("result_storage")
    @classmethod
    def _a_directory_path(cls, v: str) -> str:
        return check_result_storage(v)

    @field_validator("ray_address")
    @classmethod
    def _a_safe_address(cls, v: str | None) -> str | None:
        return None if v is None else check_address(v)


def parallel_stages(cfg: PrefectParams, params: dict, cpus: int | None = None) -> int:
    """How many stages the flow runs at once: `prefect.max_parallel_stages`, or, when null, as many as the machine
    has room for: its cores divided by the cores one LLM stage uses (`llm.threads`), at least 1. Independent
    branches of the DAG (the four joint systems, the indexes) would otherwise all start together and share two
    cores six ways."""
    if cfg.max_parallel_stages is not None:
        return cfg.max_parallel_stages
    cpus = cpus or os.cpu_count() or 1
    threads = (params.get("llm") or {}).get("threads") or 1
    return max(1, cpus // max(1, int(threads)))


def host_limit(prefix: str | None, host: str | None = None) -> str | None:
    """The name of this host's concurrency limit: `<prefix>-<host name>` (a GPU worker's stages count against its
    own machine, not the orchestrator's). None: no limit."""
    if prefix is None:
        return None
    host = re.sub(r"[^A-Za-z0-9_.-]+", "-", host or socket.gethostname()).strip("-") or "host"
    return f"{prefix}-{host}"


def server_url() -> str | None:
    """The Prefect server this process talks to (`PREFECT_API_URL`), or None for the ephemeral API a plain
    `ragteam flow run` starts for itself."""
    from prefect.settings import get_current_settings

    return get_current_settings().api.url or None


def ensure_concurrency_limit(name: str, cap: int, explicit: bool) -> tuple[int, bool]:
    """Make the Prefect global concurrency limit `name` exist; return its slots and whether it is active. A new
    limit gets `cap` slots. An existing one keeps what an operator made of it (`prefect gcl update --limit N`,
    `prefect gcl disable`) unless the run asks for a cap of its own (`explicit`: `prefect.max_parallel_stages` is
    set), which then replaces its slots and enables it. Two flow runs starting at once may both find it missing: the
    second one's create is refused, and it reads the first one's limit."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.actions import GlobalConcurrencyLimitCreate, GlobalConcurrencyLimitUpdate
    from prefect.exceptions import ObjectAlreadyExists, ObjectNotFound

    with get_client(sync_client=True) as client:
        try:
            limit = client.read_global_concurrency_limit_by_name(name)
        except ObjectNotFound:
            try:
                client.create_global_concurrency_limit(GlobalConcurrencyLimitCreate(name=name, limit=cap, active=True))
                return cap, True
            except ObjectAlreadyExists:
                limit = client.read_global_concurrency_limit_by_name(name)
        if explicit and (limit.limit != cap or not limit.active):
            client.update_global_concurrency_limit(name, GlobalConcurrencyLimitUpdate(limit=cap, active=True))
            return cap, True
        return limit.limit, limit.active


SLOT_WAIT_LOG_S = 60.0   # how often a stage waiting for a slot says so


@contextmanager
def stage_slot(name: str | None, stage: str, log=None, wait_log_s: float = SLOT_WAIT_LOG_S):
    """Hold one slot of the global concurrency limit `name` while `stage` runs here (None: no limit). While other
    flow runs or deployments on the same Prefect server hold every slot, the stage waits, saying so every
    `wait_log_s` with the command that shows who holds them. A lease renewal that fails (the server restarting)
    does not cancel a running stage; whether the slot is then freed is the server's business (a server running its
    services revokes lapsed leases; one restarted with in-memory leases keeps the slot counted: docs/prefect.md)."""
    if name is None:
        yield
        return
    from prefect.concurrency.sync import concurrency

    say = log.info if log else print
    waited = 0.0
    with ExitStack() as stack:
        while True:
            try:
                stack.enter_context(concurrency(name, occupy=1, timeout_seconds=wait_log_s, strict=True,
                                                raise_on_lease_renewal_failure=False))
                break
            except TimeoutError:
                waited += wait_log_s
                say(f"stage '{stage}' has waited {waited:.0f} s for a slot of Prefect's concurrency limit "
                    f"'{name}': other runs hold them all (`prefect gcl inspect {name}`)")
        yield


class PipelineFailed(RuntimeError):
    """One or more stages failed; the message names them and the stages left unrun."""


def load_prefect_params(root: Path, stages: dict[str, lin.Stage]) -> PrefectParams:
    cfg = parse_section(load_params(root / "params.yaml"), "prefect", PrefectParams, str(root / "params.yaml"))
    unknown = [s for s in cfg.gpu_stages if s not in stages]
    if unknown:
        raise ParamsError(f"{root / 'params.yaml'}: prefect.gpu_stages: unknown stage(s) {unknown}")
    return cfg


def artifact_key(stage: str) -> str:
    """Prefect artifact keys allow lowercase letters, digits and dashes only."""
    return "stage-" + re.sub(r"[^a-z0-9-]+", "-", stage.lower()).strip("-")


# ---------------------------------------------------------------- the commit a GPU worker runs


# ---------------------------------------------------------------- remote mode (GPU workers)


# ---------------------------------------------------------------- artifacts


def render_record(record: dict) -> str:
    """Markdown for the Prefect UI, ending with the record as JSON (for people: the orchestrator reads records from
    flow results, not from here)."""
    rows = [f"| dep | `{p}` | `{h}` |" for p, h in record["deps"].items()]
    rows += [f"| out | `{p}` | `{h}` |" for p, h in record["outs"].items()]
    for fname, vals in record["params"].items():
        rows += [f"| param | `{fname}:{k}` | `{json.dumps(v)}` |" for k, v in vals.items()]
    for m, v in record["metrics"].items():
        rows += [f"| metrics | `{m}` | `{json.dumps(v)}` |"]
    return "\n".join([
        f"# Stage `{record['stage']}`",
        f"commit `{record['git_commit']}` · cmd `{record['cmd']}`",
        "",
        "| kind | name | md5 / value |",
        "|---|---|---|",
        *rows,
        "",
        "```json",
        json.dumps(record, indent=1, default=str),
        "```",
    ])


# ---------------------------------------------------------------- tasks and the flow


@task(cache_policy=NO_CACHE, task_run_name="{name}")
def run_stage(root: str, stages: dict[str, lin.Stage], name: str, force: bool, mode: str, deployment: str,
              commit: str | None = None, ray_address: str | None = None, ray_cpus: float = 1,
              limit: str | None = None) -> dict:
    """One stage. mode: local (`dvc repro --single-item`), remote (pull deps / repro / push outs), deployment
    (send it, with the orchestrator's `commit`, to the GPU deployment and adopt the result) or ray (the local
    command as a Ray job at `ray_address`, reserving `ray_cpus`; the record names the job: `ray_job`). local and
    remote run on this host, holding a slot of the Prefect concurrency limit `limit` (`stage_slot`); a deployment's
    stage takes its slot on the worker, and Ray schedules its jobs on the cluster's CPUs."""
    log = get_run_logger()
    r = Path(root)
    t0 = time.monotonic()
    if mode == "ray":
        from prefect.runtime import flow_run

        sid = repro_on_ray(r, name, force, ray_address, str(flow_run.id), ray_cpus, log)
        record = {**locked_stage_record(r, name, stages), "ray_job": sid}
    elif mode == "deployment":
        record = dispatch_to_deployment(r, stages, name, force, deployment, commit, log)
    elif mode == "remote":
        with stage_slot(limit, name, log):
            record = run_stage_remote(r, stages, name, force, log)
    else:
        with stage_slot(limit, name, log):
            repro(r, name, force, log)
        record = locked_stage_record(r, name, stages)
    record["seconds"] = round(time.monotonic() - t0, 2)
    create_markdown_artifact(key=artifact_key(name), markdown=render_record(record),
                             description=f"DVC stage {name}: dvc.lock hashes, params, metrics")
    # A stage's markdown reports (e.g. evaluate's reports/eval.md, the MAPS Table 1) become artifacts too: the
    # stage itself runs as a dvc subprocess with no Prefect run context, so the flow publishes them.
    for out in stages[name].outs:
        if out.endswith(".md") and (r / out).is_file():
            create_markdown_artifact(key="report-" + artifact_key(Path(out).stem)[len("stage-"):], markdown=(r / out).read_text(),
                                     description=f"{out} written by stage {name}")
    return record


def ray_address_for(cfg: PrefectParams, ray_address: str | None) -> str | None:
    """The Ray job server the stages go to: `ray_address` (the flow's parameter, `--ray-address`) or
    `prefect.ray_address`, checked (`check_address`: https, or http to a loopback host); ParamsError naming it."""
    if not ray_address:
        return cfg.ray_address
    try:
        return check_address(ray_address)
    except ValueError as e:
        raise ParamsError(f"ray_address (--ray-address): {e}") from None


def stage_modes(stages: dict[str, lin.Stage], cfg: PrefectParams, remote: bool,
                ray_address: str | None = None) -> dict[str, str]:
    ray_address = ray_address_for(cfg, ray_address)

    def mode(n: str) -> str:
        if remote:
            return "remote"
        if cfg.gpu_mode == "deployment" and n in cfg.gpu_stages:
            return "deployment"
        return "ray" if ray_address else "local"

    return {n: mode(n) for n in stages}


def describe_plan(root: str | Path | None = None, targets: list[str] | None = None, upstream: bool = True,
                  remote: bool = False, ray_address: str | None = None) -> list[str]:
    """Human-readable plan: levels of stages that may run concurrently, and where each runs."""
    r = Path(root or PROJECT).resolve()
    stages = lin.load_stages(r)
    graph = lin.build_graph(stages)
    cfg = load_prefect_params(r, stages)
    modes = stage_modes(stages, cfg, remote, ray_address)
    lines = []
    for i, level in enumerate(lin.plan(graph, targets, upstream)):
        for n in level:
            after = f" after {', '.join(graph[n])}" if graph[n] else ""
            lines.append(f"level {i}: {n} [{modes[n]}]{after}")
    return lines


def _import_time_storage() -> Any:  # Prefect writes results there through an unsaved block (`storage_block`)
    try:
        return storage_block(result_storage_for(PROJECT))
    except (ParamsError, ValueError):  # reported, naming the param, when the flow runs (load_prefect_params)
        return PROJECT / DEFAULT_RESULT_STORAGE


@flow(name=FLOW_NAME, log_prints=True, persist_result=True, result_serializer="json",
      result_storage=_import_time_storage())
def pipeline(
    targets: list[str] | None = None,
    force: bool = False,
    dry_run: bool = False,
    remote: bool = False,
    upstream: bool = True,
    root: str | None = None,
    files: dict[str, FileBody] | None = None,
    git_commit: str | None = None,
    ray_address: str | None = None,
) -> dict[str, Any]:
    """Run the dvc.yaml stages (or `targets` and, if `upstream`, their upstreams) as Prefect tasks.

    force: `dvc repro --force` each selected stage. dry_run: return the plan, run nothing. remote: pull deps
    and push outs around each stage (GPU workers). files: small files to write first (sent by the orchestrator):
    only dvc.lock, the targets' params files and upstream uncached outs (`sendable_files`); code, dvc.yaml or any
    other path is refused before anything is written, so the stages run the code of the checked-out commit.
    git_commit (remote runs only; an orchestrator sends its HEAD): check that commit out first (detached), fetching
    it from `origin` if needed; CommitUnavailable if the clone cannot. The return value (plan and stage records) is
    persisted as JSON in `prefect.result_storage` (`result_storage_for`). ray_address: run the stages that would
    run here as Ray jobs on that cluster (overrides `prefect.ray_address`; see the module docstring).
    """
    r = Path(root or PROJECT).resolve()
    result_storage_for(r)   # a bad $RAGTEAM_RESULT_STORAGE or prefect.result_storage fails here, naming it
    if git_commit:
        if not remote:
            raise ValueError("git_commit is for remote runs (remote=True, a GPU worker's fresh clone): it would "
                             f"detach the HEAD of {r}")
        checkout_commit(r, git_commit, get_run_logger())
    stages = lin.load_stages(r)
    if files:
        write_files(r, files, sendable_files(stages, targets), dirs=upstream_uncached_outs(stages, targets))
        stages = lin.load_stages(r)  # params files may have changed templated values
    graph = lin.build_graph(stages)
    cfg = load_prefect_params(r, stages)
    levels = lin.plan(graph, targets, upstream)
    if dry_run:
        plan_lines = describe_plan(r, targets, upstream, remote, ray_address)
        print("\n".join(plan_lines))
        return {"plan": levels}
    modes = stage_modes(stages, cfg, remote, ray_address)
    selected = [n for level in levels for n in level]
    # GPU workers run this checkout's commit: refuse before anything runs if they could not see what runs here
    commit = orchestrator_commit(r, stages) if any(modes[n] == "deployment" for n in selected) else None
    ups = {n: [u for u in graph[n] if u in selected] for n in selected}
    task_ = run_stage.with_options(retries=cfg.retries, retry_delay_seconds=cfg.retry_delay_s)
    params = load_params(r / "params.yaml")
    address = ray_address_for(cfg, ray_address)
    ray_cpus = float((params.get("llm") or {}).get("threads") or 1)
    if any(modes[n] == "ray" for n in selected):
        with RayJobs(address) as ray:  # an unreachable cluster fails here, once, naming its address
            version = ray.version()
        # Ray schedules the jobs on its nodes' CPUs (ray_cpus each, the rest queue): no local cap unless set
        cap = cfg.max_parallel_stages or len(selected)
        print(f"stages run as Ray jobs on {address} (Ray {version.get('ray_version')}), {ray_cpus:g} CPU(s) each; "
              f"at most {cap} at once")
    else:
        cap = parallel_stages(cfg, params)
        print(f"running at most {cap} stage(s) at once (prefect.max_parallel_stages)")
    # on a Prefect server, shared with every flow run and deployment there; the ephemeral API of a plain `ragteam
    # flow run` serves this run alone (its cap above suffices), and it frees no lapsed lease: a run killed while
    # holding a slot would hold it for good
    here = any(modes[n] in ("local", "remote") for n in selected)
    limit = host_limit(cfg.concurrency_limit) if here and server_url() else None
    if limit:
        # a GPU worker (remote) keeps its host's slots: the orchestrator's params.yaml travels with the run
        slots, active = ensure_concurrency_limit(limit, cap, explicit=cfg.max_parallel_stages is not None
                                                 and not remote)
        print(f"stages run here hold a slot of Prefect's global concurrency limit '{limit}' "
              + (f"({slots} slot(s))" if active else "(disabled on the server: it limits nothing)"))

    # cancelled or interrupted (SIGINT, a Prefect cancel's SIGTERM) while stages run: this main thread gets the
    # exception, the task threads running their commands do not; every stage's process group (and Ray job) is
    # stopped before the run ends, and no retry starts one, so none runs on and writes its outs later
    with stages_stopped_on_exit(print):
        done, failed, skipped = _run_stages(task_, str(r), stages, selected, ups, cap, force, modes, cfg, commit,
                                            address, ray_cpus, limit)
    for n, rec in done.items():
        print(f"{n}: done in {rec['seconds']} s ({modes[n]}, commit {rec.get('git_commit')})")
    if failed:
        msg = "; ".join(f"{n}: {e.splitlines()[0]}" for n, e in failed.items())
        raise PipelineFailed(f"stage(s) failed: {msg}" + (f"; not run: {', '.join(skipped)}" if skipped else ""))
    return {"plan": levels, "stages": done}


def _run_stages(task_, root: str, stages: dict[str, lin.Stage], selected: list[str], ups: dict[str, list[str]],
                cap: int, force: bool, modes: dict[str, str], cfg: PrefectParams, commit: str | None,
                address: str | None, ray_cpus: float, limit: str | None
                ) -> tuple[dict[str, dict], dict[str, str], list[str]]:
    """Submit each selected stage once its upstreams are done, at most `cap` at once; (done records, failures,
    stages skipped after a failed upstream)."""
    pending, running, futures = list(selected), {}, {}
    done: dict[str, dict] = {}
    failed: dict[str, str] = {}
    skipped: list[str] = []
    while pending or running:
        for n in list(pending):  # topological order: an upstream is settled before its downstreams are looked at
            if any(u in failed or u in skipped for u in ups[n]):
                skipped.append(n)
                pending.remove(n)
            elif all(u in done for u in ups[n]) and len(running) < cap:
                futures[n] = running[n] = task_.submit(
                    root, stages, n, force, modes[n], cfg.gpu_deployment, commit, address, ray_cpus, limit,
                    wait_for=[futures[u] for u in ups[n]]
                )
                pending.remove(n)
        if not running:
            break
        fut = next(as_completed(list(running.values())))
        n = next(k for k, v in running.items() if v is fut)
        del running[n]
        fut.wait()  # sets the final state (`.state` alone may read a stale one from the API)
        state = fut.state
        if state.is_completed():
            done[n] = fut.result()
        else:
            try:
                fut.result()
                failed[n] = f"ended {state.name}"
            except Exception as e:  # the task's own error, after its retries
                failed[n] = str(e)
    return done, failed, skipped


def flow_for(root: str | Path):
    """`pipeline` persisting its results in `root`'s result storage (the module-level flow uses this checkout's,
    or $RAGTEAM_RESULT_STORAGE)."""
    storage = result_storage_for(root)
    save_storage_block(storage)
    return pipeline.with_options(result_storage=storage_block(storage))
