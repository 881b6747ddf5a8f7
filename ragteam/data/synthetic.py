"""A deterministic fictional world: entities, ~100-word passages and multi-hop questions with unique answers.

Every entity is a pure function of (seed, kind, index), so the corpus streams in O(1) memory at any size
(1,000,000 passages included) and any passage can be regenerated on its own. Names are bijections of the
index, hence unique; siblings share a surname and a birth city, and festival passages mention cities and
films without holding any gold fact: both are distractors that share names and attributes.
"""
from __future__ import annotations

import random
from collections.abc import Iterator
from dataclasses import dataclass
from functools import lru_cache

from ragteam.data.formats import make_contents

SYLLABLES = ("ka", "lo", "ver", "min", "tas", "ru", "del", "an", "bor", "qui", "sel", "mo", "tra", "vin",
             "el", "dar", "pe", "nos", "gal", "ri", "zan", "ho", "lem", "ca", "fir", "os", "ben", "tu", "mar", "ly")
FIRST_NAMES = ("Aldo", "Bera", "Corin", "Dessa", "Elio", "Fenna", "Gorm", "Hali", "Ivo", "Jessa", "Kael", "Lira",
               "Mavro", "Nerin", "Odile", "Pell", "Quilla", "Ruen", "Sabeth", "Tamsin", "Ulric", "Vesna", "Wendo",
               "Xara", "Yorick", "Zelie", "Anouk", "Bastin", "Calla", "Dorin")
ADJECTIVES = ("Silent", "Crimson", "Hollow", "Golden", "Last", "Broken", "Northern", "Hidden", "Iron", "Distant",
              "Quiet", "Burning", "Pale", "Wandering", "Sunken", "Bright", "Frozen", "Lost", "Seventh", "Velvet")
OCCUPATIONS = ("film director", "painter", "novelist", "architect", "composer", "engineer", "botanist", "actor")
COMPANY_SUFFIX = ("Studios", "Pictures", "Works", "Films", "Media", "Group")
REGIONS = ("the eastern highlands", "the southern coast", "the river basin", "the western plains", "the northern isles")

# Share of the corpus per entity kind (countries are fixed in number).
_SHARES = (("city", 0.12), ("person", 0.48), ("film", 0.2), ("company", 0.1), ("festival", 0.1))
N_COUNTRIES = 24


def _rng(seed: int, kind: str, i: int) -> random.Random:
    return random.Random(f"{seed}:{kind}:{i}")  # str seeds hash with sha512: stable across runs and platforms


def _bijective_word(i: int, space: int, n_syl: int, salt: int) -> str:
    """The i-th word of a permuted enumeration of SYLLABLES^n_syl; distinct i give distinct words."""
    j = (i * 7919 + salt) % space  # 7919 is prime and coprime with 30^k, so this permutes [0, space)
    parts = []
    for _ in range(n_syl):
        j, d = divmod(j, len(SYLLABLES))
        parts.append(SYLLABLES[d])
    return "".join(parts).capitalize()


def _n_syllables(needed: int) -> int:
    k = 2
    while len(SYLLABLES) ** k < needed:
        k += 1
    return k


@dataclass(frozen=True)
class World:
    """Sizes of the fictional world; all entities are derived on demand.

    `question_mix`: (template, weight) pairs the questions are drawn from; None = every template equally.
    """

    n_passages: int
    seed: int = 13
    question_mix: tuple[tuple[str, float], ...] | None = None

    @property
    def counts(self) -> dict[str, int]:
        rest = max(self.n_passages - N_COUNTRIES, 50)
        counts = {"country": N_COUNTRIES}
        for kind, share in _SHARES:
            counts[kind] = max(int(rest * share), {"city": N_COUNTRIES, "person": 8}.get(kind, 4))
        counts["person"] += rest - sum(v for k, v in counts.items() if k != "country")  # exact total
        counts["person"] -= counts["person"] % 2  # families of two
        return counts

    # ---- names -------------------------------------------------------------------------------------
    def _word(self, kind: str, i: int, needed: int) -> str:
        k = _n_syllables(needed)
        return _bijective_word(i, len(SYLLABLES) ** k, k, salt=hash_kind(kind))

    def country_name(self, c: int) -> str:
        return self._word("country", c, N_COUNTRIES) + "ia"

    def city_name(self, i: int) -> str:
        return self._word("city", i, self.counts["city"])

    def person_name(self, i: int) -> str:
        fam = i // 2
        surname = self._word("person", fam, self.counts["person"] // 2)
        r = _rng(self.seed, "family", fam)
        a, b = r.sample(range(len(FIRST_NAMES)), 2)
        return f"{FIRST_NAMES[a if i % 2 == 0 else b]} {surname}"

    def film_title(self, i: int) -> str:
        n_adj = len(ADJECTIVES)
        noun = self._word("film", i // n_adj, max(self.counts["film"] // n_adj + 1, 2))
        return f"The {ADJECTIVES[(i + i // n_adj) % n_adj]} {noun}"

    def company_name(self, i: int) -> str:
        return f"{self._word('company', i, self.counts['company'])} {COMPANY_SUFFIX[i % len(COMPANY_SUFFIX)]}"

    # ---- attributes --------------------------------------------------------------------------------
    def city(self, i: int) -> dict:
        r = _rng(self.seed, "city", i)
        return {"name": self.city_name(i), "country": i % N_COUNTRIES, "founded": r.randint(1150, 1850),
                "population": r.randint(20, 2000) * 1000, "region": r.choice(REGIONS)}

    def person(self, i: int) -> dict:
        fam = _rng(self.seed, "family", i // 2)
        r = _rng(self.seed, "person", i)
        n_dir = max(self.counts["person"] // 5, 1)
        return {"name": self.person_name(i), "birth_city": fam.randrange(self.counts["city"]),
                "birth_year": r.randint(1890, 1990),
                "occupation": "film director" if i % 5 == 0 and i // 5 < n_dir else r.choice(OCCUPATIONS[1:]),
                "employer": r.randrange(self.counts["company"]), "sibling": i ^ 1}

    def film(self, i: int) -> dict:
        r = _rng(self.seed, "film", i)
        director = 5 * r.randrange(max(self.counts["person"] // 5, 1))
        year = self.person(director)["birth_year"] + r.randint(22, 60)
        return {"title": self.film_title(i), "director": director, "year": year, "runtime": r.randint(78, 170)}

    def company(self, i: int) -> dict:
        r = _rng(self.seed, "company", i)
        return {"name": self.company_name(i), "hq": r.randrange(self.counts["city"]), "founded": r.randint(1880, 2005),
                "staff": r.randint(12, 9000)}

    # ---- passages ----------------------------------------------------------------------------------
    def passage(self, kind: str, i: int) -> dict:
        title, facts = getattr(self, f"_{kind}_passage")(i)
        r = _rng(self.seed, f"filler-{kind}", i)
        text = " ".join(facts)
        fillers = r.sample(_FILLERS, len(_FILLERS))  # without replacement: no sentence twice in a passage
        while len(text.split()) < 90 and fillers:
            text += " " + fillers.pop().format(name=title)
        return {"id": f"{kind}-{i}", "contents": make_contents(title, text)}

    def _country_passage(self, c: int):
        name = self.country_name(c)
        return name, [f"{name} is a country whose capital is {self.city_name(c)}.",
                      f"{name} has {self.counts['city'] // N_COUNTRIES} recorded cities."]

    def _city_passage(self, i: int):
        c = self.city(i)
        return c["name"], [f"{c['name']} is a city in {self.country_name(c['country'])}, located in {c['region']}.",
                           f"It was founded in {c['founded']} and has about {c['population']:,} inhabitants."]

    def _person_passage(self, i: int):
        p = self.person(i)
        sib = self.person_name(p["sibling"])
        return p["name"], [f"{p['name']} (born {p['birth_year']}) is a {p['occupation']} born in "
                           f"{self.city_name(p['birth_city'])}.",
                           f"{p['name']} works for {self.company_name(p['employer'])}.",
                           f"{p['name']} has a sibling, {sib}, who was also born in {self.city_name(p['birth_city'])}."]

    def _film_passage(self, i: int):
        f = self.film(i)
        return f["title"], [f"{f['title']} is a {f['year']} film directed by {self.person_name(f['director'])}.",
                            f"The film runs for {f['runtime']} minutes."]

    def _company_passage(self, i: int):
        c = self.company(i)
        return c["name"], [f"{c['name']} is a company headquartered in {self.city_name(c['hq'])}.",
                           f"It was founded in {c['founded']} and employs {c['staff']} people."]

    def _festival_passage(self, i: int):
        r = _rng(self.seed, "festival", i)
        city = self.city_name(r.randrange(self.counts["city"]))
        films = [self.film_title(r.randrange(self.counts["film"])) for _ in range(2)]
        return f"{city} Film Festival {i}", [
            f"The {city} Film Festival {i} is an annual event named after the city of {city}.",
            f"Past editions screened {films[0]} and {films[1]}, and visitors often confuse the festival with the city."]

    def iter_passages(self) -> Iterator[dict]:
        for kind, n in self.counts.items():
            for i in range(n):
                yield self.passage(kind, i)

    # ---- questions ---------------------------------------------------------------------------------
    def question(self, q: int) -> dict:
        """Question q (deterministic); answers follow from the gold passages named in metadata."""
        r = _rng(self.seed, "question", q)
        mix = self.question_mix or tuple((t, 1.0) for t in QUESTION_TYPES)
        qtype = r.choices([t for t, _ in mix], weights=[w for _, w in mix])[0]
        question, answer, gold, kind, hops = getattr(self, f"_q_{qtype}")(r)
        return {"id": f"syn-{q}", "question": question, "golden_answers": [answer],
                "metadata": {"type": kind, "template": qtype, "hops": hops, "supporting_ids": gold,
                             "supporting_titles": [self._title_of(g) for g in gold]}}

    def _title_of(self, pid: str) -> str:
        kind, i = pid.rsplit("-", 1)
        return getattr(self, f"_{kind}_passage")(int(i))[0]

    def _film_idx(self, r):
        return r.randrange(self.counts["film"])

    # one hop: the answer is in the passage whose title the question names
    def _q_film_director(self, r):
        f = self.film(fi := self._film_idx(r))
        return (f"Who directed {f['title']}?", self.person_name(f["director"]), [f"film-{fi}"], "single", 1)

    def _q_person_city(self, r):
        i = r.randrange(self.counts["person"])
        p = self.person(i)
        return (f"In which city was {p['name']} born?", self.city_name(p["birth_city"]), [f"person-{i}"], "single", 1)

    def _q_company_city(self, r):
        i = r.randrange(self.counts["company"])
        c = self.company(i)
        return (f"In which city is {c['name']} headquartered?", self.city_name(c["hq"]), [f"company-{i}"], "single", 1)

    def _q_city_country(self, r):
        i = r.randrange(self.counts["city"])
        c = self.city(i)
        return (f"In which country is the city of {c['name']}?", self.country_name(c["country"]), [f"city-{i}"],
                "single", 1)

    # two to four hops
    def _q_birth_country(self, r):
        i = r.randrange(self.counts["person"])
        p = self.person(i)
        city = self.city(p["birth_city"])
        return (f"In which country was {p['name']} born?", self.country_name(city["country"]),
                [f"person-{i}", f"city-{p['birth_city']}"], "bridge", 2)

    def _q_director_city(self, r):
        f = self.film(fi := self._film_idx(r))
        p = self.person(f["director"])
        return (f"In which city was the director of {f['title']} born?", self.city_name(p["birth_city"]),
                [f"film-{fi}", f"person-{f['director']}"], "bridge", 2)

    def _q_director_country(self, r):
        f = self.film(fi := self._film_idx(r))
        p = self.person(f["director"])
        return (f"In which country was the director of {f['title']} born?",
                self.country_name(self.city(p["birth_city"])["country"]),
                [f"film-{fi}", f"person-{f['director']}", f"city-{p['birth_city']}"], "bridge", 3)

    def _q_employer_country(self, r):
        f = self.film(fi := self._film_idx(r))
        p = self.person(f["director"])
        c = self.company(p["employer"])
        return (f"In which country is the company that employs the director of {f['title']} headquartered?",
                self.country_name(self.city(c["hq"])["country"]),
                [f"film-{fi}", f"person-{f['director']}", f"company-{p['employer']}", f"city-{c['hq']}"], "bridge", 4)

    def _q_born_first(self, r):
        while True:
            i, j = r.sample(range(self.counts["person"]), 2)
            a, b = self.person(i), self.person(j)
            if a["birth_year"] != b["birth_year"]:
                break
        first = a if a["birth_year"] < b["birth_year"] else b
        return (f"Who was born first, {a['name']} or {b['name']}?", first["name"],
                [f"person-{i}", f"person-{j}"], "comparison", 2)

    def _q_film_first(self, r):
        while True:
            i, j = r.sample(range(self.counts["film"]), 2)
            a, b = self.film(i), self.film(j)
            if a["year"] != b["year"]:
                break
        first = a if a["year"] < b["year"] else b
        return (f"Which film came out first, {a['title']} or {b['title']}?", first["title"],
                [f"film-{i}", f"film-{j}"], "comparison", 2)

    def _q_same_country(self, r):
        i, j = r.sample(range(self.counts["person"]), 2)
        a, b = self.person(i), self.person(j)
        ca, cb = self.city(a["birth_city"]), self.city(b["birth_city"])
        gold = [f"person-{i}", f"person-{j}", f"city-{a['birth_city']}", f"city-{b['birth_city']}"]
        return (f"Were {a['name']} and {b['name']} born in the same country?",
                "yes" if ca["country"] == cb["country"] else "no", list(dict.fromkeys(gold)), "comparison",
                len(set(gold)))

    def iter_questions(self, start: int, n: int) -> Iterator[dict]:
        seen: set[str] = set()
        q = start
        while len(seen) < n:
            row = self.question(q)
            q += 1
            if row["question"] not in seen:  # same question text twice would leak across splits
                seen.add(row["question"])
                yield row


QUESTION_TYPES = ("film_director", "person_city", "company_city", "city_country",        # 1 hop
                  "birth_country", "director_city", "born_first", "film_first",           # 2 hops
                  "same_country",                                                         # 2-4 hops
                  "director_country", "employer_country")                                 # 3, 4 hops

_FILLERS = (
    "Local records about {name} were collected by a regional archive.",
    "Several historians have written short accounts that mention {name}.",
    "A museum exhibit once featured material connected to {name}.",
    "Visitors frequently ask guides about the early history of {name}.",
    "Newspapers of the period covered {name} in brief notices.",
    "The name {name} also appears in a number of travel guides.",
    "Scholars disagree about minor details concerning {name}.",
    "An annual lecture series has discussed {name} on several occasions.",
    "Photographs related to {name} are kept in a public collection.",
    "Many people first heard of {name} through radio broadcasts.",
)


@lru_cache(maxsize=None)
def hash_kind(kind: str) -> int:
    return sum((k + 1) * ord(ch) for k, ch in enumerate(kind)) * 104729


def generate(n_passages: int, n_train: int, n_dev: int, seed: int = 13,
             question_mix: dict[str, float] | None = None):
    """(world, passages iterator, train questions, dev questions); the two question lists are disjoint.

    `question_mix`: template -> weight (templates in QUESTION_TYPES); None = every template equally.
    """
    if question_mix is not None:
        unknown = sorted(set(question_mix) - set(QUESTION_TYPES))
        if unknown or not any(w > 0 for w in question_mix.values()) or any(w < 0 for w in question_mix.values()):
            raise ValueError(f"question_mix: unknown templates {unknown} (known: {list(QUESTION_TYPES)})" if unknown
                             else f"question_mix: weights must be >= 0 with one > 0, got {question_mix}")
    world = World(n_passages=n_passages, seed=seed,
                  question_mix=tuple(question_mix.items()) if question_mix is not None else None)
    questions = list(world.iter_questions(0, n_train + n_dev))
    rng = random.Random(f"{seed}:split")
    rng.shuffle(questions)
    return world, world.iter_passages(), questions[:n_train], questions[n_train:]
