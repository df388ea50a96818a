"""The fictional world's questions: one-hop facts of each entity's passage and two-hop bridge
chains, with the checks that each answer is stated where the question says (``generate_world`` draws
the splits)."""

from __future__ import annotations

import random
from typing import TYPE_CHECKING

from hindsearch.records import QARecord

if TYPE_CHECKING:
    from hindsearch.data.world import Entity


def _one_hop(e: Entity) -> list[tuple[str, str, str, list[str]]]:
    """(relation, question, answer, answer aliases) facts stated in ``e``'s own passage."""
    a, n = e.attrs, e.name
    if e.kind == "person":
        out = [("born_in", f"Where was {n} born?", a["born_in"], []),
               ("birth_country", f"In which country was {n} born?", a["country"], []),
               ("birth_year", f"In which year was {n} born?", str(a["birth_year"]), [])]
        if "employer" in a:
            out.append(("employer", f"Which organisation did {n} work for?", a["employer"], []))
        if "spouse" in a:
            out.append(("spouse", f"Who was {n} married to?", a["spouse"], []))
        return out
    if e.kind == "city":
        return [("located_in", f"In which country is {n}?", a["country"], []),
                ("city_founded", f"In which year was {n} founded?", str(a["year"]), [])]
    if e.kind == "country":
        return [("capital", f"What is the capital of {n}?", a["capital"], []),
                ("independence_year", f"In which year did {n} become independent?",
                 str(a["year"]), [])]
    if e.kind == "org":
        return [("founded_by", f"Who founded the {n}?", a["founded_by"], []),
                ("headquarters", f"In which city is the {n} headquartered?", a["hq"], []),
                ("org_founded", f"In which year was the {n} founded?", str(a["year"]), [])]
    return [("author", f"Who wrote {n}?", a["author"], []),
            ("published", f"In which year was {n} first published?", str(a["year"]), [])]


# Two-hop chains: (kind, first relation, bridge attr, second relation, question template).
_CHAINS = [
    ("person", "birth_country", "country", "capital",
     "What is the capital of the country where {} was born?"),
    ("person", "employer", "employer", "founded_by",
     "Who founded the organisation that {} worked for?"),
    ("person", "employer", "employer", "org_founded",
     "In which year was the organisation that {} worked for founded?"),
    ("person", "employer", "employer", "headquarters",
     "In which city is the employer of {} headquartered?"),
    ("person", "born_in", "born_in", "city_founded",
     "In which year was the birthplace of {} founded?"),
    ("work", "author", "author", "born_in", "Where was the author of {} born?"),
    ("work", "author", "author", "birth_year", "In which year was the author of {} born?"),
    ("work", "author", "author", "employer", "Which organisation did the author of {} work for?"),
    ("org", "founded_by", "founded_by", "born_in", "Where was the founder of the {} born?"),
    ("org", "founded_by", "founded_by", "birth_year",
     "In which year was the founder of the {} born?"),
    ("org", "headquarters", "hq", "located_in",
     "In which country is the city where the {} is headquartered?"),
    ("city", "located_in", "country", "capital",
     "What is the capital of the country in which {} lies?"),
]


def _aliases(name: str, ents: dict[str, Entity]) -> list[str]:
    e = ents.get(name)
    return [name] + (e.aliases if e else [])


def _questions(ents: dict[str, Entity],
               text_of: dict[str, str]) -> tuple[list[QARecord], list[QARecord]]:
    """All candidate one-hop and two-hop questions (answers checked against evidence text)."""
    from hindsearch.answers import normalize_answer

    norm = {n: f" {normalize_answer(t)} " for n, t in text_of.items()}

    def answer_in_text(gold: list[str], name: str) -> bool:  # answers.answer_in_text on cached text
        return any(f" {normalize_answer(g)} " in norm[name] for g in gold)

    one, two = [], []
    facts = {n: {r: (q, ans) for r, q, ans, _ in _one_hop(e)} for n, e in ents.items()}
    for n, e in ents.items():
        for rel, q, ans, _ in _one_hop(e):
            gold = _aliases(ans, ents)
            if answer_in_text(gold, n):
                one.append(QARecord("", q, gold, "world", 1, [n], {"relation": rel, "subject": n}))
        for kind, r1, battr, r2, tmpl in _CHAINS:
            if e.kind != kind or battr not in e.attrs:
                continue
            bridge = e.attrs[battr]
            if r2 not in facts.get(bridge, {}):
                continue
            q2, ans = facts[bridge][r2]
            gold = _aliases(ans, ents)
            if ans == n or answer_in_text(gold, n) or not answer_in_text(gold, bridge):
                continue  # degenerate, answerable from the first passage, or unsupported
            one_q = facts[n][r1][0]
            two.append(QARecord("", tmpl.format(n), gold, "world", 2, [n, bridge],
                                {"relation": f"{r1}>{r2}", "subject": n, "bridge": bridge,
                                 "hop_questions": [one_q, q2], "hop_answers": [bridge, ans]}))
    return one, two


def _round_robin(recs: list[QARecord], n: int, rng: random.Random) -> list[QARecord]:
    """Pick ``n`` records spread evenly over relations (shuffled within each relation)."""
    groups: dict[str, list[QARecord]] = {}
    for r in recs:
        groups.setdefault(r.metadata["relation"], []).append(r)
    lists = [groups[k] for k in sorted(groups)]
    for g in lists:
        rng.shuffle(g)
    out: list[QARecord] = []
    i = 0
    while len(out) < n and any(i < len(g) for g in lists):
        out.extend(g[i] for g in lists if i < len(g))
        i += 1
    out = out[:n]
    rng.shuffle(out)
    return out
