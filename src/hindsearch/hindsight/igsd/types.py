"""IGSD's records: a proposed pair (``Pair``, also the auditable record), each stage's typed output,
the metric keys."""

from __future__ import annotations

from dataclasses import dataclass, field


from hindsearch.records import Passage


@dataclass
class Pair:
    """One verified position: student token ``a`` vs teacher token ``b`` at completion index ``t``
    of row ``row``."""

    row: int
    t: int
    a: int
    b: int
    p_T: tuple[float, float]
    """Teacher pair distribution over ``(b, a)``."""
    q_start: int
    queries: dict[str, str] = field(default_factory=dict)  # "T"/"S" -> query string
    states: dict[str, list[int]] = field(default_factory=dict)
    closed: dict[str, bool] = field(default_factory=dict)
    ig: dict[str, float] = field(default_factory=dict)
    u: dict[str, float] = field(default_factory=dict)
    docs: dict[str, list[Passage]] = field(default_factory=dict)
    delta: float = 0.0
    gate: float = 0.0
    verified: bool = False



METRIC_KEYS = (
    "failed", "rows_no_query", "positions_considered", "positions_selected", "positions_verified",
    "teacher_agree", "answer_tokens_dropped", "proposals", "proposals_gold",
    "positions_unreachable", "alias_queries_dropped",
    "hindsight_rows",
    "completions", "never_closed", "retrieval_calls", "retrieval_queries", "cache_hits",
    "cache_hit_rate", "retrieval_errors", "empty_results", "answers_cut", "utility_evals",
    "mean_delta", "frac_delta_pos", "mean_gate",
    "delta_pos_pairs", "delta_pos_teacher_hits", "delta_nonpos_pairs", "delta_nonpos_teacher_hits",
    "time_proposal", "time_completion", "time_retrieval", "time_scoring",
)



# ---- the stages after the proposal: complete -> execute -> score -> gate, typed inputs and outputs
Side = str
"""``"T"`` (the teacher's token ``b``) or ``"S"`` (the student's token ``a``)."""



SIDES: tuple[Side, Side] = ("T", "S")



@dataclass
class Completion:
    """Stage 2 (matched completion) of one side of a pair."""

    query: str
    """The executed query string."""
    state: list[int]
    """prompt + completion[:t] + proposed token + its completion (+ ``</search>`` when it never
    closed)."""
    closed: bool



@dataclass
class Scored:
    """Stage 4 (scoring) of one pair: utilities of each side's own documents and their gains over
    the controls."""

    u: dict[Side, float]
    ig: dict[Side, float]



StageMetrics = dict[str, float]
