"""The format warm-up (issue 25 §2): SFT of a joint system's shared policy on its oracle traces, stopped by the
held-out format error rate.

    traces.jsonl --(last `heldout_questions` questions)--> probe rows (never trained on)
                 --(the rest, at most `rows_per_role` per role)--> SFT rows: prompt ids under the chat template
                   (`ragteam.llm.chat_text`, as the engines encode it), then the response's ids, then EOS where the
                   response ended on EOS; loss on the response tokens only (TRL SFTTrainer, `completion_mask`)

Every `probe_every` optimiser steps from step `probe_from` on (and once before the first, with `probe_at_start`;
always after the last, the cap) `FormatProbe` has the policy
answer the probe rows' prompts greedily with each role's own sampling settings as its workflow sends them (budget,
stop strings) through the project's HF engine, and parses each output with the role's own parser: the held-out
format error rate per role, and their mean. Training stops when the mean falls below `format_threshold`
(`stop_when: mean`), or when every role's rate does (`stop_when: every_role`: a role that fails half its rows cannot
hide behind clean ones, as DECOR's Filter did at 50 % while the mean was 17 %), or at `sft.steps` (the cap); a
rerun of a warm-up that stopped at the threshold reloads it and trains no further. The
probe is greedy: the RL rollouts sample (temperature 1), and their own first-step format error rate
(`metrics/train_joint_<system>.json`) says how much of the format survives sampling. Tokenising the prompt and the
response apart is how the engines see a call (prompt ids, then sampled ids), so the warm-up teaches the very token
sequences a rollout produces; a response whose text ends on a stop string keeps it (the workflows' `keep_stop`).

Why a warm-up at all: SmolLM2-135M writes none of the joint systems' tags, so every RL reward is the format
penalty and every advantage is zero (the default run's `metrics/train_joint_*.json`). The papers start from 7-8B
instruct models that follow the formats; the paper profile keeps their recipe (`warmup.enabled: false`).
"""
from __future__ import annotations

import json
from collections import Counter, defaultdict
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, Literal

from pydantic import Field, model_validator

from ragteam.agents.core import FormatError
from ragteam.config import Strict, deep_merge, parse_section
from ragteam.llm import EngineConfig, SamplingConfig, Team, chat_text
from ragteam.train.checkpoints import TrainResult, fingerprint, model_identity, prepare_resume, run_resumable
from ragteam.train.common import model_params, precision_tag
from ragteam.train.sft import SFTParams, sft_trainer
from ragteam.warmup.oracle import OracleSystem


class WarmupParams(Strict):
    """params.yaml `warmup`, shared by the four joint systems; `systems.<system>` overrides single keys for one
    system (`for_system`), e.g. `systems: {decor: {stop_when: every_role}}`."""

    enabled: bool = True                              # false: train_joint starts from llm.model (paper profile)
    questions: int = Field(96, ge=0)                  # first n pool questions traced (stage oracle_traces); 0 = all
    heldout_questions: int = Field(16, ge=1)          # the traces' last n questions: probe rows, never trained on
    rows_per_role: int = Field(64, ge=1)              # SFT rows per role at most (each role gets its share)
    probe_rows_per_role: int = Field(4, ge=1)         # held-out rows per role the probe answers
    probe_every: int = Field(8, ge=1)                 # optimiser steps between probes
    probe_from: int = Field(0, ge=0)                  # no probe after a step before this one (but at the cap)
    probe_at_start: bool = True                       # probe the start model too (format_error_rate_before)
    format_threshold: float = Field(0.2, ge=0, le=1)  # stop once the probe's format error rate is below it ...
    stop_when: Literal["mean", "every_role"] = "mean"  # ... the mean over roles, or every role's own rate
    sft: SFTParams                                    # steps = the cap; lora: the warm-up's adapter (merged after)
    systems: dict[str, dict[str, Any]] = Field(default_factory=dict)   # per-system overrides of the keys above

    @model_validator(mode="after")
    def _known_systems(self) -> WarmupParams:
        from ragteam.warmup.oracle import SYSTEMS

        unknown = sorted(set(self.systems) - set(SYSTEMS))
        if unknown:
            raise ValueError(f"systems: no joint system {', '.join(map(repr, unknown))} "
                             f"(known: {', '.join(sorted(SYSTEMS))})")
        for name, over in self.systems.items():
            for key in ("systems", "questions"):   # questions: stage oracle_traces reads the shared value
                if key in over:
                    raise ValueError(f"systems.{name}.{key}: not overridable per system (set warmup.{key})")
        return self

    def for_system(self, name: str) -> WarmupParams:
        """These params with `systems[name]`'s keys merged in (nested keys such as `sft.steps` key by key)."""
        over = self.systems.get(name)
        if not over:
            return self
        merged = deep_merge(self.model_dump(exclude={"systems"}), over)
        return parse_section({"warmup": {"systems": {name: merged}}}, f"warmup.systems.{name}", WarmupParams)

    def below_threshold(self, rates: Mapping[str, float]) -> bool:
        """Whether a probe's rates (`FormatProbe.__call__`) end the warm-up under `stop_when`."""
        if self.stop_when == "mean":
            return rates["format_error_rate"] < self.format_threshold
        per_role = [v for k, v in rates.items() if k.startswith("format_error/")]
        return bool(per_role) and max(per_role) < self.format_threshold


# ---- rows -----------------------------------------------------------------------------------------------------------

def split_heldout(rows: Sequence[dict], heldout_questions: int) -> tuple[list[dict], list[dict]]:
    """(train rows, probe rows): the last `heldout_questions` questions (in the traces' order) are the probe's."""
    qids = list(dict.fromkeys(r["question_id"] for r in rows))
    if len(qids) <= heldout_questions:
        raise ValueError(f"warm-up: {len(qids)} traced questions, but heldout_questions is {heldout_questions}: "
                         f"nothing would be left to train on (raise warmup.questions)")
    held = set(qids[-heldout_questions:])
    return [r for r in rows if r["question_id"] not in held], [r for r in rows if r["question_id"] in held]


def per_role(rows: Sequence[dict], n: int) -> list[dict]:
    """At most the first `n` rows of each role, in the traces' order (so a frequent role cannot crowd out a rare
    one: M-ASK has 2 Search calls per Planning call)."""
    seen: dict[str, int] = defaultdict(int)
    out = []
    for r in rows:
        if seen[r["role"]] < n:
            seen[r["role"]] += 1
            out.append(r)
    return out


def sft_ids(row: Mapping[str, Any], tokenizer) -> tuple[list[int], list[int]]:
    """(input_ids, completion_mask) of one trace row: the prompt as the engines encode it (chat template, a final
    assistant message continued), then the response, then EOS only where the response ended on it."""
    prompt = tokenizer(chat_text(tokenizer, row["messages"]), add_special_tokens=False).input_ids
    response = tokenizer(row["response"], add_special_tokens=False).input_ids
    if row["eos"]:
        response = response + [tokenizer.eos_token_id]
    if not response:
        raise ValueError(f"warm-up: trace row of {row['role']} (question {row['question_id']}) has an empty response")
    return prompt + response, [0] * len(prompt) + [1] * len(response)


def tokenized_rows(rows: Sequence[dict], tokenizer, max_length: int) -> tuple[list[dict], int]:
    """SFT rows {input_ids, completion_mask} and the count dropped for exceeding `max_length` (dropped, not cut:
    a cut would teach an output without its end)."""
    out, dropped = [], 0
    for r in rows:
        ids, mask = sft_ids(r, tokenizer)
        if len(ids) > max_length:
            dropped += 1
            continue
        out.append({"input_ids": ids, "completion_mask": mask})
    if not out:
        raise ValueError(f"warm-up: all {len(rows)} rows are longer than sft.max_length={max_length} tokens")
    return out, dropped


# ---- the held-out format probe -----------------------------------------------------------------------------------

class FormatProbe:
    """Greedy answers of a policy to held-out trace prompts, parsed by each role's own parser.

    `__call__(model)` returns {"format_error_rate": mean over roles, "format_error/<role>": that role's rate}.
    The model is put in eval mode for the probe and back in train mode after (a trainer's model)."""

    def __init__(self, system: OracleSystem, rows: Sequence[dict], n_per_role: int,
                 sampling: Mapping[str, SamplingConfig], engine_cfg: EngineConfig, model_path: str, tokenizer):
        self.system, self.model_path, self.tokenizer = system, model_path, tokenizer
        self.rows = per_role(rows, n_per_role)
        self.roles = sorted({r["role"] for r in self.rows})
        if not self.rows:
            raise ValueError(f"warm-up probe for {system.name}: no held-out rows")
        self.cfg = engine_cfg.model_copy(update={"prefix_cache_tokens": 0})   # the weights change between probes
        self.sampling = {role: system.sampling(role, sampling.get(role) or sampling.get("default")
                                               or SamplingConfig()).model_copy(update={"temperature": 0.0, "n": 1})
                         for role in self.roles}     # greedy, with what the workflow adds (QAgent's stop strings)

    def outputs(self, model) -> list[str]:
        """The policy's greedy output for each probe row, ended as the workflow ends it (the stop string kept where
        the trace keeps it)."""
        from ragteam.llm.hf import HFEngine

        was_training = model.training
        model.eval()
        try:
            # peft injects the adapter into the base model in place: generating with it applies the adapter
            weights = model.get_base_model() if hasattr(model, "peft_config") else model
            team = Team(HFEngine(self.model_path, self.cfg, model=weights, tokenizer=self.tokenizer), self.sampling)
            texts: dict[int, str] = {}
            for role in self.roles:
                idx = [i for i, r in enumerate(self.rows) if r["role"] == role]
                outs = team.complete(role, [self.rows[i]["messages"] for i in idx])
                for i, o in zip(idx, outs):
                    texts[i] = o.text + ((o.stop_reason or "") if not self.rows[i]["eos"] else "")
        finally:
            model.train(was_training)
        return [texts[i] for i in range(len(self.rows))]

    def __call__(self, model) -> dict[str, float]:
        errors: dict[str, list[bool]] = defaultdict(list)
        self.failures: dict[str, tuple[str, str]] = {}    # role -> (reason, output) of its first malformed output
        for row, text in zip(self.rows, self.outputs(model)):
            parsed = self.system.parser(row["role"], row["messages"])(text)
            errors[row["role"]].append(isinstance(parsed, FormatError))
            if isinstance(parsed, FormatError):
                self.failures.setdefault(row["role"], (parsed.reason, text))
        rates = {role: sum(v) / len(v) for role, v in sorted(errors.items())}
        return {"format_error_rate": round(sum(rates.values()) / len(rates), 4),
                **{f"format_error/{role}": round(v, 4) for role, v in rates.items()}}


def probe_callback(probe: FormatProbe, every: int, done: Callable[[Mapping[str, float]], bool],
                   at_start: bool = True, start: int = 0):
    """A TrainerCallback: probe before the first step (`at_start`), after every `every`-th step from step `start` on,
    and after the last step (the cap); log the rates into the trainer's history; stop training once `done(rates)`
    (`WarmupParams.below_threshold`). The probe decodes greedily in eval mode and draws no random numbers, so where
    it probes changes when training stops, never what a step learns (a test compares the weights)."""
    from transformers import TrainerCallback

    class FormatStop(TrainerCallback):
        def _probe(self, state, control, model) -> None:
            rates = probe(model)
            state.log_history.append({"step": state.global_step, **rates})
            print(f"warm-up: step {state.global_step} held-out format errors {rates['format_error_rate']:.2f} "
                  + " ".join(f"{k.split('/', 1)[1]} {v:.2f}" for k, v in rates.items() if "/" in k), flush=True)
            for role, (reason, text) in getattr(probe, "failures", {}).items():   # what to fix, when it does not learn
                print(f"warm-up:   {role}: {reason}: {text[:300]!r}", flush=True)
            if done(rates):
                control.should_training_stop = True

        def on_train_begin(self, args, state, control, model=None, **kw):
            if at_start and state.global_step == 0:
                self._probe(state, control, model)
            return control

        def on_step_end(self, args, state, control, model=None, **kw):
            step = state.global_step
            if (step % every == 0 and step >= start) or step >= state.max_steps:
                self._probe(state, control, model)
            return control

    return FormatStop()


def stopped_at_threshold(checkpoint: str | Path, done: Callable[[Mapping[str, float]], bool]) -> bool:
    """Whether the probe logged last in `checkpoint`'s trainer state (at its own step) ended the warm-up
    (`done`, `WarmupParams.below_threshold`)."""
    state = json.loads((Path(checkpoint) / "trainer_state.json").read_text(encoding="utf-8"))
    probes = [h for h in state.get("log_history", []) if "format_error_rate" in h]
    return (bool(probes) and probes[-1]["step"] == state.get("global_step")
            and done(probes[-1]))


def load_checkpoint(model, checkpoint: str | Path) -> None:
    """The weights a trainer saved in `checkpoint` into `model` (its LoRA adapter, or the whole model)."""
    from safetensors.torch import load_file

    ckpt = Path(checkpoint)
    if hasattr(model, "peft_config"):
        from peft import set_peft_model_state_dict

        result = set_peft_model_state_dict(model, load_file(ckpt / "adapter_model.safetensors"))
        if getattr(result, "unexpected_keys", None):
            raise ValueError(f"{ckpt}: adapter weights that the model lacks: {result.unexpected_keys[:3]}")
    else:
        # a tied output layer is saved once, as the input embeddings: the only key the checkpoint may lack
        result = model.load_state_dict(load_file(ckpt / "model.safetensors"), strict=False)
        tied = {"lm_head.weight"} if getattr(model.config, "tie_word_embeddings", False) else set()
        missing = [k for k in result.missing_keys if k not in tied]
        if result.unexpected_keys or missing:
            raise ValueError(f"{ckpt}: weights that do not fit the model: unexpected {result.unexpected_keys[:3]}, "
                             f"missing {missing[:3]}")


# ---- train ----------------------------------------------------------------------------------------------------------

def train_warmup(system: OracleSystem, traces: Sequence[dict], model_path: str, ckpt_dir: str, p: WarmupParams,
                 sampling: Mapping[str, SamplingConfig], engine_cfg: EngineConfig,
                 run_tag: dict[str, Any] | None = None) -> TrainResult:
    """SFT of `model_path` on `system`'s trace rows until the held-out format error rate is below the threshold
    (or `p.sft.steps`); checkpoints under `ckpt_dir` (resumed). `extra`: rows, dropped, probe roles, why it stopped."""
    from transformers import AutoTokenizer

    if p.sft.steps < 1:
        raise ValueError("warmup.sft.steps must be a step cap >= 1 (the probe decides when to stop before it)")
    tok = AutoTokenizer.from_pretrained(model_path)
    train, held = split_heldout(traces, p.heldout_questions)
    chosen = per_role(train, p.rows_per_role)
    rows, dropped = tokenized_rows(chosen, tok, p.sft.max_length)
    probe = FormatProbe(system, held, p.probe_rows_per_role, sampling, engine_cfg, model_path, tok)
    fp = fingerprint(kind="warmup_sft", system=system.name, params=model_params(p.sft),
                     model=model_identity(model_path),
                     data=rows, probe=[[r["question_id"], r["role"]] for r in probe.rows],
                     threshold=p.format_threshold, stop_when=p.stop_when, every=p.probe_every,
                     probe_from=p.probe_from, tag=run_tag or {}, **precision_tag(engine_cfg.dtype))
    resume = prepare_resume(ckpt_dir, fp)
    callbacks = [probe_callback(probe, p.probe_every, p.below_threshold, p.probe_at_start, p.probe_from)]
    trainer = sft_trainer(rows, model_path, ckpt_dir, p.sft, callbacks=callbacks, dtype=engine_cfg.dtype)
    if resume and stopped_at_threshold(resume, p.below_threshold):
        # the run already ended there: load it and train no further (the trainer would go on to the cap), so a
        # rerun gives the same model
        load_checkpoint(trainer.model, resume)
        state = json.loads((Path(resume) / "trainer_state.json").read_text(encoding="utf-8"))
        history, step, seconds = list(state["log_history"]), int(state["global_step"]), 0.0
    else:
        history, step, seconds = run_resumable(trainer, resume)
    probes = [h for h in history if "format_error_rate" in h]
    last = probes[-1] if probes else None
    return TrainResult(model=trainer.model, tokenizer=tok, log_history=history, global_step=step, seconds=seconds,
                       resumed_from=int(resume.rsplit("-", 1)[1]) if resume else None,
                       extra={"samples": len(rows), "dropped_too_long": dropped, "fingerprint": fp,
                              "rows_per_role": dict(sorted(Counter(r["role"] for r in chosen).items())),
                              "probe_rows": len(probe.rows), "probe_roles": probe.roles,
                              "stopped_by": "threshold" if last is not None and p.below_threshold(last)
                              else "step cap"})

