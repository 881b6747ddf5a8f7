"""MAPS rewards (Sections 3.2-3.3), one function per equation, on the project's one EM / F1 / precision.

EM, PR and F1 use FlashRAG's normalisation (`ragteam.metrics`): lower case, no punctuation, no articles.
With several golden answers every term takes its max over them. That equals the max of the whole reward:
EM = 1 for some gold implies PR = F1 = 1 for that gold, and otherwise EM is 0 for all of them.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from ragteam.agents.core import FormatError
from ragteam.agents.maps import parse_answer
from ragteam.metrics import exact_match, f1_score, precision_score


def length_penalty(y: str, max_words: int, min_words: int = 0) -> float:
    """Eq. 3: L(y) = -1 if y has more than l words (whitespace split of the raw answer), else 0.

    `min_words` (not in the paper; 0 = Eq. 3 exactly) also penalises answers with fewer words: a 135M model
    under Eq. 3 alone learns the empty answer (reward 0 beats -1 when EM and PR are rarely positive).
    """
    n = len(y.split())
    return -1.0 if n > max_words or n < min_words else 0.0


def maps_answer_reward_stage1(y: str, golden_answers: list[str], alpha: float, max_words: int,
                              min_words: int = 0) -> float:
    """Eq. 4: R_a1 = EM(y, y*) + α·PR(y, y*) + L(y), with PR = |y ∩ y*| / |y| (Eq. 2, token precision)."""
    return (exact_match(y, golden_answers) + alpha * precision_score(y, golden_answers)
            + length_penalty(y, max_words, min_words))


def maps_answer_reward_stage2(y: str, golden_answers: list[str], alpha: float, max_words: int,
                              min_words: int = 0) -> float:
    """Eq. 5: R_a2 = EM(y, y*) + α·F1(y, y*) + L(y), with F1 = 2|y ∩ y*| / (|y| + |y*|) (Eq. 6)."""
    return (exact_match(y, golden_answers) + alpha * f1_score(y, golden_answers)
            + length_penalty(y, max_words, min_words))


def delta_f1(y_next: str, y_prev: str, golden_answers: list[str]) -> float:
    """Eq. 7: R_q = F1(y_{n+1}, y*) - F1(y_n, y*): the answer agent's gain from the new query's chunks."""
    return f1_score(y_next, golden_answers) - f1_score(y_prev, golden_answers)


# The answer-agent rewards by training stage; trainers and the OpenRLHF reward file look them up here.
ANSWER_REWARDS = {"stage1": maps_answer_reward_stage1, "stage2": maps_answer_reward_stage2}


@dataclass(frozen=True)
class AnswerReward:
    """The answer agent's reward on a raw model output, as every backend computes it (TRL, shared-prefix, OpenRLHF).

    y is the answer as the pipeline reads it (`maps.parse_answer`), so the reward and the parser agree on what an
    answer is. An output the parser rejects (empty, a lead-in with no answer after it, a copied `Doc 1(Title: ...`
    header) has no y: it gets `format_penalty`, or, with `format_penalty = None` (the paper profile: Eq. 3-5
    exactly), the equation's value for the empty answer. `clipped` (a completion cut at the token budget, CPU
    profile): its real length is unknown, so L(y) = -1 as for an over-long answer.
    """

    equation: Literal["stage1", "stage2"]
    alpha: float
    max_words: int
    min_words: int = 0
    format_penalty: float | None = None

    def __call__(self, text: str, golden_answers: list[str], clipped: bool = False) -> tuple[float, str]:
        """(reward, y) for one raw output; y = "" when the output has no answer."""
        y = parse_answer(text)
        if isinstance(y, FormatError):
            if self.format_penalty is not None:
                return self.format_penalty, ""
            y = ""
        r = ANSWER_REWARDS[self.equation](y, golden_answers, self.alpha, self.max_words, self.min_words)
        if clipped and length_penalty(y, self.max_words, self.min_words) == 0.0:
            r -= 1.0
        return r, y
