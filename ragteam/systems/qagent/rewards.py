"""QAgent rewards (Sec. 3.3-3.4), one function per equation, on the project's one normaliser.

Stage 1 (end-to-end RL), Eq. 7:  R(τ) = 1{r_fmt(τ) = 1} · EM_s(A*, Â)
Stage 2 (generalized RL), Eq. 8-10:  K = parseDocSet(τ);  Ã = G(q, K);  R(τ) = EM(A*, Ã) + 0.5 · Hit(τ, A*)

EM_s is strict EM (`metrics.exact_match`: FlashRAG/SQuAD normalisation, Search-R1's `em_check`). The stage-2 EM
is non-strict, "a prediction is correct if it contains the gold answer" (Sec. 4.1, after Self-RAG), read as whole
tokens (`metrics.contains_answer`): Search-R1's `subem_check` tests a character substring, which pays a generator
that says "not sure" for the gold "no". Both take the max over golden answers.
Not stated in the paper, chosen here:
- r_fmt: every turn of τ parsed without a format error (`qagent.parse_turn`: <plan> before each <search>, 1-3
  non-empty <query>, <reflection> after each <information>, no <information> written by the agent, no retry turn)
  and τ ends with a non-empty <answer>. Binary, as the paper's gate.
- Hit: "the entire trajectory contains the gold answer" (Sec. 3.4) is read over the retrieved passages K of Eq. 8
  only: a golden answer occurs as whole tokens in one passage of K (title and text, clipped to `passage_words` as
  the agent and G see them). Not the agent's own plans, queries, reflections or answer: stage 2 rewards retrieval
  (Sec. 3.4: the end-to-end answer is "relaxed to Hit"), and an agent that writes the gold itself retrieved
  nothing. Not the environment's text either: `Doc N` labels, "Title:" headers and the retry prompt (gold "2"
  must not hit "Doc 2").
The trajectory-level reward is written on the agent's last call (`AgentCall.reward`), where a trainer reads it.
"""
from __future__ import annotations

from collections.abc import Sequence

from ragteam.agents.core import clip_words
from ragteam.llm import Team
from ragteam.metrics import contains_answer, exact_match
from ragteam.records import Episode
from ragteam.retrieval.base import Hit
from ragteam.systems.qagent.workflow import agent_calls, generator_step, knowledge


def format_ok(ep: Episode) -> bool:
    """r_fmt(τ) = 1: no turn has a format error and the last turn is an answer (module docstring)."""
    calls = agent_calls(ep)
    last = calls[-1]
    return (all(c.format_error is None for c in calls) and isinstance(last.parsed, dict)
            and last.parsed.get("action") == "answer")


def qagent_reward_stage1(ep: Episode) -> float:
    """Eq. 7: R(τ) = 1{r_fmt(τ) = 1} · EM_s(A*, Â), Â the agent's own <answer>."""
    if not format_ok(ep):
        return 0.0
    return exact_match(agent_calls(ep)[-1].parsed["answer"], ep.golden_answers)


def hit(passages: Sequence[Hit], golden_answers: list[str], passage_words: int | None = None) -> float:
    """Hit(τ, A*): 1 if a golden answer occurs as whole tokens in one passage of K (its title and its text clipped
    to `passage_words`), else 0 (module docstring)."""
    return float(any(contains_answer(f"{h.title}\n{clip_words(h.text, passage_words)}", golden_answers)
                     for h in passages))


def qagent_reward_stage2(generator_answer: str, passages: Sequence[Hit], golden_answers: list[str],
                         hit_weight: float = 0.5, passage_words: int | None = None) -> float:
    """Eq. 10: R(τ) = EM(A*, Ã) + 0.5 · Hit(τ, A*), EM non-strict (Ã contains A* as whole tokens), Hit over K."""
    return (contains_answer(generator_answer, golden_answers)
            + hit_weight * hit(passages, golden_answers, passage_words))


def qagent_rewards_stage1(episodes: Sequence[Episode]) -> list[float]:
    """Eq. 7 for every episode; each reward is also written on the episode's last agent call."""
    out = []
    for ep in episodes:
        r = qagent_reward_stage1(ep)
        agent_calls(ep)[-1].reward = r
        out.append(r)
    return out


def qagent_rewards_stage2(episodes: Sequence[Episode], team: Team, passage_words: int | None = None,
                 hit_weight: float = 0.5) -> list[float]:
    """Eq. 8-10 for a group (or any batch) of episodes: one batched call of the frozen generator (`team`'s
    answer_agent) over every (q, K), recorded as an AgentCall of its episode (meta reward="stage2"); the reward is
    written on each episode's last agent call and returned in order."""
    eps = list(episodes)
    ks = [knowledge(ep) for ep in eps]
    gen = generator_step(team, eps, ks, passage_words, reward="stage2")
    out = []
    for ep, k, g in zip(eps, ks, gen):
        answer = g.parsed if g.format_error is None else ""
        r = qagent_reward_stage2(answer, k, ep.golden_answers, hit_weight, passage_words)
        g.meta.update(hit=hit(k, ep.golden_answers, passage_words), em=contains_answer(answer, ep.golden_answers))
        agent_calls(ep)[-1].reward = r
        out.append(r)
    return out
