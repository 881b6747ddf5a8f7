"""QAgent inference (Algorithm 1, Sec. 3.2-3.5), all questions advancing together, and the token view of a
trajectory that training consumes.

    y, K, b = ∅, ∅, 0
    while b < B:
        y_b ~ π(· | q, y) until </search>, </answer> or EOS
        search  -> C = [R(q_1), ..., R(q_n)] (top-k each, n <= 3); y += <information>C</information>; K = K ∪ C
        answer  -> stop
        neither -> y += prompt_rethink
        b += 1
    end to end (Table 1): the agent's own <answer>;  plug-in (Table 2): Ã = G(q, K) with a frozen generator G

Each turn is one engine call over every unfinished episode (role `qagent`, stop strings forced) and one
`batch_search` over every query of every episode that searched. The trajectory is one growing assistant message
that the engine continues (`ragteam.llm.chat_text`); every generated segment is an AgentCall whose `response` ends
with the stop string the model wrote, and the text the environment appended after it is kept apart in
`meta["injected"]` (`meta["injected_kind"]`: "information" | "retry"), so the generated and injected parts of the
sequence are known exactly (`trajectory_tokens`).

The plug-in generator is the role `answer_agent` with the MAPS answer prompt over (q, K): K, deduplicated in the
order first retrieved, is rendered as one query-pool entry whose query is the question itself, the layout the MAPS
answer agent was trained on (single-retrieval pools), so a trained MAPS answer agent can be the generator. G sees
the question and the passages only, never the agent's plans, queries, reflections or answer. (The paper does not
state G's prompt.)
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import partial

from pydantic import Field

import ragteam.systems.qagent.roles as qagent
from ragteam.agents import answer, maps
from ragteam.agents.core import QueryPool, add_to_pool, finish_episode, llm_step, new_episode, retrieve_step
from ragteam.config import Strict
from ragteam.llm import Messages, SamplingConfig, Team
from ragteam.records import AgentCall, Episode
from ragteam.retrieval.base import Hit, Retriever

ROLE = "qagent"                 # the search agent
GENERATOR_ROLE = "answer_agent"  # the frozen generator G of the plug-in mode and of the stage-2 reward


class QAgentConfig(Strict):
    """The `qagent` section of params.yaml."""

    max_turns: int = Field(4, ge=1)               # B of Algorithm 1 (not stated in the paper)
    max_queries: int = Field(qagent.MAX_QUERIES, ge=1)  # queries run per <search> block (the prompt: <= 3)
    top_k: int = Field(1, ge=1)                   # passages per query (paper: 1 for iterative methods)
    passage_words: int | None = Field(None, ge=1)  # clip passages in <information> and for G (None: whole)
    retry_prompt: str | None = None               # Algorithm 1's prompt_rethink; None: qagent.PROMPT_RETHINK
    # training (train_joint@qagent) reads joint.qagent: ragteam.systems.qagent.train.QAgentTrainParams

    @property
    def retry_text(self) -> str:
        return qagent.PROMPT_RETHINK if self.retry_prompt is None else self.retry_prompt


def agent_sampling(s: SamplingConfig) -> SamplingConfig:
    """The role's sampling with Algorithm 1's stop strings added (the workflow relies on them)."""
    return s.model_copy(update={"stop": list(dict.fromkeys([*s.stop, *qagent.STOP_STRINGS])), "n": 1})


def generator_messages(question: str, passages: Sequence[Hit], passage_words: int | None = None) -> Messages:
    """G(q, K): the MAPS answer prompt over K as one pool entry queried by the question (module docstring)."""
    return maps.answer_messages(question, QueryPool([question], [list(passages)]).render(passage_words))


def generator_step(team: Team, episodes: Sequence[Episode], passages: Sequence[Sequence[Hit]],
                   passage_words: int | None = None, **meta) -> list[AgentCall]:
    """One batched call of the frozen generator over (q, K) of every episode (plug-in mode, stage-2 reward)."""
    prompts = [generator_messages(ep.question, k, passage_words) for ep, k in zip(episodes, passages)]
    calls = llm_step(team, GENERATOR_ROLE, episodes, prompts, answer.parse_answer, continue_if=answer.is_stub, **meta)
    for c, k in zip(calls, passages):
        c.meta["passages"] = len(k)
        if c.format_error is not None:
            c.meta["fallback"] = ""  # maps.py: the empty answer
    return calls


def knowledge(ep: Episode) -> list[Hit]:
    """K = parseDocSet(τ) (Eq. 8): every passage the episode retrieved, deduplicated, in first-retrieved order."""
    pool = ep.meta.get("pool")
    if pool is None:
        raise ValueError(f"episode {ep.episode_id}: no retrieval pool (not a finished QAgent episode)")
    return [h for hs in QueryPool.from_dict(pool).hits for h in hs]


@dataclass
class _State:
    pool: QueryPool = field(default_factory=QueryPool)
    trajectory: str = ""              # every segment so far, generated and injected
    after_information: bool = False   # the last turn ended with an <information> block
    answer: str | None = None
    turns: int = 0
    retries: int = 0


def run_qagent(rows: Sequence[dict], team: Team, retriever: Retriever, cfg: QAgentConfig, plugin: bool = False,
               system: str = "qagent") -> list[Episode]:
    """Run Algorithm 1 on every row ({"id","question","golden_answers"}); one Episode each.

    End to end (`plugin=False`) the prediction is the agent's own <answer> ("" when it never answered within B
    turns); in plug-in mode it is G(q, K), and the agent's answer is only kept in `meta["agent_answer"]`.
    """
    eps = [new_episode(r, system) for r in rows]
    st = [_State() for _ in eps]
    sampling = agent_sampling(team.sampling_for(ROLE))
    active = list(range(len(eps)))
    for turn in range(1, cfg.max_turns + 1):
        if not active:
            break
        parsers = [partial(qagent.parse_turn, after_information=st[i].after_information,
                           max_queries=cfg.max_queries) for i in active]
        calls = llm_step(team, ROLE, [eps[i] for i in active],
                         [qagent.continue_messages(eps[i].question, st[i].trajectory) for i in active], parsers,
                         sampling=sampling, keep_stop=True, turn=turn)
        searches: list[tuple[int, AgentCall, list[str]]] = []
        still = []
        for i, c in zip(active, calls):
            act = c.parsed
            if c.format_error is not None:
                act = qagent.fallback_turn(c.response, cfg.max_queries)  # see qagent.py
                c.meta["fallback"] = act
            st[i].turns = turn
            st[i].trajectory += c.response
            st[i].after_information = False
            if act["action"] == "answer":
                st[i].answer = act["answer"]
                continue
            still.append(i)
            if act["action"] == "search":
                searches.append((i, c, act["queries"]))
            else:
                _inject(st[i], c, "retry", cfg.retry_text)
                st[i].retries += 1
        # one batch_search over every query of every episode that searched this turn
        flat = [(i, q) for i, _, qs in searches for q in qs]
        hits = retrieve_step(retriever, [eps[i] for i, _ in flat], [q for _, q in flat], cfg.top_k)
        pos = 0
        for i, c, qs in searches:
            mine = hits[pos:pos + len(qs)]
            pos += len(qs)
            for q, h in zip(qs, mine):
                add_to_pool(eps[i], st[i].pool, q, h, None)  # K = K ∪ C: the pool keeps only new passages
            c.retrieved_ids = [x.id for h in mine for x in h]
            c.meta["queries"] = list(qs)
            _inject(st[i], c, "information", qagent.information_block(mine, cfg.passage_words))
            st[i].after_information = True
        active = still

    ks = [[h for hs in s.pool.hits for h in hs] for s in st]
    if plugin:
        gen = generator_step(team, eps, ks, cfg.passage_words)
    for n, (ep, s, k) in enumerate(zip(eps, st, ks)):
        ep.final_answer = (gen[n].parsed or "") if plugin else (s.answer or "")
        ep.meta.update(rounds=s.turns, stop_reason="answer" if s.answer is not None else "max_turns",
                       agent_answer=s.answer, retries=s.retries, mode="plugin" if plugin else "end_to_end")
        if not plugin and s.answer is None:  # end to end, the agent's own <answer> is the only answer there is
            ep.meta["no_answer_reason"] = f"no <answer> written in {s.turns} turns: empty answer by construction"
        ep.cost["passages"] = float(len(k))  # passages handed to the answering model (G, or the agent itself)
        finish_episode(ep, s.pool)
    return eps


def _inject(s: _State, call: AgentCall, kind: str, text: str) -> None:
    call.meta["injected"] = text
    call.meta["injected_kind"] = kind
    s.trajectory += text


# ---- the trajectory as training sees it ---------------------------------------------------------------------------

def agent_calls(ep: Episode) -> list[AgentCall]:
    """The agent's turns in order, checked to form one trajectory: turn t's prompt continues exactly the
    generated and injected text of turns 1..t-1."""
    calls = [c for c in ep.calls if c.role == ROLE]
    if not calls:
        raise ValueError(f"episode {ep.episode_id}: no {ROLE} calls")
    so_far = ""
    for t, c in enumerate(calls, start=1):
        prompt = c.prompt[-1]["content"] if c.prompt and c.prompt[-1]["role"] == "assistant" else ""
        if prompt != so_far or c.prompt[0] != calls[0].prompt[0]:
            raise ValueError(f"episode {ep.episode_id}: {ROLE} call {t} does not continue the trajectory of the "
                             f"calls before it")
        so_far += c.response + c.meta.get("injected", "")
    return calls


def trajectory_text(ep: Episode) -> str:
    """τ without the prompt: every generated segment and every injected block, in order."""
    return "".join(c.response + c.meta.get("injected", "") for c in agent_calls(ep))


@dataclass(frozen=True)
class TrajectoryTokens:
    input_ids: list[int]    # prompt + trajectory
    loss_mask: list[int]    # 1 = generated by the agent; 0 = prompt, <information> blocks, retry text
    prompt_len: int

    @property
    def n_generated(self) -> int:
        return sum(self.loss_mask)


def trajectory_tokens(ep: Episode, tokenizer) -> TrajectoryTokens:
    """Token ids and loss mask of an episode's trajectory (Fig. 2: "the searched content tokens are masked").

    Token in, token out: the first prompt is the ids the engine recorded for the first turn, each generated
    segment the ids it sampled (`AgentCall.response_ids`: through the stop string's tokens, or the EOS), so the
    loss scores what the policy sampled (see `ragteam.train.joint.batch.tokenize_call`); only the injected
    `<information>` blocks and retry text, which the engine never sampled, are tokenised here (on their own, no
    special tokens). Every token belongs to exactly one segment and the mask follows the segments exactly:
    generated segments 1, injected text 0 (the paper masks the retrieved content; the retry text is environment
    text too). Search-R1 concatenates per-segment ids the same way.
    The engine conditions each later turn on its own tokenisation of the trajectory text; the two agree wherever a
    segment boundary is also a pre-tokenizer boundary (the injected blocks begin with a newline after the agent's
    `</search>` and end with a single newline, `qagent.information_block`) and wherever the sampled ids are the
    text's own tokenisation; they differ where the policy sampled a non-canonical split, a last token that runs
    past the stop string (whose extra characters the text, and so the next prompt, leaves out), or an EOS before a
    retry (kept and scored: stopping without an action was the policy's choice; the next prompt has no EOS).
    Calls without recorded ids (scripted engines, records read back from JSONL) are tokenised from their text,
    the first prompt under the chat template (`ragteam.llm.chat_text`), and an EOS-ended last segment gets the EOS
    token appended (mask 1), since the policy chose to stop there.
    Text injected after the last generated segment conditions nothing and is left out.
    """
    from ragteam.llm import chat_text

    def enc(text: str) -> list[int]:
        return tokenizer(text, add_special_tokens=False).input_ids if text else []

    calls = agent_calls(ep)
    ids = list(calls[0].prompt_ids) if calls[0].prompt_ids else enc(chat_text(tokenizer, calls[0].prompt[:1]))
    mask = [0] * len(ids)
    prompt_len = len(ids)
    for n, c in enumerate(calls):
        parts = [(list(c.response_ids) if c.response_ids else enc(c.response), 1)]
        if n < len(calls) - 1:
            parts.append((enc(c.meta.get("injected", "")), 0))
        for seg, m in parts:
            ids += seg
            mask += [m] * len(seg)
    if calls[-1].meta.get("finish") == "eos" and not calls[-1].response_ids:   # recorded ids hold their EOS
        if tokenizer.eos_token_id is None:
            raise ValueError("the tokenizer has no eos_token_id to end an EOS-finished trajectory with")
        ids.append(tokenizer.eos_token_id)
        mask.append(1)
    return TrajectoryTokens(ids, mask, prompt_len)
