"""MAPS / DRAG prompts and the parsers of every role, on well-formed and malformed outputs."""
import pytest

from ragteam.agents import baselines, maps
from ragteam.agents.core import FormatError, QueryPool
from ragteam.retrieval.base import Hit

# ---- prompts --------------------------------------------------------------------------------------------------------


def _pool() -> QueryPool:
    p = QueryPool()
    p.add("Who directed Shit Year?", [Hit("7", '"Shit Year"\nShit Year is a 2010 film by Cam Archer.', 3.0),
                                      Hit("9", '"Cam Archer"\nCam Archer is an American filmmaker.', 2.0)])
    p.add("Cam Archer nationality", [Hit("9", '"Cam Archer"\nduplicate', 1.0),
                                     Hit("4", '"Tyler Perry"\nTyler Perry is an American actor.', 1.0)])
    return p


def test_pool_renders_in_the_papers_layout_and_keeps_the_union_of_chunks():
    text = _pool().render()
    assert text == (
        'Query 1: Who directed Shit Year?\nRetrieved Content:\n'
        'Doc 1(Title: "Shit Year"): Shit Year is a 2010 film by Cam Archer.\n'
        'Doc 2(Title: "Cam Archer"): Cam Archer is an American filmmaker.\n\n'
        'Query 2: Cam Archer nationality\nRetrieved Content:\n'
        'Doc 1(Title: "Tyler Perry"): Tyler Perry is an American actor.')  # doc 9 already in the pool
    assert _pool().render(passage_words=3).splitlines()[2] == 'Doc 1(Title: "Shit Year"): Shit Year is ...'


def test_pool_cap_and_round_trip():
    p = QueryPool()
    added = p.add("q", [Hit(str(i), f'"T{i}"\nx', 1.0) for i in range(8)], max_chunks=5)
    assert [h.id for h in added] == ["0", "1", "2", "3", "4"] and p.n_chunks == 5
    assert p.add("q2", [Hit("9", '"T9"\ny', 1.0)], max_chunks=5) == [] and p.queries == ["q", "q2"]
    again = QueryPool.from_dict(p.to_dict())
    assert again.render() == p.render() and again.prefix(1).queries == ["q"]


def test_prompts_are_the_papers_templates_filled_in():
    q, pool = "Who is older?", "Query 1: Who is older?\nRetrieved Content:"
    m = maps.query_messages(q, pool)
    assert m[0]["content"].startswith("You are a retrieval query generation agent.")
    assert "Maximum 8 keywords." in m[0]["content"]
    assert m[1]["content"] == f"Question: {q}\nQuery Pool:\n{pool}"
    j = maps.judge_messages(q, pool)
    assert "'Sufficient Information' or 'Insufficient Information'" in j[0]["content"]
    a = maps.answer_messages(q, pool)
    assert a[0]["content"] == ("Answer the question based on the given document. Output only the final answer with "
                               f"no explanations or additional text.\n\nQuery Pool:\n{pool}")
    assert a[1]["content"] == f"Question: {q}"
    o = maps.opponent_messages(q, pool)
    assert "Query Expansion: [New Query]" in o[0]["content"] and "Only Output: Concede" in o[0]["content"]
    mod = maps.moderator_messages(q, pool, " pro says ", "opp says")
    assert mod[1]["content"].endswith("Proponent:\npro says\nOpponent:\nopp says\n\nOutput only the agent's name. "
                                      "Do NOT output more than one agent or any explanation.")
    ref = baselines.reference([Hit("1", '"Paris"\nParis is the capital of France.', 1.0)])
    assert ref == 'Doc 1(Title: "Paris") Paris is the capital of France.\n'


# ---- query agent ----------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("raw, query", [
    ("Tyler Perry nationality", "Tyler Perry nationality"),
    ("New Query: the director of Shit Year", "director Shit Year"),
    ("Sure! Here is the new query:\nCam Archer birthplace country", "Cam Archer birthplace country"),
    ("Query 2:\n  Cam Archer   birthplace", "Cam Archer birthplace"),
    ('"Cam Archer" (born 1981), American film-maker; films: Shit Year, Wild Tigers',
     "Cam Archer born 1981 American film-maker films Shit"),           # over-long: first 8 keywords
    ("who is the director of the film and what about his country", "director film country"),
    ("Cam Archer cam archer CAM", "Cam Archer"),                              # duplicates dropped
    ("The new query is:\n\nQuestion: Were Scott Derrickson and Ed Wood of the same nationality?\nOutput:",
     "Scott Derrickson Ed Wood nationality"),                                # SmolLM2 echoes the prompt
])
def test_parse_query_sanitises_to_at_most_8_keywords_without_stopwords(raw, query):
    got = maps.parse_query(raw)
    assert got == query
    assert len(got.split()) <= 8 and not set(got.lower().split()) & maps.STOPWORDS


@pytest.mark.parametrize("raw", ["", "   \n ", "and or the of about", "?!..."])
def test_parse_query_rejects_outputs_without_keywords(raw):
    assert isinstance(maps.parse_query(raw), FormatError)


def test_query_fallback_keywords_of_the_question():
    assert maps.keywords("Who was the first president of the United States of America?") == \
        "first president United States America"


# ---- judge ----------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("raw, label", [
    ("Sufficient Information", maps.SUFFICIENT), ("Insufficient Information", maps.INSUFFICIENT),
    ("'Insufficient Information'", maps.INSUFFICIENT), (" sufficient   information.\n", maps.SUFFICIENT),
])
def test_parse_judge_accepts_exactly_the_two_labels(raw, label):
    assert maps.parse_judge(raw) == label


@pytest.mark.parametrize("raw", ["", "Sufficient", "Insufficient Information because Doc 2 lacks the date",
                                 "I think the information is sufficient.", "Sufficient Information\nInsufficient "
                                 "Information", "Yes"])
def test_parse_judge_anything_else_is_a_format_error(raw):
    assert isinstance(maps.parse_judge(raw), FormatError)


# ---- answer ---------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("raw, answer", [
    ("Paris", "Paris"), ("The answer is Paris.", "Paris"), ("Answer: 1998", "1998"), ("Final answer: yes", "yes"),
    ("**Cam Archer**", "Cam Archer"), ("\n\nParis\nBecause Doc 1 says so.", "Paris"),
    ("A Beautiful Mind", "A Beautiful Mind"),                                   # 'A' is not an "A:" label
    ("Paris is the capital. " + "It has many museums and " * 10, "Paris is the capital"),  # over-long: 1st sentence
])
def test_parse_answer(raw, answer):
    assert maps.parse_answer(raw) == answer


def test_parse_answer_caps_a_single_long_sentence_and_rejects_empty():
    assert len(maps.parse_answer("word " * 100).split()) == maps.MAX_ANSWER_WORDS
    for raw in ("", "  \n", "Answer:", '""'):
        assert isinstance(maps.parse_answer(raw), FormatError), raw


@pytest.mark.parametrize("raw, answer", [
    ("The answer to this question is:\nAda Lovelace", "Ada Lovelace"),         # the answer below its lead-in
    ("The answer to this question is: Ada Lovelace.", "Ada Lovelace"),
    ("Based on the given documents, the answer is: 1815", "1815"),
    ("Sure! The answer to the question is:\n\n**London**", "London"),
    ("Question: Who wrote it?\nAda Lovelace", "Ada Lovelace"),                # an echoed prompt line is skipped
    ("Answer:\nThe answer is:\nLondon", "London"),
    ("(no new documents)\nLondon", "London"),                               # the pool's marker copied back
    ("No new documents were written about London", "No new documents were written about London"),
    ("no", "no"), ("Yes.", "Yes"), ("Time: 10:30", "Time: 10:30"),            # short answers and colons survive
])
def test_parse_answer_reads_past_lead_ins(raw, answer):
    assert maps.parse_answer(raw) == answer


@pytest.mark.parametrize("raw", [
    "The answer to this question is:", "The answer to this question is", "Based on the documents:",
    'Doc 1(Title: "Ed Wood"): Ed Wood is a 1994 film', "Doc 3 (title: Paris) ...", "Question: who directed it?",
    "The answer to this question is:\nThe answer is:",
    "(no new documents)", "Answer: (no new documents)", "The answer is:\n(No new documents.)",
])
def test_parse_answer_rejects_outputs_with_no_answer(raw):
    assert isinstance(maps.parse_answer(raw), FormatError), raw
    assert maps.is_stub(raw) == (not raw.startswith("Doc ")), raw   # a stub a continuation or a draw may still fix


# ---- debate ---------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("raw, parsed", [
    ("The docs miss his birthplace.\nQuery Expansion: [Cam Archer birthplace]",
     {"action": "expand", "query": "Cam Archer birthplace"}),
    ("Concede", {"action": "concede", "query": None}),
    ("I will not concede.\nquery expansion:\n  Shit Year release date", {"action": "expand",
                                                                          "query": "Shit Year release date"}),
    ("Query Expansion: [x y]\nOn reflection: Concede", {"action": "concede", "query": None}),  # the last action wins
])
def test_parse_opponent(raw, parsed):
    assert maps.parse_opponent(raw) == parsed


@pytest.mark.parametrize("raw", ["", "The documents are weak.", "Query Expansion: [New Query]",
                                 "Query Expansion:", "Query Expansion: []"])
def test_parse_opponent_malformed(raw):
    assert isinstance(maps.parse_opponent(raw), FormatError)


@pytest.mark.parametrize("raw, winner", [
    ("Opponent", maps.OPPONENT), ("Proponent Agent", maps.PROPONENT), ("**opponent**", maps.OPPONENT),
    ("The winner is the Opponent.", maps.OPPONENT), ("Opponent. The proponent ignored Doc 3.", maps.OPPONENT),
])
def test_parse_moderator(raw, winner):
    assert maps.parse_moderator(raw) == winner


@pytest.mark.parametrize("raw", ["", "Both agents argued well", "opponents", "I pick the proponent or the opponent"])
def test_parse_moderator_malformed(raw):
    assert isinstance(maps.parse_moderator(raw), FormatError)


def test_parse_proponent_only_rejects_empty():
    assert maps.parse_proponent("  The docs say Paris.  ") == "The docs say Paris."
    assert isinstance(maps.parse_proponent(" \n"), FormatError)
