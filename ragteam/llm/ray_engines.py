"""vLLM engines as Ray actors: `llm.vllm.ray.engines` engines of one model behind the same interface as one
`VLLMEngine`, for users who outgrow one engine (OpenRLHF and verl put their rollout engines on Ray the same way).

- A call's prompts are spread over the engines (prompt i to engine i mod N, so long and short prompts mix) and come
  back in the caller's order. A seeded call seeds each prompt by its index in the whole call
  (`VLLMEngine.generate(positions=...)`), so a prompt draws the same samples on N engines as on one.
- A trainer's policy reaches every engine: `load_lora` / `load_weights` are checked here first (a bad adapter fails
  with its path before any engine sees it) and then broadcast; the paths must be readable by every actor (on a
  local cluster they are; on a multi-node cluster put the workdir on a shared filesystem).
- `VLLMPolicy` (`ragteam.llm.vllm_backend`) drives this class exactly as it drives one engine.

Where the cluster comes from: `llm.vllm.ray.address` None starts a local one in this process (`ray.init`, its state
under `llm.vllm.ray.temp_dir` in the workspace, stopped when the last engine set that started it closes); an address
joins an existing cluster, which this code never stops. On the CPU build each actor binds its own cores
(`VLLM_CPU_OMP_THREADS_BIND`, `threads_per_engine` each; by default this machine's cores split evenly), otherwise
both engines would spin on the same cores. On a GPU host each actor asks Ray for `tensor_parallel_size` GPUs.

A dead actor (killed, out of memory) is `EngineDead`, naming the model and the actor, like a dead engine core.
"""
from __future__ import annotations

import os
import sys
from pathlib import Path

from ragteam.llm import Completion, EngineConfig, EngineDead, Messages, SamplingConfig
from ragteam.llm.vllm_backend import _LIVE, AdapterSwitch, check_adapter_dir, check_weights_dir, lora_rank_slot
from ragteam.timing import timed

_STARTED_HERE: dict[str, int] = {"open": 0}   # engine sets using the local cluster this process started


class _EngineActor:
    """One VLLMEngine inside a Ray actor process (the class Ray wraps with `ray.remote`)."""

    def __init__(self, model_path: str, cfg_json: str, max_lora_rank: int | None):
        from ragteam.llm import EngineConfig
        from ragteam.llm.vllm_backend import VLLMEngine

        self.engine = VLLMEngine(model_path, EngineConfig.model_validate_json(cfg_json), max_lora_rank=max_lora_rank)

    def metadata(self) -> dict:
        return {**self.engine.metadata, "pid": os.getpid(),
                "omp_threads_bind": os.environ.get("VLLM_CPU_OMP_THREADS_BIND")}

    def generate(self, prompts, sampling_json: str, positions, lora_on: bool):
        from ragteam.llm import SamplingConfig

        sampling = SamplingConfig.model_validate_json(sampling_json)
        if lora_on:
            return self.engine.generate(prompts, sampling, positions=positions)
        with self.engine.adapter_off():
            return self.engine.generate(prompts, sampling, positions=positions)

    def load_lora(self, path: str) -> None:
        self.engine.load_lora(path)

    def unload_lora(self) -> None:
        self.engine.unload_lora()

    def load_weights(self, path: str) -> None:
        self.engine.load_weights(path)

    def serve_checkpoint(self, path: str) -> None:
        self.engine.serve_checkpoint(path)

    def close(self) -> None:
        self.engine.close()


def core_sets(engines: int, threads: int | None, cores: list[int]) -> list[list[int]]:
    """The cores each of `engines` CPU engines binds: `threads` each (default: `cores` split evenly, at least one),
    taken in order and wrapping around when the engines ask for more cores than there are."""
    per = threads or max(1, len(cores) // engines)
    return [[cores[(i * per + k) % len(cores)] for k in range(per)] for i in range(engines)]


class RayEngines(AdapterSwitch):
    """`cfg.vllm.ray.engines` vLLM engines on `model_path`, each a Ray actor, behind the Engine interface and the
    weight-sync verbs of `VLLMEngine` (`load_lora`, `unload_lora`, `load_weights`, `adapter_off`, `close`)."""

    @timed("engine_start")
    def __init__(self, model_path: str, cfg: EngineConfig, max_lora_rank: int | None = None):
        try:
            import ray
        except ImportError as e:
            raise RuntimeError(f"llm.vllm.ray.engines {cfg.vllm.ray.engines} needs Ray, which is not installed in "
                               f"{sys.prefix}: it is in the worker environment (`make setup-worker`)") from e
        self._ray, self.model_path = ray, str(model_path)
        opts = cfg.vllm.ray
        self._started_cluster = False
        if not ray.is_initialized():
            if opts.address is None:
                temp = Path(opts.temp_dir).resolve()
                temp.mkdir(parents=True, exist_ok=True)
                ray.init(num_cpus=len(os.sched_getaffinity(0)), include_dashboard=False, _temp_dir=str(temp),
                         log_to_driver=True, configure_logging=False)
                self._started_cluster = True
                _STARTED_HERE["open"] += 1
            else:
                try:
                    ray.init(address=opts.address, log_to_driver=True, configure_logging=False)
                except Exception as e:  # noqa: BLE001 (Ray's connection errors have many types)
                    raise RuntimeError(f"llm.vllm.ray.address {opts.address!r}: cannot join that Ray cluster "
                                       f"({type(e).__name__}: {e})") from e
        elif _STARTED_HERE["open"]:
            self._started_cluster = True
            _STARTED_HERE["open"] += 1
        self.max_lora_rank = lora_rank_slot(max_lora_rank) if max_lora_rank else None
        cuda = cfg.device == "cuda" or (cfg.device == "auto" and _has_cuda())
        binds = (core_sets(opts.engines, opts.threads_per_engine, sorted(os.sched_getaffinity(0)))
                 if not cuda and opts.address is None else [None] * opts.engines)
        actor_cls = ray.remote(_EngineActor)
        # the engine settings only (a stage hands over its LLMConfig, whose roles and sampling the actors don't need)
        cfg_json = EngineConfig.model_validate(cfg.model_dump(include=set(EngineConfig.model_fields))).model_dump_json()
        self._actors = []
        for i, cores in enumerate(binds):
            env = {"VLLM_CPU_NUM_OF_RESERVED_CPU": "0"}
            if cores is not None:
                env["VLLM_CPU_OMP_THREADS_BIND"] = ",".join(map(str, cores))
            for var in ("VLLM_CPU_KVCACHE_SPACE", "VLLM_CACHE_ROOT", "VLLM_CONFIG_ROOT", "VLLM_LOGGING_LEVEL",
                        "HF_HUB_OFFLINE"):
                if var in os.environ:
                    env[var] = os.environ[var]
            self._actors.append(actor_cls.options(
                name=None, num_cpus=len(cores) if cores else (opts.threads_per_engine or 1),
                num_gpus=cfg.vllm.tensor_parallel_size if cuda else 0,
                runtime_env={"env_vars": env}).remote(self.model_path, cfg_json, self.max_lora_rank))
        self._lora_on, self._closed = True, False
        _LIVE.add(self)
        try:
            metas = self._all("metadata")     # waits for every engine to have started
        except BaseException:
            self.close()
            raise
        self.metadata = {**metas[0], "engine": "vllm-ray", "engines": len(self._actors),
                         "ray_version": ray.__version__, "ray_address": opts.address or "local",
                         "omp_threads_bind": [m["omp_threads_bind"] for m in metas]}
        self.metadata.pop("pid", None)

    # -- calls to the actors --------------------------------------------------------------------------------------
    def _get(self, refs, what: str):
        """ray.get with Ray's errors turned into the project's: a dead actor is EngineDead, an engine's own
        error is re-raised as itself (ValueError for a bad adapter, EngineDead for a dead core)."""
        ray = self._ray
        try:
            return ray.get(refs)
        except ray.exceptions.RayActorError as e:
            lines = [ln.strip() for ln in str(e).splitlines() if ln.strip()]
            cause = lines[-1] if lines else type(e).__name__      # the creation task's exception, when it was that
            raise EngineDead(f"a Ray actor of the vLLM engines on {self.model_path} has died during {what} "
                             f"({type(e).__name__}: {cause[:300]}); the engines cannot be used again: restart the "
                             "stage") from e
        except ray.exceptions.RayTaskError as e:
            cause = e.as_instanceof_cause() if hasattr(e, "as_instanceof_cause") else e
            inner = getattr(e, "cause", None)
            if isinstance(inner, (EngineDead, ValueError, RuntimeError)):
                raise type(inner)(str(inner)) from e
            raise RuntimeError(f"vLLM engines on {self.model_path}, {what}: {cause}") from e

    def _all(self, method: str, *args):
        if self._closed:
            raise EngineDead(f"the vLLM engines on {self.model_path} were closed")
        return self._get([getattr(a, method).remote(*args) for a in self._actors], method)

    # -- the Engine interface ---------------------------------------------------------------------------------------
    @timed("generation")
    def generate(self, prompts: list[Messages], sampling: SamplingConfig) -> list[list[Completion]]:
        if self._closed:
            raise EngineDead(f"the vLLM engines on {self.model_path} were closed")
        n = len(self._actors)
        shards = [list(range(k, len(prompts), n)) for k in range(n)]
        sj = sampling.model_dump_json()
        refs, used = [], []
        for actor, idx in zip(self._actors, shards):
            if idx:
                refs.append(actor.generate.remote([prompts[i] for i in idx], sj, idx, self._lora_on))
                used.append(idx)
        out: list[list[Completion]] = [[] for _ in prompts]
        for idx, res in zip(used, self._get(refs, "generate")):
            for i, r in zip(idx, res):
                out[i] = r
        return out

    # -- weights: checked here, then broadcast --------------------------------------------------------------------
    def load_lora(self, adapter_dir: str | Path) -> None:
        if not self.max_lora_rank:
            raise RuntimeError(f"vLLM engines on {self.model_path} were started without LoRA (max_lora_rank)")
        d = check_adapter_dir(adapter_dir, self.max_lora_rank)
        self._all("load_lora", str(d.resolve()))

    def unload_lora(self) -> None:
        self._all("unload_lora")

    def load_weights(self, weights_dir: str | Path) -> None:
        d = check_weights_dir(weights_dir)
        self._all("load_weights", str(d.resolve()))

    def serve_checkpoint(self, weights_dir: str | Path) -> None:
        """Every engine serves another checkpoint from now on (`VLLMEngine.serve_checkpoint`)."""
        self._all("serve_checkpoint", str(check_weights_dir(weights_dir).resolve()))
        self.model_path = str(weights_dir)
        self.metadata = {**self.metadata, "model": self.model_path}

    def close(self) -> None:
        """Stop every engine and its actor; the local cluster this process started stops with the last set."""
        if self._closed:
            return
        self._closed = True
        _LIVE.discard(self)
        ray = self._ray
        for a in self._actors:
            try:
                ray.get(a.close.remote(), timeout=60)
            except Exception:  # noqa: BLE001 (a dead actor is as good as closed)
                pass
            try:
                ray.kill(a)
            except Exception:  # noqa: BLE001
                pass
        if self._started_cluster:
            _STARTED_HERE["open"] -= 1
            if _STARTED_HERE["open"] == 0 and ray.is_initialized():
                ray.shutdown()


def _has_cuda() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return bool(torch.cuda.is_available())
