"""The Prefect flow over a toy dvc.yaml in a throwaway git+dvc repo (ephemeral Prefect API, one PREFECT_HOME)."""
from __future__ import annotations

import base64
import json
import os
import re
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest
import yaml
from test_dvc_remote_s3 import BUCKET, KEY, SECRET, s3_endpoint  # noqa: F401  (moto's S3 server)
from ray_cluster import free_port

REPO = Path(__file__).resolve().parents[1]

MAKE_PY = """\
import pathlib, time, yaml
n = yaml.safe_load(open("params.yaml"))["toy"]["n"]
out = pathlib.Path("data/raw"); out.mkdir(parents=True, exist_ok=True)
for i in range(n):
    (out / f"{i}.txt").write_text("x" * (i + 1))
pathlib.Path("log").mkdir(exist_ok=True)
with open("log/runs.log", "a") as f:
    f.write("make\\n")
"""

COUNT_PY = """\
import json, pathlib, yaml
scale = yaml.safe_load(open("params.yaml"))["toy"]["scale"]
files = sorted(pathlib.Path("data/raw").iterdir())
total = sum(len(f.read_text()) for f in files) * scale
pathlib.Path("out").mkdir(exist_ok=True); pathlib.Path("out/count.txt").write_text(str(total))
pathlib.Path("metrics").mkdir(exist_ok=True)
json.dump({"total": total, "files": len(files)}, open("metrics/count.json", "w"))
pathlib.Path("reports").mkdir(exist_ok=True); pathlib.Path("reports/count.md").write_text(f"| total |\\n|---|\\n| {total} |\\n")
pathlib.Path("log").mkdir(exist_ok=True)
with open("log/runs.log", "a") as f:
    f.write("count\\n")
"""

CHAIN_DVC = """\
stages:
  make:
    cmd: python make.py
    deps: [make.py]
    params: [toy.n]
    outs: [data/raw]
  count:
    cmd: python count.py
    deps:
      - count.py
      - data/raw
    params: [toy.scale]
    outs:
      - out/count.txt
      - reports/count.md:
          cache: false
    metrics:
      - metrics/count.json:
          cache: false
artifacts:
  raw-data:
    path: data/raw
    type: dataset
"""

# step.py NAME SECONDS MODE: MODE ok | flaky (first attempt fails) | broken (always fails).
STEP_PY = """\
import json, pathlib, sys, time
name, secs, mode = sys.argv[1], float(sys.argv[2]), sys.argv[3]
log = pathlib.Path("log"); log.mkdir(exist_ok=True)
att = log / f"{name}.attempts"
n = int(att.read_text()) + 1 if att.exists() else 1
att.write_text(str(n))
if mode == "broken" or (mode == "flaky" and n == 1):
    sys.exit(f"{name}: failing on attempt {n}")
start = time.time(); time.sleep(secs); end = time.time()
(log / f"{name}.json").write_text(json.dumps({"start": start, "end": end}))
pathlib.Path("out").mkdir(exist_ok=True); pathlib.Path(f"out/{name}.txt").write_text(name)
"""

BRANCHES_DVC = """\
stages:
  left:
    cmd: python step.py left 2.5 ok
    deps: [step.py]
    outs: [out/left.txt]
  right:
    cmd: python step.py right 2.5 ok
    deps: [step.py]
    outs: [out/right.txt]
  flaky:
    cmd: python step.py flaky 0 flaky
    deps: [step.py]
    outs: [out/flaky.txt]
  broken:
    cmd: python step.py broken 0 broken
    deps: [step.py]
    outs: [out/broken.txt]
  after_broken:
    cmd: python step.py after_broken 0 ok
    deps: [out/broken.txt]
    outs: [out/after_broken.txt]
"""


def prefect_section(**over) -> dict:
    # each repo its own concurrency limit: the session's one Prefect server keeps a limit's slots between tests
    cfg = {"retries": 1, "retry_delay_s": 0, "gpu_stages": [], "gpu_mode": "local",
           "gpu_deployment": "ragteam-pipeline/gpu", "concurrency_limit": f"toy-stages-{uuid.uuid4().hex[:8]}"}
    return {**cfg, **over}


def sh(args: list[str], cwd: Path) -> str:
    env = {**os.environ, "DVC_NO_ANALYTICS": "1"}
    r = subprocess.run(args, cwd=cwd, capture_output=True, text=True, env=env)
    assert r.returncode == 0, f"{args} failed:\n{r.stdout}\n{r.stderr}"
    return r.stdout


def dvc(cwd: Path, *args: str) -> str:
    return sh([sys.executable, "-m", "dvc", *args], cwd)


def _remote():
    import flows.remote

    return flows.remote


def make_repo(path: Path, dvc_yaml: str, files: dict[str, str], params: dict, remote: Path | None = None) -> Path:
    """A committed git+dvc repo with analytics off (and a local default remote if given)."""
    path.mkdir(parents=True)
    sh(["git", "init", "-q", "-b", "main"], path)
    sh(["git", "config", "user.email", "t@example.com"], path)
    sh(["git", "config", "user.name", "t"], path)
    dvc(path, "init", "-q")
    config = "[core]\n    analytics = false\n    check_update = false\n"
    if remote:
        config += f"    remote = local\n['remote \"local\"']\n    url = {remote}\n"
    (path / ".dvc" / "config").write_text(config)
    (path / "dvc.yaml").write_text(dvc_yaml)
    (path / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    (path / ".gitignore").write_text("/log/\n")
    for name, text in files.items():
        (path / name).parent.mkdir(parents=True, exist_ok=True)
        (path / name).write_text(text)
    sh(["git", "add", "-A"], path)
    sh(["git", "commit", "-q", "-m", "toy"], path)
    return path


def chain_repo(path: Path, remote: Path | None = None, **prefect) -> Path:
    params = {"toy": {"n": 3, "scale": 2}, "prefect": prefect_section(**prefect)}
    return make_repo(path, CHAIN_DVC, {"make.py": MAKE_PY, "count.py": COUNT_PY}, params, remote)


@pytest.fixture(scope="session")
def flows_mod(tmp_path_factory):
    """flows.pipeline imported with one fresh PREFECT_HOME for the whole session (ephemeral API server)."""
    home = tmp_path_factory.mktemp("prefect-home")
    mp = pytest.MonkeyPatch()
    mp.setenv("PREFECT_HOME", str(home))
    # flow results go here, not under this checkout's .prefect/results (flow_for(root) tests unset it)
    mp.setenv("RAGTEAM_RESULT_STORAGE", str(tmp_path_factory.mktemp("prefect-results")))
    mp.delenv("PREFECT_API_URL", raising=False)
    mp.syspath_prepend(str(REPO))
    from prefect.settings import (
        PREFECT_HOME,
        PREFECT_SERVER_ANALYTICS_ENABLED,
        PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS,
        temporary_settings,
    )

    import flows.pipeline as fp  # sets the other offline defaults (setdefault: our PREFECT_HOME stays)

    with temporary_settings(updates={PREFECT_HOME: home, PREFECT_SERVER_ANALYTICS_ENABLED: False,
                                     PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS: 120}):
        yield fp
    from prefect.server.api.server import SubprocessASGIServer

    for server in list(SubprocessASGIServer._instances.values()):
        server.stop()  # now, while logging still has somewhere to write (atexit would log to a closed stream)
    mp.undo()


def parse_record(markdown: str) -> dict:
    """The record a stage artifact shows at its end, as JSON (for people; the flow itself returns the records)."""
    blocks = re.findall(r"```json\n(.*?)\n```", markdown, flags=re.S)
    assert blocks, f"artifact has no ```json block:\n{markdown}"
    return json.loads(blocks[-1])


def artifacts_of(flow_run_id) -> dict[str, dict]:
    """Stage records of one flow run, read back through the Prefect client."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterFlowRunId

    with get_client(sync_client=True) as client:
        arts = client.read_artifacts(
            artifact_filter=ArtifactFilter(flow_run_id=ArtifactFilterFlowRunId(any_=[flow_run_id])))
    return {a.key: (a.data if a.key.startswith("report-") else parse_record(a.data)) for a in arts
            if a.key}  # keyless: the result artifacts Prefect adds for persisted results


def lock_md5s(repo: Path, stage: str, kind: str) -> dict[str, str]:
    entry = yaml.safe_load((repo / "dvc.lock").read_text())["stages"][stage]
    return {d["path"]: d["md5"] for d in entry[kind]}


def test_flow_runs_chain_in_order_and_records_artifacts(flows_mod, tmp_path, monkeypatch):
    repo = chain_repo(tmp_path / "toy")
    monkeypatch.delenv("RAGTEAM_RESULT_STORAGE")  # the toy's params decide: the default, .prefect/results
    state = flows_mod.flow_for(repo)(root=str(repo), return_state=True)
    assert state.is_completed(), state
    assert state.result()["plan"] == [["make"], ["count"]]
    [persisted] = (repo / ".prefect/results").iterdir()  # the return value, as JSON, where params.yaml says
    assert json.loads(persisted.read_text()) == json.loads(json.dumps(state.result()))
    assert (repo / "out/count.txt").read_text() == "12"  # (1+2+3) * scale 2
    assert (repo / "log/runs.log").read_text().split() == ["make", "count"]

    arts = artifacts_of(state.state_details.flow_run_id)
    assert set(arts) == {"stage-make", "stage-count", "report-count"}
    assert arts["report-count"] == (repo / "reports/count.md").read_text()  # a stage's markdown report
    head = sh(["git", "rev-parse", "HEAD"], repo).strip()
    count = arts["stage-count"]
    assert count["git_commit"] == head
    assert count["deps"] == lock_md5s(repo, "count", "deps")
    assert count["outs"] == lock_md5s(repo, "count", "outs")
    assert count["outs"]["out/count.txt"] == flows_mod.lin.md5_file(repo / "out/count.txt")
    assert count["params"] == {"params.yaml": {"toy.scale": 2}}
    assert count["metrics"] == {"metrics/count.json": {"total": 12, "files": 3}}
    assert arts["stage-make"]["outs"]["data/raw"].endswith(".dir")

    # targets + force: only `make` (no downstream), and it re-runs although nothing changed
    state = flows_mod.pipeline(root=str(repo), targets=["make"], force=True, return_state=True)
    assert state.is_completed(), state
    assert (repo / "log/runs.log").read_text().split() == ["make", "count", "make"]


def test_independent_stages_overlap_and_failures_are_retried_then_reported(flows_mod, tmp_path):
    repo = make_repo(tmp_path / "toy", BRANCHES_DVC, {"step.py": STEP_PY}, {"prefect": prefect_section()})
    fp = flows_mod
    assert fp.lin.plan(fp.lin.build_graph(fp.lin.load_stages(repo)), ["left", "right"]) == [["left", "right"]]

    state = fp.pipeline(root=str(repo), targets=["left", "right"], return_state=True)
    assert state.is_completed(), state
    left, right = (json.loads((repo / f"log/{n}.json").read_text()) for n in ("left", "right"))
    assert max(left["start"], right["start"]) < min(left["end"], right["end"]), (left, right)

    # flaky fails once and is retried (retries: 1); broken fails both attempts; its downstream never runs
    state = fp.pipeline(root=str(repo), targets=["flaky", "after_broken"], return_state=True)
    assert state.is_failed()
    with pytest.raises(fp.PipelineFailed, match=r"stage\(s\) failed: broken: .*; not run: after_broken$") as err:
        state.result()
    assert "flaky" not in str(err.value)
    assert (repo / "log/flaky.attempts").read_text() == "2"
    assert (repo / "out/flaky.txt").exists()
    assert (repo / "log/broken.attempts").read_text() == "2"
    assert not (repo / "log/after_broken.attempts").exists()


def test_a_local_flow_runs_no_more_stages_at_once_than_max_parallel_stages(flows_mod, tmp_path):
    repo = make_repo(tmp_path / "toy", BRANCHES_DVC, {"step.py": STEP_PY},
                     {"prefect": prefect_section(max_parallel_stages=1)})
    state = flows_mod.pipeline(root=str(repo), targets=["left", "right"], return_state=True)
    assert state.is_completed(), state
    first, second = sorted((json.loads((repo / f"log/{n}.json").read_text()) for n in ("left", "right")),
                           key=lambda r: r["start"])
    assert first["end"] <= second["start"], (first, second)            # one after the other, never together


def test_a_stage_slot_waits_while_others_hold_every_slot_and_says_so(flows_mod):
    """`stage_slot` holds one slot of a Prefect global concurrency limit: while another holder (another flow run,
    a deployment) has the only slot, the stage waits, logging each wait, and enters once the slot is released."""
    import threading

    from prefect.client.orchestration import get_client
    from prefect.client.schemas.actions import GlobalConcurrencyLimitUpdate
    from prefect.concurrency.sync import concurrency

    name = flows_mod.host_limit(f"toy-stages-{uuid.uuid4().hex[:8]}")
    assert flows_mod.ensure_concurrency_limit(name, 1, explicit=True) == (1, True)   # created with the cap's slots

    class Log:
        lines: list[str] = []

        def info(self, line):
            self.lines.append(line)

    log, entered = Log(), []

    def stage():
        with flows_mod.stage_slot(name, "left", log, wait_log_s=1):
            entered.append(time.time())

    with concurrency(name, occupy=1, strict=True):                           # another run holds the only slot
        run = threading.Thread(target=stage)
        run.start()
        time.sleep(4)
        assert not entered and run.is_alive()
        released = time.time()
    run.join(timeout=60)
    assert not run.is_alive() and entered and entered[0] >= released
    assert any(f"'left' has waited" in line and f"prefect gcl inspect {name}" in line for line in log.lines), log.lines
    # an existing limit keeps an operator's slots and switch unless the run sets its own cap; two creators race safely
    with get_client(sync_client=True) as client:
        client.update_global_concurrency_limit(name, GlobalConcurrencyLimitUpdate(limit=2, active=False))
    assert flows_mod.ensure_concurrency_limit(name, 1, explicit=False) == (2, False)
    assert flows_mod.ensure_concurrency_limit(name, 3, explicit=True) == (3, True)
    with get_client(sync_client=True) as client:
        client.delete_global_concurrency_limit_by_name(name)
    results = []
    racers = [threading.Thread(target=lambda: results.append(flows_mod.ensure_concurrency_limit(name, 2, False)))
              for _ in range(3)]
    for t in racers:
        t.start()
    for t in racers:
        t.join(timeout=60)
    assert results == [(2, True)] * 3
    with get_client(sync_client=True) as client:
        client.delete_global_concurrency_limit_by_name(name)


def test_names_of_host_limits_and_a_flow_without_a_server_takes_none(flows_mod, tmp_path):
    """`<prefix>-<host>`, in the characters Prefect allows. The ephemeral API of a plain `ragteam flow run` serves one
    run and frees no lapsed lease (a killed run would keep its slot for good): no limit is made or held there."""
    from prefect.client.orchestration import get_client
    from prefect.exceptions import ObjectNotFound

    assert flows_mod.host_limit(None) is None
    assert flows_mod.host_limit("p", "gpu/box 1") == "p-gpu-box-1"
    with pytest.raises(Exception, match="concurrency_limit"):
        flows_mod.PrefectParams(**prefect_section(concurrency_limit="a/b"))
    prefix = f"toy-stages-{uuid.uuid4().hex[:8]}"
    repo = make_repo(tmp_path / "toy", BRANCHES_DVC, {"step.py": STEP_PY},
                     {"prefect": prefect_section(concurrency_limit=prefix)})
    assert flows_mod.server_url() is None
    assert flows_mod.pipeline(root=str(repo), targets=["left"], return_state=True).is_completed()
    with get_client(sync_client=True) as client, pytest.raises(ObjectNotFound):
        client.read_global_concurrency_limit_by_name(flows_mod.host_limit(prefix))


def test_parallel_stages_is_the_param_or_the_cores_one_llm_stage_leaves_room_for(flows_mod):
    cfg = flows_mod.PrefectParams(**prefect_section())
    assert flows_mod.parallel_stages(cfg, {"llm": {"threads": 2}}, cpus=2) == 1      # this machine: one at a time
    assert flows_mod.parallel_stages(cfg, {"llm": {"threads": 2}}, cpus=16) == 8
    assert flows_mod.parallel_stages(cfg, {"llm": {"threads": 4}}, cpus=2) == 1
    assert flows_mod.parallel_stages(cfg, {}, cpus=3) == 3
    assert flows_mod.parallel_stages(flows_mod.PrefectParams(**prefect_section(max_parallel_stages=3)),
                                     {"llm": {"threads": 2}}, cpus=2) == 3
    with pytest.raises(Exception, match="max_parallel_stages"):
        flows_mod.PrefectParams(**prefect_section(max_parallel_stages=0))


def test_gpu_stage_runs_on_worker_via_deployment_with_dvc_pull_and_push(flows_mod, tmp_path, monkeypatch):
    """gpu_mode: deployment. The deployment call is replaced by running the same flow, as the gpu deployment
    would (remote=True, upstream=False), in a separate git clone sharing only the DVC remote and the result storage;
    the orchestrator reads the worker's record from the flow run's persisted result, as the server reports it.
    (tests/test_flow_server.py does this with a real server, work pool and worker.)"""
    remote = tmp_path / "dvc-remote"
    repo = chain_repo(tmp_path / "main", remote=remote, gpu_stages=["count"], gpu_mode="deployment")
    worker = tmp_path / "worker"
    sh(["git", "clone", "-q", str(repo), str(worker)], tmp_path)
    fp = flows_mod
    gpu_deployment = yaml.safe_load((REPO / "prefect.yaml").read_text())["deployments"]
    gpu_params = next(d for d in gpu_deployment if d["work_pool"]["name"] == "gpu")["parameters"]
    calls = []

    runs = []

    def fake_run_deployment(name, parameters, flow_run_name=None, job_variables=None, **kw):
        calls.append((name, parameters, job_variables))
        assert not (worker / "data/raw").exists()  # the worker only gets deps through `dvc pull`
        state = fp.pipeline(root=str(worker), **{**gpu_params, **parameters}, return_state=True)
        from prefect.client.orchestration import get_client

        with get_client(sync_client=True) as client:  # the run as the server has it: no result in memory
            runs.append(client.read_flow_run(state.state_details.flow_run_id))
        return runs[-1]

    monkeypatch.setattr("prefect.deployments.run_deployment", fake_run_deployment)
    state = fp.pipeline(root=str(repo), return_state=True)
    assert state.is_completed(), state

    [(name, params, job_vars)] = calls
    assert name == "ragteam-pipeline/gpu" and params["targets"] == ["count"] and params["upstream"] is False
    head = sh(["git", "rev-parse", "HEAD"], repo).strip()
    assert params["git_commit"] == head
    storage = fp.result_storage_for(repo)
    assert job_vars == {"env": {"RAGTEAM_RESULT_STORAGE": str(storage)}}  # the worker persists where we read
    # the worker's return value, persisted as JSON in the result storage, is what the orchestrator adopted
    from prefect._internal.result_records import ResultRecordMetadata

    meta = runs[0].state.data
    assert isinstance(meta, ResultRecordMetadata) and Path(meta.storage_key).parent == storage
    persisted = json.loads(Path(meta.storage_key).read_text())
    assert persisted["stages"]["count"]["git_commit"] == head
    assert persisted["stages"]["count"]["lock"] == yaml.safe_load((repo / "dvc.lock").read_text())["stages"]["count"]
    assert (worker / "data/raw/2.txt").read_text() == "xxx"  # pulled from the DVC remote
    assert (repo / "log/runs.log").read_text().split() == ["make"]  # count did not run here...
    assert (worker / "log/runs.log").read_text().split() == ["count"]  # ...but on the worker
    assert (repo / "out/count.txt").read_text() == "12"  # pushed by the worker, pulled back
    assert json.loads((repo / "metrics/count.json").read_text())["total"] == 12  # uncached: shipped back
    assert lock_md5s(repo, "count", "outs") == lock_md5s(worker, "count", "outs")
    assert json.loads(dvc(repo, "status", "--json")) == {}  # the adopted lock entry matches the workspace
    assert "/count.txt" in (repo / "out/.gitignore").read_text().split()  # git-ignored like a local repro


def test_a_deployment_result_this_side_cannot_read_fails_the_stage_naming_the_storage(flows_mod, tmp_path,
                                                                                       monkeypatch):
    """The worker's record comes only from its persisted result: missing or recordless results fail clearly."""
    from types import SimpleNamespace

    from prefect._internal.result_records import ResultRecordMetadata
    from prefect.serializers import JSONSerializer
    from prefect.states import Completed

    storage = tmp_path / "results"
    storage.mkdir()

    def fake_run(key: str):
        meta = ResultRecordMetadata(storage_key=str(storage / key), serializer=JSONSerializer())
        return lambda **kw: SimpleNamespace(id="run-1", state=Completed(data=meta))

    monkeypatch.setattr("prefect.deployments.run_deployment", fake_run("gone"))  # a directory not shared
    with pytest.raises(flows_mod.StageFailed, match=f"stage 'count': flow run run-1 on ragteam-pipeline/gpu "
                                                    f"completed, but its result could not be read from {storage}"):
        flows_mod.submit_to_deployment("ragteam-pipeline/gpu", "count", {}, storage)
    (storage / "other").write_text(json.dumps({"plan": [["make"]], "stages": {"make": {}}}))
    monkeypatch.setattr("prefect.deployments.run_deployment", fake_run("other"))
    with pytest.raises(flows_mod.StageFailed, match="returned no record for the stage"):
        flows_mod.submit_to_deployment("ragteam-pipeline/gpu", "count", {}, storage)


def test_remote_run_files_are_limited_to_the_lock_params_and_declared_outs(flows_mod, tmp_path):
    """A flow run's `files` cannot replace code or dvc.yaml on a worker; the orchestrator adopts only the stage's
    declared uncached outs from a worker's record."""
    repo = chain_repo(tmp_path / "toy")
    fp = flows_mod
    remote = _remote()
    stages = fp.lin.load_stages(repo)
    assert remote.sendable_files(stages, ["count"]) == {"dvc.lock", "params.yaml"}
    code = {p: (repo / p).read_text() for p in ("count.py", "dvc.yaml", "params.yaml")}
    for bad in ("count.py", "dvc.yaml", "./make.py", "data/raw/0.txt", "out/count.txt"):
        with pytest.raises(ValueError, match=f"refusing to write '{re.escape(bad)}'.*dvc.lock, params.yaml"):
            fp.pipeline.fn(root=str(repo), targets=["count"], upstream=False, dry_run=True,
                           files={"params.yaml": "toy: {n: 1}\n", bad: "import os; os.system('boom')\n"})
    assert {p: (repo / p).read_text() for p in code} == code          # refused before anything was written
    with pytest.raises(ValueError, match="inside the project"):
        remote.write_files(repo, {"../escape.txt": "x"}, {"../escape.txt"})
    new_params = code["params.yaml"].replace("scale: 2", "scale: 3")
    fp.pipeline.fn(root=str(repo), targets=["count"], upstream=False, dry_run=True,
                   files={"params.yaml": new_params, "dvc.lock": "schema: '2.0'\nstages: {}\n"})
    assert (repo / "params.yaml").read_text() == new_params and (repo / "dvc.lock").is_file()
    record = {"stage": "count", "lock": {"cmd": "python count.py"},
              "files": {"metrics/count.json": "{}\n", "count.py": "evil\n"}}
    with pytest.raises(ValueError, match="refusing to write 'count.py'.*metrics/count.json, reports/count.md"):
        remote.adopt_remote_result(repo, stages, record)
    assert (repo / "count.py").read_text() == code["count.py"] and not (repo / "metrics/count.json").exists()


def test_a_training_stages_uncached_outs_travel_whole_curves_directory_and_png_included(flows_mod, tmp_path):
    """What a GPU worker returns for a training stage: its DVCLive curves (a directory of TSVs) and its PNG figure
    (bytes, not text) arrive whole; the directory is replaced, not merged into, and a path outside the stage's
    declared outs, or a body that is neither text nor base64, is refused before anything is written."""
    fp = flows_mod
    remote = _remote()
    worker, here = tmp_path / "worker", tmp_path / "here"
    curves, png = "reports/training/train_judge", "reports/figures/train_judge.png"
    (worker / curves / "plots/metrics").mkdir(parents=True)
    (worker / curves / "plots/metrics/loss.tsv").write_text("step\tloss\n1\t2.0\n")
    (worker / curves / "metrics.json").write_text('{"loss": 2.0, "step": 1}')
    (worker / png).parent.mkdir(parents=True)
    figure = b"\x89PNG\r\n\x1a\n" + bytes(range(256))
    (worker / png).write_bytes(figure)
    files = remote.out_files(worker, [curves, png, "metrics/never_written.json"])
    assert sorted(files) == [png, f"{curves}/metrics.json", f"{curves}/plots/metrics/loss.tsv"]
    assert files[png] == {"base64": base64.b64encode(figure).decode()}
    files = json.loads(json.dumps(files))                     # through the run's JSON result
    (here / curves / "plots/metrics").mkdir(parents=True)
    (here / curves / "plots/metrics/stale.tsv").write_text("from an earlier run\n")
    # the stage's uncached outs as dvc.yaml declares them: DVCLive's summary file, the curves directory, the figure
    outs = {f"{curves}/metrics.json", f"{curves}/plots/metrics", png, "metrics/train_judge.json"}
    files = {k: v for k, v in files.items() if k != f"{curves}/metrics.json"} | {
        f"{curves}/metrics.json": files[f"{curves}/metrics.json"]}
    (here / "metrics").mkdir()
    (here / "metrics/train_judge.json").write_text("{}")
    for bad, body in (("reports/training/other/x.tsv", "x"), (f"{curves}/../../../escape", "x"),
                      (f"{curves}/plots/metrics/a.tsv", {"base64": "not base64!"}),
                      (f"{curves}/plots/metrics/b.tsv", 3),
                      ("metrics/train_judge.json/x", "a file turned into a directory"),
                      (f"{curves}/metrics.json/x", "nor a file out that is not here yet")):
        with pytest.raises(ValueError, match="refusing to write|inside the project|does not decode|must be text"):
            remote.write_files(here, {**files, bad: body}, outs,
                           dirs={f"{curves}/plots/metrics", "metrics/train_judge.json"})
        assert not (here / png).exists()                     # checked before anything was written
    assert (here / "metrics/train_judge.json").read_text() == "{}"
    remote.write_files(here, files, outs, dirs={f"{curves}/plots/metrics"})
    assert (here / png).read_bytes() == figure
    assert sorted(p.relative_to(here / curves).as_posix() for p in (here / curves).rglob("*") if p.is_file()) == [
        "metrics.json", "plots/metrics/loss.tsv"]              # stale.tsv went with the old directory
    (worker / curves / "plots/metrics/link.tsv").symlink_to(tmp_path / "outside.txt")
    with pytest.raises(ValueError, match="link.tsv is a symlink"):
        remote.out_files(worker, [curves])
    (worker / curves / "plots/metrics/link.tsv").unlink()
    remote.MAX_SHIPPED_BYTES, cap = 100, remote.MAX_SHIPPED_BYTES
    try:
        with pytest.raises(ValueError, match=f"exceed 0 MiB \\({png}: 0 MiB\\): make it a cached out"):
            remote.out_files(worker, [curves, png])
    finally:
        remote.MAX_SHIPPED_BYTES = cap


def test_the_orchestrator_refuses_code_changes_a_gpu_worker_could_not_see(flows_mod, tmp_path):
    repo = chain_repo(tmp_path / "toy", gpu_stages=["count"], gpu_mode="deployment")
    fp = flows_mod
    remote = _remote()
    stages = fp.lin.load_stages(repo)
    head = sh(["git", "rev-parse", "HEAD"], repo).strip()
    # shipped with the run (dvc.lock, params files), written by the pipeline (outs) or by dvc (.gitignore): fine
    (repo / "params.yaml").write_text((repo / "params.yaml").read_text() + "# edited\n")
    (repo / ".gitignore").write_text("/log/\n/x\n")
    assert remote.orchestrator_commit(repo, stages) == head
    (repo / "count.py").write_text(COUNT_PY + "# not committed\n")
    with pytest.raises(remote.UncommittedChanges, match=f"uncommitted changes to count.py: .*commit {head}"):
        remote.orchestrator_commit(repo, stages)
    state = fp.pipeline(root=str(repo), return_state=True)          # refused before any stage runs
    assert state.is_failed()
    with pytest.raises(remote.UncommittedChanges, match="count.py"):
        state.result()
    assert not (repo / "log").exists()
    with pytest.raises(ValueError, match="git_commit is for remote runs"):  # never detaches a working checkout
        fp.pipeline.fn(root=str(repo), git_commit=head, dry_run=True)
    assert sh(["git", "rev-parse", "--abbrev-ref", "HEAD"], repo).strip() == "main"


def test_a_worker_checks_out_the_orchestrators_commit_behind_its_branch_head(flows_mod, tmp_path):
    """A deployment clones the branch head, shallow; the flow fetches and detaches at the commit it was sent."""
    fp = flows_mod
    remote = _remote()
    repo = chain_repo(tmp_path / "toy")
    commit_a = sh(["git", "rev-parse", "HEAD"], repo).strip()
    (repo / "count.py").write_text(COUNT_PY + "# B\n")
    sh(["git", "commit", "-qam", "B"], repo)
    commit_b = sh(["git", "rev-parse", "HEAD"], repo).strip()
    clone = tmp_path / "clone"
    sh(["git", "clone", "-q", "--depth", "1", "--branch", "main", f"file://{repo}", str(clone)], tmp_path)
    with pytest.raises(Exception):
        sh(["git", "cat-file", "-e", f"{commit_a}^{{commit}}"], clone)  # not in the shallow clone
    assert remote.checkout_commit(clone, commit_a) == commit_b
    assert sh(["git", "rev-parse", "HEAD"], clone).strip() == commit_a
    assert (clone / "count.py").read_text() == COUNT_PY
    assert fp.lin.git_head(clone) == commit_a                                      # what stage records name
    assert remote.checkout_commit(clone, commit_a) == commit_a                         # already there: nothing to do
    unknown = "0123456789abcdef0123456789abcdef01234567"
    with pytest.raises(remote.CommitUnavailable, match=f"orchestrator's commit {unknown}: this clone is at {commit_a}"):
        remote.checkout_commit(clone, unknown)
    with pytest.raises(remote.CommitUnavailable, match="not a full commit hash"):
        remote.checkout_commit(clone, "main")


def test_a_worker_runs_only_a_commit_of_its_branch_and_never_over_local_edits(flows_mod, tmp_path):
    """A hash alone does not choose the code: a commit the remote serves from another branch (a fork's, a pull
    request's) is refused, and so is checking out over uncommitted edits (a person's checkout, not a fresh clone)."""
    fp = flows_mod
    remote = _remote()
    repo = chain_repo(tmp_path / "toy")
    main_head = sh(["git", "rev-parse", "HEAD"], repo).strip()
    sh(["git", "checkout", "-q", "-b", "side"], repo)
    (repo / "count.py").write_text(COUNT_PY + "import os  # not reviewed\n")
    sh(["git", "commit", "-qam", "side"], repo)
    side = sh(["git", "rev-parse", "HEAD"], repo).strip()
    sh(["git", "checkout", "-q", "main"], repo)
    clone = tmp_path / "clone"
    sh(["git", "clone", "-q", "--depth", "1", "--branch", "main", f"file://{repo}", str(clone)], tmp_path)
    with pytest.raises(remote.CommitUnavailable, match=f"{side} is not in the history of the branch this deployment "
                                                   f"clones \\(at {main_head}\\)"):
        remote.checkout_commit(clone, side)
    assert sh(["git", "rev-parse", "HEAD"], clone).strip() == main_head                 # left where it was
    (repo / "make.py").write_text((repo / "make.py").read_text() + "# A2\n")
    sh(["git", "commit", "-qam", "A2"], repo)
    sh(["git", "-C", str(clone), "fetch", "-q", "origin", "main"], tmp_path)
    (clone / "count.py").write_text("edited by hand\n")
    with pytest.raises(remote.CommitUnavailable, match="uncommitted changes to tracked files"):
        remote.checkout_commit(clone, sh(["git", "rev-parse", "HEAD"], repo).strip())
    assert (clone / "count.py").read_text() == "edited by hand\n"


def test_the_orchestrator_reads_a_workers_result_as_json_from_its_storage_only(flows_mod, tmp_path):
    """Prefect's own `state.result()` decodes with the serializer the run's state names (pickle included): the
    orchestrator reads the stored JSON itself, inside the result storage, and refuses anything else."""
    from types import SimpleNamespace as NS

    fp = flows_mod
    remote = _remote()
    storage = tmp_path / "results"
    storage.mkdir()
    (storage / "k1").write_text(json.dumps({"stages": {"count": {"stage": "count"}}}))
    ok = NS(data=NS(storage_key=str(storage / "k1"), serializer=NS(type="json")))
    assert remote.read_worker_result(ok, storage) == {"stages": {"count": {"stage": "count"}}}
    wrapped = {"metadata": {"serializer": {"type": "json"}}, "result": json.dumps({"stages": {}})}
    (storage / "k2").write_text(json.dumps(wrapped))
    assert remote.read_worker_result(NS(data={"storage_key": "k2", "serializer": {"type": "json"}}), storage) == {
        "stages": {}}
    (tmp_path / "elsewhere").write_text("{}")
    for state, why in [(NS(data=NS(storage_key=str(storage / "k1"), serializer=NS(type="pickle"))), "'pickle', not json"),
                       (NS(data={"storage_key": str(tmp_path / "elsewhere"), "serializer": {"type": "json"}}),
                        "outside the result storage"),
                       (NS(data={"storage_key": "../elsewhere", "serializer": {"type": "json"}}),
                        "outside the result storage"),
                       (NS(data=None), "names no persisted result")]:
        with pytest.raises(ValueError, match=why):
            remote.read_worker_result(state, storage)


def test_results_persist_on_s3_and_the_orchestrator_reads_them_there(flows_mod, tmp_path, monkeypatch, s3_endpoint):
    """With `prefect.result_storage: s3://...` (moto's server here) a flow run persists its return value as JSON in
    the bucket, and the orchestrator reads it back from there, as it would a GPU worker's on another host; a key
    outside the storage's prefix is refused."""
    from types import SimpleNamespace as NS

    import boto3

    fp = flows_mod
    remote = _remote()
    for var, value in (("AWS_ACCESS_KEY_ID", KEY), ("AWS_SECRET_ACCESS_KEY", SECRET), ("AWS_ENDPOINT_URL", s3_endpoint),
                       ("AWS_DEFAULT_REGION", "us-east-1")):
        monkeypatch.setenv(var, value)
    url = f"s3://{BUCKET}/prefect-results"
    monkeypatch.setenv("RAGTEAM_RESULT_STORAGE", url)
    repo = chain_repo(tmp_path / "toy")
    assert fp.result_storage_for(repo) == url
    done = fp.flow_for(repo)(root=str(repo), dry_run=True, return_state=True)
    assert done.is_completed(), done
    from prefect.client.orchestration import get_client

    with get_client(sync_client=True) as client:   # the run as the server has it, as a deployment run's is read
        state = client.read_flow_run(done.state_details.flow_run_id).state
    key = state.data.storage_key           # relative to the saved block's basepath: this storage
    assert remote.read_worker_result(state, url) == {"plan": [["make"], ["count"]]}
    s3 = boto3.client("s3", endpoint_url=s3_endpoint, region_name="us-east-1", aws_access_key_id=KEY,
                      aws_secret_access_key=SECRET)
    keys = [o["Key"] for o in s3.list_objects_v2(Bucket=BUCKET)["Contents"]]
    assert keys == [f"prefect-results/{key}"]
    for key in (f"s3://{BUCKET}/elsewhere/x", f"{url}/../elsewhere/x", f"{url}-other/x"):
        with pytest.raises(ValueError, match="outside the result storage"):
            remote.read_worker_result(NS(data={"storage_key": key, "serializer": {"type": "json"}}), url)


def test_plan_and_param_validation_without_running(flows_mod, tmp_path, monkeypatch):
    repo = chain_repo(tmp_path / "toy", gpu_stages=["count"])
    assert flows_mod.describe_plan(repo) == ["level 0: make [local]", "level 1: count [local] after make"]
    assert flows_mod.describe_plan(repo, ["count"], upstream=False, remote=True) == [
        "level 0: count [remote] after make"]
    assert flows_mod.pull_targets(flows_mod.lin.load_stages(repo), "count") == ["data/raw"]
    from typer.testing import CliRunner

    from ragteam.cli import app

    monkeypatch.chdir(repo)
    res = CliRunner().invoke(app, ["flow", "run", "--dry-run", "count"])
    assert res.exit_code == 0 and res.output.splitlines() == ["level 0: make [local]",
                                                              "level 1: count [local] after make"]
    res = CliRunner().invoke(app, ["flow", "run", "nope"])
    assert res.exit_code == 1 and "unknown stage(s) ['nope']" in res.output
    res = CliRunner().invoke(app, ["flow", "run", "--dry-run", "--ray-address", "https://head:8265", "count"])
    assert res.exit_code == 0 and res.output.splitlines() == ["level 0: make [ray]", "level 1: count [ray] after make"]
    params = yaml.safe_load((repo / "params.yaml").read_text())
    params["prefect"]["gpu_stages"] = ["nope"]
    (repo / "params.yaml").write_text(yaml.safe_dump(params))
    with pytest.raises(flows_mod.ParamsError, match=r"prefect.gpu_stages.*nope"):
        flows_mod.describe_plan(repo)
    params["prefect"] = prefect_section(retries=-1)
    (repo / "params.yaml").write_text(yaml.safe_dump(params))
    with pytest.raises(flows_mod.ParamsError, match=r"prefect\.retries"):
        flows_mod.describe_plan(repo)

    # prefect.result_storage: a directory, relative to the project root or absolute; $RAGTEAM_RESULT_STORAGE wins
    monkeypatch.delenv("RAGTEAM_RESULT_STORAGE")
    for value, where in (("runs/results", repo / "runs/results"), (str(tmp_path / "shared"), tmp_path / "shared")):
        params["prefect"] = prefect_section(result_storage=value)
        (repo / "params.yaml").write_text(yaml.safe_dump(params))
        assert flows_mod.result_storage_for(repo) == where
        assert flows_mod.flow_for(repo).result_storage == where
    params["prefect"] = prefect_section(result_storage="s3://team-bucket/ragteam/results/")
    (repo / "params.yaml").write_text(yaml.safe_dump(params))
    assert flows_mod.result_storage_for(repo) == "s3://team-bucket/ragteam/results"
    assert flows_mod.storage_block(flows_mod.result_storage_for(repo)).startswith("remote-file-system/ragteam-results-")
    for bad, why in (("gs://bucket/results", "not gs://"), ("s3://", "needs a bucket"),
                     ("s3://b/../up", "without empty, '.' or '..'"), ("", "non-empty"), (3, "string")):
        params["prefect"] = prefect_section(result_storage=bad)
        (repo / "params.yaml").write_text(yaml.safe_dump(params))
        with pytest.raises(flows_mod.ParamsError, match=rf"invalid params:\n  prefect\.result_storage: .*{why}"):
            flows_mod.describe_plan(repo)
        with pytest.raises(flows_mod.ParamsError, match=rf"prefect\.result_storage: .*{why}"):
            flows_mod.result_storage_for(repo)
    monkeypatch.setenv("RAGTEAM_RESULT_STORAGE", str(tmp_path / "from-env"))
    assert flows_mod.result_storage_for(repo) == tmp_path / "from-env"
    monkeypatch.setenv("RAGTEAM_RESULT_STORAGE", "relative")
    with pytest.raises(ValueError, match="RAGTEAM_RESULT_STORAGE='relative': must be an absolute path or an s3://"):
        flows_mod.result_storage_for(repo)
    monkeypatch.setenv("RAGTEAM_RESULT_STORAGE", "ftp://host/x")
    with pytest.raises(ValueError, match="RAGTEAM_RESULT_STORAGE='ftp://host/x': a URL must be s3://"):
        flows_mod.result_storage_for(repo)


def test_the_flow_refuses_a_plain_http_ray_address_before_running(flows_mod, tmp_path, monkeypatch):
    """`prefect.ray_address` and `--ray-address` must be https, or http to a loopback host (issue 71: a Ray job's
    command, environment and token went in clear to any host; tests/test_ray_secrets.py has the client's side)."""
    from typer.testing import CliRunner

    from ragteam.cli import app

    repo = chain_repo(tmp_path / "toy", ray_address="http://head:8265")
    with pytest.raises(flows_mod.ParamsError, match=r"prefect\.ray_address: .*plain http to head, which is not a "
                                                    r"loopback host"):
        flows_mod.describe_plan(repo)
    repo = chain_repo(tmp_path / "toy2")
    with pytest.raises(flows_mod.ParamsError, match=r"ray_address \(--ray-address\): .*'head:8265' has no scheme"):
        flows_mod.describe_plan(repo, ray_address="head:8265")
    monkeypatch.chdir(repo)
    res = CliRunner().invoke(app, ["flow", "run", "--dry-run", "--ray-address", "http://head:8265", "count"])
    assert res.exit_code == 1 and "plain http to head, which is not a loopback host" in res.output
    res = CliRunner().invoke(app, ["flow", "run", "--dry-run", "--ray-address", "https://head:8265", "count"])
    assert res.exit_code == 0 and res.output.splitlines() == ["level 0: make [ray]", "level 1: count [ray] after make"]


def test_prefect_yaml_deployments_target_the_flow():
    import inspect

    doc = yaml.safe_load((REPO / "prefect.yaml").read_text())
    pools = {d["work_pool"]["name"]: d for d in doc["deployments"]}
    assert set(pools) == {"process", "gpu"}
    sys.path.insert(0, str(REPO))
    from flows.pipeline import FLOW_NAME, pipeline

    sig = inspect.signature(pipeline.fn)
    for d in doc["deployments"]:
        path, func = d["entrypoint"].split(":")
        assert (REPO / path).is_file() and func == "pipeline"
        assert set(d.get("parameters") or {}) <= set(sig.parameters)
    assert pools["gpu"]["parameters"]["remote"] is True
    params = yaml.safe_load((REPO / "params.yaml").read_text())["prefect"]
    assert params["gpu_deployment"] == f"{FLOW_NAME}/{pools['gpu']['name']}"



def test_make_flow_runs_the_flow_not_just_an_import():
    """`make flow` ran `python -m flows.pipeline`, a module without a __main__ block: it imported and ran nothing.
    The target runs the CLI, and so does `make repro` (the flow runs two stages at once, `dvc repro` one); its plan
    (a dry run, no server) lists every dvc.yaml stage."""
    for target in ("flow", "repro"):
        recipe = re.search(rf"^{target}:.*\n((?:\t.*\n)+)", (REPO / "Makefile").read_text(), re.M).group(1)
        recipe = [line.strip() for line in recipe.split("\n") if line.strip()]
        assert recipe == ["$(call BOTH_ENVS,)", "ragteam flow run"], (target, recipe)   # set-up, then the flow
    assert yaml.safe_load((REPO / "params.yaml").read_text())["prefect"]["max_parallel_stages"] == 2
    out = subprocess.run([str(Path(sys.executable).parent / "ragteam"), "flow", "run", "--dry-run"], cwd=REPO,
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    stages = yaml.safe_load((REPO / "dvc.yaml").read_text())["stages"]
    assert all(name in out.stdout for name in stages)


def test_an_untracked_module_a_stage_depends_on_is_refused_before_dispatch(flows_mod, tmp_path):
    """A new file under a stage's dep directory runs here but is missing from the worker's checkout of the commit:
    the orchestrator names it before any stage runs; untracked files no stage depends on are left alone."""
    fp = flows_mod
    remote = _remote()
    dvc_yaml = CHAIN_DVC.replace("      - count.py\n", "      - count.py\n      - lib\n")
    repo = make_repo(tmp_path / "toy", dvc_yaml, {"make.py": MAKE_PY, "count.py": COUNT_PY, "lib/__init__.py": ""},
                     {"toy": {"n": 3, "scale": 2}, "prefect": prefect_section(gpu_stages=["count"],
                                                                               gpu_mode="deployment")})
    stages = fp.lin.load_stages(repo)
    assert "lib" in stages["count"].deps
    head = sh(["git", "rev-parse", "HEAD"], repo).strip()
    (repo / "notes.txt").write_text("scratch\n")                       # no stage reads it
    assert remote.orchestrator_commit(repo, stages) == head
    (repo / "lib" / "helper.py").write_text("X = 1\n")                 # imported by a stage, never git-added
    with pytest.raises(remote.UncommittedChanges, match=f"uncommitted changes to lib/helper.py: .*commit {head}"):
        remote.orchestrator_commit(repo, stages)


# ---------------------------------------------------------------- Ray mode: stages as Ray jobs on a local cluster


@pytest.fixture(scope="module")
def ray_address(tmp_path_factory):
    """One local Ray cluster (worker environment) for this module's Ray tests; it shares this filesystem."""
    from ray_cluster import local_ray_cluster

    with local_ray_cluster(tmp_path_factory.mktemp("rayflow")) as address:
        yield address


def flow_logs(flow_run_id, last: str) -> list[str]:
    """The run's log messages as the Prefect API has them, once `last` is among them (logs are sent in batches)."""
    import time

    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import LogFilter, LogFilterFlowRunId

    deadline = time.monotonic() + 30
    while True:
        with get_client(sync_client=True) as client:
            logs = [log.message for log in client.read_logs(
                log_filter=LogFilter(flow_run_id=LogFilterFlowRunId(any_=[flow_run_id])))]
        if last in logs or time.monotonic() > deadline:
            return logs
        time.sleep(0.5)


def test_stages_run_as_ray_jobs_on_the_cluster(flows_mod, ray_address, tmp_path):
    from ragteam.ray_jobs import RayJobs

    repo = chain_repo(tmp_path / "toy", ray_address=ray_address)
    assert flows_mod.describe_plan(repo) == ["level 0: make [ray]", "level 1: count [ray] after make"]
    state = flows_mod.pipeline(root=str(repo), return_state=True)
    assert state.is_completed(), state
    assert (repo / "out/count.txt").read_text() == "12" and len(list((repo / "data/raw").iterdir())) == 3
    assert "Data and pipelines are up to date." in dvc(repo, "status")
    records = state.result()["stages"]
    with RayJobs(ray_address) as ray:
        jobs = {j["submission_id"]: j for j in ray.list()}
    for name in ("make", "count"):
        job = jobs[records[name]["ray_job"]]           # each stage ran as a Ray job, and it succeeded
        assert job["status"] == "SUCCEEDED" and job["metadata"]["ragteam_stage"] == name
        assert job["entrypoint"].endswith(f"repro --single-item {name}")
    assert records["count"]["outs"]["out/count.txt"] == flows_mod.lin.md5_file(repo / "out/count.txt")
    done = f"Ray job {records['count']['ray_job']}: SUCCEEDED"
    logs = flow_logs(state.state_details.flow_run_id, done)  # the job's log and status, in the task's log
    assert "Running stage 'count':" in logs and "> python count.py" in logs and done in logs


def test_a_failing_ray_job_fails_the_flow_naming_the_stage(flows_mod, ray_address, tmp_path):
    repo = make_repo(tmp_path / "toy", BRANCHES_DVC, {"step.py": STEP_PY},
                     {"prefect": prefect_section(ray_address=ray_address)})
    state = flows_mod.pipeline(root=str(repo), targets=["broken"], return_state=True)
    assert state.is_failed()
    with pytest.raises(flows_mod.PipelineFailed,
                       match=r"stage\(s\) failed: broken: stage 'broken' failed as a Ray job: Ray job ragteam-broken-"
                             r"[0-9a-f]{16}-2 on http://127\.0\.0\.1:\d+ ended FAILED: Job entrypoint command "
                             r"failed with exit code \d+; last log lines: Running stage 'broken': \| > python step.py "
                             r"broken 0 broken \| broken: failing on attempt 2 \| ERROR: failed to reproduce 'broken'"
                       ) as err:
        state.result()
    assert "attempt 1" not in str(err.value)  # the retry's log only, not the first attempt's
    assert (repo / "log/broken.attempts").read_text() == "2"  # the retry ran it again: the job's attempt 2
    assert not (repo / "out/broken.txt").exists()

    address = f"http://127.0.0.1:{free_port()}"  # no cluster there: one error naming the address, nothing run
    state = flows_mod.pipeline(root=str(repo), targets=["left"], ray_address=address, return_state=True)
    with pytest.raises(flows_mod.RayJobError, match=f"no Ray job server answers at {address} "):
        state.result()
    assert not (repo / "log/left.attempts").exists()
