"""The `ragteam` command line: the single entry point (pipeline, data checks, lineage, services)."""
from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Optional

import typer

from ragteam import views


def error_line(e: BaseException) -> str:
    """One line naming what a user got wrong: the message with its whitespace folded; a missing file as
    '<path>: file not found' rather than Python's '[Errno 2] ...'."""
    if isinstance(e, FileNotFoundError) and e.filename:
        return f"{e.filename}: file not found"
    return " ".join(str(e).split()) or type(e).__name__


def user_errors() -> tuple[type[BaseException], ...]:
    """The exceptions that mean bad input from the user (a profile, a params file, a path, a model source, a data
    file), not a bug: the CLI prints them as one line. Imported lazily: `ragteam --help` stays fast."""
    from ragteam.config import ParamsError
    from ragteam.io import DataError
    from ragteam.lineage import LineageError
    from ragteam.models import ModelSourceError
    from ragteam.registry import RegistryError

    return ParamsError, DataError, LineageError, ModelSourceError, RegistryError, FileNotFoundError


def fail(e: BaseException) -> typer.Exit:
    """Print `ERROR <one line>` on stderr; return the Exit(1) for the caller to raise."""
    typer.echo(f"ERROR {error_line(e)}", err=True)
    return typer.Exit(1)


class App(typer.Typer):
    """A Typer app whose user errors (see `user_errors`) end as one `ERROR ...` line and exit status 1 instead of a
    traceback panel; anything else is a bug and keeps its traceback."""

    def __call__(self, *args, **kwargs):
        try:
            return super().__call__(*args, **kwargs)
        except Exception as e:
            if isinstance(e, user_errors()):
                typer.echo(f"ERROR {error_line(e)}", err=True)
                sys.exit(1)
            raise


app = App(no_args_is_help=True, add_completion=False, help="Teams of LLM agents for RAG, as a pipeline.")
data_app = typer.Typer(no_args_is_help=True, help="Prepared-data checks.")
profile_app = typer.Typer(no_args_is_help=True, help="Param profiles (overlays on params.yaml).")
app.add_typer(data_app, name="data")
app.add_typer(profile_app, name="profile")


@data_app.command("validate")
def data_validate(
    file: Path = typer.Argument(..., help="JSONL file to check"),
    kind: str = typer.Option(..., "--kind", help="corpus | benchmark | train"),
    min_rows: int = typer.Option(1, help="fewest rows allowed"),
    max_rows: int = typer.Option(30_000_000, help="most rows allowed"),
    min_chars: int = typer.Option(20, help="corpus: shortest contents"),
    max_chars: int = typer.Option(20_000, help="corpus: longest contents"),
    report: Optional[Path] = typer.Option(None, help="also write the JSON report here"),
) -> None:
    """Run the prepare_data validation rules (Great Expectations) on one file; exit 1 on any violation."""
    from ragteam.data.validate import Limits, validate_file
    from ragteam.io import DataError, write_json

    if kind not in ("corpus", "benchmark", "train"):
        raise typer.BadParameter("must be corpus, benchmark or train", param_hint="--kind")
    try:
        rep = validate_file(file, kind, Limits((min_rows, max_rows), (min_chars, max_chars)))
    except DataError as e:
        typer.echo(f"FAILED {e}", err=True)
        if report:
            write_json(report, {"success": False, "error": str(e)})
        raise typer.Exit(1)
    if report:
        write_json(report, rep.to_dict())
    typer.echo(rep.summary(), err=not rep.success)
    raise typer.Exit(0 if rep.success else 1)


def _checkout_on_path(folder: str, root: Path | None = None) -> Path:
    """Put on sys.path the checkout whose `folder` (`stages/`, `flows/`: beside dvc.yaml, outside the installed
    package) is imported: `root` (default: the dvc.yaml above the working directory) where it has one, else the
    checkout this ragteam comes from."""
    import ragteam
    from ragteam.lineage import LineageError, find_root

    if root is None:
        try:
            root = find_root()
        except LineageError:
            root = None
    if root is None or not (root / folder).is_dir():
        root = Path(ragteam.__file__).resolve().parents[1]
    if str(root) not in sys.path:
        sys.path.insert(0, str(root))
    return root


def _check_params(params: dict, source: str) -> None:
    """`ragteam.params_check.check_params` with the checkout's stage models importable."""
    _checkout_on_path("stages")
    from ragteam.params_check import check_params

    check_params(params, source)


@profile_app.command("flags")
def profile_flags(names: list[str], params: Path = Path("params.yaml")) -> None:
    """Print `-S key=value` flags applying profiles/<name>.yaml (several: in order), for
    `dvc exp run $(ragteam profile flags paper table3)`."""
    from ragteam.profiles import merged_params
    from ragteam.profiles import profile_flags as flags

    _check_params(merged_params(names, params), f"{params} with profile(s) {', '.join(names)}")
    typer.echo(" ".join(flags(names, params)))


@profile_app.command("apply")
def profile_apply(name: str, params: Path = Path("params.yaml")) -> None:
    """Rewrite params.yaml with profiles/<name>.yaml merged over it (for `dvc repro`; git keeps the old one)."""
    from ragteam.profiles import apply_profile, merged_params

    _check_params(merged_params([name], params), f"{params} with profile {name}")
    changed = apply_profile(name, params)
    typer.echo(f"{params}: applied profile {name!r} ({len(changed)} values changed)")


registry_app = typer.Typer(no_args_is_help=True, help="Versions of the trained agents (GTO tags for dvc artifacts).")
app.add_typer(registry_app, name="registry")


@registry_app.command("register")
def registry_register(
    artifact: str = typer.Argument(..., help="an artifact of dvc.yaml, e.g. answer-agent"),
    version: Optional[str] = typer.Option(None, help="v<major>.<minor>.<patch> (default: the next patch version)"),
    rev: str = typer.Option("HEAD", help="the commit whose dvc.lock holds the artifact"),
    message: Optional[str] = typer.Option(None, help="the tag's message"),
    repo: Path = typer.Option(Path("."), help="the project checkout"),
) -> None:
    """Register a version of ARTIFACT: an annotated git tag `<artifact>@<version>` (GTO's format)."""
    from ragteam.registry import register

    got = register(repo, artifact, version, rev, message)
    typer.echo(f"registered {got.tag} -> {got.commit[:12]}\n"
               f"push it: git push origin {got.tag} (and dvc push)\n"
               f"fetch it: dvc artifacts get <repo url> {got.artifact} --rev {got.version}")


@registry_app.command("list")
def registry_list(artifact: Optional[str] = typer.Argument(None), repo: Path = typer.Option(Path("."))) -> None:
    """Registered versions (all artifacts, or one), in version order."""
    from ragteam.registry import versions

    rows = versions(repo, artifact)
    for v in rows:
        typer.echo(f"{v.artifact}\t{v.version}\t{v.commit[:12]}")
    if not rows:
        typer.echo(f"no registered version{' of ' + artifact if artifact else 's'} in {repo.resolve()}: register "
                   "the committed run's models with `ragteam registry register-run` (one artifact: `ragteam registry "
                   "register <artifact>`)")


@registry_app.command("register-run")
def registry_register_run(
    version: Optional[str] = typer.Option(None, help="v<major>.<minor>.<patch> for every model of the run "
                                          "(default: the next minor version above all of theirs, v0.1.0 first)"),
    dry_run: bool = typer.Option(False, "--dry-run", help="check and print what would be tagged, tag nothing"),
    repo: Path = typer.Option(Path("."), help="the project checkout"),
) -> None:
    """Register every model artifact of dvc.yaml that the committed run at HEAD produced, under one version. Refused,
    with nothing tagged, on uncommitted changes, on a stage `dvc status` finds out of date with dvc.lock (upstream
    ones included), or on weights the DVC remote lacks (`dvc push`)."""
    from ragteam.registry import register_run

    got = register_run(repo, version, dry_run=dry_run)
    verb = "would register" if dry_run else "registered"
    for v in got.registered:
        typer.echo(f"{verb} {v.tag} -> {v.commit[:12]}")
    for name, why in got.skipped:
        typer.echo(f"skipped {name}: {why}")
    if not got.registered:
        typer.echo(f"nothing to register at {got.commit[:12]}")
    elif not dry_run:
        typer.echo(f"push the tags: git push origin {' '.join(v.tag for v in got.registered)}\n"
                   f"fetch the latest: dvc artifacts get <repo url> {got.registered[0].artifact} "
                   f"(this version: --rev {got.version})")


@registry_app.command("get")
def registry_get(
    artifact: str = typer.Argument(..., help="a trained agent of dvc.yaml's artifacts, e.g. mask-agent"),
    version: str = typer.Argument(..., help="a registered version, v<major>.<minor>.<patch>"),
    out: Path = typer.Option(..., "-o", "--out", help="a new directory for the model"),
    repo: str = typer.Option(".", help="the project: a path or git URL (its DVC remote holds the weights)"),
    no_eval: bool = typer.Option(False, "--no-eval", help="fetch with the training card alone, when no "
                                 "evaluation at the tagged commit is of these weights"),
) -> None:
    """Fetch a registered agent with its release model card: the training card plus the scores, 95 % intervals and
    paired differences that evaluate / evaluate_agents recorded at the tagged commit for the rows that run on these
    weights (refused where those records are stale), also as Hugging Face model-index metadata."""
    from ragteam.release import get_release

    dest = get_release(repo, artifact, version, out, evaluation=not no_eval)
    typer.echo(f"{artifact}@{version} -> {dest} (release card: {dest / 'README.md'})")


flow_app = typer.Typer(no_args_is_help=True, help="Run the dvc.yaml stages as a Prefect flow.")
app.add_typer(flow_app, name="flow")


@flow_app.command("run")
def flow_run(
    targets: Optional[list[str]] = typer.Argument(None, help="stages to run (with their upstreams); default all"),
    force: bool = typer.Option(False, "--force", help="dvc repro --force each selected stage"),
    dry_run: bool = typer.Option(False, "--dry-run", help="print the plan (levels, where each stage runs) only"),
    remote: bool = typer.Option(False, "--remote", help="dvc pull each stage's deps before, dvc push its outs after"),
    single: bool = typer.Option(False, "--single", help="run only the named targets, not their upstreams"),
    ray_address: Optional[str] = typer.Option(
        None, "--ray-address", metavar="URL",
        help="run the stages as Ray jobs on this cluster's job server (https://<head>:8265, or http:// on "
             "loopback; docs/prefect.md), which must share this checkout's filesystem; default: params.yaml "
             "prefect.ray_address (null: run them here)"),
) -> None:
    """Run the pipeline with Prefect (ephemeral local API, PREFECT_HOME=.prefect); exit 1 if a stage fails."""
    from ragteam.config import ParamsError
    from ragteam.lineage import LineageError, find_root

    root = find_root()
    _checkout_on_path("flows", root)
    from flows.pipeline import describe_plan, flow_for

    try:  # also checks targets and params before a Prefect server is started
        from ragteam.config import load_params

        if (root / "params.yaml").is_file():
            _check_params(load_params(root / "params.yaml"), str(root / "params.yaml"))
        plan = describe_plan(root, targets or None, not single, remote, ray_address)
    except (LineageError, ParamsError) as e:
        raise fail(e)
    if dry_run:
        typer.echo("\n".join(plan))
        return
    state = flow_for(root)(targets=targets or None, force=force, remote=remote, upstream=not single,
                           root=str(root), ray_address=ray_address, return_state=True)
    if not state.is_completed():
        try:
            state.result()
        except Exception as e:
            typer.echo(f"FAILED {e}", err=True)
        raise typer.Exit(1)


@app.command("lineage")
def lineage_cmd(
    path: Path = typer.Argument(..., help="a file or directory produced by a dvc.yaml stage"),
    as_json: bool = typer.Option(False, "--json", help="machine-readable output"),
    rev: Optional[str] = typer.Option(None, "--rev", help="as this commit has it (a commit, branch, tag or a "
                                      "kept experiment's commit), not the workspace"),
) -> None:
    """Which stage produced PATH: its cmd, params (current and locked), deps/outs md5 and the dvc.lock commit."""
    from ragteam.lineage import LineageError, find_root, lineage

    try:
        info = lineage(find_root(path.resolve().parent), path, rev=rev)
    except LineageError as e:
        raise fail(e)
    if as_json:
        typer.echo(json.dumps(info, indent=2, default=str))
        return
    art = info["artifact"]
    typer.echo(f"{info['path']}" + (f"  at {info['rev']}" if info["rev"] else ""))
    typer.echo(f"  stage     {info['stage']}  (out {info['out']})" + (f"  artifact {art['name']} [{art.get('type', '')}]" if art else ""))
    typer.echo(f"  cmd       {info['cmd']}")
    for p in info["params"]:
        name = f"{p['file']}:{p['name']}" if p["name"] else p["file"]
        same = "" if p["current"] == p["locked"] else f"   (locked: {json.dumps(p['locked'], default=str)})"
        typer.echo(f"  param     {name} = {json.dumps(p['current'], default=str)}{same}")
    env = info.get("environment")
    if env:
        from ragteam.environment import packages_line

        typer.echo(f"  env       {env.get('env', '?')} environment, Python {env.get('python', '?')}: "
                   f"{packages_line(env)}")
    for kind in ("deps", "outs"):
        for d in info[kind]:
            typer.echo(f"  {kind[:-1]:<9} {d['path']}  md5 {d.get('md5', '-')}")
    if "member_md5" in info:
        where = "at the commit" if info["rev"] else "workspace"
        typer.echo(f"  file md5  {info.get('member_md5') or '-'} (in dvc.lock), {info.get('workspace_md5', '-')} ({where})")
    commit = f"last committed in {info['lock_commit']}" if info["lock_commit"] else "not committed yet"
    typer.echo(f"  dvc.lock  {commit}" + ("  (has uncommitted changes)" if info["lock_dirty"] and info["lock_commit"] else ""))
    if not info["locked"]:
        typer.echo("  (stage not in dvc.lock yet: run `dvc repro` first)")


@app.command("serve-retriever")
def serve_retriever(
    index: list[Path] = typer.Option(..., "--index", help="index dir (bm25s / Lucene / dense) or FAISS file; "
                                     "repeat for reciprocal-rank fusion"),
    corpus: Optional[Path] = typer.Option(None, help="corpus JSONL (default: the one recorded in the index)"),
    encoder: Optional[Path] = typer.Option(None, help="encoder model dir or id (default: recorded in the index)"),
    convention: str = typer.Option("auto", help="auto | e5 | bge | sentence-transformers"),
    device: Optional[str] = typer.Option(None, help="encoder device (default: cuda if available)"),
    host: Optional[str] = typer.Option(None, help="bind address (default retrieval.service.host: 127.0.0.1)"),
    port: Optional[int] = typer.Option(None, help="port (default retrieval.service.port)"),
    topk: Optional[int] = typer.Option(None, help="topk when a request sends null"),
    max_queries: Optional[int] = typer.Option(None, help="most queries in one request"),
    max_query_chars: Optional[int] = typer.Option(None, help="longest query in characters"),
    max_topk: Optional[int] = typer.Option(None, help="largest topk / N"),
    token_file: Optional[Path] = typer.Option(None, help="a file whose first line is the bearer token clients "
                                              "must send (default: $RAGTEAM_RETRIEVER_TOKEN); required unless "
                                              "--host is loopback"),
    allowed_host: list[str] = typer.Option([], "--allowed-host", help="a Host name the service answers to; "
                                           "repeat (default beyond loopback: the bound address and this "
                                           "machine's names)"),
    docs: bool = typer.Option(False, "--docs", help="serve /docs and /openapi.json"),
    params: Path = typer.Option(Path("params.yaml"), help="defaults come from its retrieval.service section"),
) -> None:
    """Serve an index over HTTP: Search-R1 `POST /retrieve` and JADE/M-ASK `POST /search` (docs/security.md)."""
    from ragteam.config import ParamsError, load_params, parse_section
    from ragteam.io import DataError
    from ragteam.retrieval import open_retriever
    from ragteam.retrieval.config import RetrievalParams
    from ragteam.retrieval.service import ServiceLimits, exposure_for, read_token, serve

    try:
        cfg = parse_section(load_params(params), "retrieval", RetrievalParams, str(params)).service \
            if params.exists() else None
        base = ServiceLimits() if cfg is None else ServiceLimits(
            max_queries=cfg.max_queries, max_query_chars=cfg.max_query_chars, max_topk=cfg.max_topk,
            default_topk=cfg.default_topk, max_batch=cfg.max_batch)
        limits = ServiceLimits(max_queries=max_queries or base.max_queries,
                               max_query_chars=max_query_chars or base.max_query_chars,
                               max_topk=max_topk or base.max_topk, default_topk=topk or base.default_topk,
                               max_batch=base.max_batch)
        host = host or (cfg.host if cfg else "127.0.0.1")
        port = port or (cfg.port if cfg else 8000)
        exposure = exposure_for(host, read_token(token_file), allowed_host, docs)  # before any index is loaded
        for i in index:
            _local_input(i, "index (--index)", "build it with its stage (`dvc repro index_bm25@bm25s`, "
                         "`index_dense`) or `dvc pull` it")
        retriever = open_retriever(index, corpus=corpus, encoder=encoder, convention=convention, device=device)
    except (ParamsError, DataError, ValueError, RuntimeError) as e:
        raise fail(e)
    auth = "bearer token required" if exposure.token else "no token"
    typer.echo(f"serving {', '.join(map(str, index))} on http://{host}:{port} (POST /retrieve, POST /search; "
               f"{auth})", err=True)
    serve(retriever, host=host, port=port, limits=limits, name="+".join(p.name for p in index), exposure=exposure)


def _local_input(path: str | Path, what: str, fix: str) -> None:
    """Refuse, naming it and the fix, a local input that is not there (a model directory or index a stage writes);
    hub ids (`hf:`), URLs and retrieval services are left to their loaders."""
    from ragteam.io import DataError

    text = str(path)
    if Path(text).exists():
        return
    # a path into the project's outputs, or one that is plainly a path; `org/name` is a hub id for its loader
    if Path(text).parts[0] in ("models", "data", "results") or text.startswith(("/", ".", "~")):
        raise DataError(f"{text}: no such {what}: {fix}")


@app.command("ask")
def ask(
    questions: list[str] = typer.Argument(..., help="one or more questions (answered together, batched)"),
    system: Optional[str] = typer.Option(None, help="a system of eval.systems in params.yaml (default: MAPS)"),
    params: Path = typer.Option(Path("params.yaml"), help="params file (llm, eval and the workflow sections)"),
    index: Optional[str] = typer.Option(None, help="index dir or http(s) retrieval service (default: eval.retriever)"),
    calls: bool = typer.Option(False, "--calls", help="also print every agent call"),
    as_json: bool = typer.Option(False, "--json", help="print the Episodes as JSONL instead"),
) -> None:
    """Answer QUESTIONS with one configured system (MAPS by default): answers, rounds, cost, optionally every call."""
    from ragteam.config import ParamsError, load_params, parse_section
    from ragteam.eval.evaluate import EvalConfig, WorkflowConfigs, make_team, row_kind, run_system
    from ragteam.systems.registry import frozen_role_models
    from ragteam.systems.maps import SYSTEM as MAPS
    from ragteam.io import DataError
    from ragteam.llm import EnginePool, LLMConfig

    system = system or MAPS.name
    try:
        p = load_params(params)
        llm = parse_section(p, "llm", LLMConfig)
        ev = parse_section(p, "eval", EvalConfig)
        if system not in ev.systems:
            raise ParamsError(f"--system {system!r} is not in eval.systems ({', '.join(ev.systems)})")
        spec, retriever = ev.systems[system], None
        _local_input(llm.model, "model directory (llm.model)", "run `dvc repro prepare_models` (or `dvc pull "
                     f"{llm.model}`) first")
        if spec.model:
            _local_input(spec.model, f"model directory (eval.systems.{system}.model)", "run the stage that trains "
                         f"it (`dvc repro evaluate` runs every one) or `dvc pull {spec.model}` first")
        if row_kind(spec.workflow).retrieves:
            from ragteam.retrieval import open_retriever

            _local_input(index or ev.retriever, "index", "build it with `dvc repro index_bm25@bm25s` (the "
                         "default's; dense: index_dense) or `dvc pull` it, or name another with --index")
            retriever = open_retriever(index or ev.retriever)
        cfgs = WorkflowConfigs.from_params(p, ev.baselines)
        team = make_team(EnginePool(llm), spec, ev.agents, llm.model, llm.sampling, frozen_role_models(cfgs))
        rows = [{"id": str(i), "question": q, "golden_answers": []} for i, q in enumerate(questions)]
        episodes = run_system(spec, rows, team, retriever, cfgs, system)
    except (ParamsError, DataError, ValueError, RuntimeError, OSError) as e:
        raise fail(e)
    for ep in episodes:
        if as_json:
            typer.echo(ep.model_dump_json())
            continue
        c = ep.cost
        rounds = f", {ep.meta['rounds']} round(s), {ep.meta['stop_reason']}" if "rounds" in ep.meta else ""
        if "turns" in ep.meta.get("workflow", {}):
            rounds = f", {ep.meta['workflow']['turns']} turn(s), {ep.meta['stop_reason']}"
        typer.echo(f"Q: {ep.question}\nA: {ep.final_answer}\n   {system}{rounds}; {int(c['llm_calls'])} LLM calls, "
                   f"{int(c['prompt_tokens'] + c['completion_tokens'])} tokens, {int(c['retrieval_calls'])} "
                   f"retrievals, {c['seconds']:.1f} s")
        for call in ep.calls if calls else []:
            status = f"FORMAT ERROR {call.format_error}" if call.format_error else f"-> {call.parsed!r}"
            typer.echo(f"   [{call.role}] {call.response.strip()[:200]!r} {status}")


@app.command("oracle-traces")
def oracle_traces(
    system: str = typer.Argument(..., help="a joint system with an oracle (ragteam.systems.registry.REGISTRY)"),
    pool: Path = typer.Option(Path("data/prepared/train/pool.jsonl"), help="training pool (FlashRAG QA rows)"),
    corpus: Path = typer.Option(Path("data/prepared/corpus.jsonl"), help="corpus JSONL (the gold passages)"),
    index: Optional[str] = typer.Option(None, help="index dir or http(s) service (default: joint.retriever)"),
    benchmarks: Path = typer.Option(Path("data/prepared/benchmarks"), help="evaluation benchmarks: refused"),
    model: Optional[Path] = typer.Option(None, help="model dir whose tokenizer counts tokens (default: llm.model)"),
    params: Path = typer.Option(Path("params.yaml"), help="params file (llm.sampling, the system's section)"),
    out: Optional[Path] = typer.Option(None, help="output dir (default: data/warmup/<system>)"),
    max_questions: int = typer.Option(0, help="first n questions of the pool; 0 = all"),
) -> None:
    """Write SYSTEM's oracle traces (issue 25 §1): OUT/traces.jsonl, one validated row per role call, and
    OUT/summary.json (yield, rows per role, longest output per role against its budget)."""
    from transformers import AutoTokenizer

    from ragteam.config import load_params
    from ragteam.retrieval import open_retriever
    from ragteam.systems.registry import oracle_system
    from ragteam.warmup.traces import write_system_traces

    try:
        p = load_params(params)
        player = oracle_system(system, p)   # an unknown system fails here, before the tokenizer and index load
        _local_input(model or p["llm"]["model"], "model directory (--model, default llm.model)",
                     "run `dvc repro prepare_models` (or `dvc pull models/llm`) first")
        _local_input(index or p["joint"]["retriever"], "index (--index, default joint.retriever)",
                     "build it with `dvc repro index_bm25@bm25s` or `dvc pull` it")
        tok = AutoTokenizer.from_pretrained(str(model or p["llm"]["model"]))
        retriever = open_retriever(index or p["joint"]["retriever"], corpus=corpus)
        summary = write_system_traces(player, pool, corpus, retriever, benchmarks, tok, p,
                                      out or Path("data/warmup") / system, max_questions)
    except (ValueError, OSError) as e:
        raise fail(e)
    typer.echo(f"{system}: {summary['complete']}/{summary['questions']} questions traced (yield {summary['yield']}), "
               f"{summary['rows']} rows; dropped {summary['dropped'] or 'none'}")


# the views (ragteam/views): each command imports what it needs when it runs
app.command("experiments")(views.experiments_cmd)
app.command("dag")(views.dag_cmd)
app.command("times")(views.times_cmd)
app.command("plots-template")(views.plots_template_cmd)


def main() -> None:  # pragma: no cover
    app()


if __name__ == "__main__":  # pragma: no cover
    main()
