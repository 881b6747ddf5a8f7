"""The proof of "one system, one module" (issue 72): a sixth system, defined in this one file (its prompts, parsers,
workflow, reward, credit and oracle player), registered in `ragteam.systems.registry.REGISTRY`, runs through the real stage
code: its oracle traces (`stages.oracle_traces`), a warm-up of a few SFT steps on them (`stages.warmup_joint`) and
one RL step (`stages.train_joint`), then an evaluate row of its base and trained team (`stages.evaluate`),
touching no other module of the library. docs/adding-a-system.md walks through
it.

The toy: a query writer reads the question and writes `<query>...</query>`; the retriever searches it; an answerer
reads the passages and writes `<answer>...</answer>`. Both calls get the episode's F1, minus a format penalty for a
malformed call of their own; the advantage is each call's reward less the step's mean (no critic).
"""
from __future__ import annotations

import json
import re
from collections.abc import Sequence
from pathlib import Path

import pytest
from pydantic import Field

from ragteam.agents.core import FormatError, clip_words, finish_episode, llm_step, new_episode, retrieve_step
from ragteam.config import Strict, load_params, parse_section
from ragteam.metrics import exact_match, f1_score
from ragteam.records import Episode
from ragteam.systems.registry import REGISTRY, RowKind, System, oracle_system, register
from ragteam.train.joint.params import JointSystemParams
from ragteam.train.joint.system import JointSystem
from ragteam.warmup.oracle import OracleSystem, user_text, visible_fact

pytestmark = pytest.mark.slow      # it loads SmolLM2

# ---- the system: roles, prompts, parsers -------------------------------------------------------------------------

NAME = "toy"
QUERY, ANSWER = "toy_query", "toy_answer"
ROLES = (QUERY, ANSWER)
QUERY_PROMPT = "Write one search query that finds the facts the question needs, as <query>your query</query>."
ANSWER_PROMPT = "Answer the question from the passages, as <answer>a short answer</answer>."


class ToyConfig(Strict):
    """params.yaml `toy`: the system's own section."""

    top_k: int = Field(4, ge=1)
    passage_words: int = Field(40, ge=1)
    format_penalty: float = Field(0.5, ge=0)


def _tagged(tag: str):
    def parse(text: str):
        m = re.search(rf"<{tag}>(.+?)</{tag}>", text, re.DOTALL)
        return m.group(1).strip() if m else FormatError(f"no <{tag}>...</{tag}> block")
    return parse


parse_query, parse_answer = _tagged("query"), _tagged("answer")


def query_messages(question: str):
    return [{"role": "system", "content": QUERY_PROMPT}, {"role": "user", "content": f"Question: {question}"}]


def answer_messages(question: str, passages: Sequence[str]):
    docs = "\n".join(f"Passage {i}: {p}" for i, p in enumerate(passages, 1))
    return [{"role": "system", "content": ANSWER_PROMPT},
            {"role": "user", "content": f"Passages:\n{docs}\nQuestion: {question}"}]


# ---- its workflow (inference and training rollouts alike) ----------------------------------------------------------

def run_toy(rows: Sequence[dict], team, retriever, cfg: ToyConfig, system: str = NAME) -> list[Episode]:
    eps = [new_episode(r, system) for r in rows]
    queries = llm_step(team, QUERY, eps, [query_messages(e.question) for e in eps], parse_query)
    asked = [c.parsed if c.format_error is None else e.question for e, c in zip(eps, queries)]
    hits = retrieve_step(retriever, eps, asked, cfg.top_k)
    for ep, q, h in zip(eps, asked, hits):
        ep.queries.append(q)
        ep.retrieved_ids.append([x.id for x in h])
    answers = llm_step(team, ANSWER, eps, [answer_messages(e.question, [clip_words(x.text, cfg.passage_words)
                                                                          for x in h]) for e, h in zip(eps, hits)],
                       parse_answer)
    for ep, c in zip(eps, answers):
        ep.final_answer = c.parsed if c.format_error is None else ""
        finish_episode(ep)
    return eps


# ---- its reward and credit -----------------------------------------------------------------------------------------

def annotate(eps: list[Episode], cfg: ToyConfig) -> list[Episode]:
    """Every call: the episode's F1, minus the penalty where the call itself broke its format."""
    for ep in eps:
        f1 = f1_score(ep.final_answer or "", ep.golden_answers)
        for c in ep.calls:
            c.reward = f1 - (cfg.format_penalty if c.format_error is not None else 0.0)
    return eps


def centred(eps: Sequence[Episode]) -> list[list[float | None]]:
    """Each call's reward less the mean over the step's calls (no critic)."""
    rewards = [c.reward for ep in eps for c in ep.calls]
    mean = sum(rewards) / len(rewards)
    return [[c.reward - mean for c in ep.calls] for ep in eps]


def toy_joint(params: dict, retriever) -> JointSystem:
    cfg = parse_section(params, NAME, ToyConfig)
    return JointSystem(name=NAME, roles=ROLES, rollout=lambda rows, team: run_toy(rows, team, retriever, cfg),
                       annotate=lambda eps: annotate(eps, cfg), advantage=centred,
                       requires={"normalize_advantages": False},
                       describe={"workflow": "tests/test_toy_system.py run_toy", "toy": cfg.model_dump()})


# ---- its oracle player (the warm-up's traces) -----------------------------------------------------------------------

def toy_oracle(params: dict) -> OracleSystem:
    cfg = parse_section(params, NAME, ToyConfig)

    def replies(gold):
        def answer(messages):
            shown = all(visible_fact(gold, i, [user_text(messages)]) for i in range(len(gold.hops)))
            return f"<answer>{gold.answer if shown else 'unknown'}</answer>"
        return {QUERY: lambda m: f"<query>{gold.question}</query>", ANSWER: answer}

    def incomplete(ep: Episode) -> str | None:
        bad = [c.role for c in ep.calls if c.format_error is not None]
        if bad:
            return f"format error in {bad[0]}"
        return None if exact_match(ep.final_answer or "", ep.golden_answers) else "final answer not the gold"

    return OracleSystem(name=NAME, roles=ROLES, replies=replies,
                        run=lambda rows, team, retriever: run_toy(rows, team, retriever, cfg),
                        annotate=lambda eps: annotate(eps, cfg), incomplete=incomplete,
                        parser=lambda role, m: {QUERY: parse_query, ANSWER: parse_answer}[role],
                        describe={"workflow": "tests/test_toy_system.py run_toy"})


# ---- its evaluation row -----------------------------------------------------------------------------------------------

def toy_row(rows, team, retriever, cfgs, spec, name) -> list[Episode]:
    """An evaluate row of the toy: its workflow under its own section (`WorkflowConfigs.section`)."""
    return run_toy(rows, team, retriever, cfgs.section(NAME, ToyConfig()), system=name)


TOY = System(name=NAME, section=NAME, config=ToyConfig, train_params=JointSystemParams, joint=toy_joint,
             reward_text="Toy: every call gets the episode's F1, minus toy.format_penalty for its own format error.",
             oracle=toy_oracle, rows={NAME: RowKind(roles=ROLES, family="Toy", run=toy_row)})


# ---- through the real stages ----------------------------------------------------------------------------------------

@pytest.fixture
def registered():
    register(TOY)
    yield TOY
    del REGISTRY[NAME]


def _data(root):
    """The default run's synthetic data, a little of it, and its BM25 index, where the stages look for them."""
    from ragteam.data import synthetic
    from ragteam.io import write_jsonl
    from ragteam.retrieval.bm25 import build_bm25s_index

    _, passages, train, dev = synthetic.generate(60, 40, 4, 0, None)
    prepared = root / "data/prepared"
    write_jsonl(prepared / "corpus.jsonl", list(passages))
    write_jsonl(prepared / "train/pool.jsonl", train)
    write_jsonl(prepared / "benchmarks/synthetic.jsonl", dev)
    build_bm25s_index(prepared / "corpus.jsonl", root / "data/indexes/bm25s", k1=0.9, b=0.4, show_progress=False)
    return root / "data/indexes/bm25s"


def test_a_system_defined_in_one_file_traces_warms_up_and_trains_through_the_stages(registered, smollm2_dir,
                                                                                   tmp_path, monkeypatch):
    from stages import oracle_traces, train_joint, warmup_joint

    from ragteam.params_check import check_params

    monkeypatch.chdir(tmp_path)
    index = _data(tmp_path)
    params = load_params(Path(__file__).resolve().parents[1] / "params.yaml")
    params["llm"].update(model=str(smollm2_dir), device="cpu", threads=1)
    params["llm"]["sampling"].update({QUERY: {"max_new_tokens": 48}, ANSWER: {"max_new_tokens": 24}})
    params[NAME] = {"top_k": 4, "passage_words": 60}
    params["joint"].update(systems=[NAME], retriever=str(index))
    params["joint"][NAME] = {"max_questions": 2, "ppo": {"steps": 1, "questions_per_step": 2, "minibatch_size": 4,
                                                         "micro_batch_size": 2, "normalize_advantages": False}}
    params["warmup"].update(questions=12, heldout_questions=2, probe="rows", probe_every=2, probe_from=0,
                            probe_at_start=False, systems={})
    params["warmup"]["sft"].update(steps=2, batch_size=2, save_steps=2)
    check_params(params)          # the registry knows the toy: joint.systems, joint.toy and warmup pass

    traced = oracle_traces.run(NAME, params)
    assert traced["complete"] >= 4 and set(traced["rows_per_role"]) == set(ROLES)
    rows = [json.loads(line) for line in (tmp_path / "data/warmup" / NAME / "traces.jsonl").read_text().splitlines()]
    assert {r["system"] for r in rows} == {NAME} and rows[0]["messages"][0]["content"] == QUERY_PROMPT

    warm = warmup_joint.run(NAME, params)
    assert warm["enabled"] and (tmp_path / "models/warmup" / NAME / "model.safetensors").is_file()

    metrics = train_joint.run(NAME, params)
    card = (tmp_path / "models/agents" / NAME / "README.md").read_text()
    assert "every call gets the episode's F1" in card and "no critic" in card
    assert metrics["questions"] == 2 and f"reward/{QUERY}_last" in metrics
    assert oracle_system(NAME, params).roles == ROLES

    # and an evaluate row of it, base and trained, through the real evaluate stage
    from stages import evaluate

    from ragteam.eval.evaluate import EvalConfig, WorkflowConfigs
    from ragteam.llm import LLMConfig
    from ragteam.retrieval import open_retriever

    trained = f"{NAME}_trained"
    ev = EvalConfig(benchmarks=["synthetic"], n_questions=2,
                    systems={NAME: {"workflow": NAME}, trained: {"workflow": NAME, "model": f"models/agents/{NAME}"}})
    cfgs = WorkflowConfigs.from_params(params)
    assert cfgs.section(NAME).passage_words == 60
    scored = evaluate.run(parse_section(params, "llm", LLMConfig), cfgs, ev,
                          benchmarks=tmp_path / "data/prepared/benchmarks", results=tmp_path / "results/eval",
                          report=tmp_path / "reports/eval.md", figures=tmp_path / "figures",
                          differences=tmp_path / "metrics/eval_compare.json", retriever=open_retriever(index))
    assert list(scored) == [NAME, trained] and scored[trained]["avg"]["n"] == 2
    eps = [json.loads(line) for line in (tmp_path / "results/eval" / trained / "synthetic.jsonl").read_text().splitlines()]
    assert [c["role"] for c in eps[0]["calls"]] == [QUERY, ANSWER]
