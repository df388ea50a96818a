"""A deterministic, seeded fictional encyclopedia: passages plus one- and two-hop questions.

A search agent can only be tested on facts it cannot already know, so the default data is invented:
``generate_world(seed)`` builds entities with random-syllable names, typed relations and built-in
distractors, one Wikipedia-like passage each, and one-hop and two-hop (bridge) questions whose
``evidence`` lists the passage titles that answer them. ``write_world`` writes ``corpus.jsonl``,
``train/dev/test.jsonl`` and ``world.json``; ``ensure_world`` builds once and caches. The world's
design and question records: docs/data.md, "The fictional world".
"""

from __future__ import annotations

import json
import os
import random
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hindsearch.data.world_questions import _questions, _round_robin
from hindsearch.data.world_words import (_CITY_FORMS, _CODAS, _COUNTRY_SUFFIX, _FILLER, _GENRES,
                                         _OCCUPATIONS, _ONSETS, _ORG_KINDS, _REGIONS, _VOWELS,
                                         _WORK_NOUNS)
from hindsearch.records import Passage, QARecord, make_contents

GENERATOR_VERSION = 1
DEFAULT_ENTITIES = 2000
DEFAULT_SPLITS = {"train": 2000, "dev": 200, "test": 200}
# Share of entities per kind (the rest are people).
KIND_SHARE = {"country": 0.04, "city": 0.2, "org": 0.13, "work": 0.18}

@dataclass
class Entity:
    """One thing of the world; ``attrs`` holds its relations (names of other entities) and years."""

    kind: str
    name: str
    attrs: dict[str, Any] = field(default_factory=dict)
    aliases: list[str] = field(default_factory=list)


@dataclass
class World:
    """Generated world: passages (one per entity), questions per split, and the entities."""

    seed: int
    n_entities: int
    passages: list[Passage]
    splits: dict[str, list[QARecord]]
    entities: dict[str, Entity] = field(default_factory=dict)
    test_questions: int | None = None
    """The test split's size override (None = the default)."""

    def counts(self) -> dict[str, Any]:
        c: dict[str, Any] = {"passages": len(self.passages)}
        for split, recs in self.splits.items():
            c[split] = {"questions": len(recs), "one_hop": sum(r.hops == 1 for r in recs),
                        "two_hop": sum(r.hops == 2 for r in recs)}
        return c


class _Namer:
    """Syllable-based name factory that never returns the same (case-folded) name twice."""

    def __init__(self, rng: random.Random):
        self.rng, self.used = rng, set()

    def stem(self, min_syl: int = 2, max_syl: int = 3) -> str:
        r = self.rng
        while True:
            n = r.randint(min_syl, max_syl)
            w = "".join(r.choice(_ONSETS) + r.choice(_VOWELS) for _ in range(n)) + r.choice(_CODAS)
            if 4 <= len(w) <= 11:
                return w.capitalize()

    def claim(self, *names: str) -> bool:
        keys = [n.lower() for n in names]
        if any(k in self.used for k in keys):
            return False
        self.used.update(keys)
        return True

    def unique(self, make) -> str:
        while True:
            name = make()
            if self.claim(name):
                return name


def _kind_counts(n: int) -> dict[str, int]:
    c = {k: max(2, round(n * s)) for k, s in KIND_SHARE.items()}
    c["city"] = max(c["city"], 2 * c["country"])
    c["person"] = max(4, n - sum(c.values()))
    return c


def _make_places(rng: random.Random, namer: "_Namer",
                 counts: dict[str, int]) -> tuple[list[Entity], list[Entity]]:
    """Countries, then cities (a fifth share a stem with an earlier city), then each country's
    capital."""
    countries = []
    for _ in range(counts["country"]):
        name = namer.unique(lambda: namer.stem(1, 2) + rng.choice(_COUNTRY_SUFFIX))
        countries.append(Entity("country", name,
                                {"region": rng.choice(_REGIONS), "year": rng.randint(1450, 1890),
                                                  "language": namer.stem(1, 2) + "ic"}))
    cities: list[Entity] = []
    stems: list[str] = []
    for i in range(counts["city"]):
        name = None
        if stems and rng.random() < 0.2:  # distractor: shares a stem with an earlier city
            name = rng.choice(["New {}", "Port {}", "{} Vale", "{} Falls", "Upper {}"]).format(
                rng.choice(stems))
            name = name if namer.claim(name) else None
        name = name or namer.unique(lambda: rng.choice(_CITY_FORMS).format(namer.stem()))
        stems.append(name.split()[-1] if name.split()[0] in ("New", "Port", "Upper")
                     else name.split()[0])
        country = countries[i % len(countries)]  # every country gets cities
        cities.append(Entity("city", name, {"country": country.name, "year": rng.randint(850, 1820),
                                            "river": namer.stem(1, 2)}))
    for c in countries:
        own = [x for x in cities if x.attrs["country"] == c.name]
        c.attrs["capital"] = own[0].name
        c.attrs["cities"] = [x.name for x in own[1:4]]
        own[0].attrs["capital_of"] = c.name
    return countries, cities


def _make_people(rng: random.Random, namer: "_Namer", counts: dict[str, int],
                 cities: list[Entity]) -> list[Entity]:
    """People (a third with a middle name, findable by the short form too), a third of them married
    pairwise."""
    first_names = [namer.stem(2, 2) for _ in range(max(30, counts["person"] // 3))]
    surnames = [namer.stem(2, 3) for _ in range(max(20, counts["person"] // 3))]
    people: list[Entity] = []
    while len(people) < counts["person"]:
        first, last = rng.choice(first_names), rng.choice(surnames)
        middle = rng.choice(first_names) if rng.random() < 0.3 else None
        full, short = (f"{first} {middle} {last}", f"{first} {last}") if middle else (
            f"{first} {last}", None)
        if not namer.claim(*([full, short] if short else [full])):
            continue
        city = rng.choice(cities)
        people.append(Entity("person", full, {
            "born_in": city.name, "country": city.attrs["country"],
            "birth_year": rng.randint(1760, 1960), "occupation": rng.choice(_OCCUPATIONS),
            "gender": rng.choice("mf")}, [short] if short else []))
    singles = people[:]
    rng.shuffle(singles)
    for a, b in zip(singles[0:len(singles) // 3],
                    singles[len(singles) // 3: 2 * len(singles) // 3]):
        a.attrs["spouse"], b.attrs["spouse"] = b.name, a.name
    return people


def _make_orgs_and_works(rng: random.Random, namer: "_Namer", counts: dict[str, int],
                         cities: list[Entity], people: list[Entity]) -> list[Entity]:
    """Organisations (founder, HQ, employees) and works (author, genre, year)."""
    orgs = []
    for _ in range(counts["org"]):
        founder = rng.choice(people)
        name = namer.unique(lambda: f"{namer.stem()} {rng.choice(_ORG_KINDS)}"
                            if rng.random() < 0.75
                            else f"{founder.name.split()[-1]} {rng.choice(_ORG_KINDS)}")
        orgs.append(Entity("org", name, {"founded_by": founder.name, "hq": rng.choice(cities).name,
                                         "year": founder.attrs["birth_year"]
                                         + rng.randint(22, 55)}))
    for p in people:
        if rng.random() < 0.85:
            p.attrs["employer"] = rng.choice(orgs).name
    works = []
    for _ in range(counts["work"]):
        author = rng.choice(people)
        name = namer.unique(lambda: rng.choice(["The {} {}", "{1} of {0}",
                                                "The {1} of {0}"]).format(
            namer.stem() if rng.random() < 0.7 else rng.choice(cities).name,
            rng.choice(_WORK_NOUNS)))
        works.append(Entity("work", name, {"author": author.name, "genre": rng.choice(_GENRES),
                                           "year": author.attrs["birth_year"]
                                           + rng.randint(20, 60)}))
    return orgs + works


def _build_entities(rng: random.Random, n_entities: int) -> dict[str, Entity]:
    """Create the entities and their relations (all by name), consistent in time (same draw order as
    ever)."""
    namer, counts = _Namer(rng), _kind_counts(n_entities)
    countries, cities = _make_places(rng, namer, counts)
    people = _make_people(rng, namer, counts, cities)
    rest = _make_orgs_and_works(rng, namer, counts, cities, people)
    return {e.name: e for e in countries + cities + people + rest}


def _article(word: str) -> str:
    return "an" if word[0] in "aeiou" else "a"


def _passage_text(e: Entity, ents: dict[str, Entity], by_kind: dict[str, list[str]],
                  rng: random.Random) -> str:
    """Wikipedia-like text for one entity: fact sentences, then filler up to 60-150 words."""
    a = e.attrs
    if e.kind == "person":
        s, o, p = ("she", "her", "her") if a["gender"] == "f" else ("he", "him", "his")
        job = f"{_article(a['occupation'])} {a['occupation']}"
        facts = [f"{e.name} (born {a['birth_year']}) is {job} from {a['country']}.",
                 f"{s.capitalize()} was born in {a['born_in']} in {a['birth_year']}."]
        if "employer" in a:
            facts.append(f"{s.capitalize()} worked for the {a['employer']} for many years.")
        if "spouse" in a:
            facts.append(f"{s.capitalize()} was married to {a['spouse']}.")
    elif e.kind == "city":
        facts = [f"{e.name} is a city in {a['country']}, on the {a['river']} river.",
                 f"It was founded in {a['year']}."]
        if "capital_of" in a:
            facts.append(f"{e.name} is the capital of {a['capital_of']}.")
    elif e.kind == "country":
        facts = [f"{e.name} is a country in the {a['region']}.", f"Its capital is {a['capital']}.",
                 f"It became an independent state in {a['year']}, and its official language is "
                 f"{a['language']}."]
        if a["cities"]:
            facts.append("Other cities include " + ", ".join(a["cities"]) + ".")
    elif e.kind == "org":
        facts = [f"The {e.name} is an organisation headquartered in {a['hq']}.",
                 f"It was founded by {a['founded_by']} in {a['year']}."]
    else:
        facts = [f"{e.name} is {_article(a['genre'])} {a['genre']} written by {a['author']}.",
                 f"It was first published in {a['year']}."]
    def other(kind: str) -> str:  # another entity of ``kind``, never this one
        name = rng.choice(by_kind[kind])
        return name if name != e.name else by_kind[kind][(by_kind[kind].index(name) + 1) % len(
            by_kind[kind])]

    fill = {"city2": other("city"), "person2": other("person"), "country2": other("country"),
            "work2": other("work")}
    if e.kind == "person":
        fill.update(s=s, S=s.capitalize(), o=o, p=p)
    pool = [f.format(**fill) for f in _FILLER[e.kind]]
    rng.shuffle(pool)
    target = rng.randint(60, 110)
    words = sum(len(x.split()) for x in facts)
    extra = []
    for sent in pool:
        if words >= target:
            break
        extra.append(sent)
        words += len(sent.split())
    body = facts[:1]  # lead sentence first, then facts and filler interleaved
    for i in range(max(len(facts) - 1, len(extra))):
        body += facts[i + 1:i + 2] + extra[i:i + 1]
    return " ".join(body)


def split_sizes(n_entities: int, test_questions: int | None = None) -> dict[str, int]:
    """Questions per split: the defaults, scaled down for worlds smaller than the default.

    ``test_questions`` overrides the test split's size (a different world: the shuffles differ).
    """
    scale = min(1.0, n_entities / DEFAULT_ENTITIES)
    sizes = {k: max(4, round(v * scale)) for k, v in DEFAULT_SPLITS.items()}
    if test_questions is not None:
        sizes["test"] = int(test_questions)
    return sizes


def generate_world(seed: int = 0, n_entities: int | None = None,
                   test_questions: int | None = None) -> World:
    """Build the world for ``seed``: same seed, size and test size -> byte-identical passages and
    questions."""
    n = n_entities or DEFAULT_ENTITIES
    if n < 40:
        raise ValueError(f"n_entities must be at least 40 (got {n})")
    rng = random.Random(seed)
    ents = _build_entities(rng, n)
    by_kind: dict[str, list[str]] = {}
    for e in ents.values():
        by_kind.setdefault(e.kind, []).append(e.name)
    text_of = {name: _passage_text(e, ents, by_kind, rng) for name, e in ents.items()}
    order = sorted(ents)  # passage order independent of creation order
    rng.shuffle(order)
    passages = [Passage(str(i), make_contents(name, text_of[name])) for i, name in enumerate(order)]
    one, two = _questions(ents, text_of)
    sizes = split_sizes(n, test_questions)
    total = sum(sizes.values())
    n_one = min(len(one), total // 2 + total % 2)
    n_two = min(len(two), total - n_one)
    pick_one, pick_two = _round_robin(one, n_one, rng), _round_robin(two, n_two, rng)
    splits: dict[str, list[QARecord]] = {}
    io = it = 0
    for split, size in sizes.items():
        size = round(size * (n_one + n_two) / total)
        k1 = min(size // 2 + size % 2, n_one - io)
        k2 = min(size - k1, n_two - it)
        recs = pick_one[io:io + k1] + pick_two[it:it + k2]
        io, it = io + k1, it + k2
        rng.shuffle(recs)
        for i, r in enumerate(recs):
            r.id = f"{split}_{i}"
        splits[split] = recs
    return World(seed, n, passages, splits, ents, test_questions)


def write_world(world: World, out_dir: str | Path) -> Path:
    """Write ``corpus.jsonl``, ``train/dev/test.jsonl`` and ``world.json`` into ``out_dir``."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    with (out / "corpus.jsonl").open("w", encoding="utf-8") as f:
        for p in world.passages:
            f.write(json.dumps(p.to_search_r1(), ensure_ascii=False) + "\n")
    for split, recs in world.splits.items():
        with (out / f"{split}.jsonl").open("w", encoding="utf-8") as f:
            for r in recs:
                f.write(json.dumps(r.to_dict(), ensure_ascii=False) + "\n")
    meta = {"seed": world.seed, "n_entities": world.n_entities,
            "generator_version": GENERATOR_VERSION, "test_questions": world.test_questions,
            "counts": world.counts()}
    (out / "world.json").write_text(json.dumps(meta, indent=1) + "\n", encoding="utf-8")
    return out


def world_is_current(out_dir: str | Path, seed: int = 0, n_entities: int | None = None,
                     test_questions: int | None = None) -> bool:
    """True when ``out_dir`` holds a complete world of this seed, size, test size and generator
    version."""
    out = Path(out_dir)
    try:
        meta = json.loads((out / "world.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    files = ["corpus.jsonl"] + [f"{s}.jsonl" for s in DEFAULT_SPLITS]
    return (meta.get("seed") == seed and meta.get("n_entities") == (n_entities or DEFAULT_ENTITIES)
            and meta.get("generator_version") == GENERATOR_VERSION
            and meta.get("test_questions") == test_questions
            and all((out / f).is_file() for f in files))


def ensure_world(out_dir: str | Path, seed: int = 0, n_entities: int | None = None,
                 test_questions: int | None = None) -> Path:
    """Build the world into ``out_dir`` unless it is already there (same seed/size/version).

    Atomic: written to a temporary sibling folder, then renamed over ``out_dir``, so a crash never
    leaves a half-written world that looks complete. An existing ``out_dir`` is replaced only when
    it is a world folder (``world.json``) or empty; anything else is refused (``UnsafeOutput``).
    """
    out = Path(out_dir)
    if world_is_current(out, seed, n_entities, test_questions):
        return out
    from hindsearch.fsutil import check_replaceable, json_marker

    # never replace user data
    check_replaceable(out, json_marker("world.json", "generator_version"), "world folder")
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.parent / f".{out.name}.tmp-{os.getpid()}-{time.monotonic_ns()}"
    try:
        write_world(generate_world(seed, n_entities, test_questions), tmp)
    except BaseException:  # a failed or interrupted build leaves no temporary folder behind
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    try:
        if out.exists():
            old = out.parent / f".{out.name}.old-{os.getpid()}-{time.monotonic_ns()}"
            out.rename(old)
            tmp.rename(out)
            shutil.rmtree(old, ignore_errors=True)
        else:
            tmp.rename(out)
    except OSError:  # another process finished the same build first
        shutil.rmtree(tmp, ignore_errors=True)
        if not world_is_current(out, seed, n_entities, test_questions):
            raise
    return out


def ensure_world_for(data_cfg: Any) -> Path:
    """``ensure_world`` with the world fields of a ``DataConfig`` (dir, seed, entities, test
    size)."""
    return ensure_world(data_cfg.world_dir, seed=data_cfg.world_seed,
                        n_entities=data_cfg.world_entities,
                        test_questions=getattr(data_cfg, "world_test_questions", None))
