"""QAgent rewards (Sec. 3.3-3.4), one function per equation, on the project's one EM / accuracy.

Stage 1 (end-to-end RL), Eq. 7:  R(τ) = 1{r_fmt(τ) = 1} · EM_s(A*, Â)
Stage 2 (generalized RL), Eq. 8-10:  K = parseDocSet(τ);  Ã = G(q, K);  R(τ) = EM(A*, Ã) + 0.5 · Hit(τ, A*)

EM_s is strict EM (`metrics.exact_match`: FlashRAG/SQuAD normalisation, as Search-R1's EM); the stage-2 EM is
non-strict, "the prediction contains the gold answer" (`metrics.accuracy`); both take the max over golden answers.
Not stated in the paper, chosen here:
- r_fmt: every turn of τ parsed without a format error (`qagent.parse_turn`: <plan> before each <search>, 1-3
  non-empty <query>, <reflection> after each <information>, no <information> written by the agent, no retry turn)
  and τ ends with a non-empty <answer>. Binary, as the paper's gate.
- Hit: "the entire trajectory contains the gold answer": a normalised golden answer is contained in the whole of τ
  after the prompt, the injected <information> blocks included (the retrieved passages are part of τ, Eq. 6).
The trajectory-level reward is written on the agent's last call (`AgentCall.reward`), where a trainer reads it.
"""
from __future__ import annotations

from collections.abc import Sequence

from ragteam.agents.qagent_workflow import agent_calls, generator_step, knowledge, trajectory_text
from ragteam.eval.metrics import accuracy, exact_match
from ragteam.llm import Team
from ragteam.records import Episode


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


def hit(trajectory: str, golden_answers: list[str]) -> float:
    """Hit(τ, A*): 1 if the trajectory contains a golden answer (normalised), else 0."""
    return accuracy(trajectory, golden_answers)


def qagent_reward_stage2(generator_answer: str, trajectory: str, golden_answers: list[str],
                         hit_weight: float = 0.5) -> float:
    """Eq. 10: R(τ) = EM(A*, Ã) + 0.5 · Hit(τ, A*), with non-strict EM (Ã contains A*)."""
    return accuracy(generator_answer, golden_answers) + hit_weight * hit(trajectory, golden_answers)


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
    gen = generator_step(team, eps, [knowledge(ep) for ep in eps], passage_words, reward="stage2")
    out = []
    for ep, g in zip(eps, gen):
        answer = g.parsed if g.format_error is None else ""
        r = qagent_reward_stage2(answer, trajectory_text(ep), ep.golden_answers, hit_weight)
        g.meta.update(hit=hit(trajectory_text(ep), ep.golden_answers), em=accuracy(answer, ep.golden_answers))
        agent_calls(ep)[-1].reward = r
        out.append(r)
    return out
