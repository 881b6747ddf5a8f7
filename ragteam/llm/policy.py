"""The engine a trainer samples its policy from, and the Team of one training step.

A trainer asks for samples and hands over new weights; it never touches an engine's internals (STYLE.md: TRL's
trainers). A `PolicyEngine` is an Engine with two more verbs:
  sync(policy)  the trainer's current policy becomes the engine's weights: `live` (hf) generates with the model being
                trained and only drops stale prefix KV; `vllm` saves the LoRA adapter or the full weights and loads
                them into the running engine (no restart);
  base()        an Engine on the frozen base model, for helper roles that must not change while the policy trains.
Implementations: `ragteam.llm.hf.HFPolicy` and `ragteam.llm.vllm_backend.VLLMPolicy`.
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Literal, Protocol

from ragteam.llm import Completion, Engine, EngineConfig, Messages, SamplingConfig, Team, call_seed, load_engine


class PolicyEngine(Protocol):
    model_path: str

    def generate(self, prompts: list[Messages], sampling: SamplingConfig) -> list[list[Completion]]: ...

    def sync(self, policy) -> None:
        """Generate with `policy`'s current weights from now on (a peft model with LoRA, else the plain model)."""
        ...

    def base(self) -> Engine:
        """An Engine on the base model, which training never changes."""
        ...

    def close(self) -> None:
        """Free the engine's processes and files."""
        ...


def policy_engine(backend: Literal["live", "vllm"], policy, tokenizer, model_path: str, cfg: EngineConfig,
                  workdir: str | Path | None = None) -> PolicyEngine:
    """The policy engine of `backend` for `policy` (loaded from `model_path`); `workdir` holds what vllm syncs (the
    live engine syncs nothing and needs none).

    The vLLM engine is started with LoRA when `policy` is a peft model (its rank), else for full-weight reloads."""
    base_loader = lambda path: load_engine(path, cfg)  # noqa: E731  (full fine-tuning: an untouched copy)
    if backend == "live":
        from ragteam.llm.hf import HFPolicy

        return HFPolicy(policy, tokenizer, model_path, cfg, base_loader)
    if workdir is None:
        raise ValueError(f"policy engine {backend!r} on {model_path}: a workdir is needed for the weights it syncs")
    from ragteam.llm.vllm_backend import VLLMEngine, VLLMPolicy

    lora = hasattr(policy, "peft_config")
    rank = policy.peft_config[policy.active_adapter].r if lora else None
    if cfg.vllm.ray.engines > 1:          # N engines as Ray actors, each step's weights broadcast to all
        from ragteam.llm.ray_engines import RayEngines

        return VLLMPolicy(RayEngines(model_path, cfg, max_lora_rank=rank), workdir, base_loader, lora=lora)
    return VLLMPolicy(VLLMEngine(model_path, cfg, max_lora_rank=rank), workdir, base_loader, lora=lora)


class Rollouts:
    """One Team per training step: the trained `roles` sample from the policy engine at the rollout `temperature`
    and `top_p` (one completion per call), the system's frozen roles run on the base model (checkpoint None or the
    policy's own) or on their own checkpoint, with their own sampling settings (e.g. a judge at T = 0)."""

    def __init__(self, engine: PolicyEngine, sampling: Mapping[str, SamplingConfig], roles: Sequence[str],
                 frozen_roles: Mapping[str, str | None] | None, cfg: EngineConfig, *, temperature: float,
                 top_p: float, seed: int):
        self.engine, self.seed = engine, seed
        default = sampling.get("default") or SamplingConfig()
        guided = [r for r in roles if (sampling.get(r) or default).regex is not None]
        if guided:   # the trainer's log-probs would be those of the unconstrained policy (issue 24 §3)
            raise ValueError(f"llm.sampling: the trained roles {', '.join(guided)} have a guided-decoding regex; a "
                             "policy's samples must be its own, unconstrained: remove it for training")
        self.sampling = {r: (sampling.get(r) or default).model_copy(update={"temperature": temperature,
                                                                           "top_p": top_p, "n": 1})
                         for r in roles}
        self.frozen: dict[str, Engine] = {}
        self._loaded: dict[str, Engine] = {}
        for role, path in (frozen_roles or {}).items():
            self.sampling[role] = sampling.get(role) or default
            if path in (None, engine.model_path):
                self.frozen[role] = engine.base()
            else:
                if path not in self._loaded:
                    self._loaded[path] = load_engine(path, cfg)
                self.frozen[role] = self._loaded[path]

    def team(self, step: int, policy, process: int = 0) -> Team:
        """The Team of training step `step` after handing the engine `policy`'s weights.

        One seed per (run seed, step, process): the Team derives a fresh one for each of the step's engine calls
        (`ragteam.llm.Team`), so no two calls or turns replay one random stream, a rerun or a resumed step samples
        exactly what the first run did, and the processes of a data-parallel run (`process`) sample apart."""
        self.engine.sync(policy)
        return Team(lambda role: self.frozen.get(role, self.engine), dict(self.sampling),
                    seed=call_seed(self.seed, step, process), keep_token_ids=True)

    def greedy_team(self, policy) -> Team:
        """A Team on `policy`'s current weights whose trained roles decode greedily (the team-reward probe,
        `ragteam.train.probe`); frozen roles keep their own settings, as in the rollouts. No seed: a greedy call
        draws no random numbers."""
        self.engine.sync(policy)
        sampling = {r: s if r in self.frozen else s.model_copy(update={"temperature": 0.0, "top_p": 1.0})
                    for r, s in self.sampling.items()}
        return Team(lambda role: self.frozen.get(role, self.engine), sampling)

    def close(self) -> None:
        self.engine.close()
        for e in self._loaded.values():
            if hasattr(e, "close"):
                e.close()
