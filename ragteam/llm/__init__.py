"""LLM engines: batched chat generation behind one small interface, chosen by params (`hf` or `vllm`).

A workflow hands an engine every prompt waiting at the same step at once (`Engine.generate`); the engine decides how
to batch them on its device. `Team` maps agent roles to engines and sampling settings; `EnginePool` loads each
distinct model path once, so three MAPS agents that share a checkpoint share one copy in memory.
"""
from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Literal, Protocol

from pydantic import Field

from ragteam.config import Strict

Messages = list[dict[str, str]]


class SamplingConfig(Strict):
    """Generation settings of one role. temperature 0 = greedy; `stop` strings end a completion (not included)."""

    max_new_tokens: int = Field(32, ge=1)
    temperature: float = Field(0.0, ge=0.0)
    top_p: float = Field(1.0, gt=0.0, le=1.0)
    n: int = Field(1, ge=1)
    stop: list[str] = Field(default_factory=list)
    seed: int | None = None


class VLLMOptions(Strict):
    gpu_memory_utilization: float = Field(0.85, gt=0.0, le=1.0)  # per engine: with k distinct paths use <= 0.9/k
    max_model_len: int | None = None
    tensor_parallel_size: int = Field(1, ge=1)
    enable_prefix_caching: bool = True  # role prompts and retrieved docs are shared prefixes


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


@dataclass(frozen=True)
class Completion:
    text: str
    prompt_tokens: int
    completion_tokens: int
    finish_reason: str  # "stop" (EOS or a stop string) | "length"
    stop_reason: str | None = None  # the stop string that ended the text (not included in it); None: EOS or length


class Engine(Protocol):
    model_path: str

    def generate(self, prompts: list[Messages], sampling: SamplingConfig) -> list[list[Completion]]:
        """One list of `sampling.n` completions per prompt, in prompt order."""
        ...


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
    from ragteam.llm.vllm_backend import VLLMEngine

    return VLLMEngine(model_path, cfg)


class EnginePool:
    """Loads each distinct model path once (lazily, on first use) and hands out Teams that share the engines."""

    def __init__(self, cfg: EngineConfig, loader: Callable[[str, EngineConfig], Engine] = load_engine):
        self.cfg, self._loader, self._engines = cfg, loader, {}

    def get(self, path: str) -> Engine:
        if path not in self._engines:
            self._engines[path] = self._loader(path, self.cfg)
        return self._engines[path]

    def team(self, role_models: Mapping[str, str], default_model: str,
             sampling: Mapping[str, SamplingConfig] | None = None) -> Team:
        """A Team where `role` runs on role_models.get(role, default_model)."""
        return Team(lambda role: self.get(role_models.get(role, default_model)), sampling)

    @property
    def loaded(self) -> list[str]:
        return list(self._engines)


class Team:
    """Role -> engine and sampling. Counts engine calls per role (one per workflow step, whatever the batch)."""

    def __init__(self, engines: Engine | Callable[[str], Engine],
                 sampling: Mapping[str, SamplingConfig] | None = None):
        self._engine_for = engines if callable(engines) and not hasattr(engines, "generate") else (lambda _r: engines)
        self.sampling = dict(sampling or {})
        self.calls: dict[str, int] = {}
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
        t0 = time.perf_counter()
        out = self.engine(role).generate(prompts, sampling or self.sampling_for(role))
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
