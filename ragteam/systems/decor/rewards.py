"""DECOR rewards (Sec. 4.3) and the judges behind them, one function per equation.

    format gate      R_total = format_penalty (−1) for every policy call of a trajectory with a malformed output
    Eq. 2            R_team  = λ·F1(a_final, g) + (1 − λ)·R_LJ(a_final, g)           R_LJ ∈ {0, 1}
    role reward      R_role^u ∈ {+1, −1} per Planner / Filter step and for the Answerer (0 = not judged)
    Eq. 3            R_total^u = α·R_team + β·R_role^u                                β = 1 − α unless set

F1 is the project's one token F1 (`ragteam.metrics`), max over the golden answers. `AgentCall.reward` of each
policy call receives its step's R_total (α·R_team + β·R_role of that step); the estimator averages them per role and
trajectory (`ragteam.train.decor_adv`). The summarizer's calls get no reward (it is frozen).

Judges (`judge: rules | llm` in params):
- `LLMJudge` sends the Appendix B prompts (B.1 answer equivalence, B.2 Planner, B.3 Filter, B.4 Answerer; verbatim,
  B.1's garbled separator restored as "@@@" from its own example) to the `decor_judge` role of a Team (any model the
  Engine interface loads: a local checkpoint on hf, or vLLM on a GPU worker), all prompts of a batch in one engine
  call. YES/NO parse to 1/0 (R_LJ) and +1/−1 (R_role). Anything else is a judge error: recorded (the judge calls are
  kept as AgentCalls in `Episode.meta["judge_calls"]`, errors in `meta["judge_errors"]`), scored 0 (R_LJ = 0,
  R_role = 0: no signal), never raised. An empty prediction is not sent: R_LJ = 0 (B.1: "FORMAT ERROR" -> NO).
- `RuleJudge` (offline default) computes the verdicts from data the pipeline already has; the rules are in its
  docstring (the one place they are written; docs/systems.md's `decor` row names the two judges).
Gold answers are joined with "@@@" for every prompt's "Golden Answer" / "Reference Answer".
"""
from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol

import ragteam.systems.decor.roles as decor
from ragteam.agents.core import FormatError
from ragteam.llm import Messages, Team
from ragteam.metrics import contains_answer, f1_score, normalize_answer
from ragteam.records import AgentCall, Episode
from ragteam.retrieval.base import Hit
from ragteam.systems.decor.workflow import JUDGE_ROLE, DecorConfig, DecorRewardConfig

GOLD_SEPARATOR = "@@@"

# ---- Appendix B: judge prompts ------------------------------------------------------------------------------------

JUDGE_ANSWER_PROMPT = """You are an expert evaluation model. Your task is to judge whether the predicted answer correctly answers the question, based on the provided reference answer(s). The reference answer may contain multiple valid candidates separated by "@@@". The prediction is correct if it is factually consistent with at least one reference candidate and sufficiently answers the question.
Output ONLY "YES" or "NO"—no explanations, no punctuation, no extra text.
Core Principles:
1. Judge based on factual consistency and sufficiency for the question, not string similarity.
2. Ignore non-semantic surface differences: surrounding quotation marks ("...", '...'), articles ("the", "a"), capitalization, punctuation, parentheses, extra whitespace, or formatting.
3. The prediction may be more detailed or less detailed than the reference—as long as it is factually correct and aligns with at least one reference candidate, output YES.
4. The reference answer defines what is considered correct; your job is to check if the prediction matches any of those correct answers.
Correct Match Rules (Output YES if):
1. Semantic Equivalence: Same meaning, different phrasing.
2. Surface Form Differences: Differences only in quotes, articles ("the"), capitalization, punctuation, or whitespace are ignored.
- Example: "The Princess and the Frog" vs The Princess and the Frog → YES.
3. Numeric Equivalence: "7" vs "seven", etc.
4. Date Granularity:
- If the question asks for a year, "1995" matches "November 22, 1995".
- If the question asks for exact date, full date is required.
- Prediction can be more detailed than reference, but not less.
5. Standard Abbreviations: "ly" ↔ "light-years", "NASA" ↔ full name, etc.
6. Entity Identity: Same real-world entity, regardless of naming style.
7. More Detail, No Error: Prediction adds correct specifics without contradiction.
Critical Exclusion Rules (Output NO if):
1. Prediction omits information explicitly required by the question.
2. Prediction adds factually incorrect information.
3. Prediction refers to a different entity, value, time, or location.
4. Numerical or unit inaccuracy (e.g., meters vs feet).
5. Temporal/spatial mismatch.
6. Prediction is "FORMAT ERROR" or unreadable.
Examples:
Prediction: 42
Reference Answer: forty-two
Output: YES

Prediction: July 4, 2023
Reference Answer: July 4th, 2023
Output: YES

Prediction: the inner mitochondrial membrane
Reference Answer: inner mitochondrial membrane
Output: YES

Prediction: 1995
Reference Answer: November 22, 1995
Output: NO

Prediction: November 22, 1995
Reference Answer: 1995
Output: YES

Prediction: 26 January 1788
Reference Answer: 1788
Output: YES

Prediction: 8.6 light-years
Reference Answer: 2.6 parsecs@@@8.6 ly
Output: YES

Prediction: "The Princess and the Frog"
Reference Answer: The Princess and the Frog
Output: YES

Prediction: May, 2023
Reference Answer: May 6, 2012
Output: NO

Prediction: 15
Reference Answer: 16
Output: NO

Prediction: 10 meter
Reference Answer: 6 meter
Output: NO

Prediction: Einstein
Reference Answer: Newton
Output: NO

Important: Always anchor your judgment to the question. If the prediction answers the question correctly and aligns factually with any reference candidate—even if wrapped in quotes, preceded by "the", or differently capitalized—output YES.
Input for Judgment:
Question: {question}
Prediction: {pred}
Reference Answer: {answer}
Output:"""

JUDGE_PLANNER_PROMPT = """You are an evaluator for a planner agent in a multi-step question-answering system. Your role is to provide training signals during RLHF. Be reasonable and lenient toward plausible attempts, and only output NO for clear, unambiguous violations. Output YES if the planner's output meets all of the following:
1. The <search> content is a natural-language phrase that includes all explicit, key constraints from the user's query (e.g., named entities, years if stated, categories like "duo", "capital", "cover", etc.). → Note: It is NOT required to include implicit or unstated information. Time references are only required if explicitly mentioned in the query.
2. The search phrase is coherent, non-repetitive, and could reasonably be used in a real search engine to retrieve relevant information.
3. The search does not duplicate any query already present in the history search information.
4. The output strictly follows the required format: - Reasoning is entirely within <think> and </think> tags. - Search content (or "None") is entirely within <search> and </search> tags. - There is no text outside these tags, including extra explanations, greetings, markdown, or whitespace-only lines.
5. The <search> content does not contain the final answer, a direct answer fragment (e.g., "The Kendalls"), or commentary—even if factually correct.
Output NO if ANY of the following occurs:
- The <search> content is irrelevant to the user's query (e.g., topics not mentioned or implied).
- It repeats a search already in the history.
- The <search> field contains the final answer or a direct answer entity (e.g., names, dates, locations that directly answer the question).
- The output format is violated:
  - Missing <think> or </think> tags.
  - Missing <search> or </search> tags.
  - Any content (including blank lines, comments, or explanations) appears outside the <think> and <search> blocks.
- The search phrase is nonsensical, including but not limited to:
  - Repeated words or phrases (e.g., "Kelly Kelly Kelly").
  - Gibberish or random characters (e.g., "asdf!#").
  • Incoherent mix of unrelated languages without contextual reason.
  • Empty or whitespace-only search content when history is empty.
- History is empty, but the planner outputs <search>None</search>.
Important:
Do NOT require that the search query guarantees retrieval of the golden answer.
A focused, constraint-aware, and non-redundant search that could help gather relevant information is sufficient for YES.
---
Input:
- Query: {query}
- History Search Information: {history_search_information}
- Planner Output: {planner_output}
- Golden Answer: {golden_answer}
---
Output ONLY:
YES or NO"""

JUDGE_FILTER_PROMPT = """You are an evaluator judging whether the filter agent produced a useful and well-structured response.
Focus on semantic usefulness, not perfect verbatim matching. The goal is to check if the filter:
- Kept the core information needed for the golden answer,
- Removed clearly irrelevant content,
- Summarized faithfully and coherently,
- Used the required tag structure.
Output YES if all of the following are true:
1. Core information is preserved:
The key facts needed to derive or support the golden answer are present (e.g., names of artists, songs, or actions like "covered"). Minor details like exact years or chart numbers may be omitted if the main point is clear.
2. Irrelevant content is mostly removed:
No large blocks of off-topic text (e.g., biography details unrelated to the query) remain.
3. Summary is coherent:
The content inside <filter> is a single, flowing paragraph (not bullet points, fragments, or disjointed sentences).
4. No factual distortion:
No invented claims, swapped roles, or misrepresentations (e.g., saying "wrote" instead of "covered"). Light rewording for fluency is acceptable.
5. Basic structure is correct:
- The response contains both <think>...</think> and <filter>...</filter> blocks.
- All filtered content is inside <filter>...</filter>.
- Nothing appears outside these two blocks (except whitespace).
It's OK to say YES even if:
- The <think> section is brief or imperfect, as long as it shows some reasoning.
- The <filter> omits a minor number or date, but the main answer is inferable.
- The wording differs slightly from the retrieval, as long as meaning is intact.
Output NO only if:
- Core facts for the golden answer are missing (e.g., no mention of who covered a song).
- The output lacks <filter> or <think> tags, or puts content outside them.
- The <filter> contains lists, multiple paragraphs, or obvious hallucinations.
- Most of the output is irrelevant to the query.
Input:
- Query: {query}
- Retrieval Result: {retrieval_result}
- Filter Output: {filter_output}
- Golden Answer: {golden_answer}
Output ONLY:
YES or NO"""

JUDGE_ANSWERER_PROMPT = """You are an evaluator judging whether the answerer followed instructions and produced a correct, well-formed response.
Focus on real mistakes, not minor wording. Be tolerant of phrasing as long as meaning is correct and structure is respected.
Output YES if all of the following are true:
1. All reasoning is inside <think> tags
- No analysis, justification, or explanatory text appears outside <think>...</think>.
2. Final answer is inside <answer> tags
- The answer is concise, directly responsive (e.g., name for "who", city for "capital"), and contains no extra commentary.
3. Correct answer based on available info
- The answer matches the golden answer in meaning and factual accuracy, even if phrased slightly differently (e.g., "The Kendalls" vs "the duo The Kendalls" is OK).
- Minor omissions (like not mentioning "1977") are acceptable as long as the core answer is correct.
4. Reasoning is present and relevant
- The <think> section shows a logical attempt to use the search info to derive the answer.
- It doesn't need to be perfect, but should not be empty or completely off-topic.
5. No content outside the two tag blocks
- The response starts with <think> and ends with </answer>, with nothing before, between, or after.
6. Handles conflicts reasonably (if any)
- If search info conflicts, the reasoning shows an attempt to choose the best source.
It's OK to say YES even if:
- The reasoning is a bit verbose or repetitive.
- The answer omits a non-critical detail (e.g., year, album name).
- The wording differs slightly from the golden answer but refers to the same entity.
Output NO only if:
- Reasoning appears outside <think> tags (e.g., between </think> and <answer>).
- Answer appears outside <answer> tags.
- Final answer is factually wrong or missing.
- Tags are missing, malformed, or duplicated.
- Entire <think> section is empty or just placeholder text.
- Response contains hallucinated facts not in the search info.
- Mix of languages or repeated phrases.
Input: - Query: {query}
- History Search Information: {history_search_information}
- Answerer Output: {answerer_output}
- Golden Answer: {golden_answer}
Output ONLY:
YES or NO"""


def _user(text: str) -> Messages:
    return [{"role": "user", "content": text}]


def judge_answer_messages(question: str, prediction: str, golden_answers: Sequence[str]) -> Messages:
    return _user(JUDGE_ANSWER_PROMPT.format(question=question, pred=prediction,
                                            answer=GOLD_SEPARATOR.join(golden_answers)))


def judge_planner_messages(question: str, history: str, planner_output: str, golden_answers: Sequence[str]
                           ) -> Messages:
    return _user(JUDGE_PLANNER_PROMPT.format(query=question, history_search_information=history,
                                             planner_output=planner_output,
                                             golden_answer=GOLD_SEPARATOR.join(golden_answers)))


def judge_filter_messages(search_query: str, retrieval_result: str, filter_output: str,
                          golden_answers: Sequence[str]) -> Messages:
    return _user(JUDGE_FILTER_PROMPT.format(query=search_query, retrieval_result=retrieval_result,
                                            filter_output=filter_output,
                                            golden_answer=GOLD_SEPARATOR.join(golden_answers)))


def judge_answerer_messages(question: str, history: str, answerer_output: str, golden_answers: Sequence[str]
                            ) -> Messages:
    return _user(JUDGE_ANSWERER_PROMPT.format(query=question, history_search_information=history,
                                              answerer_output=answerer_output,
                                              golden_answer=GOLD_SEPARATOR.join(golden_answers)))


_VERDICT = re.compile(r"^(?:(?:final\s+)?(?:output|answer|verdict|judgment|judgement)\s*[:：]\s*)?(yes|no)\b(.*)$",
                      re.IGNORECASE | re.DOTALL)


def parse_verdict(text: str) -> bool | FormatError:
    """YES -> True, NO -> False. Case, surrounding quotes / markdown / a final period and an "Output:" label are
    ignored, and a verdict followed by an explanation counts; anything else (including both words) is an error."""
    s = text.strip().strip("*`\"' \n")
    m = _VERDICT.match(s)
    if not m:
        return FormatError(f"not YES or NO: {s[:80]!r}" if s else "empty verdict")
    other = "no" if m.group(1).lower() == "yes" else "yes"
    if re.search(rf"\b{other}\b", m.group(2), re.IGNORECASE):
        return FormatError(f"both YES and NO in {s[:80]!r}")
    return m.group(1).lower() == "yes"


# ---- the equations ------------------------------------------------------------------------------------------------

def format_ok(ep: Episode) -> bool:
    """R_fmt = 1 iff no policy call (Planner, Filter, Answerer) of the trajectory is malformed and it was not cut."""
    return "truncated" not in ep.meta and all(c.format_error is None for c in ep.calls
                                              if c.role in decor.POLICY_ROLES)


def team_reward(f1: float, lj: float, lam: float) -> float:
    """Eq. 2: R_team = λ·R_F1 + (1 − λ)·R_LJ."""
    return lam * f1 + (1.0 - lam) * lj


def total_reward(r_team: float, r_role: float, alpha: float, beta: float) -> float:
    """Eq. 3 (valid format): R_total^u = α·R_team + β·R_role^u."""
    return alpha * r_team + beta * r_role


# ---- judges -------------------------------------------------------------------------------------------------------

@dataclass
class Judgement:
    """One trajectory's verdicts: R_LJ and R_role per policy call index (absent = not judged, counts 0)."""

    lj: float = 0.0
    roles: dict[int, float] = field(default_factory=dict)
    errors: list[str] = field(default_factory=list)


class Judge(Protocol):
    name: str

    def judge(self, episodes: Sequence[Episode], roles: bool = True) -> list[Judgement]:
        """R_LJ of every episode; with `roles`, R_role of every policy call of the episodes that pass the gate."""
        ...


def _turn(ep: Episode, turn: int) -> dict:
    return next(x for x in ep.meta.get("turns", []) if x["turn"] == turn)


def _contains(text: str, golds: Sequence[str]) -> bool:
    """A gold answer (or a title) occurs in the text as whole tokens, a possessive read as the entity
    ("Freedonia's army" mentions Freedonia): `metrics.contains_answer`, the rewards' one containment test."""
    return contains_answer(text, list(golds)) == 1.0


def _title_key(title: str) -> str:
    return normalize_answer(title)


def _mention(title: str) -> str:
    """How a passage title is mentioned in prose: the disambiguation in parentheses dropped."""
    return re.sub(r"\s*\([^)]*\)\s*$", "", title).strip() or title


def _policy_calls(ep: Episode) -> list[tuple[int, AgentCall]]:
    return [(k, c) for k, c in enumerate(ep.calls) if c.role in decor.POLICY_ROLES]


class RuleJudge:
    """Offline verdicts from the data the pipeline already has (golden answers, retrieved passages, supporting
    titles from the question rows' `metadata.supporting_titles`). Containment = a normalised gold answer occurs in
    the normalised text as whole tokens, a possessive counting as its entity (`metrics.contains_answer`: "no" is
    not in "not", "Freedonia" is in "Freedonia's"); "yes"/"no" golds never count as contained in passages or
    queries.

    - R_LJ: 1 iff a gold answer is contained in the prediction (the project's Acc, but as whole words: "no" is not
      contained in "not", "Paris" not in "Parisian").
    - Planner, search at turn t: −1 if the query repeats an earlier query of the episode (normalised) or contains a
      gold answer (B.2: no answer in the query); else +1 iff its results hold a passage not retrieved at an earlier
      turn whose title is a supporting title or that contains a gold answer.
    - Planner, STOP: +1 iff t > 1 and the memory's evidence it saw contains a gold answer (B.2: STOP on an empty
      history = NO). "Memory contains" looks at the evidence only, not at the search queries.
    - Filter at turn t: +1 iff (a) when some retrieved passage contains a gold answer, the evidence contains one,
      (b) every supporting title among the retrieved passages is mentioned (its parenthesised disambiguation
      dropped), and (c) when no passage contains a gold answer, the evidence does not either (no unsupported
      answer); else −1.
    - Answerer: judged only when M_T contains a gold answer (the paper's intent: reward the Answerer for using
      the evidence, not for the retrieval's failures): +1 iff R_LJ = 1, else −1; otherwise not judged (0).
    """

    name = "rules"

    def judge(self, episodes: Sequence[Episode], roles: bool = True) -> list[Judgement]:
        out = []
        for ep in episodes:
            j = Judgement(lj=float(_contains(ep.final_answer or "", ep.golden_answers)))
            if roles and format_ok(ep):
                for k, c in _policy_calls(ep):
                    v = self.role_verdict(ep, c, j.lj)
                    if v is not None:
                        j.roles[k] = v
            out.append(j)
        return out

    def role_verdict(self, ep: Episode, call: AgentCall, lj: float) -> float | None:
        golds = [g for g in ep.golden_answers if normalize_answer(g) not in ("yes", "no")]
        if call.role == decor.PLANNER:
            turn = call.meta["turn"]
            if call.parsed["action"] == "stop":
                return 1.0 if turn > 1 and _contains(decor.history_evidence(call.meta["history"]), golds) else -1.0
            query = call.parsed["query"]
            earlier = [x for x in ep.meta["turns"] if x["turn"] < turn]
            if any(normalize_answer(x["query"]) == normalize_answer(query) for x in earlier):
                return -1.0
            if _contains(query, golds):
                return -1.0
            seen = {d["id"] for x in earlier for d in x["docs"]}
            support = {_title_key(t) for t in ep.meta.get("supporting_titles", [])}
            for d in _turn(ep, turn)["docs"]:
                h = Hit(d["id"], d["contents"], 0.0)
                if h.id not in seen and (_title_key(h.title) in support or _contains(h.contents, golds)):
                    return 1.0
            return -1.0
        if call.role == decor.FILTER:
            hits = [Hit(d["id"], d["contents"], 0.0) for d in _turn(ep, call.meta["turn"])["docs"]]
            evidence = call.parsed
            answer_in_docs = any(_contains(h.contents, golds) for h in hits)
            if answer_in_docs != _contains(evidence, golds):  # (a) kept the answer / (c) none unsupported
                return -1.0
            support = {_title_key(t) for t in ep.meta.get("supporting_titles", [])}
            titles = {h.title for h in hits if _title_key(h.title) in support}
            if not all(_contains(evidence, [_mention(t)]) for t in titles):
                return -1.0
            return 1.0
        if call.role == decor.ANSWERER:
            if not _contains(decor.history_evidence(call.meta["history"]), golds):
                return None
            return 1.0 if lj == 1.0 else -1.0
        return None


class LLMJudge:
    """Appendix B prompts through the Engine interface (the Team's `decor_judge` role); see the module doc."""

    name = "llm"

    def __init__(self, team: Team, role: str = JUDGE_ROLE):
        self.team, self.role = team, role

    def _prompts(self, ep: Episode, roles: bool) -> list[tuple[int | None, Messages]]:
        """(policy call index or None for B.1, messages) for one episode."""
        out: list[tuple[int | None, Messages]] = []
        if ep.final_answer and ep.golden_answers:
            out.append((None, judge_answer_messages(ep.question, ep.final_answer, ep.golden_answers)))
        if not (roles and format_ok(ep)):
            return out
        for k, c in _policy_calls(ep):
            if c.role == decor.PLANNER:
                m = judge_planner_messages(ep.question, c.meta["history"], c.response, ep.golden_answers)
            elif c.role == decor.FILTER:
                m = judge_filter_messages(c.meta["search_query"], c.meta["retrieval_result"], c.response,
                                          ep.golden_answers)
            else:
                m = judge_answerer_messages(ep.question, c.meta["history"], c.response, ep.golden_answers)
            out.append((k, m))
        return out

    def judge(self, episodes: Sequence[Episode], roles: bool = True) -> list[Judgement]:
        items = [(e, k, m) for e, ep in enumerate(episodes) for k, m in self._prompts(ep, roles)]
        outs = self.team.complete(self.role, [m for _, _, m in items]) if items else []
        res = [Judgement() for _ in episodes]
        for ep in episodes:
            ep.meta["judge_calls"], ep.meta["judge_errors"] = [], []
        for (e, k, msgs), out in zip(items, outs):
            ep, j = episodes[e], res[e]
            verdict = parse_verdict(out.text)
            kind = "answer" if k is None else ep.calls[k].role
            err = verdict.reason if isinstance(verdict, FormatError) else None
            call = AgentCall(role=self.role, prompt=list(msgs), response=out.text,
                             parsed=None if err else ("YES" if verdict else "NO"), format_error=err,
                             prompt_tokens=out.prompt_tokens, completion_tokens=out.completion_tokens,
                             episode_id=ep.episode_id, meta={"judged": kind, "call_index": k})
            ep.meta["judge_calls"].append(call.model_dump(mode="json"))
            if err is not None:
                j.errors.append(f"{kind}: {err}")
                ep.meta["judge_errors"].append(f"{kind} (call {k}): {err}")
                if k is not None:
                    j.roles[k] = 0.0    # a judge error gives no role signal
                continue                # ... and R_LJ stays 0
            if k is None:
                j.lj = 1.0 if verdict else 0.0
            else:
                j.roles[k] = 1.0 if verdict else -1.0
        return res


def make_judge(cfg: DecorConfig, team: Team) -> Judge:
    """The judge of `decor.judge`; `team` must map `decor_judge` to the judge model (make_team does)."""
    return LLMJudge(team) if cfg.judge == "llm" else RuleJudge()


# ---- rewards on Episodes ------------------------------------------------------------------------------------------

def assign_rewards(episodes: Sequence[Episode], judgements: Sequence[Judgement], cfg: DecorRewardConfig
                   ) -> None:
    """Fill `AgentCall.reward` (R_total of the step) of every policy call and `Episode.meta["reward"]`.

    meta["reward"] = {format_ok, f1, lj, team, roles: {call index: R_role}}; `team` is R_team even for a gated
    trajectory (the step log's figures), but then every policy call's reward is `format_penalty`.
    """
    for ep, j in zip(episodes, judgements):
        ok = format_ok(ep)
        f1 = f1_score(ep.final_answer or "", ep.golden_answers) if ep.golden_answers else 0.0
        r_team = team_reward(f1, j.lj, cfg.lam)
        for k, c in _policy_calls(ep):
            c.reward = (total_reward(r_team, j.roles.get(k, 0.0), cfg.alpha, cfg.beta_value) if ok
                        else cfg.format_penalty)
        ep.meta["reward"] = {"format_ok": ok, "f1": f1, "lj": j.lj, "team": r_team,
                             "roles": {str(k): v for k, v in j.roles.items()}}


def decor_rewards(episodes: Sequence[Episode], judge: Judge, cfg: DecorRewardConfig) -> list[Judgement]:
    """Judge the episodes (LJ and roles) and assign the rewards of Eq. 2-3 with the format gate."""
    judgements = judge.judge(episodes, roles=True)
    assign_rewards(episodes, judgements, cfg)
    return judgements


def score_lj(episodes: Sequence[Episode], judge: Judge) -> None:
    """The LJ metric (evaluation): `Episode.metrics["lj"]` = R_LJ in {0, 1} for every episode with golds."""
    scored = [ep for ep in episodes if ep.golden_answers]
    for ep, j in zip(scored, judge.judge(scored, roles=False)):
        ep.metrics["lj"] = j.lj
