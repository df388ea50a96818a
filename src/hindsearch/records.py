"""Record types shared by every stage: passages, QA examples, rollout turns and trajectories.

These are plain dataclasses with ``to_dict``/``from_dict`` so they round-trip through
JSONL (``trajectories.jsonl``, ``samples.jsonl``, demonstration files).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass, field, fields
from typing import Any


def bare_title(title: str) -> str:
    """A title without the surrounding double quotes wiki-18 puts around it (stripped)."""
    t = title.strip()
    if len(t) >= 2 and t[0] == t[-1] == '"':
        t = t[1:-1]
    return t


def title_key(title: str) -> str:
    """The key titles are compared by: bare and lower-cased."""
    return bare_title(title).lower()


@dataclass(frozen=True)
class Passage:
    """One retrievable passage in wiki-18 format.

    ``contents`` is ``'"Title"\\ntext'`` exactly as Search-R1's corpus stores it; the title is
    the first line (quotes kept, as Search-R1's ``Doc i(Title: ...)`` shows them).
    """

    id: str
    contents: str
    score: float | None = None

    @property
    def title(self) -> str:
        return self.contents.split("\n", 1)[0]

    @property
    def text(self) -> str:
        parts = self.contents.split("\n", 1)
        return parts[1] if len(parts) > 1 else ""

    @property
    def bare_title(self) -> str:
        """Title without the surrounding double quotes wiki-18 puts around it."""
        return bare_title(self.title)

    def to_search_r1(self) -> dict[str, Any]:
        """The ``document`` object of Search-R1's ``/retrieve`` response."""
        return {"id": self.id, "contents": self.contents}


def make_contents(title: str, text: str) -> str:
    """Build wiki-18 ``contents`` from a bare title and a text."""
    return f'"{title}"\n{text}'


@dataclass
class QARecord:
    """One question with its gold answers, normalised from any supported QA format.

    ``hops`` is 1 or 2 for the fictional world and multi-hop sets when known, else None.
    ``evidence`` holds the bare titles of the passages that support the answer (when known).
    """

    id: str
    question: str
    golden_answers: list[str]
    data_source: str = ""
    hops: int | None = None
    evidence: list[str] = field(default_factory=list)
    metadata: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "QARecord":
        names = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in d.items() if k in names})


@dataclass
class Turn:
    """One model turn of a rollout.

    ``action`` is ``search``, ``answer``, ``invalid`` (no well-formed tag: the notice was
    injected) or ``truncated`` (budget ran out mid-turn). Token spans are half-open
    ``[start, end)`` offsets into the trajectory's ``completion_ids``:
    ``gen_span`` = tokens the model produced this turn; ``query_span`` = the query text
    tokens inside ``<search>...</search>`` (empty when not a search); ``inject_span`` =
    the tokens injected after the turn (information block or notice; empty when none).
    """

    action: str
    content: str = ""
    gen_span: tuple[int, int] = (0, 0)
    query_span: tuple[int, int] = (0, 0)
    inject_span: tuple[int, int] = (0, 0)
    doc_ids: list[str] = field(default_factory=list)
    doc_titles: list[str] = field(default_factory=list)
    doc_snippets: list[str] = field(default_factory=list)
    error: str | None = None

    def record(self) -> dict[str, Any]:
        """What ``samples.jsonl`` keeps of the turn: ``action``, ``content`` (the query or the
        answer), the retrieved ``doc_ids`` / ``doc_titles`` (bare) and ``error`` (None when the turn
        had none)."""
        return {"action": self.action, "content": self.content, "doc_ids": list(self.doc_ids),
                "doc_titles": list(self.doc_titles), "error": self.error}


@dataclass
class Trajectory:
    """A full multi-turn rollout, with the exact ids trained on and their masks.

    ``completion_ids``, ``gen_mask``, ``query_mask`` and ``logprobs`` have equal length.
    ``gen_mask[i] = 1`` iff the model sampled token i; ``query_mask[i] = 1`` iff token i
    is part of a search query text; ``logprobs[i]`` is the sampling log-prob of a generated
    token (0.0 on injected tokens).
    """

    qid: str
    question: str
    golden_answers: list[str]
    prompt_ids: list[int]
    completion_ids: list[int] = field(default_factory=list)
    gen_mask: list[int] = field(default_factory=list)
    query_mask: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    turns: list[Turn] = field(default_factory=list)
    answer: str | None = None
    reward: float = 0.0
    em: float = 0.0
    f1: float = 0.0
    stop_reason: str = ""
    hops: int | None = None
    evidence: list[str] = field(default_factory=list)
    data_source: str = ""
    errors: list[str] = field(default_factory=list)
    completion_text: str = ""
    extra: dict[str, Any] = field(default_factory=dict)

    def model_text(self, decode: Callable[[list[int]], str]) -> str:
        """The text the model itself wrote: each turn's ``gen_span`` decoded on its own, joined.
        Injected information blocks and notices are left out (the invalid-action notice names
        ``<answer>`` itself)."""
        return "".join(decode(self.completion_ids[a:b])
                       for a, b in (t.gen_span for t in self.turns))

    @property
    def queries(self) -> list[str]:
        return [t.content for t in self.turns if t.action == "search"]

    def retrieved_keys(self, from_turn: int = 0) -> set[str]:
        """``title_key`` of everything the searches retrieved (from turn ``from_turn`` on)."""
        return {title_key(t) for turn in self.turns[from_turn:] for t in turn.doc_titles}

    @property
    def evidence_recall(self) -> float:
        """Share of the question's evidence titles that the searches retrieved (0 without
        evidence)."""
        ev = {title_key(e) for e in self.evidence}
        return len(ev & self.retrieved_keys()) / len(ev) if ev else 0.0

    @property
    def num_searches(self) -> int:
        return sum(1 for t in self.turns if t.action == "search")

    @property
    def num_invalid(self) -> int:
        return sum(1 for t in self.turns if t.action == "invalid")

    @property
    def failed(self) -> bool:
        return self.reward <= 0.0

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["queries"] = self.queries
        d["num_searches"] = self.num_searches
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "Trajectory":
        names = {f.name for f in fields(cls)}
        kw = {k: v for k, v in d.items() if k in names}
        kw["turns"] = [
            Turn(**{**t, **{s: tuple(t[s]) for s in ("gen_span", "query_span", "inject_span")
                            if s in t}})
            for t in d.get("turns", [])
        ]
        return cls(**kw)
