"""MAPS rewards (Eq. 3-7) against hand-computed values."""
import pytest

from ragteam.rewards.maps import (
    ANSWER_REWARDS,
    delta_f1,
    length_penalty,
    maps_answer_reward_stage1,
    maps_answer_reward_stage2,
)

R1, R2 = maps_answer_reward_stage1, maps_answer_reward_stage2


def test_exact_answer_after_normalisation_gets_em_plus_alpha():
    # "The Eiffel Tower!" -> "eiffel tower": EM 1, PR 1, F1 1, 3 words <= l
    assert R1("The Eiffel Tower!", ["Eiffel Tower"], alpha=0.5, max_words=12) == pytest.approx(1.5)
    assert R2("the  eiffel tower", ["Eiffel Tower"], alpha=0.3, max_words=12) == pytest.approx(1.3)


def test_answer_wrapped_in_a_sentence_separates_precision_from_f1():
    # "It is Paris." -> tokens [it, is, paris], gold [paris]: PR = 1/3, recall 1, F1 = 2*(1/3)/(4/3) = 1/2
    assert R1("It is Paris.", ["Paris"], alpha=0.5, max_words=12) == pytest.approx(0.5 / 3)
    assert R2("It is Paris.", ["Paris"], alpha=0.5, max_words=12) == pytest.approx(0.25)


def test_multiple_golds_take_the_best_match():
    # vs "New York": PR 2/3 (new, york of new york city), F1 = 2*(2/3)*1/(5/3) = 0.8; vs "NYC": 0
    golds = ["NYC", "New York"]
    assert R1("New York City", golds, alpha=1.0, max_words=12) == pytest.approx(2 / 3)
    assert R2("New York City", golds, alpha=1.0, max_words=12) == pytest.approx(0.8)
    # EM against the second gold counts in full
    assert R2("nyc", golds, alpha=0.5, max_words=12) == pytest.approx(1.5)


def test_empty_answer_scores_zero_and_is_not_penalised():
    assert R1("", ["Paris"], alpha=0.5, max_words=12) == 0.0
    assert R2("   ", ["Paris"], alpha=0.5, max_words=12) == 0.0


def test_over_long_answer_gets_the_length_penalty():
    y = "the answer is Paris because the document says that Paris is the capital of France"  # 15 words
    # normalised: 12 tokens (3 x "the" dropped), one overlap with "paris" (clipped count) -> PR 1/12
    assert R1(y, ["Paris"], alpha=0.5, max_words=12) == pytest.approx(0.5 / 12 - 1.0)
    # F1: p = 1/12, r = 1 -> 2/13
    assert R2(y, ["Paris"], alpha=0.5, max_words=12) == pytest.approx(0.5 * 2 / 13 - 1.0)


def test_length_penalty_boundary_is_strictly_greater_than_l():
    assert length_penalty("one two three", 3) == 0.0
    assert length_penalty("one two three four", 3) == -1.0
    assert length_penalty("", 0) == 0.0
    # a correct answer that is too long still loses the format term: EM 1 + α - 1
    assert R1("Paris Paris", ["Paris Paris"], alpha=0.5, max_words=1) == pytest.approx(0.5)


def test_yes_no_answers_must_match_exactly():
    assert R1("Yes.", ["yes"], alpha=0.5, max_words=12) == pytest.approx(1.5)
    assert R2("yes", ["no"], alpha=0.5, max_words=12) == 0.0
    # "yes they are" vs "yes": FlashRAG gives F1/PR 0 when one side is yes/no and they differ
    assert R2("yes they are", ["yes"], alpha=0.5, max_words=12) == 0.0


def test_alpha_scales_only_the_matching_term():
    a = R2("It is Paris", ["Paris"], alpha=0.0, max_words=12)
    b = R2("It is Paris", ["Paris"], alpha=2.0, max_words=12)
    assert a == 0.0 and b == pytest.approx(1.0)


def test_delta_f1_is_the_change_in_answer_f1():
    assert delta_f1("Paris", "London", ["Paris"]) == pytest.approx(1.0)
    assert delta_f1("London", "Paris", ["Paris"]) == pytest.approx(-1.0)
    assert delta_f1("the Paris", "Paris.", ["Paris"]) == 0.0
    # partial: F1("It is Paris") = 0.5, F1("London") = 0
    assert delta_f1("It is Paris", "London", ["Paris", "Lutetia"]) == pytest.approx(0.5)
    # best gold per answer: "New York" (0.8 vs "new york") -> "NYC" (1.0)
    assert delta_f1("NYC", "New York City", ["NYC", "New York"]) == pytest.approx(0.2)


def test_answer_rewards_registry_maps_stages_to_equations():
    assert ANSWER_REWARDS == {"stage1": R1, "stage2": R2}


def test_min_words_also_penalises_the_empty_answer_and_defaults_to_eq3():
    # a policy that learns "" to dodge L(y) (reward 0 > -1) is penalised when min_words = 1
    assert length_penalty("", 5, min_words=1) == -1.0
    assert length_penalty("Paris", 5, min_words=1) == 0.0
    assert R1("", ["Paris"], alpha=0.5, max_words=5, min_words=1) == -1.0
    assert R2(" ", ["Paris"], alpha=0.5, max_words=5, min_words=1) == -1.0
    assert R2("Paris", ["Paris"], alpha=0.5, max_words=5, min_words=1) == pytest.approx(1.5)
    assert R1("", ["Paris"], alpha=0.5, max_words=5) == 0.0  # Eq. 3 as written


# ---- the reward on raw outputs: parser and reward agree, degenerate outputs never win ------------------------------

from ragteam.rewards.maps import AnswerReward  # noqa: E402

GOLD = ["Ada Lovelace"]
CORRECT_LONG = ("The person who wrote the first published algorithm for the Analytical Engine was Ada Lovelace, "
                "an English mathematician")
# what a policy can collapse to: lead-in stubs, empty lines, copied passage headers, prompt echoes
DEGENERATE = ["The answer to this question is:", "Answer:", "", "   \n  ", "\n\n", "**Answer:**",
              'Doc 1(Title: "Ada Lovelace"): Augusta Ada King', "Doc 2(Title: Charles Babbage) ...",
              "Based on the given documents, the answer is:", "Question: who wrote the first algorithm?",
              "The answer to this question is:\nThe answer is:", "(no new documents)", "Answer: (no new documents)"]


@pytest.mark.parametrize("equation", ["stage1", "stage2"])
@pytest.mark.parametrize("degenerate", DEGENERATE)
def test_no_degenerate_output_scores_as_well_as_a_correct_long_answer(equation, degenerate):
    # the CPU default: l = 8, min_words 1, a format penalty of -1 for an output with no answer
    reward = AnswerReward(equation, alpha=0.5, max_words=8, min_words=1, format_penalty=-1.0)
    long_r, long_y = reward(CORRECT_LONG, GOLD)
    assert long_y.startswith("The person who wrote") and len(long_y.split()) > 8   # over l: L(y) = -1
    for clipped in (False, True):
        r, y = reward(degenerate, GOLD, clipped=clipped)
        assert y == "" and r < long_r, (degenerate, r, long_r)


def test_a_lead_in_then_the_answer_is_scored_as_the_answer():
    reward = AnswerReward("stage2", alpha=0.5, max_words=8, min_words=1, format_penalty=-1.0)
    assert reward("The answer to this question is:\nAda Lovelace", GOLD) == (pytest.approx(1.5), "Ada Lovelace")
    assert reward("The answer to this question is: Ada Lovelace.", GOLD) == (pytest.approx(1.5), "Ada Lovelace")
    # the stub the issue found ("to this question is:" read as the answer scored 0 under Eq. 3-5) is no answer now
    assert reward("The answer to this question is:", GOLD) == (-1.0, "")


def test_paper_profile_keeps_the_equations_exactly():
    # format_penalty None, min_words 0: an answer-less output is the empty answer, Eq. 4 gives it 0 (the paper's
    # equations rank it above a correct long answer, -1 + α·PR; the CPU default's format penalty exists for that)
    reward = AnswerReward("stage1", alpha=0.5, max_words=12, min_words=0, format_penalty=None)
    assert reward("Answer:", GOLD) == (0.0, "")
    assert reward("Ada Lovelace", GOLD)[0] == pytest.approx(1.5)
    r, _ = reward(CORRECT_LONG + " " + "who lived in London in the nineteenth century", GOLD)
    assert -1.0 < r < 0.0


def test_one_token_answers_get_precision_one_or_zero():
    reward = AnswerReward("stage1", alpha=0.5, max_words=8, min_words=1, format_penalty=-1.0)
    assert reward("Lovelace", GOLD)[0] == pytest.approx(0.5)     # PR = 1/1, EM 0
    assert reward("Babbage", GOLD)[0] == 0.0                     # PR = 0
    assert reward("the", GOLD)[0] == pytest.approx(0.0)          # "the" normalises away: PR 0, one raw word
