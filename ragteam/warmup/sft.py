"""The format warm-up (issue 25 §2): SFT of a joint system's shared policy on its oracle traces, stopped by the
held-out format error rate.

    traces.jsonl --(last `heldout_questions` questions)--> probe rows (never trained on)
                 --(the rest, at most `rows_per_role` per role)--> SFT rows: prompt ids under the chat template
                   (`ragteam.llm.chat_text`, as the engines encode it), then the response's ids, then EOS where the
                   response ended on EOS; loss on the response tokens only (TRL SFTTrainer, `completion_mask`)

Every `probe_every` optimiser steps from step `probe_from` on (and once before the first, with `probe_at_start`;
always after the last, the cap) the probe measures the held-out
format error rate, in one of two ways (`probe`):
- `rows`: `FormatProbe` has the policy answer the probe rows' prompts greedily with each role's own sampling settings
  as its workflow sends them (budget, stop strings) through the project's HF engine, and parses each output with the
  role's own parser: the rate per role, and their mean. Every prompt is an oracle trace's, so every earlier turn in
  it is the oracle's.
- `rollout`: `RolloutProbe` runs the held-out questions through the system's own workflow, greedily, with the
  rollouts' retriever, so later turns see the policy's own earlier outputs and what its own queries found: the share
  of questions with a malformed call (what `evaluate` reports as `format_error_questions`), each role's share of
  malformed calls, and the share of questions without an answer. QAgent's 16-step warm-up read 0 % on the rows and
  58 % of its held-out questions had a malformed turn in its own trajectories (docs/joint.md).
Training stops when the mean (rows) or the question-level rate (rollout) falls below `format_threshold`
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
from ragteam.train.checkpoints import (TrainResult, fingerprint, load_checkpoint, model_identity,  # noqa: F401
                                       prepare_resume, run_resumable)
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
    probe: Literal["rows", "rollout"] = "rows"        # what the probe answers: held-out trace rows, or the
                                                      # held-out questions through the system's own workflow
    probe_rows_per_role: int = Field(4, ge=1)         # held-out rows per role the rows probe answers
    probe_every: int = Field(8, ge=1)                 # optimiser steps between probes
    probe_from: int = Field(0, ge=0)                  # no probe after a step before this one (but at the cap)
    probe_at_start: bool = True                       # probe the start model too (format_error_rate_before)
    format_threshold: float = Field(0.2, ge=0, le=1)  # stop once the probe's format error rate is below it ...
    stop_when: Literal["mean", "every_role"] = "mean"  # ... the mean over roles (rollout: the questions' rate),
                                                      # or every role's own rate (rollout: and the questions')
    sft: SFTParams                                    # steps = the cap; lora: the warm-up's adapter (merged after)
    systems: dict[str, dict[str, Any]] = Field(default_factory=dict)   # per-system overrides of the keys above

    @model_validator(mode="after")
    def _not_overridable(self) -> WarmupParams:
        """(Which names `systems` may hold is the registry's: `ragteam.systems.params.WarmupSection`.)"""
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
        """Whether a probe's rates (`FormatProbe.__call__`, `RolloutProbe.__call__`) end the warm-up under
        `stop_when`."""
        below = rates["format_error_rate"] < self.format_threshold
        if self.stop_when == "mean":
            return below
        per_role = [v for k, v in rates.items() if k.startswith("format_error/")]
        # rollout: the question-level rate as well (one question whose Filter fails in all its turns can leave the
        # Filter's call rate above the threshold while the questions' rate is below it, and the reverse)
        return (bool(per_role) and max(per_role) < self.format_threshold
                and (below or self.probe != "rollout"))


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
        # the engine's prefix cache (llm.prefix_cache_tokens) is on: each probe builds a fresh engine, so a cached KV
        # never outlives the weights that made it (tests/test_warmup.py)
        self.cfg = engine_cfg
        self.sampling = {role: system.sampling(role, sampling.get(role) or sampling.get("default")
                                               or SamplingConfig()).model_copy(update={"temperature": 0.0, "n": 1})
                         for role in self.roles}     # greedy, with what the workflow adds (QAgent's stop strings)

    def outputs(self, model) -> list[str]:
        """The policy's greedy output for each probe row, ended as the workflow ends it (the stop string kept where
        the trace keeps it)."""
        from ragteam.llm.policy import policy_engine

        was_training = model.training
        model.eval()
        try:
            # the live policy engine generates with `model` itself, its adapter applied
            team = Team(policy_engine("live", model, self.tokenizer, self.model_path, self.cfg), self.sampling)
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


class RolloutProbe:
    """The policy's own greedy trajectories on held-out questions, through the system's own workflow (the one its
    rollouts and oracle traces run, `OracleSystem.run`), with the retriever the rollouts search.

    The rows probe (`FormatProbe`) prompts each role with an oracle trace's prompt: every earlier turn is the
    oracle's. A policy's later turns instead see its own earlier outputs and what its own queries retrieved, and
    that is where QAgent's 16-step warm-up broke: 0 % format errors on the oracle rows, yet a malformed turn on 75 %
    of the 40 questions of `evaluate` (docs/joint.md). This probe measures what the rollouts and `evaluate` meet.

    `__call__(model)` returns
    - `format_error_rate`: the share of the held-out questions whose trajectory has a malformed call of a policy
      role (the question-level rate `evaluate` reports as `format_error_questions`, over the policy's roles: a frozen
      helper, DECOR's summarizer on the base model, is not what the warm-up trains);
    - `format_error/<role>`: the share of that role's calls that are malformed (a role that never ran is absent);
    - `no_answer_rate`: the share of questions whose final answer is empty (`ragteam.metrics.has_answer`).
    Policy roles generate with the trainer's model (adapter applied), other roles with the start model, loaded once.
    Greedy: every role's `llm.sampling` at temperature 0, with what the workflow adds to it (QAgent's stop strings).
    The model is put in eval mode for the probe and back in train mode after."""

    def __init__(self, system: OracleSystem, questions: Sequence[dict], retriever,
                 sampling: Mapping[str, SamplingConfig], engine_cfg: EngineConfig, model_path: str, tokenizer):
        if not questions:
            raise ValueError(f"warm-up rollout probe for {system.name}: no held-out questions")
        self.system, self.questions, self.retriever = system, list(questions), retriever
        self.model_path, self.tokenizer = model_path, tokenizer
        self.roles = sorted(system.roles)
        # the engine's prefix cache (llm.prefix_cache_tokens) is on: `episodes` builds a fresh policy engine for each
        # probe, so a cached KV never outlives the weights that made it; the frozen roles' engine keeps the start
        # model's. Same greedy outputs, probes 1.4-1.7x faster (benchmarks/results/warmup_probe_cache.md).
        # The policy generates live on HF in this process (the trainer's own model), and so do the frozen roles,
        # whatever llm.backend says: the warm-up stage runs in the main environment, which has no vLLM
        self.cfg = engine_cfg.model_copy(update={"backend": "hf"})
        greedy = {"temperature": 0.0, "n": 1}
        self.sampling = {k: v.model_copy(update=greedy) for k, v in sampling.items()}
        self.sampling.setdefault("default", SamplingConfig().model_copy(update=greedy))
        self._frozen = None           # the start model's engine, for roles the warm-up does not train

    def episodes(self, model) -> list:
        from ragteam.llm import load_engine
        from ragteam.llm.policy import policy_engine

        was_training = model.training
        model.eval()
        try:
            policy = policy_engine("live", model, self.tokenizer, self.model_path, self.cfg)

            def engine(role: str):
                if role in self.system.roles:
                    return policy
                if self._frozen is None:
                    self._frozen = load_engine(self.model_path, self.cfg)
                return self._frozen

            return self.system.run(self.questions, Team(engine, self.sampling), self.retriever)
        finally:
            model.train(was_training)

    def __call__(self, model) -> dict[str, float]:
        from ragteam.metrics import has_answer

        return rollout_rates(self.episodes(model), self.system.roles, has_answer, self)


def rollout_rates(episodes: Sequence, roles: Sequence[str], has_answer: Callable[[str | None], bool],
                  probe: Any = None) -> dict[str, float]:
    """`RolloutProbe.__call__`'s rates of `episodes` (see there); the first malformed output of each role goes to
    `probe.failures` (role -> (reason, output)) for the log."""
    if not episodes:
        raise ValueError("warm-up rollout probe: the workflow returned no episode")
    calls: dict[str, list[bool]] = defaultdict(list)
    failures: dict[str, tuple[str, str]] = {}
    bad_questions = 0
    for ep in episodes:
        bad = False
        for c in ep.calls:
            if c.role not in roles:
                continue
            calls[c.role].append(c.format_error is not None)
            if c.format_error is not None:
                bad = True
                failures.setdefault(c.role, (c.format_error, c.response))
        bad_questions += bad
    if probe is not None:
        probe.failures = failures
    n = len(episodes)
    return {"format_error_rate": round(bad_questions / n, 4),
            **{f"format_error/{role}": round(sum(v) / len(v), 4) for role, v in sorted(calls.items())},
            "no_answer_rate": round(sum(not has_answer(ep.final_answer) for ep in episodes) / n, 4)}


def probe_callback(probe: FormatProbe | RolloutProbe, every: int, done: Callable[[Mapping[str, float]], bool],
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
                  + " ".join(f"{k.split('/', 1)[1]} {v:.2f}" for k, v in rates.items() if "/" in k)
                  + (f"; no answer {rates['no_answer_rate']:.2f}" if "no_answer_rate" in rates else ""), flush=True)
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


# ---- train ----------------------------------------------------------------------------------------------------------

def heldout_questions(traces: Sequence[dict], heldout: int, pool: Mapping[str, dict]) -> list[dict]:
    """The pool rows ({"id", "question", "golden_answers", ...}) of the traces' held-out questions (`split_heldout`),
    in the traces' order: the rollout probe's questions."""
    _, held = split_heldout(traces, heldout)
    qids = list(dict.fromkeys(r["question_id"] for r in held))
    missing = [q for q in qids if q not in pool]
    if missing:
        raise ValueError(f"warm-up rollout probe: held-out question(s) {', '.join(missing[:3])} of the traces are not "
                         f"in the training pool (the traces and data/prepared disagree: rerun oracle_traces)")
    return [pool[q] for q in qids]


def train_warmup(system: OracleSystem, traces: Sequence[dict], model_path: str, ckpt_dir: str, p: WarmupParams,
                 sampling: Mapping[str, SamplingConfig], engine_cfg: EngineConfig,
                 run_tag: dict[str, Any] | None = None, pool: Mapping[str, dict] | None = None,
                 retriever=None) -> TrainResult:
    """SFT of `model_path` on `system`'s trace rows until the held-out format error rate is below the threshold
    (or `p.sft.steps`); checkpoints under `ckpt_dir` (resumed). `extra`: rows, dropped, probe roles, why it stopped.
    `p.probe: rollout` needs the training `pool` (id -> row) and the rollouts' `retriever`."""
    from transformers import AutoTokenizer

    if p.sft.steps < 1:
        raise ValueError("warmup.sft.steps must be a step cap >= 1 (the probe decides when to stop before it)")
    tok = AutoTokenizer.from_pretrained(model_path)
    train, held = split_heldout(traces, p.heldout_questions)
    chosen = per_role(train, p.rows_per_role)
    rows, dropped = tokenized_rows(chosen, tok, p.sft.max_length)
    if p.probe == "rollout":
        if pool is None or retriever is None:
            raise ValueError("warmup.probe: rollout needs the training pool and the retriever")
        probe: FormatProbe | RolloutProbe = RolloutProbe(
            system, heldout_questions(traces, p.heldout_questions, pool), retriever, sampling, engine_cfg,
            model_path, tok)
        probed: list = [q["id"] for q in probe.questions]
    else:
        probe = FormatProbe(system, held, p.probe_rows_per_role, sampling, engine_cfg, model_path, tok)
        probed = [[r["question_id"], r["role"]] for r in probe.rows]
    fp = fingerprint(kind="warmup_sft", system=system.name, params=model_params(p.sft),
                     model=model_identity(model_path),
                     data=rows, probe=probed, **({"probe_kind": p.probe} if p.probe != "rows" else {}),
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
                              "probe": p.probe,
                              "probe_rows": len(probe.rows) if isinstance(probe, FormatProbe) else 0,
                              "probe_questions": len(probe.questions) if isinstance(probe, RolloutProbe) else 0,
                              "probe_roles": probe.roles,
                              "stopped_by": "threshold" if last is not None and p.below_threshold(last)
                              else "step cap"})

