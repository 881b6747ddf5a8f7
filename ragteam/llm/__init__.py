"""LLM engines: batched chat generation behind one small interface, chosen by params (`hf` or `vllm`).

A workflow hands an engine every prompt waiting at the same step at once (`Engine.generate`); the engine decides how
to batch them on its device. `Team` maps agent roles to engines and sampling settings; `EnginePool` loads each
distinct model path once, so three MAPS agents that share a checkpoint share one copy in memory.
"""
from __future__ import annotations

import hashlib
import json
import re
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Literal, Protocol

from pydantic import Field, field_validator

from ragteam.config import Strict

Messages = list[dict[str, str]]


class SamplingConfig(Strict):
    """Generation settings of one role. temperature 0 = greedy; `stop` strings end a completion (not included).

    `seed`: the seed of one engine call (hf: the torch RNG is seeded with it for that call; vLLM: prompt i's request
    is seeded with `call_seed(seed, i)`). A seeded `Team` sets it on every sampled call (`call_seed`); None: the
    engine's `EngineConfig.seed` (hf: every such call; vLLM: its generator, seeded once at start-up)."""

    max_new_tokens: int = Field(32, ge=1)
    temperature: float = Field(0.0, ge=0.0)
    top_p: float = Field(1.0, gt=0.0, le=1.0)
    n: int = Field(1, ge=1)
    stop: list[str] = Field(default_factory=list)
    seed: int | None = None
    min_new_tokens: int = Field(0, ge=0)   # EOS cannot end a completion before n new tokens
    # guided decoding (vLLM's structured outputs, xgrammar): the completion is constrained to match this regular
    # expression. For inference and for measuring what a format costs a model (the `<system>_grammar` rows); vllm
    # only (the hf engine refuses it) and never for a trainer's policy samples (`ragteam.llm.policy.Rollouts`
    # refuses it), since it changes the distribution the trainer's log-probs are computed under
    regex: str | None = None

    @field_validator("regex")
    @classmethod
    def _compiles(cls, v: str | None) -> str | None:
        if v is not None:
            try:
                re.compile(v)
            except re.error as e:
                raise ValueError(f"regex {v!r} does not compile: {e}") from None
        return v


class AnswerFallback(Strict):
    """What an answering role does when its output, continued (`agents.core.continue_lead_ins`), still gives no
    answer (a lead-in stub, an empty output, a copied passage header): `samples` fresh completions of the same prompt
    in one engine call at `temperature` / `top_p`, the first that parses is the answer
    (`agents.core.resample_no_answers`). 0 samples: off, the call keeps its no answer. `seed`: the draws' seed
    (None: `llm.seed`), so a rerun draws the same samples. Inference only: trainers' policy samples are scored as
    drawn (a stub keeps its penalty), and a Team without it (every trainer's rollouts) never resamples.

    Why: a trained MAPS answer agent's greedy output was a stub on 34 % of real held-out questions; continuing it
    answered 79 % of them, 4 draws at T 0.8 all of them (studies/answer_silence/notes.md)."""

    samples: int = Field(4, ge=0)
    temperature: float = Field(0.8, gt=0.0)
    top_p: float = Field(1.0, gt=0.0, le=1.0)
    seed: int | None = None


class RayOptions(Strict):
    """vLLM engines as Ray actors (`ragteam.llm.ray_engines`): `engines` > 1 puts that many engines of each model
    behind one Engine, a call's prompts spread over them and a policy's weights broadcast to all."""

    engines: int = Field(1, ge=1)           # 1: one engine in this process, no Ray
    address: str | None = None              # an existing cluster (`ray://host:10001`, `auto`); None: a local one
    threads_per_engine: int | None = Field(None, ge=1)  # CPU build: cores per engine (None: this machine's, split)
    temp_dir: str = ".ray"                  # a local cluster's state (sockets, logs), inside the workspace


class VLLMOptions(Strict):
    gpu_memory_utilization: float = Field(0.85, gt=0.0, le=1.0)  # per engine: with k distinct paths use <= 0.9/k
    max_model_len: int | None = None
    tensor_parallel_size: int = Field(1, ge=1)
    enable_prefix_caching: bool = True  # role prompts and retrieved docs are shared prefixes
    # no torch.compile / CUDA graphs: on 2 CPU cores the engine starts in ~14 s instead of ~45 s and generates ~12 %
    # slower (notes/stack.md §11): right for tests and short stages
    enforce_eager: bool = False
    # engines one stage keeps started at once (EnginePool closes the least recently used first): each vLLM engine on
    # the CPU holds its model, its KV cache (VLLM_CPU_KVCACHE_SPACE GiB) and two processes, measured 4.6 GB for
    # SmolLM2 with 2 GiB of KV, and stage evaluate asks for up to 8 checkpoints. None: no limit
    max_engines: int | None = Field(3, ge=1)
    ray: RayOptions = RayOptions()


class EngineConfig(Strict):
    """How models are loaded (the `llm` section of params.yaml minus the per-role parts)."""

    backend: Literal["hf", "vllm"] = "hf"
    device: Literal["auto", "cpu", "cuda"] = "auto"
    dtype: Literal["auto", "float32", "bfloat16", "float16"] = "float32"
    threads: int | None = Field(None, ge=1)  # torch CPU threads (hf); None leaves torch's default
    batch_size: int = Field(16, ge=1)        # hf: prompts per forward pass (a step's prompts are split into these)
    prefix_cache_tokens: int = Field(0, ge=0)  # hf on CPU: KV of recent prompts kept for prefix reuse (0 = off)
    seed: int = 0
    vllm: VLLMOptions = VLLMOptions()


class LLMConfig(EngineConfig):
    """The `llm` section: engine settings, the base model every role uses, and per-role sampling."""

    model: str = "models/llm"
    sampling: dict[str, SamplingConfig] = Field(default_factory=dict)  # role -> settings; "default" for the rest
    # the engine of single stages, overriding `backend` there: a stage name (synthesize, label_judge, evaluate,
    # evaluate_agents, train_query) or train_joint (every joint system's frozen roles; the policy's own rollouts
    # follow joint.ppo.rollout_backend), chosen from benchmarks/engines.py's table
    stages: dict[str, Literal["hf", "vllm"]] = Field(default_factory=dict)
    answer_fallback: AnswerFallback = AnswerFallback()   # answering roles at inference: no answer -> fresh samples

    def for_stage(self, stage: str) -> LLMConfig:
        """These settings with the engine `stages` names for `stage` (a name, or its family: `train_joint` for
        `train_joint_mask`)."""
        backend = stage_backend(self.backend, self.stages, stage)
        return self if backend == self.backend else self.model_copy(update={"backend": backend})


def stage_backend(default: str, stages: Mapping[str, str], stage: str) -> str:
    """The engine of `stage`: its own entry in `llm.stages`, else its family's (the name before `_<system>` of a
    joint stage: train_joint_mask -> train_joint), else `default` (`llm.backend`)."""
    if stage in stages:
        return stages[stage]
    family = stage.rsplit("_", 1)[0] if stage.startswith("train_joint_") else None
    return stages.get(family, default) if family else default


@dataclass(frozen=True)
class Completion:
    """One sampled completion: its text, and the token ids the engine saw and sampled (token in, token out).

    Trainers score `token_ids`, never a re-tokenisation of `text`: decoding and re-encoding can merge or split tokens
    (e.g. a sampled `<` `/` `search` `>` re-encodes as `</` `search` `>`), which would train on sequences the policy
    never sampled. `token_ids` run up to and including EOS when generation stopped on it, and through the token that
    completed a stop string when one ended it: those tokens were sampled (the decision to stop is in them), though
    `text` is cut before the stop string and any characters of that last token beyond it are in the ids only.
    """

    text: str
    prompt_tokens: int
    completion_tokens: int
    finish_reason: str  # "stop" (EOS or a stop string) | "length"
    stop_reason: str | None = None  # the stop string that ended the text (not included in it); None: EOS or length
    prompt_ids: tuple[int, ...] | None = None  # the prompt as the engine tokenised it (chat template applied)
    token_ids: tuple[int, ...] | None = None   # the sampled ids (see above); None: an engine that does not say
    logprobs: tuple[float, ...] | None = None  # the engine's log-prob of each sampled id (vLLM); None: not computed
    lead_in: str | None = None  # the answer-less lead-in this completion continues (agents.core.continue_lead_ins)


class EngineDead(RuntimeError):
    """An engine's process died (killed, out of memory, or a fatal error in it; vLLM's engine core): it cannot be
    used again. Stages end with one line naming it, their outputs untouched (they are written atomically)."""


class Engine(Protocol):
    model_path: str

    def generate(self, prompts: list[Messages], sampling: SamplingConfig) -> list[list[Completion]]:
        """One list of `sampling.n` completions per prompt, in prompt order."""
        ...


def call_seed(*parts: object) -> int:
    """A 31-bit seed derived from `parts` (e.g. the run seed, the step, a call counter): distinct parts give unrelated
    streams, equal parts the same one. A hash, not arithmetic, so (seed, step, call) triples never collide by
    accident; 31 bits fit every engine's seed type."""
    digest = hashlib.blake2b(":".join(map(str, parts)).encode(), digest_size=4).digest()
    return int.from_bytes(digest, "little") & 0x7FFFFFFF


def find_stop(text: str, stop: list[str]) -> tuple[str, str | None]:
    """(`text` cut before its earliest stop string, that stop string) or (`text`, None) when none occurs."""
    hits = [(i, s) for s in stop if s for i in [text.find(s)] if i >= 0]
    if not hits:
        return text, None
    cut, s = min(hits, key=lambda h: h[0])
    return text[:cut], s


def truncate_at_stop(text: str, stop: list[str]) -> tuple[str, bool]:
    """Cut `text` before the earliest stop string (vLLM's default: the stop string is not returned)."""
    cut, s = find_stop(text, stop)
    return cut, s is not None


def continues_assistant(messages: Messages) -> bool:
    """True when the last message is a partial assistant turn that generation must continue (multi-turn agents
    whose trajectory is one growing assistant message, e.g. QAgent); else a new assistant turn is opened."""
    return bool(messages) and messages[-1].get("role") == "assistant"


def chat_text(tokenizer, messages: Messages) -> str:
    """The prompt text of `messages` under the tokenizer's chat template, ready for generation.

    A final assistant message is continued: rendered without its end-of-turn token (transformers'
    `continue_final_message`), so the model goes on writing inside that turn; otherwise the generation prompt of a
    new assistant turn is added.
    """
    if continues_assistant(messages):
        return tokenizer.apply_chat_template(messages, tokenize=False, continue_final_message=True,
                                             add_generation_prompt=False)
    return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)


def load_engine(model_path: str, cfg: EngineConfig) -> Engine:
    if cfg.backend == "hf":
        from ragteam.llm.hf import HFEngine

        return HFEngine(model_path, cfg)
    if cfg.vllm.ray.engines > 1:
        from ragteam.llm.ray_engines import RayEngines

        return RayEngines(model_path, cfg)
    from ragteam.llm.vllm_backend import VLLMEngine

    return VLLMEngine(model_path, cfg)


# config.json keys that describe how a checkpoint was saved, not the network an engine builds from it (training with
# gradient checkpointing saves use_cache false)
_SAVE_ONLY_CONFIG_KEYS = ("_name_or_path", "transformers_version", "use_cache")
# files of a checkpoint dir that an engine's behaviour does not depend on, besides the weights: the model card, the
# prepared model's manifest, the trainer's run fingerprint (ragteam.models.MANIFEST, ragteam.train.checkpoints)
_NOT_BEHAVIOUR = ("README.md", "ragteam-manifest.json", "ragteam-train.json")
_WEIGHTS = (".safetensors", ".bin", ".pt", ".pth", ".gguf", ".safetensors.index.json", ".bin.index.json")


def swap_blocker(loaded: str, wanted: str) -> str | None:
    """Why an engine started on checkpoint dir `loaded` cannot serve checkpoint dir `wanted` by reloading weights
    in place (None: it can): the architecture (config.json, bar `_SAVE_ONLY_CONFIG_KEYS`) and generation defaults
    (generation_config.json, bar its transformers_version) must be equal, and every other file but the weights and
    `_NOT_BEHAVIOUR` (tokenizer, chat templates, whatever format they come in) the same bytes, so that the reloaded
    engine generates what one started on `wanted` would (tests/worker checks the tokens). Unseeded sampling draws
    from the engine's running random state, as on any engine that has generated before."""
    a, b = Path(loaded), Path(wanted)

    def parsed(d: Path, name: str) -> dict | None:
        try:
            cfg = json.loads((d / name).read_text(encoding="utf-8"))
        except FileNotFoundError:
            return None
        except (OSError, ValueError) as e:
            raise ValueError(f"{d / name}: not readable JSON ({e})") from None
        return {k: v for k, v in cfg.items() if k not in _SAVE_ONLY_CONFIG_KEYS}

    if parsed(a, "config.json") is None or parsed(b, "config.json") is None:
        return "no config.json in both"
    for name in ("config.json", "generation_config.json"):
        if parsed(a, name) != parsed(b, name):
            return f"{name} differs"
    def others(d: Path) -> set[str]:
        return {f.relative_to(d).as_posix() for f in d.rglob("*") if f.is_file()
                and f.name not in ("config.json", "generation_config.json", *_NOT_BEHAVIOUR)
                and not f.name.endswith(_WEIGHTS)}

    for name in sorted(others(a) | others(b)):
        fa, fb = a / name, b / name
        if fa.is_file() != fb.is_file() or (fa.is_file() and fa.read_bytes() != fb.read_bytes()):
            return f"{name} differs"
    return None


class EnginePool:
    """Loads each distinct model path once (lazily, on first use) and hands out Teams that share the engines.

    With the vllm backend at most `cfg.vllm.max_engines` engines are started at once. One more checkpoint then takes
    the place of the least recently used: when both are the same architecture with the same tokenizer
    (`swap_blocker`), that engine reloads the new weights in place (`serve_checkpoint`: about a second for SmolLM2
    on the CPU, where closing an engine and starting another takes about 20 s); otherwise it is closed and a new one
    started. A Team asks the pool on every call, so a checkpoint swapped or closed out is brought back when next
    needed. `started`, `swapped` and `closed` count those events (stage evaluate prints them)."""

    def __init__(self, cfg: EngineConfig, loader: Callable[[str, EngineConfig], Engine] = load_engine):
        self.cfg, self._loader, self._engines = cfg, loader, {}
        self.started = self.swapped = self.closed = 0

    def get(self, path: str) -> Engine:
        if path in self._engines:
            self._engines[path] = self._engines.pop(path)           # most recently used last
            return self._engines[path]
        cap = self.cfg.vllm.max_engines if self.cfg.backend == "vllm" else None
        while cap is not None and len(self._engines) >= cap:
            old_path = next(iter(self._engines))
            try:
                blocker = swap_blocker(old_path, path) if hasattr(self._engines[old_path], "serve_checkpoint") \
                    else "the engine cannot reload weights"
            except ValueError as e:     # an unreadable config: no swap; starting an engine on it reports it
                blocker = str(e)
            old = self._engines.pop(old_path)
            if blocker is None:
                try:
                    old.serve_checkpoint(path)
                except BaseException:   # the reload failed (maybe half-way): the engine is closed, not reused
                    if hasattr(old, "close"):
                        old.close()
                    self.closed += 1
                    raise
                self.swapped += 1
                self._engines[path] = old
                return old
            if hasattr(old, "close"):
                old.close()
            self.closed += 1
        self._engines[path] = self._loader(path, self.cfg)
        self.started += 1
        return self._engines[path]

    def close(self) -> None:
        """Close every engine (vLLM's processes); the pool stays usable."""
        for e in self._engines.values():
            if hasattr(e, "close"):
                e.close()
        self._engines.clear()

    def team(self, role_models: Mapping[str, str], default_model: str,
             sampling: Mapping[str, SamplingConfig] | None = None) -> Team:
        """A Team where `role` runs on role_models.get(role, default_model), with the pool's `answer_fallback`
        (an `LLMConfig`'s, its seed defaulting to `llm.seed`; none for a bare `EngineConfig`)."""
        fallback = getattr(self.cfg, "answer_fallback", None)
        if fallback is not None and fallback.seed is None:
            fallback = fallback.model_copy(update={"seed": self.cfg.seed})
        return Team(lambda role: self.get(role_models.get(role, default_model)), sampling, fallback=fallback)

    @property
    def loaded(self) -> list[str]:
        return list(self._engines)


class Team:
    """Role -> engine and sampling. Counts engine calls per role (one per workflow step, whatever the batch).

    `seed` (the joint trainer's rollouts): the k-th engine call of this Team, if it samples (temperature > 0), runs
    with `SamplingConfig.seed = call_seed(seed, k)`, replacing any seed of the role's settings. Every call, role and
    turn thus draws a fresh random stream (re-seeding each call with one seed replays the same stream: successive
    calls' samples are correlated), and a Team rebuilt with the same seed that makes the same calls in the same
    order (a rerun, a resumed step) reproduces every sample. Greedy calls are unaffected. Without a seed (evaluation,
    synthesis) the sampling settings pass through unchanged: each call is seeded by the caller's `seed` or the
    engine's, which keeps those stages' outputs as they were.

    `keep_token_ids` (trainers): workflows copy each Completion's token ids onto its AgentCall
    (`ragteam.agents.core.llm_step`), for the loss to score the sampled ids. Off elsewhere: a paper-scale evaluation
    holds a system's tens of thousands of episodes at once, and their prompt ids would take gigabytes.

    `fallback` (inference Teams from `EnginePool.team`): what answering roles do with an output that gives no answer
    (`AnswerFallback`); None: nothing, as in every trainer's rollouts.
    """

    def __init__(self, engines: Engine | Callable[[str], Engine],
                 sampling: Mapping[str, SamplingConfig] | None = None, seed: int | None = None,
                 keep_token_ids: bool = False, fallback: AnswerFallback | None = None):
        self._engine_for = engines if callable(engines) and not hasattr(engines, "generate") else (lambda _r: engines)
        self.sampling = dict(sampling or {})
        self.seed, self.keep_token_ids, self.fallback = seed, keep_token_ids, fallback
        self.calls: dict[str, int] = {}
        self.n_calls = 0  # engine calls so far, every role: k of call_seed(seed, k)
        # called after every engine call with (role, prompts, seconds): progress of long runs (stage evaluate)
        self.on_call: Callable[[str, int, float], None] | None = None

    def engine(self, role: str) -> Engine:
        return self._engine_for(role)

    def sampling_for(self, role: str) -> SamplingConfig:
        return self.sampling.get(role) or self.sampling.get("default") or SamplingConfig()

    def generate(self, role: str, prompts: list[Messages], sampling: SamplingConfig | None = None
                 ) -> list[list[Completion]]:
        if not prompts:
            return []
        self.calls[role] = self.calls.get(role, 0) + 1
        s = sampling or self.sampling_for(role)
        if self.seed is not None and s.temperature > 0:
            s = s.model_copy(update={"seed": call_seed(self.seed, self.n_calls)})
        self.n_calls += 1
        t0 = time.perf_counter()
        out = self.engine(role).generate(prompts, s)
        if self.on_call is not None:
            self.on_call(role, len(prompts), time.perf_counter() - t0)
        return out

    def complete(self, role: str, prompts: list[Messages], sampling: SamplingConfig | None = None
                 ) -> list[Completion]:
        """One completion per prompt (`sampling`, default the role's, with n forced to 1)."""
        s = sampling or self.sampling_for(role)
        if s.n != 1:
            s = s.model_copy(update={"n": 1})
        return [c[0] for c in self.generate(role, prompts, s)]
