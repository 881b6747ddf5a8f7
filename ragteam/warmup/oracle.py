"""Oracle traces for the format warm-up (issue 25 §1): an oracle team plays every role of a joint system from a
training question's gold chain (`ragteam.warmup.gold`), through the workflow code the rollouts use.

Mechanism. `OracleEngine` is an `Engine`: each prompt's reply is `reply(messages)`, a pure function of the prompt
and the question's `Gold`, turned into a `Completion` as a real engine would: the text is cut before the earliest
stop string (`find_stop`, reported as `stop_reason`), token counts and ids come from the project tokenizer
(prompt ids under the chat template, `chat_text`; sampled ids through the stop string's tokens, or the text's ids
and EOS), and a reply longer than the role's `max_new_tokens` is cut there with finish_reason "length", exactly
what the policy's budget would do to it. The workflow (`run_mask(training=True)`, `run_qagent`), the prompts and
the rewards are the rollouts' own, so the traces' prompts are byte for byte what the policy sees.

One question per workflow run: M-ASK's Summary prompt holds the search query and the passages but not the
question, so in a batch the gold of a Summary prompt could not be told from the prompt alone; run one at a time,
every prompt of the run belongs to the one gold chain the engine holds. (The prompts do not depend on the batch.)

Each system adds one `<system>_oracle(params) -> OracleSystem` (`SYSTEMS`): its role replies, its workflow, its
reward and what makes an episode a complete trace (M-ASK, QAgent, JADE, DECOR).
"""
from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from ragteam.agents import mask as M
from ragteam.agents import qagent as Q
from ragteam.config import ParamsError, parse_section
from ragteam.metrics import contains_answer, exact_match
from ragteam.llm import Completion, Messages, SamplingConfig, Team, chat_text, find_stop
from ragteam.records import Episode
from ragteam.retrieval.base import Retriever
from ragteam.warmup.gold import Gold, Hop, bare

Reply = Callable[[Messages], str]


# ---- the engine ---------------------------------------------------------------------------------------------------

class OracleEngine:
    """An Engine whose completion of a prompt is `reply(prompt)` (module docstring); `tokenizer` is the policy's."""

    model_path = "oracle"

    def __init__(self, reply: Reply, tokenizer):
        if tokenizer.eos_token_id is None:
            raise ValueError("OracleEngine: the tokenizer has no eos_token_id to end a completion with")
        self.reply, self.tok = reply, tokenizer

    def _ids(self, text: str) -> list[int]:
        return self.tok(text, add_special_tokens=False).input_ids if text else []

    def complete(self, messages: Messages, sampling: SamplingConfig) -> Completion:
        text, stop = find_stop(self.reply(messages), sampling.stop)
        ids = self._ids(text + stop) if stop else self._ids(text) + [self.tok.eos_token_id]
        finish = "stop"
        if len(ids) > sampling.max_new_tokens:   # the budget cuts it, as it would cut the policy
            ids = ids[:sampling.max_new_tokens]
            text, stop = find_stop(self.tok.decode(ids, skip_special_tokens=True), sampling.stop)
            finish = "stop" if stop else "length"
        prompt_ids = self._ids(chat_text(self.tok, messages))
        return Completion(text, len(prompt_ids), len(ids), finish, stop, tuple(prompt_ids), tuple(ids))

    def generate(self, prompts: list[Messages], sampling: SamplingConfig) -> list[list[Completion]]:
        return [[self.complete(m, sampling)] * sampling.n for m in prompts]


def oracle_team(replies: Mapping[str, Reply], tokenizer, sampling: Mapping[str, SamplingConfig]) -> Team:
    """A Team whose every role is an OracleEngine with that role's reply, under the rollouts' sampling settings."""
    engines = {role: OracleEngine(r, tokenizer) for role, r in replies.items()}

    def engine(role: str) -> OracleEngine:
        if role not in engines:
            raise ValueError(f"the oracle team has no reply for role {role!r} (it plays {sorted(engines)})")
        return engines[role]

    return Team(engine, sampling, keep_token_ids=True)


def query_forms(hop: Hop) -> tuple[str, str]:
    """The queries an oracle tries for a hop, in order: its sub-question, then its entity with the words of the
    relation's sentence (`Hop.keyword_query`), searched when the first did not bring the fact into view (e.g. a
    city's name is also a family name, and BM25 ranks the family's people above the city)."""
    return hop.question, hop.keyword_query


def _hop_of_query(gold: Gold, query: str) -> int:
    for i, h in enumerate(gold.hops):
        if query in query_forms(h):
            return i
    raise ValueError(f"question {gold.question_id}: query {query!r} is none of the oracle's hop queries")


def _visible_fact(gold: Gold, i: int, docs: Sequence[str]) -> bool:
    """Hop i's fact sentence is shown whole in one of the rendered passages (as clipped for the prompt)."""
    return any(gold.hops[i].fact in d for d in docs)


# ---- M-ASK ---------------------------------------------------------------------------------------------------------
# Output forms: the Planning / Search / Summary / Update / Answer formats of the paper's Appendix C prompts
# (`ragteam.agents.mask`), as accepted by parse_plan, parse_search, parse_summary, parse_update, parse_final_answer.

def _user(messages: Messages) -> str:
    return messages[-1]["content"]


def _field(text: str, start: str, end: str | None) -> str:
    m = re.search(re.escape(start) + (r"(.*?)" + re.escape(end) if end else r"(.*)\Z"), text, re.DOTALL)
    if m is None:
        raise ValueError(f"prompt has no {start.strip()!r} field: {text[:120]!r}")
    return m.group(1)


def _mask_history(text: str) -> list[tuple[str, str]]:
    hist = _field(text, "Search history: ", "\n\nOutput only")
    if hist.strip() == M.NO_SEARCHES:
        return []
    out = []
    for line in hist.splitlines():
        m = re.match(r"\d+\. Query: (.*) \| Summary: (.*)$", line)
        if m is None:
            raise ValueError(f"search history line {line!r} is not in render_history's layout")
        out.append((m.group(1), m.group(2)))
    return out


def _mask_steps(trajectory: str) -> list[tuple[str, str]]:
    return [(q, a) for q, a in re.findall(r"^t\d+: Q: (.*?) \| A: (.*)$", trajectory, re.MULTILINE)]


def mask_planning(gold: Gold) -> str:
    """Planning (paper §3.2.1): one `<qi>`/`<ai>` pair per gold hop, the hop's sub-question and sub-answer, and the
    golden answer as a_0, so r_plan = F1(a_0, y) = 1 (Eq. 2, the top of its range)."""
    pairs = "".join(f"<q{i}>{h.question}</q{i}>\n<a{i}>{h.answer}</a{i}>\n"
                    for i, h in enumerate(gold.hops[:M.MAX_PLAN_STEPS], 1))
    return f"{pairs}<predicted_answer>{gold.answer}</predicted_answer>"


def mask_search(gold: Gold, messages: Messages) -> str:
    """Search: the first hop not yet evidenced, by its first untried query form (`query_forms`); a hop whose forms
    all came back without evidence is given up; `<end>` when no hop is left. Reads only the prompt's search
    history (query and summary of every past search)."""
    history = _mask_history(_user(messages))
    for h in gold.hops:
        tried = {q: s for q, s in history if q in query_forms(h)}
        if any(s != M.NO_USEFUL_INFORMATION for s in tried.values()):
            continue
        untried = [q for q in query_forms(h) if q not in tried]
        if untried:
            return f"<search>{untried[0]}</search>"
    return "<end>"


def mask_summary(gold: Gold, messages: Messages) -> str:
    """Summary: the fact sentence of the searched hop when the (clipped) passages show it whole, else the prompt's
    `No useful information`: evidence the documents in the prompt do not show is never written."""
    text = _user(messages)
    query = _field(text, "Query: ", "\nCandidate Documents: ")
    docs = re.findall(r"Doc\d+: (.*)", _field(text, "Candidate Documents: ", None))
    i = _hop_of_query(gold, query)
    ev = gold.hops[i].fact if _visible_fact(gold, i, docs) else M.NO_USEFUL_INFORMATION
    return f"<evidence>{ev}</evidence>"


def mask_update(gold: Gold, messages: Messages) -> str:
    """Update: evidence for a hop whose sub-question is a step of K replaces that step (`<Update>ti</Update>`: K
    keeps the sub-answer, now with its source sentence); anything else is appended (`<Add>t(n+1)</Add>`, numbered),
    and `No useful information` never overwrites a step (the workflow's own fallback rule)."""
    text = _user(messages)
    steps = _mask_steps(_field(text, "Thinking trajectory: ", "\nNew query: "))
    query = _field(text, "\nNew query: ", "\nEvidence: ")
    evidence = _field(text, "\nEvidence: ", None)
    if evidence != M.NO_USEFUL_INFORMATION:
        sub = gold.hops[_hop_of_query(gold, query)].question
        for n, (q, _a) in enumerate(steps, 1):
            if q == sub:
                return f"<Update>t{n}</Update>"
    return f"<Add>t{len(steps) + 1}</Add>"


def mask_answer(gold: Gold, messages: Messages) -> str:
    """Answer: the golden answer (F1 = 1, Eq. 2) when K states it (as a step's answer: K_0 = [(q, a_0)] with
    `mask.initial_trajectory: question`) or states every hop's sub-answer it follows from (a comparison's
    yes / no is written nowhere), else `unkown`."""
    trajectory = _field(_user(messages), "Thinking trajectory: ", None)
    answers = [a for _q, a in _mask_steps(trajectory)]
    known = (any(exact_match(a, [gold.answer]) for a in answers)
             or all(contains_answer(trajectory, [h.answer]) for h in gold.hops))
    return f"<predicted_answer>{gold.answer if known else M.UNKNOWN}</predicted_answer>"


def mask_replies(gold: Gold) -> dict[str, Reply]:
    return {M.PLANNING: lambda m: mask_planning(gold), M.SEARCH: lambda m: mask_search(gold, m),
            M.SUMMARY: lambda m: mask_summary(gold, m), M.UPDATE: lambda m: mask_update(gold, m),
            M.ANSWER: lambda m: mask_answer(gold, m)}


def mask_top_reward(ep: Episode) -> list[float]:
    """Per call, the highest reward any output of its role could get in the state it acted in (Eq. 2-3): Planning
    and Answer 1; Search / Summary / Update of turn t 1 - F1(a_{t-1}) (F1(a_t) is at most 1); a Search that ends 0.
    With a_0 correct (the oracle's plan) the turn-level ones are 0: no search can raise a correct answer."""
    from ragteam.metrics import f1_score

    answers = {int(c.meta["turn"]): c.meta["answer"] for c in ep.calls
               if c.role in (M.PLANNING, M.ANSWER) and not c.meta.get("final")}
    out = []
    for c in ep.calls:
        if c.role in (M.PLANNING, M.ANSWER):
            out.append(1.0)
        elif c.role == M.SEARCH and c.meta.get("end"):
            out.append(0.0)
        else:
            out.append(1.0 - f1_score(answers[int(c.meta["turn"]) - 1], ep.golden_answers))
    return out


def mask_parser(role: str, messages: Messages) -> Callable[[str], Any]:
    if role == M.UPDATE:
        n = len(_mask_steps(_field(_user(messages), "Thinking trajectory: ", "\nNew query: ")))
        return lambda t: M.parse_update(t, n)
    return {M.PLANNING: M.parse_plan, M.SEARCH: M.parse_search, M.SUMMARY: M.parse_summary,
            M.ANSWER: M.parse_final_answer}[role]


# ---- QAgent --------------------------------------------------------------------------------------------------------
# Output forms: Table 5's loop (`ragteam.agents.qagent.QAGENT_PROMPT`): `<reflection>` after every <information>,
# `<plan>` before every `<search>` of 1..max_queries `<query>` blocks, `<answer>` at the end; accepted by
# `qagent.parse_turn`.

_INFO = re.compile(r"<information>(.*?)</information>", re.DOTALL)


def _qagent_trajectory(messages: Messages) -> str:
    return messages[-1]["content"] if messages[-1]["role"] == "assistant" else ""


def qagent_turn(gold: Gold, messages: Messages, max_queries: int) -> str:
    """One QAgent turn from the trajectory so far (the continued assistant message):
    - a hop is found when an <information> block shows its fact sentence (`_visible_fact`);
    - after an <information> block, a `<reflection>` restating the facts it showed, each as its `Hop.statement`
      (the shortest form that carries it: the per-turn budget also holds the plan and up to 3 queries), and
      naming the sub-questions it did not answer;
    - every hop found: `<answer>golden answer</answer>` (Eq. 7's strict EM = 1);
    - else search the hops not found whose entity is known (named by the question or by a found hop), each by its
      first untried query form, at most `max_queries`, after a `<plan>` listing their sub-questions;
    - nothing left to try: `<answer>unknown</answer>` (the trace is incomplete and the builder drops it)."""
    traj = _qagent_trajectory(messages)
    blocks = _INFO.findall(traj)
    docs = [line for b in blocks for line in b.splitlines()]
    found = {i for i in range(len(gold.hops)) if _visible_fact(gold, i, docs)}
    tried = set(re.findall(r"<query>(.*?)</query>", traj))
    head = ""
    if traj.rstrip().endswith("</information>"):
        last = blocks[-1].splitlines()
        facts = [h.statement for i, h in enumerate(gold.hops) if _visible_fact(gold, i, last)]
        searched = re.findall(r"<query>(.*?)</query>", traj[traj.rfind("<search>"):])
        missed = [gold.hops[_hop_of_query(gold, q)].question for q in searched
                  if _hop_of_query(gold, q) not in found]
        said = " ".join(facts + [f"No result answers: {q}" for q in missed])
        head = f"<reflection>{said}</reflection>\n"
    if len(found) == len(gold.hops):
        return f"{head}<answer>{gold.answer}</answer>"
    todo = []
    for i, h in enumerate(gold.hops):
        dep = gold.depends_on(i)
        untried = [q for q in query_forms(h) if q not in tried]
        if i not in found and (dep is None or dep in found) and untried:
            todo.append((h, untried[0]))
    todo = todo[:max_queries]
    if not todo:
        return f"{head}<answer>unknown</answer>"
    plan = " ".join(h.question for h, _ in todo)
    queries = "".join(f"<query>{q}</query>\n" for _, q in todo)
    return f"{head}<plan>{plan}</plan>\n<search>\n{queries}</search>"


def qagent_parser(messages: Messages, max_queries: int) -> Callable[[str], Any]:
    after = _qagent_trajectory(messages).rstrip().endswith("</information>")
    return lambda t: Q.parse_turn(t, after_information=after, max_queries=max_queries)


# ---- JADE ----------------------------------------------------------------------------------------------------------
# Output forms: Appendix E's tags (`ragteam.agents.jade`), accepted by parse_plan, parse_rewrite,
# parse_subquestions, parse_doc_ids, parse_answer. The oracle's strategy, per node of Algorithm 1's trace:
# - the root of a one-hop question: the solving plan `R, DS, AG`; of hops where one names another's entity (a chain,
#   or a comparison of two chains): `QDS` into one sub-question per hop, an entity found by an earlier hop written
#   as a reference to that sub-question ("In which city was the answer to q1 born?": at decomposition time the
#   entity is not known); of hops that do not depend on each other: `QDP` into the hops' own sub-questions;
# - a serial sub-question before it is planned: QR resolves the reference with the answers so far (the serial
#   rewrite) into the hop's own question, which is then R's query;
# - every sub-question: `R, DS, AG`; DS keeps the candidates whose (clipped) text shows the hop's fact sentence,
#   AG answers with the hop's sub-answer when the selection shows it, else "I don't know";
# - AS, after a decomposition: the golden answer when every hop's answer was found, else "I don't know".

_JADE_REF = "the answer to q{j}"
_JADE_UNKNOWN = "I don't know"
_JADE_SOLVE = "<workflow>R, DS, AG</workflow>"


def _jade_question(messages: Messages, label: str) -> str:
    """The node's question of a JADE prompt: the user message's `Question:` / `Original Question:` line."""
    for line in _user(messages).splitlines():
        if line.startswith(label):
            return line[len(label):]
    raise ValueError(f"JADE prompt has no {label!r} line: {_user(messages)[:120]!r}")


def jade_serial(gold: Gold) -> bool:
    """Some hop's entity is another hop's answer: the sub-questions depend on each other (QDS); else QDP."""
    return any(gold.depends_on(i) is not None for i in range(len(gold.hops)))


def jade_subquestions(gold: Gold) -> list[str]:
    """The decomposer's sub-questions: each hop's own question, an entity found by an earlier hop written as a
    reference to that hop's sub-question."""
    out = []
    for i, h in enumerate(gold.hops):
        dep = gold.depends_on(i)
        out.append(h.question if dep is None else h.question.replace(h.title, _JADE_REF.format(j=dep + 1)))
    return out


def _jade_hop(gold: Gold, question: str) -> int:
    if question == gold.question and len(gold.hops) == 1:     # a one-hop question is solved at the root
        return 0
    for i, h in enumerate(gold.hops):
        if question in (h.question, jade_subquestions(gold)[i]):
            return i
    raise ValueError(f"question {gold.question_id}: {question!r} is none of the oracle's sub-questions")


def jade_planner(gold: Gold, messages: Messages) -> str:
    q = _jade_question(messages, "Question: ")
    if q == gold.question and len(gold.hops) > 1:
        return f"<workflow>{'QDS' if jade_serial(gold) else 'QDP'}</workflow>"
    return _JADE_SOLVE


def jade_decompose(gold: Gold) -> str:
    return "\n".join(f"<q{i}>{q}</q{i}>" for i, q in enumerate(jade_subquestions(gold), 1))


def jade_rewrite(gold: Gold, messages: Messages) -> str:
    """The serial rewrite: the hop's own question once the sub-question it refers to is answered (its answer is in
    the prompt's observations), else the question as it stands."""
    q = _jade_question(messages, "Original Question: ")
    i = _jade_hop(gold, q)
    dep = gold.depends_on(i)
    if (dep is not None and _JADE_REF.format(j=dep + 1) in q
            and f"Answer: {gold.hops[dep].answer}" in _user(messages)):
        q = gold.hops[i].question
    return f"<query>{q}</query>"


def _jade_docs(messages: Messages) -> list[str]:
    return re.findall(r"^Document\d+ \(Title: .*?\): (.*)$", _user(messages), re.MULTILINE)


def jade_select(gold: Gold, messages: Messages) -> str:
    i = _jade_hop(gold, _jade_question(messages, "Question: "))
    docs = _jade_docs(messages)
    return f"<id>{', '.join(str(k) for k, d in enumerate(docs) if _visible_fact(gold, i, [d]))}</id>"


def jade_answer(gold: Gold, messages: Messages) -> str:
    q = _jade_question(messages, "Question: ")
    if q == gold.question and len(gold.hops) > 1:      # not the oracle's plan; answer nothing it cannot see
        return f"<answer>{_JADE_UNKNOWN}</answer>"
    i = _jade_hop(gold, q)
    shown = _visible_fact(gold, i, _jade_docs(messages))
    return f"<answer>{gold.hops[i].answer if shown else _JADE_UNKNOWN}</answer>"


def jade_summarise(gold: Gold, messages: Messages) -> str:
    text = _user(messages)
    found = all(f"Answer: {h.answer}" in text for h in gold.hops)
    return f"<answer>{gold.answer if found else _JADE_UNKNOWN}</answer>"


def jade_replies(gold: Gold) -> dict[str, Reply]:
    from ragteam.agents import jade as J

    return {J.PLANNER: lambda m: jade_planner(gold, m), J.QR: lambda m: jade_rewrite(gold, m),
            J.QDS: lambda m: jade_decompose(gold), J.QDP: lambda m: jade_decompose(gold),
            J.DS: lambda m: jade_select(gold, m), J.AG: lambda m: jade_answer(gold, m),
            J.AS: lambda m: jade_summarise(gold, m)}


def jade_parser(role: str, messages: Messages) -> Callable[[str], Any]:
    from ragteam.agents import jade as J

    if role == J.DS:
        n = len(_jade_docs(messages))
        return lambda t: (lambda ids: ids if isinstance(ids, J.FormatError) else J.check_doc_ids(ids, n))(
            J.parse_doc_ids(t))
    return {J.PLANNER: J.parse_plan, J.QR: J.parse_rewrite, J.QDS: J.parse_subquestions,
            J.QDP: J.parse_subquestions, J.AG: J.parse_answer, J.AS: J.parse_answer}[role]


# ---- DECOR ---------------------------------------------------------------------------------------------------------
# Output forms: Appendix A's `<think>...</think>` then one `<search>` / `<filter>` / `<answer>` block, the tags on
# their own lines as the templates lay them out (`ragteam.agents.decor.parse_blocks`). Strategy:
# - Planner: the first hop whose fact sentence the memory's evidence does not hold, by its sub-question (an entity
#   found by an earlier hop is in that evidence); `None` once every fact is there;
# - Filter: the fact sentences of the hops that the (clipped) results show, and of every other supporting passage
#   the results hold its first sentence (the rule judge wants each such title mentioned), in one paragraph;
# - Answerer: the golden answer when the memory holds every hop's fact, else "unknown".
# The <think> blocks say in one sentence what the output rests on (the budgets hold one sentence, tests/test_budgets).

def _decor_field(text: str, start: str) -> str:
    i = text.rfind(start)
    if i < 0:
        raise ValueError(f"DECOR prompt has no {start.strip()!r} field: {text[-160:]!r}")
    return text[i + len(start):]


def _decor_block(think: str, tag: str, content: str) -> str:
    return f"<think>\n{think}\n</think>\n<{tag}>\n{content}\n</{tag}>"


def _decor_known(gold: Gold, history: str) -> list[int]:
    from ragteam.agents import decor as D

    evidence = D.history_evidence(history)
    return [i for i, h in enumerate(gold.hops) if h.fact in evidence]


def decor_planner(gold: Gold, messages: Messages) -> str:
    history = _decor_field(_user(messages), "history search information: ")
    known = _decor_known(gold, history)
    todo = [i for i in range(len(gold.hops)) if i not in known]
    if not todo:
        return _decor_block("The history states every fact the question needs.", "search", "None")
    h = gold.hops[todo[0]]
    return _decor_block(f"The history does not answer: {h.question}", "search", h.question)


def decor_filter(gold: Gold, messages: Messages) -> str:
    text = _user(messages)
    docs = re.findall(r'^Doc \d+\(Title: "(.*?)"\): (.*)$', _decor_field(text, "Retrieval Results: "), re.MULTILINE)
    kept = []
    for title, body in docs:
        facts = [h.fact for h in gold.hops if h.fact in body]
        if facts:
            kept += [f for f in facts if f not in kept]
        elif any(bare(title) == bare(h.title) for h in gold.hops):
            first = re.split(r"(?<=[.!?])\s", body, maxsplit=1)[0]
            if first not in kept:
                kept.append(first)
    if not kept:
        return _decor_block("No document states a fact the query asks for.", "filter", "No relevant information.")
    return _decor_block("I kept the sentences that state the facts the query asks for.", "filter", " ".join(kept))


def decor_answer(gold: Gold, messages: Messages) -> str:
    history = _decor_field(_user(messages), "History search information: ")
    if len(_decor_known(gold, history)) == len(gold.hops):
        return _decor_block("The history states every fact the answer follows from.", "answer", gold.answer)
    return _decor_block("The history does not state every fact the answer needs.", "answer", "unknown")


def decor_summary(messages: Messages) -> str:
    from ragteam.agents import decor as D

    return D.history_evidence(_decor_field(_user(messages), "Search history:\n")) or "-"


def decor_replies(gold: Gold) -> dict[str, Reply]:
    from ragteam.agents import decor as D

    return {D.PLANNER: lambda m: decor_planner(gold, m), D.FILTER: lambda m: decor_filter(gold, m),
            D.ANSWERER: lambda m: decor_answer(gold, m), D.SUMMARIZER: decor_summary}


# ---- the systems ---------------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class OracleSystem:
    """What the builder needs of one joint system (module docstring)."""

    name: str
    roles: tuple[str, ...]
    replies: Callable[[Gold], dict[str, Reply]]
    run: Callable[[list[dict], Team, Retriever], list[Episode]]      # the rollouts' workflow, training mode
    annotate: Callable[[list[Episode]], None]                         # the rollouts' reward
    incomplete: Callable[[Episode], str | None]                       # why an episode is no trace (None: it is)
    parser: Callable[[str, Messages], Callable[[str], Any]]           # (role, prompt) -> the role's own parser
    describe: dict[str, Any] = field(default_factory=dict)
    # (role, the role's llm.sampling) -> what the workflow generates with (QAgent adds Algorithm 1's stop strings)
    sampling: Callable[[str, SamplingConfig], SamplingConfig] = lambda role, s: s


def mask_oracle(params: dict[str, Any]) -> OracleSystem:
    from ragteam.agents.mask_workflow import MaskConfig, run_mask
    from ragteam.rewards.mask import annotate_mask

    cfg = parse_section(params, "mask", MaskConfig)

    def incomplete(ep: Episode) -> str | None:
        bad = [c.role for c in ep.calls if c.format_error is not None]
        if bad:
            return f"format error in {bad[0]}"
        if exact_match(ep.final_answer or "", ep.golden_answers) < 1:
            return "final answer not the gold"
        low = [c.role for c, top in zip(ep.calls, mask_top_reward(ep)) if abs(c.reward - top) > 1e-9]
        return f"reward below its top in {low[0]}" if low else None

    return OracleSystem(
        name="mask", roles=M.ROLES, replies=mask_replies,
        run=lambda rows, team, retriever: run_mask(rows, team, retriever, cfg, system="mask", training=True),
        annotate=lambda eps: annotate_mask(eps, cfg.format_penalty), incomplete=incomplete, parser=mask_parser,
        describe={"workflow": "ragteam.agents.mask_workflow.run_mask(training=True)", "mask": cfg.model_dump()})


def qagent_oracle(params: dict[str, Any]) -> OracleSystem:
    from ragteam.agents.qagent_workflow import ROLE, QAgentConfig, agent_sampling, run_qagent
    from ragteam.rewards.qagent import qagent_rewards_stage1

    cfg = parse_section(params, "qagent", QAgentConfig)

    def incomplete(ep: Episode) -> str | None:
        bad = [c.meta.get("turn") for c in ep.calls if c.format_error is not None]
        if bad:
            return f"format error in turn {bad[0]}"
        if ep.meta.get("stop_reason") != "answer":
            return f"no answer within max_turns {cfg.max_turns}"
        return None if ep.calls[-1].reward == 1.0 else "Eq. 7 reward below 1"

    return OracleSystem(
        name="qagent", roles=(ROLE,),
        replies=lambda gold: {ROLE: lambda m: qagent_turn(gold, m, cfg.max_queries)},
        run=lambda rows, team, retriever: run_qagent(rows, team, retriever, cfg, plugin=False, system="qagent"),
        annotate=qagent_rewards_stage1, incomplete=incomplete,
        parser=lambda role, m: qagent_parser(m, cfg.max_queries), sampling=lambda role, s: agent_sampling(s),
        describe={"workflow": "ragteam.agents.qagent_workflow.run_qagent (end to end)", "reward": "Eq. 7",
                  "qagent": cfg.model_dump()})


def jade_oracle(params: dict[str, Any]) -> OracleSystem:
    from ragteam.agents import jade as J
    from ragteam.agents.jade_workflow import JadeConfig, run_jade
    from ragteam.rewards.jade import assign_rewards

    cfg = parse_section(params, "jade", JadeConfig)

    def annotate(eps: list[Episode]) -> None:
        for ep in eps:
            assign_rewards(ep, cfg.reward)

    def incomplete(ep: Episode) -> str | None:
        bad = [c.role for c in ep.calls if c.format_error is not None]
        if bad:
            return f"format error in {bad[0]}"
        if ep.meta.get("stop_reason") != "answered":
            return f"not answered within max_rounds {cfg.max_rounds}"
        if exact_match(ep.final_answer or "", ep.golden_answers) < 1:
            return "final answer not the gold"
        low = [c.role for c in ep.calls if c.meta.get("selected_ids") == []]
        return f"{low[0]} selected no document" if low else None

    return OracleSystem(
        name="jade", roles=J.ROLES, replies=jade_replies,
        run=lambda rows, team, retriever: run_jade(rows, team, retriever, cfg, system="jade"),
        annotate=annotate, incomplete=incomplete, parser=jade_parser,
        describe={"workflow": "ragteam.agents.jade_workflow.run_jade (Algorithm 1, the rollouts' procedure)",
                  "reward": "JADE Eq. 6-8", "jade": cfg.model_dump()})


def decor_oracle(params: dict[str, Any]) -> OracleSystem:
    """DECOR with the offline rule judge (`decor.judge: rules`; an LLM judge would need a model). A complete trace:
    every call well formed, the golden answer, and no role verdict of -1 (each policy call's R_total at least
    α·R_team; the Answerer is judged only when the memory holds a non-yes/no gold answer, Sec. 4.3)."""
    from ragteam.agents import decor as D
    from ragteam.agents.decor_workflow import DecorConfig, run_decor
    from ragteam.rewards.decor import RuleJudge, decor_rewards

    cfg = parse_section(params, "decor", DecorConfig)
    if cfg.judge != "rules":
        raise ParamsError("DECOR oracle traces need decor.judge: rules (the LLM judge needs a model to run)")

    def incomplete(ep: Episode) -> str | None:
        if ep.meta.get("truncated"):
            return f"format error in {ep.meta['truncated']['role']}"
        if exact_match(ep.final_answer or "", ep.golden_answers) < 1:
            return "final answer not the gold"
        low = [c.role for c in ep.calls if c.role in D.POLICY_ROLES and c.reward < cfg.reward.alpha - 1e-9]
        return f"role verdict -1 for {low[0]}" if low else None

    return OracleSystem(
        name="decor", roles=D.POLICY_ROLES, replies=decor_replies,
        run=lambda rows, team, retriever: run_decor(rows, team, retriever, cfg, system="decor",
                                                    truncate_on_format_error=True),
        annotate=lambda eps: decor_rewards(eps, RuleJudge(), cfg.reward), incomplete=incomplete,
        parser=lambda role, m: {D.PLANNER: D.parse_planner, D.FILTER: D.parse_filter, D.ANSWERER: D.parse_answerer,
                                D.SUMMARIZER: D.parse_summary}[role],
        describe={"workflow": "ragteam.agents.decor_workflow.run_decor (training mode, one rollout per question)",
                  "reward": "DECOR Eq. 2-3 with the rule judge", "decor": cfg.model_dump()})


SYSTEMS: dict[str, Callable[[dict[str, Any]], OracleSystem]] = {"mask": mask_oracle, "qagent": qagent_oracle,
                                                                "jade": jade_oracle, "decor": decor_oracle}


def oracle_system(name: str, params: dict[str, Any]) -> OracleSystem:
    if name not in SYSTEMS:
        raise ParamsError(f"no oracle for system {name!r} (known: {', '.join(sorted(SYSTEMS))})")
    return SYSTEMS[name](params)
