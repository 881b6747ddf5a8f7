"""Which environment a stage's engines need: a stage whose params put it on vLLM re-runs itself in the worker
environment (`.venv-worker`), where vLLM is installed. What a stage records of the environment that ran it is
`ragteam.environment`."""
from __future__ import annotations

import sys
from typing import Any

WORKER_PYTHON = ".venv-worker/bin/python"   # scripts/setup_worker.sh builds it; RAGTEAM_WORKER_PYTHON overrides
_REEXEC_MARK = "RAGTEAM_IN_WORKER_ENV"


def vllm_reasons(params: dict[str, Any], stage: str, system: str | None = None, rollouts_only: bool = False
                 ) -> list[str]:
    """The params that make `stage` need vLLM: its engine (`llm.stages.<stage>`, else `llm.backend`; see
    `ragteam.llm.stage_backend`), a `rollout_backend: vllm` anywhere in the stage's own section (the GRPO runs of
    train_answer and train_query), and for a joint training stage (`system`) one in joint.ppo or joint.<system>.ppo.
    `rollouts_only`: the stage has no engine but its rollouts' (train_answer), so `llm.backend` does not count.
    [] = the stage runs where it is."""
    from ragteam.llm import stage_backend

    llm = params.get("llm") or {}
    stages = llm.get("stages") or {}
    reasons = []
    if not rollouts_only and stage_backend(llm.get("backend", "hf"), stages, stage) == "vllm":
        family = stage.rsplit("_", 1)[0] if stage.startswith("train_joint_") else None
        key = stage if stage in stages else family if family in stages else None
        reasons.append(f"llm.stages.{key}: vllm" if key else "llm.backend: vllm")
    # a GRPO trainer's groups sampled by vLLM (train_answer.stage1 / stage2, train_query.grpo)
    reasons += [f"{path}.rollout_backend: vllm" for path in _vllm_rollouts(params.get(stage), stage)]
    if system is not None:
        joint = params.get("joint") or {}
        own = ((joint.get(system) or {}).get("ppo") or {}).get("rollout_backend")
        shared = (joint.get("ppo") or {}).get("rollout_backend")
        if (own or shared) == "vllm":
            where = f"joint.{system}.ppo" if own else "joint.ppo"
            reasons.append(f"{where}.rollout_backend: vllm")
    return reasons


def _vllm_rollouts(section: Any, path: str) -> list[str]:
    """Dotted paths under `path` of the sections in `section` that set `rollout_backend: vllm`."""
    if not isinstance(section, dict):
        return []
    own = [path] if section.get("rollout_backend") == "vllm" else []
    return own + [p for k, v in section.items() for p in _vllm_rollouts(v, f"{path}.{k}")]


def ensure_engine_environment(stage: str, params: dict[str, Any], system: str | None = None,
                              rollouts_only: bool = False) -> None:
    """Run the calling stage in the environment its engines need, so `dvc repro` and the Prefect flow start every
    stage the same way (`python -m stages.<stage>` in the orchestrator environment) whatever the params.

    Where the params ask for vLLM (`vllm_reasons`) and this interpreter cannot import it, the process replaces
    itself (exec, same pid, same arguments, same working directory and stdout) with the worker environment's
    interpreter (`RAGTEAM_WORKER_PYTHON`, default `.venv-worker/bin/python`), which runs the stage from the start. A
    missing worker environment ends the stage with one line saying how to build it, before anything is written.
    Elsewhere: nothing."""
    import importlib.util
    import os

    reasons = vllm_reasons(params, stage, system, rollouts_only)
    if not reasons or importlib.util.find_spec("vllm") is not None:
        return
    py = os.environ.get("RAGTEAM_WORKER_PYTHON") or WORKER_PYTHON
    if os.environ.get(_REEXEC_MARK):
        sys.exit(f"{stage} FAILED: {', '.join(reasons)}, but the worker environment ({sys.executable}) cannot "
                 "import vllm: rebuild it with `make setup-worker`")
    if not os.path.isfile(py) or not os.access(py, os.X_OK):
        sys.exit(f"{stage} FAILED: {', '.join(reasons)} needs vLLM, which only the worker environment has, and "
                 f"{py} does not exist: build it with `make setup-worker` (or point RAGTEAM_WORKER_PYTHON at one)")
    print(f"{stage}: {', '.join(reasons)}: running in the worker environment ({py})", flush=True)
    sys.stderr.flush()
    env = {**os.environ, _REEXEC_MARK: "1"}
    for var, sub in (("VLLM_CACHE_ROOT", "cache"), ("VLLM_CONFIG_ROOT", "config")):   # vLLM's state stays in the
        env.setdefault(var, os.path.abspath(os.path.join(".vllm-cache", "stages", sub)))  # workspace, not ~/.cache
    args = sys.orig_argv[1:]
    if args[:1] == ["-m"] and len(args) > 1:      # a stage module: run it under worker_main, which closes the
        args = ["-m", "ragteam.llm.worker_main", *args[1:]]   # engines when it ends (see there why)
    os.execve(py, [py, *args], env)
