"""MAPS training recipes (Algorithm 1, steps 3, 5, 7) on the TRL backend: what the train_* stages call.

- answer agent: GRPO stage 1 on top-3 samples with R_a1 (Eq. 4), then stage 2 on top-5 samples with R_a2 (Eq. 5),
  starting from the stage-1 model (the paper's curriculum);
- query agent: GRPO with R_q = ΔF1 (Eq. 7) of the frozen answer agent, answers supplied by the caller;
- judge agent: SFT on the unanimity labels (`ragteam.train.sft.train_sft`).
"""
from __future__ import annotations

import gc
import hashlib
import json
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, Literal

from pydantic import Field

from ragteam.agents import maps
from ragteam.agents.core import QueryPool, continue_lead_ins
from ragteam.config import Strict
from ragteam.llm import Team
from ragteam.retrieval.base import Retriever
from ragteam.rewards.maps import AnswerReward, delta_f1
from ragteam.train.checkpoints import TrainResult, save_agent
from ragteam.train.curves import curve_rows
from ragteam.train.grpo import GRPOParams, GRPOSample, answer_reward_func, completion_text, train_grpo
from ragteam.train.sft import SFTSample


class AnswerAgentParams(Strict):
    """params.yaml `train_answer`: the two GRPO stages share α and l (values not stated in the paper)."""

    alpha: float = Field(ge=0)                 # α in Eq. 4 / Eq. 5
    max_words: int = Field(ge=1)               # l in Eq. 3
    min_words: int = Field(0, ge=0)            # 0 = Eq. 3; 1 = also penalise the empty answer (CPU profile)
    clipped_is_long: bool = False              # L(y) = -1 for a completion cut at max_completion_length (CPU)
    format_penalty: float | None = None        # an output with no parseable answer; None = Eq. 3-5 exactly
    stage1_reward: Literal["stage1", "stage2"] = "stage1"  # stage 1's equation: Eq. 4 (the paper's mixed design)
                                                           # or Eq. 5 (Figure 3's single reward for both stages)
    stage1: GRPOParams
    stage2: GRPOParams

    def reward(self, stage: Literal["stage1", "stage2"]) -> AnswerReward:
        equation = self.stage1_reward if stage == "stage1" else "stage2"
        return AnswerReward(equation, self.alpha, self.max_words, self.min_words, self.format_penalty)


def train_answer_agent(stage1: Sequence[GRPOSample | dict], stage2: Sequence[GRPOSample | dict], model_path: str,
                       work_dir: str | Path, params: AnswerAgentParams,
                       callbacks: list | None = None, engine_cfg=None) -> tuple[TrainResult, list[dict]]:
    """Stage 1 (Eq. 4) then stage 2 (Eq. 5) from the stage-1 model; returns the final result and the curve rows.

    `work_dir` keeps both stages' checkpoints and the stage-1 model; it must not be a DVC out (DVC deletes outs
    before a run, and a rerun after a kill resumes from it). A finished stage 1 is not retrained: its last
    checkpoint is at the final step, so resuming it is a no-op.
    """
    work = Path(work_dir)
    eos = _eos_ids(model_path)
    tag = {"alpha": params.alpha, "l": params.max_words, "min_words": params.min_words,
           "clipped_is_long": params.clipped_is_long, "format_penalty": params.format_penalty,
           "y": "maps.parse_answer (lead-in aware)"}
    eq = {"stage1": "Eq. 4", "stage2": "Eq. 5"}
    r1 = train_grpo(stage1, model_path, str(work / "stage1"), params.stage1,
                    answer_reward_func(params.reward("stage1"),
                                       params.stage1.max_completion_length if params.clipped_is_long else None, eos),
                    run_tag={**tag, "reward": eq[params.stage1_reward]}, callbacks=callbacks,
                    engine_cfg=engine_cfg)
    stage1_model = save_agent(r1, work / "stage1_model")
    rows = curve_rows(r1.log_history, stage="stage1")
    summary1 = {"global_step": r1.global_step, "seconds": r1.seconds, "resumed_from": r1.resumed_from,
                "fingerprint": r1.extra["fingerprint"]}
    del r1
    gc.collect()
    r2 = train_grpo(stage2, str(stage1_model), str(work / "stage2"), params.stage2,
                    answer_reward_func(params.reward("stage2"),
                                       params.stage2.max_completion_length if params.clipped_is_long else None, eos),
                    run_tag={**tag, "reward": "Eq. 5"}, callbacks=callbacks, engine_cfg=engine_cfg)
    rows += curve_rows(r2.log_history, step_offset=params.stage1.steps, stage="stage2")
    r2.extra["stage1"] = summary1
    return r2, rows


def _eos_ids(model_path: str) -> list[int]:
    """The ids that end a completion: the tokenizer's EOS and the generation config's (a list for some models)."""
    from transformers import AutoTokenizer, GenerationConfig

    ids = {AutoTokenizer.from_pretrained(model_path).eos_token_id}
    try:
        eos = GenerationConfig.from_pretrained(model_path).eos_token_id
    except OSError:      # no generation_config.json
        eos = None
    ids |= set(eos if isinstance(eos, list) else [eos])
    return sorted(i for i in ids if i is not None)


def query_reward_func(answer_pairs: Callable[[list[str], list[dict[str, Any]]], tuple[list[str], list[str]]]
                      ) -> Callable[..., list[float]]:
    """The TRL reward for the query agent: R_q = F1(y_{n+1}, y*) - F1(y_n, y*) (Eq. 7) per sampled query.

    `answer_pairs(queries, metas)` returns (y_{n+1}, y_n): the frozen answer agent's answers with and without the
    chunks each query retrieves, computed in batched engine calls (and cached per (question, pool)) by the caller;
    `metas` are the samples' `meta` dicts (question, query pool, ...). Logged per step (so they survive a resume in
    the trainer's log history): the shares of zero and positive rewards and, where `answer_pairs` keeps
    `AnswerPairs.stats`, the shares of malformed queries and of queries that added no new chunk.
    """

    def delta_f1_reward(completions: list, golden_answers: list[list[str]], meta: list[str], log_metric=None,
                        **_: Any) -> list[float]:
        queries = [completion_text(c) for c in completions]
        stats = getattr(answer_pairs, "stats", None)
        before = dict(stats) if stats is not None else None
        y_next, y_prev = answer_pairs(queries, [json.loads(m) for m in meta])
        rewards = [delta_f1(a, b, g) for a, b, g in zip(y_next, y_prev, golden_answers, strict=True)]
        if log_metric is not None:
            n = max(len(rewards), 1)
            log_metric("delta_f1_zero", sum(r == 0 for r in rewards) / n)
            log_metric("delta_f1_positive", sum(r > 0 for r in rewards) / n)
            if before is not None:
                log_metric("query_malformed", (stats["format_errors"] - before["format_errors"]) / n)
                log_metric("query_no_new_chunks", (stats["no_new_chunks"] - before["no_new_chunks"]) / n)
        return rewards

    return delta_f1_reward


# ---- training samples from the synthesis outputs (data/synthesis/*.jsonl) --------------------------------------

def _pool(row: dict, where: str) -> QueryPool:
    try:
        return QueryPool.from_dict(row["pool"])
    except (KeyError, TypeError, ValueError) as e:
        raise ValueError(f"{where}: row id={row.get('id')!r} has no valid `pool` ({type(e).__name__}: {e})") from None


def answer_samples(rows: Sequence[dict], top_k: int, passage_words: int | None, where: str = "t1") -> list[GRPOSample]:
    """T1 rows with `top_k` -> answer-agent GRPO prompts: the MAPS answer prompt over the row's snapshot."""
    out = []
    for r in rows:
        if r.get("top_k") != top_k:
            continue
        prompt = maps.answer_messages(r["question"], _pool(r, where).render(passage_words))
        out.append(GRPOSample(id=r["id"], prompt=prompt, golden_answers=r["golden_answers"],
                              meta={"question_id": r.get("question_id"), "round": r.get("round")}))
    return out


def query_samples(rows: Sequence[dict], passage_words: int | None, where: str = "t2") -> list[GRPOSample]:
    """T2 rows -> query-agent GRPO prompts; `meta` carries the question and pool the ΔF1 reward needs."""
    out = []
    for r in rows:
        pool = _pool(r, where)
        out.append(GRPOSample(id=r["id"], prompt=maps.query_messages(r["question"], pool.render(passage_words)),
                              golden_answers=r["golden_answers"],
                              meta={"question": r["question"], "pool": r["pool"]}))
    return out


def judge_samples(rows: Sequence[dict], where: str = "t3") -> list[SFTSample]:
    """T3 rows (label_judge output) -> SFT pairs: the judge prompt and its unanimity label as the assistant turn."""
    out = []
    for r in rows:
        msgs = r.get("messages")
        if not msgs or msgs[-1].get("role") != "assistant" or r.get("label") not in (maps.SUFFICIENT,
                                                                                    maps.INSUFFICIENT):
            raise ValueError(f"{where}: row id={r.get('id')!r} is not a labelled judge sample")
        out.append(SFTSample(id=r["id"], prompt=msgs[:-1], completion=msgs[-1]["content"],
                             meta={"label": r["label"], "n_correct": r.get("n_correct")}))
    return out


def oversample_labels(samples: Sequence[SFTSample]) -> list[SFTSample]:
    """Every label as often as the most frequent one: the minority's rows repeated in order (deterministic).

    With unanimity labels the judge data is ~95 % `Insufficient`; SFT on it learns to say the majority label.
    Repeats get ids `<id>#r<k>` so a row's copies stay traceable. A label with no rows stays absent.
    """
    by_label: dict[str, list[SFTSample]] = {}
    for s in samples:
        by_label.setdefault(s.completion, []).append(s)
    if not by_label:
        return []
    target = max(len(v) for v in by_label.values())
    out = list(samples)
    for rows in by_label.values():
        out += [rows[i % len(rows)].model_copy(update={"id": f"{rows[i % len(rows)].id}#r{i // len(rows) + 1}"})
                for i in range(target - len(rows))]
    return out


# ---- ΔF1: the frozen answer agent with and without a query's chunks (Eq. 7) ------------------------------------

def _pool_key(question: str, pool: QueryPool) -> str:
    blob = json.dumps([question, pool.queries, [[h.id for h in hs] for hs in pool.hits]], ensure_ascii=False)
    return hashlib.sha256(blob.encode()).hexdigest()


class AnswerPairs:
    """`answer_pairs(queries, metas)` for `query_reward_func`: y_{n+1} and y_n from the frozen answer agent.

    Each query is sanitised with the MAPS query parser (a malformed query retrieves nothing, so y_{n+1} = y_n and
    its reward is 0), retrieved with `top_k` (one batched search), added to the sample's pool as at inference
    (duplicates are not re-added, `max_chunks` cap), and both pools are answered greedily in ONE batched engine
    call over the answers not yet cached. Answers are cached per (question, pool), so y_n is computed once per
    question and a repeated query costs nothing.
    """

    def __init__(self, team: Team, retriever: Retriever, top_k: int, passage_words: int | None,
                 max_chunks: int | None = None, role: str = "answer_agent"):
        self.team, self.retriever, self.top_k = team, retriever, top_k
        self.passage_words, self.max_chunks, self.role = passage_words, max_chunks, role
        self.cache: dict[str, str] = {}
        self.stats = {"queries": 0, "format_errors": 0, "no_new_chunks": 0, "answers_generated": 0,
                      "cache_hits": 0, "engine_calls": 0}

    def _answer(self, items: list[tuple[str, QueryPool]]) -> list[str]:
        keys = [_pool_key(q, p) for q, p in items]
        todo: dict[str, tuple[str, QueryPool]] = {}
        for k, item in zip(keys, items):
            if k not in self.cache and k not in todo:
                todo[k] = item
        self.stats["cache_hits"] += len(keys) - len(todo)
        if todo:
            prompts = [maps.answer_messages(q, p.render(self.passage_words)) for q, p in todo.values()]
            sampling = self.team.sampling_for(self.role).model_copy(update={"n": 1, "temperature": 0.0})
            outs = continue_lead_ins(self.team, self.role, prompts, self.team.generate(self.role, prompts, sampling),
                                     maps.is_stub, sampling)   # as MAPS inference reads the answer agent
            self.stats["engine_calls"] += 1
            self.stats["answers_generated"] += len(prompts)
            for k, o in zip(todo, outs):
                a = maps.parse_answer(o[0].text)
                self.cache[k] = a if isinstance(a, str) else ""
        return [self.cache[k] for k in keys]

    def __call__(self, queries: list[str], metas: list[dict[str, Any]]) -> tuple[list[str], list[str]]:
        parsed = [maps.parse_query(q) for q in queries]
        ok = [i for i, p in enumerate(parsed) if isinstance(p, str) and p.strip()]
        self.stats["queries"] += len(queries)
        self.stats["format_errors"] += len(queries) - len(ok)
        hits = self.retriever.batch_search([parsed[i] for i in ok], self.top_k) if ok else []
        hits_of = dict(zip(ok, hits))
        prev, nxt = [], []
        for i, m in enumerate(metas):
            base = QueryPool.from_dict(m["pool"])
            grown = QueryPool.from_dict(m["pool"])
            if i in hits_of and grown.add(parsed[i], hits_of[i], self.max_chunks):
                nxt.append((m["question"], grown))
            else:  # nothing new reached the answer agent: same pool, same answer
                self.stats["no_new_chunks"] += 1
                nxt.append((m["question"], base))
            prev.append((m["question"], base))
        answers = self._answer(prev + nxt)
        return answers[len(prev):], answers[: len(prev)]
