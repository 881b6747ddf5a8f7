"""Oracle traces for the format warm-up (issue 25 §1): on the default synthetic data with the project's own BM25
index, every role of M-ASK and QAgent, played by the oracle through the rollouts' workflow, writes outputs that its
own parser accepts and that its system's reward puts at the top; traces refuse evaluation questions; every row is
validated when written and read; every oracle output fits its role's budget."""
from __future__ import annotations

import json
from collections import Counter, defaultdict
from pathlib import Path

import pytest

from ragteam.agents.core import FormatError
from ragteam.config import deep_merge, load_params
from ragteam.data import synthetic
from ragteam.io import DataError, write_jsonl
from ragteam.llm import LLMConfig, SamplingConfig, chat_text
from ragteam.profiles import load_profile
from ragteam.systems.registry import oracle_system
from ragteam.systems.mask import roles as M
from ragteam.systems.qagent import roles as Q
from ragteam.systems.qagent.workflow import agent_calls
from ragteam.warmup import traces as T
from ragteam.warmup.gold import GoldError, gold_chain
from ragteam.warmup.oracle import OracleEngine

REPO = Path(__file__).resolve().parents[1]
PARAMS = load_params(REPO / "params.yaml")
PER_TEMPLATE = 3


@pytest.fixture(scope="module")
def tok(smollm2_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(smollm2_dir))


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    """The default run's synthetic data (params data.synthetic) and its BM25 index, built as the pipeline does."""
    from ragteam.retrieval.bm25 import build_bm25s_index
    from ragteam.retrieval.loader import open_retriever

    d, syn = tmp_path_factory.mktemp("oracle-data"), PARAMS["data"]["synthetic"]
    _, passages, train, dev = synthetic.generate(syn["n_passages"], syn["n_train"], syn["n_dev"],
                                                 PARAMS["data"]["seed"], syn["question_mix"])
    corpus = list(passages)
    write_jsonl(d / "corpus.jsonl", corpus)
    write_jsonl(d / "pool.jsonl", train)
    write_jsonl(d / "benchmarks" / "synthetic.jsonl", dev)
    bm = PARAMS["retrieval"]["bm25"]
    build_bm25s_index(d / "corpus.jsonl", d / "bm25s", k1=bm["k1"], b=bm["b"], stemmer=bm["bm25s"]["stemmer"],
                      stopwords=bm["bm25s"]["stopwords"], show_progress=False)
    by_template = defaultdict(list)
    for r in train:
        by_template[r["metadata"]["template"]].append(r)
    sample = [r for rows in by_template.values() for r in rows[:PER_TEMPLATE]]
    return {"dir": d, "passages": {p["id"]: p["contents"] for p in corpus}, "train": train, "dev": dev,
            "sample": sample, "retriever": open_retriever(d / "bm25s", corpus=d / "corpus.jsonl", threads=1)}


def _build(name, data, tok, rows=None):
    system = oracle_system(name, PARAMS)
    return (system, *T.build_traces(system, rows or data["sample"], data["retriever"], data["passages"], tok, PARAMS,
                                    T.evaluation_questions(data["dir"] / "benchmarks")))


@pytest.fixture(scope="module")
def mask_built(data, tok):
    return _build("mask", data, tok)


@pytest.fixture(scope="module")
def qagent_built(data, tok):
    return _build("qagent", data, tok)


@pytest.fixture(scope="module")
def jade_built(data, tok):
    return _build("jade", data, tok)


@pytest.fixture(scope="module")
def decor_built(data, tok):
    return _build("decor", data, tok)


# ---- gold ------------------------------------------------------------------------------------------------------------

def test_every_training_question_has_a_gold_chain_that_leads_to_its_answer(data):
    seen = Counter()
    for row in data["train"]:
        g = gold_chain(row, data["passages"])
        seen[row["metadata"]["template"]] += 1
        assert [h.passage_id for h in g.hops] == row["metadata"]["supporting_ids"]
        for h in g.hops:
            assert h.answer in h.fact and h.fact in data["passages"][h.passage_id]
        if row["metadata"]["type"] == "bridge" or row["metadata"]["hops"] == 1:
            assert g.hops[-1].answer == row["golden_answers"][0]
    assert set(seen) == set(synthetic.QUESTION_TYPES)


def test_a_chain_that_does_not_reach_the_answer_and_a_row_without_hop_gold_are_refused(data):
    row = next(r for r in data["train"] if r["metadata"]["template"] == "director_city")
    bad = {**row, "metadata": {**row["metadata"], "supporting_ids": row["metadata"]["supporting_ids"][::-1]}}
    with pytest.raises(GoldError, match=row["id"]):
        gold_chain(bad, data["passages"])
    with pytest.raises(GoldError, match="do not lead to the golden answer"):
        gold_chain({**row, "golden_answers": ["Nowhere"]}, data["passages"])
    hotpot = {"id": "hp-1", "question": "q?", "golden_answers": ["a"],
              "metadata": {"supporting_facts": {"title": ["A"], "sent_id": [0]}}}
    with pytest.raises(GoldError, match="supporting_facts"):
        gold_chain(hotpot, data["passages"])


# ---- the engine ----------------------------------------------------------------------------------------------------

def test_oracle_engine_stops_and_counts_tokens_as_a_real_engine(tok):
    msgs = [{"role": "user", "content": "Question: who?"}]
    prompt_ids = tok(chat_text(tok, msgs), add_special_tokens=False).input_ids
    eng = OracleEngine(lambda m: "<plan>p</plan>\n<search><query>x</query></search> never seen", tok)
    c = eng.generate([msgs], SamplingConfig(max_new_tokens=64, stop=["</search>", "</answer>"]))[0][0]
    assert (c.text, c.stop_reason, c.finish_reason) == ("<plan>p</plan>\n<search><query>x</query>", "</search>", "stop")
    assert list(c.token_ids) == tok("<plan>p</plan>\n<search><query>x</query></search>",
                                    add_special_tokens=False).input_ids
    assert c.completion_tokens == len(c.token_ids) and list(c.prompt_ids) == prompt_ids
    assert c.prompt_tokens == len(prompt_ids)

    eos = OracleEngine(lambda m: "<end>", tok).generate([msgs], SamplingConfig(max_new_tokens=8))[0][0]
    assert eos.token_ids[-1] == tok.eos_token_id and eos.stop_reason is None and eos.text == "<end>"
    assert eos.completion_tokens == len(tok("<end>", add_special_tokens=False).input_ids) + 1

    long = OracleEngine(lambda m: "<evidence>" + "word " * 50 + "</evidence>", tok)
    cut = long.generate([msgs], SamplingConfig(max_new_tokens=12))[0][0]
    assert cut.finish_reason == "length" and cut.completion_tokens == 12 and "</evidence>" not in cut.text
    assert isinstance(M.parse_summary(cut.text), FormatError)   # the budget breaks the oracle as it would the policy


# ---- M-ASK -----------------------------------------------------------------------------------------------------------

def test_mask_oracle_plays_every_role_parsed_by_its_own_parser_at_the_top_of_its_reward(mask_built, data):
    _system, rows, eps, summary = mask_built
    assert summary["yield"] == 1.0 and summary["complete"] == len(data["sample"])
    assert set(summary["rows_per_role"]) == set(M.ROLES)
    for ep in eps:
        assert ep.final_answer == ep.golden_answers[0]
        n_steps = 0
        for c in ep.calls:
            assert c.format_error is None, (c.role, c.response)
            if c.role == M.PLANNING:
                assert c.prompt == M.planning_messages(ep.question)      # the workflow's own prompt
                plan = M.parse_plan(c.response)
                assert plan["predicted_answer"] == ep.golden_answers[0] and c.reward == 1.0   # Eq. 2: F1(a_0, y)
                n_steps = len(plan["steps"])
            elif c.role == M.ANSWER:
                assert M.parse_final_answer(c.response) == ep.golden_answers[0] and c.reward == 1.0
            elif c.role == M.SEARCH:
                assert not isinstance(M.parse_search(c.response), FormatError)
                assert c.reward == 0.0   # Eq. 3 with a_{t-1} already right: 1 - 1, nothing can do better
            elif c.role == M.SUMMARY:
                ev = M.parse_summary(c.response)
                # evidence is copied from the passages the prompt shows, or it is the prompt's "No useful information"
                assert ev == M.NO_USEFUL_INFORMATION or ev in c.prompt[-1]["content"]
                assert c.reward == 0.0
            else:
                op = M.parse_update(c.response, n_steps)
                assert not isinstance(op, FormatError) and c.reward == 0.0
                n_steps += op.kind == "add"
    # every hop searched in turn; evidence found for nearly every search
    summaries = [r for r in rows if r["role"] == M.SUMMARY]
    assert sum(M.NO_USEFUL_INFORMATION not in r["response"] for r in summaries) >= 0.8 * len(summaries)


def test_mask_oracle_searches_each_hop_by_its_sub_question(mask_built, data):
    _system, rows, eps, _ = mask_built
    ep = next(e for e in eps if e.meta["hops"] >= 2)
    gold = gold_chain(next(r for r in data["sample"] if r["id"] == ep.question_id), data["passages"])
    assert ep.queries[:2] == [gold.hops[0].question, gold.hops[1].question]


def test_mask_oracle_with_the_papers_initial_trajectory_of_the_question_alone(data, tok):
    """`mask.initial_trajectory: question` (the paper profile's K_0 = [(q, a_0)]): no plan step to replace, so
    evidence is added (a one-hop question's evidence replaces t1, whose query is its sub-question), and the Answer reads the gold from t1's a_0 while the hops' sub-answers are still missing."""
    params = deep_merge(PARAMS, {"mask": {"initial_trajectory": "question"}})
    system = oracle_system("mask", params)
    rows, eps, summary = T.build_traces(system, data["sample"], data["retriever"], data["passages"], tok, params,
                                        T.evaluation_questions(data["dir"] / "benchmarks"))
    assert summary["yield"] == 1.0
    for r in (r for r in rows if r["role"] == M.UPDATE):   # only a one-hop question's step t1 is its sub-question
        user = r["messages"][-1]["content"]
        replaces = user.split("\nNew query: ")[1].split("\nEvidence: ")[0] in user.split("\n")[0]
        assert r["response"] == ("<Update>t1</Update>" if replaces else f"<Add>t{user.count(' | A: ') + 1}</Add>")
    assert all(c.reward == 1.0 for ep in eps for c in ep.calls if c.role == M.ANSWER)


# ---- QAgent --------------------------------------------------------------------------------------------------------

def test_qagent_oracle_turns_parse_and_earn_eq7_reward_1(qagent_built, data):
    _system, rows, eps, summary = qagent_built
    complete = [e for e in eps if e.meta["oracle"] == "complete"]
    assert len({r["question_id"] for r in rows}) == len(complete) == summary["complete"]
    for ep in complete:
        calls = agent_calls(ep)          # one continued trajectory: each prompt continues the turns before it
        after = False
        for c in calls:
            parsed = Q.parse_turn(c.response, after_information=after, max_queries=PARAMS["qagent"]["max_queries"])
            assert not isinstance(parsed, FormatError), c.response
            after = c.meta.get("injected_kind") == "information"
        assert calls[-1].parsed == {"action": "answer", "answer": ep.golden_answers[0]}
        assert calls[-1].reward == 1.0      # Eq. 7: format gate x strict EM
    # 1-2 hop questions complete; 3-hop chains need 3 searches and an answer, a 4th turn that max_turns 3 does not give
    short = [e for e in eps if e.meta["hops"] <= 2]
    assert sum(e.meta["oracle"] == "complete" for e in short) >= 0.75 * len(short)
    three = [e for e in eps if e.meta["hops"] == 3]
    assert three and all(e.meta["oracle"] == f"no answer within max_turns {PARAMS['qagent']['max_turns']}"
                         for e in three)


def test_jade_oracle_decomposes_chains_serially_resolves_references_and_earns_r_global_1(jade_built, data):
    """Algorithm 1 with the oracle: a chain is decomposed by QDS with later entities as references, the serial
    rewrite resolves each reference with the answer found, a comparison goes to QDP, every sub-question is solved by
    R, DS, AG; every call parses and the terminal call earns R_global = F1 = 1 with no format penalty (Eq. 6-8)."""
    from ragteam.systems.jade import roles as J

    _system, rows, eps, summary = jade_built
    assert set(summary["rows_per_role"]) >= {J.PLANNER, J.DS, J.AG}
    complete = [e for e in eps if e.meta["oracle"] == "complete"]
    assert len(complete) >= 0.75 * len(eps), summary["incomplete"]
    roles_seen = set()
    for ep in complete:
        assert ep.final_answer == ep.golden_answers[0] and ep.meta["stop_reason"] == "answered"
        assert all(c.format_error is None for c in ep.calls)
        assert [c.reward for c in ep.calls] == [0.0] * (len(ep.calls) - 1) + [1.0]
        roles_seen |= {c.role for c in ep.calls}
        plans = [p["plan"] for p in ep.meta["plans"]]
        hops = ep.meta["hops"]
        if hops == 1:
            assert plans == ["R,DS,AG"]
        else:
            assert plans[0] in ("QDS", "QDP") and plans[1:] == ["R,DS,AG"] * hops
        for c in ep.calls:
            if c.role == J.QR:       # the serial rewrite: a reference resolved with the answer found, else as asked
                asked = c.prompt[-1]["content"].split("Original Question: ")[1].split("\n")[0]
                assert c.parsed == asked if "the answer to q" not in asked else "the answer to q" not in c.parsed
            if c.role == J.QDS:
                assert all("the answer to q" in q for q in c.parsed[1:])
    assert {J.PLANNER, J.QR, J.QDS, J.QDP, J.DS, J.AG, J.AS} <= roles_seen


def test_decor_oracle_writes_think_then_one_block_and_earns_the_rule_judges_verdicts(decor_built, data):
    """Every policy call well formed (<think> then <search> / <filter> / <answer>), the golden answer, R_team = 1
    and no role verdict of -1 (R_total >= α); one-hop questions trace; chains longer than decor.t_max cannot."""
    from ragteam.systems.decor import roles as D

    _system, rows, eps, summary = decor_built
    alpha = PARAMS["decor"]["reward"]["alpha"]
    complete = [e for e in eps if e.meta["oracle"] == "complete"]
    assert complete and set(summary["rows_per_role"]) == set(D.POLICY_ROLES)
    for ep in complete:
        assert ep.final_answer == ep.golden_answers[0] and not ep.meta.get("truncated")
        for c in ep.calls:
            parser = {D.PLANNER: D.parse_planner, D.FILTER: D.parse_filter, D.ANSWERER: D.parse_answerer}[c.role]
            assert not isinstance(parser(c.response), FormatError), c.response
            assert c.reward >= alpha - 1e-9
        searched = [c.parsed["query"] for c in ep.calls if c.role == D.PLANNER and c.parsed["action"] == "search"]
        assert len(searched) == ep.meta["hops"]          # one search per hop, by its sub-question
    one = [e for e in eps if e.meta["hops"] == 1]
    assert sum(e.meta["oracle"] == "complete" for e in one) >= 0.9 * len(one)
    assert all(e.meta["oracle"] != "complete" for e in eps if e.meta["hops"] > PARAMS["decor"]["t_max"])


# ---- training pool only ---------------------------------------------------------------------------------------------

def test_traces_refuse_evaluation_questions_by_id_and_by_text(data, tok):
    system = oracle_system("mask", PARAMS)
    ev = T.evaluation_questions(data["dir"] / "benchmarks")
    leak = data["dev"][3]
    for rows in ([*data["sample"][:2], leak], [{**leak, "id": "renamed-1"}]):
        with pytest.raises(DataError, match="evaluation questions") as e:
            T.build_traces(system, rows, data["retriever"], data["passages"], tok, PARAMS, ev)
        assert rows[-1]["id"] in str(e.value)
    with pytest.raises(DataError, match="no benchmark files"):
        T.evaluation_questions(data["dir"] / "nowhere")


# ---- rows: validated when written and read ---------------------------------------------------------------------------

def test_written_traces_are_validated_row_by_row(mask_built, tmp_path):
    system, rows, _eps, _ = mask_built
    path = tmp_path / "warmup" / "mask" / "traces.jsonl"
    assert T.write_traces(path, rows, system) == len(rows)
    assert T.read_traces(path, system) == json.loads(json.dumps(rows))
    broken = [dict(r) for r in rows]
    i = next(n for n, r in enumerate(broken) if r["role"] == M.SEARCH)
    broken[i]["response"] = "search for it"
    with pytest.raises(DataError, match=rf"row {i + 1} \(mask_search"):
        T.write_traces(tmp_path / "other.jsonl", broken, system)
    write_jsonl(tmp_path / "raw.jsonl", broken)
    with pytest.raises(DataError, match=rf"raw.jsonl:{i + 1}"):
        T.read_traces(tmp_path / "raw.jsonl", system)
    with pytest.raises(DataError, match="not a role of qagent"):
        T.read_traces(path, oracle_system("qagent", PARAMS))


# ---- budgets (the check of tests/test_budgets.py, on the oracle's own outputs) --------------------------------------

PROFILES = {"default": PARAMS, "paper": deep_merge(PARAMS, load_profile("paper", REPO / "profiles"))}


@pytest.mark.parametrize("profile", sorted(PROFILES))
def test_every_oracle_output_fits_its_roles_budget(profile, mask_built, qagent_built, jade_built, decor_built, tok):
    sampling = LLMConfig.model_validate(PROFILES[profile]["llm"]).sampling
    short = []
    for _system, rows, _eps, _ in (mask_built, qagent_built, jade_built, decor_built):
        need = defaultdict(int)
        for r in rows:   # + EOS where EOS ended it; a stop string's tokens are in the response already
            n = len(tok(r["response"], add_special_tokens=False).input_ids) + r["eos"]
            assert n == r["response_tokens"]
            need[r["role"]] = max(need[r["role"]], n)
        for role, n in need.items():
            budget = (sampling.get(role) or sampling["default"]).max_new_tokens
            if budget < n:
                short.append(f"llm.sampling.{role}.max_new_tokens is {budget}, the oracle's longest output needs {n}")
    assert not short, f"{profile} profile:\n" + "\n".join(short)


# ---- the command -------------------------------------------------------------------------------------------------

def test_cli_writes_validated_traces_and_a_summary_and_refuses_evaluation_questions(data, smollm2_dir, tmp_path):
    from typer.testing import CliRunner

    from ragteam.cli import app

    d = data["dir"]
    write_jsonl(tmp_path / "pool.jsonl", data["sample"][:12])
    args = ["oracle-traces", "qagent", "--pool", str(tmp_path / "pool.jsonl"), "--corpus", str(d / "corpus.jsonl"),
            "--index", str(d / "bm25s"), "--benchmarks", str(d / "benchmarks"), "--model", str(smollm2_dir),
            "--params", str(REPO / "params.yaml"), "--out", str(tmp_path / "warmup" / "qagent")]
    res = CliRunner().invoke(app, args)
    assert res.exit_code == 0, res.output
    summary = json.loads((tmp_path / "warmup" / "qagent" / "summary.json").read_text())
    rows = T.read_traces(tmp_path / "warmup" / "qagent" / "traces.jsonl", oracle_system("qagent", PARAMS))
    assert summary["questions"] == 12 and summary["rows"] == len(rows) > 0
    assert f"{summary['complete']}/12 questions traced" in res.output

    write_jsonl(tmp_path / "pool.jsonl", [*data["sample"][:2], data["dev"][0]])
    res = CliRunner().invoke(app, args)
    assert res.exit_code == 1 and "evaluation questions" in res.output and data["dev"][0]["id"] in res.output


# ---- 2WikiMultihopQA gold (the mirror data's training pool takes half of these rows) ---------------------------------

@pytest.fixture(scope="module")
def wiki2(shared_data):
    from ragteam.data.formats import load_qa

    rows = load_qa(shared_data / "benchmarks" / "2wikimultihopqa" / "dev.jsonl")
    corpus = shared_data / "corpus" / "mini_wiki.jsonl"
    return rows, corpus, T.load_passages(corpus, rows)


def test_2wiki_evidence_triples_become_hop_chains_in_their_order(wiki2):
    rows, _corpus, passages = wiki2
    chains = 0
    for row in rows:
        try:
            g = gold_chain(row, passages)
        except GoldError:
            continue
        chains += 1
        assert [h.title for h in g.hops] == [s for s, _r, _o in row["metadata"]["evidences"]]
        for h, (_s, _r, obj) in zip(g.hops, row["metadata"]["evidences"]):
            assert h.answer.casefold() == obj.casefold() and h.answer in h.fact
            assert h.fact in " ".join(passages[h.passage_id].split())
        if row["metadata"]["type"] in ("compositional", "inference"):
            assert g.hops[-1].answer.casefold() in {a.casefold() for a in row["golden_answers"]}
    assert chains >= 0.6 * len(rows)


def test_mask_oracle_on_2wiki_rows_tops_every_reward(wiki2, tok, tmp_path):
    from ragteam.retrieval.bm25 import build_bm25s_index
    from ragteam.retrieval.loader import open_retriever

    rows, corpus, passages = wiki2
    build_bm25s_index(corpus, tmp_path / "bm25s", k1=0.9, b=0.4, show_progress=False)
    retriever = open_retriever(tmp_path / "bm25s", corpus=corpus, threads=1)
    sample = rows[:16]
    system = oracle_system("mask", PARAMS)
    # no evaluation set here: these benchmark rows stand in for the mirror's training pool
    traces, eps, summary = T.build_traces(system, sample, retriever, passages, tok, PARAMS, (set(), set()))
    with_gold = len(sample) - summary["dropped"].get("no gold chain", 0)
    assert with_gold >= 8 and summary["complete"] >= with_gold - 1
    for ep in (e for e in eps if e.meta["oracle"] == "complete"):
        assert all(c.reward == (1.0 if c.role in (M.PLANNING, M.ANSWER) else 0.0) for c in ep.calls)
        assert ep.final_answer == ep.golden_answers[0]


# ---- the output grammars of guided decoding (ragteam.agents.grammars, issue 24 §3) ----------------------------------

def test_every_oracle_output_matches_its_roles_grammar(mask_built, qagent_built, jade_built, decor_built):
    """The grammars hold the layout the parsers read: each oracle output (a valid, top-reward output of its role on
    the default pool) is a full match of its role's regex, so constraining a role to it never rules out the best
    answer."""
    import re

    from ragteam.systems.registry import grammars

    GRAMMARS = grammars()
    misses, seen = [], Counter()
    for built, rows, _eps, _ in (mask_built, qagent_built, jade_built, decor_built):
        system = built.name
        for r in rows:
            regex = GRAMMARS[system].get(r["role"])
            if regex is None:
                continue                      # a frozen helper role (DECOR's summarizer): never constrained
            seen[system, r["role"]] += 1
            response = r["response"]
            if r["role"] == M.UPDATE:   # the grammar spells an Add as the prompt does, t(n+1); the oracle numbers it
                response = re.sub(r"<Add>t\d+</Add>", "<Add>t(n+1)</Add>", response)
            if re.fullmatch(regex, response) is None:
                misses.append(f"{system}/{r['role']}: {r['response']!r}")
    first = {m.split(":", 1)[0]: m for m in misses}          # one example per role
    assert not misses, f"{len(misses)} oracle outputs outside their grammar, e.g.:\n" + "\n".join(first.values())
    assert {s for s, _ in seen} == set(GRAMMARS)
    assert all(role in {r for _, r in seen} for g in GRAMMARS.values() for role in g), seen
