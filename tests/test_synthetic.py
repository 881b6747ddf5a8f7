import re
import tracemalloc

from ragteam.data.formats import split_contents
import pytest

from ragteam.data.synthetic import QUESTION_TYPES, World, generate


def _facts(world: World, pids: list[str]) -> str:
    return " ".join(split_contents(world.passage(*pid.rsplit("-", 1)[:1], int(pid.rsplit("-", 1)[1]))["contents"])[1]
                    for pid in pids)


def _derive(q: dict, world: World) -> str:
    """Recompute the answer from the gold passages' text only (regexes over the fixed templates)."""
    text = _facts(world, q["metadata"]["supporting_ids"])
    born = dict(re.findall(r"([A-Z]\w+ [A-Z]\w+) \(born \d+\) is an? [\w ]+? born in (\w+)\.", text))
    year = {n: int(y) for n, y in re.findall(r"([A-Z]\w+ [A-Z]\w+) \(born (\d+)\)", text)}
    country = dict(re.findall(r"(\w+) is a city in (\w+),", text))
    directed = dict(re.findall(r"(The \w+ \w+) is a \d+ film directed by ([A-Z]\w+ [A-Z]\w+)\.", text))
    film_year = {t: int(y) for t, y in re.findall(r"(The \w+ \w+) is a (\d+) film", text)}
    works = dict(re.findall(r"([A-Z]\w+ [A-Z]\w+) works for (\w+ \w+)\.", text))
    hq = dict(re.findall(r"(\w+ \w+) is a company headquartered in (\w+)\.", text))
    t, qs = q["metadata"]["template"], q["question"]
    hq_of = dict(re.findall(r"(\w+ \w+) is a company headquartered in (\w+)\.", text))
    if t == "film_director":
        return directed[re.search(r"Who directed (.+)\?", qs).group(1)]
    if t == "person_city":
        return born[re.search(r"city was (.+) born\?", qs).group(1)]
    if t == "company_city":
        return hq_of[re.search(r"city is (.+) headquartered\?", qs).group(1)]
    if t == "city_country":
        return country[re.search(r"the city of (\w+)\?", qs).group(1)]
    if t == "birth_country":
        return country[born[re.search(r"was (.+) born\?", qs).group(1)]]
    film = re.search(r"director of (The \w+ \w+)", qs)
    if t == "director_city":
        return born[directed[film.group(1)]]
    if t == "director_country":
        return country[born[directed[film.group(1)]]]
    if t == "employer_country":
        return country[hq[works[directed[film.group(1)]]]]
    if t == "born_first":
        a, b = re.search(r"first, (.+) or (.+)\?", qs).groups()
        return a if year[a] < year[b] else b
    if t == "film_first":
        a, b = re.search(r"first, (.+) or (.+)\?", qs).groups()
        return a if film_year[a] < film_year[b] else b
    if t == "same_country":
        a, b = re.search(r"Were (.+) and (.+) born in", qs).groups()
        return "yes" if country[born[a]] == country[born[b]] else "no"
    raise AssertionError(t)


def test_answers_are_derivable_from_gold_passages():
    world, _, train, dev = generate(3000, 300, 60, seed=5)
    templates = set()
    for q in train + dev:
        assert _derive(q, world) == q["golden_answers"][0], q
        assert 1 <= q["metadata"]["hops"] <= 4
        templates.add(q["metadata"]["template"])
    assert templates == set(QUESTION_TYPES)


def test_question_mix_weights_the_templates_and_names_unknown_ones():
    _, _, train, _ = generate(20000, 200, 0, seed=5, question_mix={"film_director": 3, "born_first": 1})
    counts = {t: sum(q["metadata"]["template"] == t for q in train) for t in ("film_director", "born_first")}
    assert sum(counts.values()) == 200 and counts["film_director"] > 2 * counts["born_first"] > 0  # ~3:1
    assert all(q["metadata"]["hops"] == 1 for q in train if q["metadata"]["template"] == "film_director")
    with pytest.raises(ValueError, match="unknown templates \\['film_genre'\\]"):
        generate(1000, 10, 0, question_mix={"film_genre": 1})
    with pytest.raises(ValueError, match="weights"):
        generate(1000, 10, 0, question_mix={"film_director": 0})


def test_deterministic_and_seed_sensitive():
    a = generate(500, 20, 10, seed=1)
    b = generate(500, 20, 10, seed=1)
    c = generate(500, 20, 10, seed=2)
    assert list(a[1]) == list(b[1]) and a[2] == b[2] and a[3] == b[3]
    assert a[2] != c[2]


def test_ids_titles_unique_and_splits_disjoint():
    world, passages, train, dev = generate(4000, 400, 100, seed=3)
    rows = list(passages)
    assert len(rows) == 4000
    assert len({r["id"] for r in rows}) == len(rows)
    assert len({split_contents(r["contents"])[0] for r in rows}) == len(rows)
    assert not {q["question"] for q in train} & {q["question"] for q in dev}
    words = [len(split_contents(r["contents"])[1].split()) for r in rows]
    assert 60 <= sum(words) / len(words) <= 130


def test_distractors_share_names_and_attributes():
    world = World(2000, seed=13)
    a, b = world.person(0), world.person(1)  # siblings
    assert a["name"].split()[1] == b["name"].split()[1] and a["birth_city"] == b["birth_city"]
    fest = split_contents(world.passage("festival", 0)["contents"])[1]
    assert "Film Festival" in fest and any(world.city_name(i) in fest for i in range(world.counts["city"]))


@pytest.mark.slow
def test_streams_a_million_passages_in_bounded_memory():
    world = World(1_000_000, seed=13)
    assert sum(world.counts.values()) == 1_000_000
    last = world.passage("person", world.counts["person"] - 1)  # random access, no materialised world
    assert last["id"] == f"person-{world.counts['person'] - 1}"
    tracemalloc.start()
    for i, _ in enumerate(world.iter_passages()):
        if i == 20_000:
            break
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    assert peak < 5 * 2**20, peak  # nothing accumulates while streaming
