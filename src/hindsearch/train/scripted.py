"""Scripted searcher: demonstration rollouts in the exact Search-R1 protocol text (cold start).

Each demo searches through the real ``Retriever`` (its information blocks are exactly
``protocol.information_block`` of what came back) and answers only from what it retrieved. It solves
most one-hop questions and only part of the two-hop ones (``p_bridge``), leaving headroom for RL;
with probability ``p_feedback`` a demo carries a hindsight line it follows (``feedback_kinds``).
Output: text-only ``Trajectory`` objects (``extra["segments"]``, ``extra["hint"]``) that
``train.warmup.tokenize_demo`` tokenises. The answering rule and the demo kinds: docs/methods.md,
"The scripted searcher and the warm-up".
"""

from __future__ import annotations

import random
import re
from collections.abc import Sequence
from typing import Any

from hindsearch.agent import protocol
from hindsearch.config.fields import FEEDBACK_KINDS
from hindsearch.records import Passage, QARecord, Trajectory, Turn, title_key
from hindsearch.answers import exact_match, f1_score, normalize_answer

SNIPPET_CHARS = 160


def find_in_docs(answers: Sequence[str], docs: Sequence[Passage]) -> str | None:
    """The first answer string that occurs (case-insensitive, whole words) in a passage, as written
    there.

    Returns the surface form from the passage text (or title), or None when no answer occurs.
    """
    for a in answers:
        a = a.strip()
        if not a:
            continue
        pat = re.compile(r"(?<!\w)" + re.escape(a) + r"(?!\w)", re.IGNORECASE)
        for d in docs:
            m = pat.search(d.bare_title + "\n" + d.text)
            if m:
                return m.group(0)
    return None


def guess_from_docs(question: str, docs: Sequence[Passage], rng: random.Random) -> str:
    """A guess seen in the docs: the title of a retrieved passage that the question does not
    mention.

    Falls back to the first passage's title, or ``"unknown"`` when nothing was retrieved.
    """
    qn = normalize_answer(question)
    titles = [d.bare_title for d in docs if d.bare_title]
    fresh = [t for t in titles if normalize_answer(t) and normalize_answer(t) not in qn]
    if fresh:
        return fresh[0] if rng.random() < 0.7 else rng.choice(fresh)
    return titles[0] if titles else "unknown"


def _hop_questions(record: QARecord) -> tuple[str, str] | None:
    hq = record.metadata.get("hop_questions")
    if (isinstance(hq, (list, tuple)) and len(hq) == 2
            and all(isinstance(q, str) and q.strip() for q in hq)):
        return hq[0].strip(), hq[1].strip()
    return None


def feedback_critique(record: QARecord) -> str:
    """A short critique that points the search the right way without giving the answer."""
    hq = _hop_questions(record)
    bridge = record.metadata.get("bridge")
    if record.hops == 2 and hq and bridge:
        return f"After the first search, search for {bridge} and answer {hq[1]}"
    return "Search with the question and answer with the name written in the passages."


class ScriptedSearcher:
    """Writes demonstration trajectories with real retrieval (see the module docstring).

    ``retriever`` is any ``Retriever`` (``retrieve(queries, k) -> list[list[Passage]]``).
    Deterministic: the random choices of a record depend only on ``seed`` and the record id.
    """

    def __init__(self, retriever: Any, topk: int = 3, p_bridge: float = 0.5,
                 p_feedback: float = 0.0, max_turns: int = 4, seed: int = 0,
                 feedback_kinds: Sequence[str] = ("critique",)) -> None:
        for name, p in (("p_bridge", p_bridge), ("p_feedback", p_feedback)):
            if not 0.0 <= p <= 1.0:
                raise ValueError(f"warmup.{name} must be in [0, 1], got {p}")
        if max_turns < 1:
            raise ValueError(f"rollout.max_turns must be >= 1 for demonstrations, got {max_turns}")
        kinds = tuple(feedback_kinds)
        bad = [k for k in kinds if k not in FEEDBACK_KINDS]
        if not kinds or bad:
            raise ValueError("warmup.feedback_kinds must be a non-empty subset of "
                             f"{FEEDBACK_KINDS}, got {list(kinds)}")
        self.retriever, self.topk = retriever, topk
        self.p_bridge, self.p_feedback = p_bridge, p_feedback
        self.max_turns, self.seed, self.feedback_kinds = max_turns, seed, kinds

    # -------------------------------------------------------------- one demo
    def demo(self, record: QARecord) -> Trajectory:
        """One demonstration trajectory for ``record`` (text level, with segments)."""
        rng = random.Random(f"{self.seed}:{record.id}")
        if not (self.p_feedback > 0 and rng.random() < self.p_feedback):
            return self._write(record, rng)
        kind = self.feedback_kinds[0] if len(self.feedback_kinds) == 1 else rng.choice(
            self.feedback_kinds)
        if kind == "critique":
            return self._write(record, rng, protocol.FEEDBACK_TEMPLATE.format(
                critique=feedback_critique(record)),
                               chain=True, kind=kind)
        if kind in ("answer_line", "answer_query"):
            gold = record.golden_answers[0]
            return self._write(record, rng, protocol.GOLD_HINDSIGHT_TEMPLATE.format(answer=gold),
                               chain=True, kind=kind,
                               answer_query=gold if kind == "answer_query" else None)
        from hindsearch.hindsight.judge import OracleJudge  # lazy: judge imports torch

        # the attempt the judge critiques: the typical failure of a student, answering after one
        # search
        prev = self._write(record, random.Random(f"{self.seed}:{record.id}:attempt"), chain=False)
        if prev.em > 0:
            return self._write(record, rng)  # the judge critiques failures only
        crit = OracleJudge(sees_gold=kind == "oracle_gold").critique([prev])[0]
        hint = protocol.FEEDBACK_TEMPLATE.format(critique=crit.text)
        if kind == "oracle_nogold":
            # no privileged information: an unhinted draw
            return self._write(record, rng, hint, kind=kind)
        missed = {title_key(t) for t in prev.evidence} - prev.retrieved_keys()
        subject = record.metadata.get("subject")
        first = subject if subject and title_key(subject) in missed else None
        return self._write(record, rng, hint, chain=True, kind=kind, first_query=first,
                           bridge_by_name=True)

    def _write(self, record: QARecord, rng: random.Random, hint: str | None = None,
               chain: bool | None = None, kind: str | None = None, first_query: str | None = None,
               bridge_by_name: bool = False, answer_query: str | None = None) -> Trajectory:
        """The demo itself: ``chain`` forces (True) or forbids (False) the two-hop chain (None: with
        probability ``p_bridge``), ``first_query`` replaces the question as the first query,
        ``bridge_by_name`` searches the bridge's name instead of the second sub-question,
        ``answer_query`` (the hinted answer) is named before the question in the first query, and
        the chain is followed only when that search returned no passage holding a gold answer."""
        bridge = record.metadata.get("bridge") if record.hops == 2 else None
        follow_chain = bool(bridge) and (chain if chain is not None
                                         else rng.random() < self.p_bridge)
        hq = _hop_questions(record)
        answer_found: bool | None = None
        segments: list[list[Any]] = []
        turns: list[Turn] = []
        read: list[Passage] = []

        def search(thought: str, query: str) -> list[Passage]:
            segments.append([f"<think> {thought} </think>\n<search> {query} </search>", True])
            docs = list(self.retriever.retrieve([query], self.topk)[0])
            segments.append([protocol.information_block(docs), False])
            turns.append(Turn(action="search", content=query, doc_ids=[d.id for d in docs],
                              doc_titles=[d.bare_title for d in docs],
                              doc_snippets=[d.text[:SNIPPET_CHARS] for d in docs]))
            read.extend(docs)
            return docs

        question = protocol.format_question(record.question)
        if answer_query:
            docs = search(f"The answer should be {answer_query}. I search for it with the "
                          "question.",
                          f"{answer_query} {question}")
            answer_found = find_in_docs(record.golden_answers, read) is not None
            # the hindsight query found what holds the answer
            follow_chain = follow_chain and not answer_found
        elif first_query:
            docs = search(f"The feedback says to search for {first_query} directly.", first_query)
        else:
            docs = search("I need to look this up.", question)
        if follow_chain and bridge:
            if find_in_docs([bridge], read) is None and hq and self.max_turns >= 3:
                search("I should find the first fact on its own.", hq[0])
            found_bridge = find_in_docs([bridge], read)
            if found_bridge is not None and self.max_turns >= len(turns) + 1:
                second = found_bridge if bridge_by_name or not hq else hq[1]
                search(f"The passages point to {found_bridge}. Now I need to find out about "
                       f"{found_bridge}.", second)
        ans = find_in_docs(record.golden_answers, read)
        if ans is not None:
            thought, answer = f"The passages say the answer is {ans}.", ans
        else:
            answer = guess_from_docs(record.question, docs, rng)
            thought = f"I am not sure. My best guess is {answer}."
        segments.append([f"<think> {thought} </think>\n<answer> {answer} </answer>", True])
        turns.append(Turn(action="answer", content=answer))
        text = "".join(s for s, _ in segments)
        return Trajectory(
            qid=record.id, question=record.question, golden_answers=list(record.golden_answers),
            prompt_ids=[], turns=turns, answer=answer,
            reward=exact_match(answer, record.golden_answers),
            em=exact_match(answer, record.golden_answers),
            f1=f1_score(answer, record.golden_answers), stop_reason="answer", hops=record.hops,
            evidence=list(record.evidence), data_source=record.data_source, completion_text=text,
            extra={"segments": segments, "hint": hint, "hint_kind": kind, "scripted": True,
                   "followed_chain": follow_chain, "answer_query_found": answer_found,
                   "bridge": bridge, "metadata": dict(record.metadata)},
        )

    def demos(self, records: Sequence[QARecord]) -> list[Trajectory]:
        """Demonstrations for every record, in order."""
        return [self.demo(r) for r in records]


def ceiling_from_demos(demos: Sequence[Trajectory]) -> dict[str, Any]:
    """EM of demonstrations overall and per hop count, plus searches per question.

    Returns ``{"n", "em", "em_by_hops": {"1": .., "2": ..}, "n_by_hops", "searches_per_question"}``.
    """
    by: dict[str, list[float]] = {}
    for t in demos:
        by.setdefault(str(t.hops if t.hops is not None else "unknown"), []).append(t.em)
    n = len(demos)
    return {
        "n": n,
        "em": sum(t.em for t in demos) / n if n else 0.0,
        "em_by_hops": {k: sum(v) / len(v) for k, v in sorted(by.items())},
        "n_by_hops": {k: len(v) for k, v in sorted(by.items())},
        "searches_per_question": sum(t.num_searches for t in demos) / n if n else 0.0,
    }


def scripted_ceiling(records: Sequence[QARecord], retriever: Any, topk: int = 3,
                     p_bridge: float = 0.5, max_turns: int = 4, seed: int = 0) -> dict[str, Any]:
    """The scripted searcher's own EM per hop count on ``records`` (the ceiling it teaches)."""
    s = ScriptedSearcher(retriever, topk=topk, p_bridge=p_bridge, max_turns=max_turns, seed=seed)
    return ceiling_from_demos(s.demos(records))
