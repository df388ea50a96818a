"""IGSD: the teacher proposes query tokens of failed rollouts (``propose``), each proposal and the
student's token are completed, executed and scored against control passages (``stages``: complete ->
execute -> score -> gate), and the gated pairs are distilled (``losses.igsd_pair_loss``).
``run_igsd`` (``driver``) runs one step from the term's ``AuxContext``; every rank makes the same
model-core calls, so several processes stay in lockstep. docs/methods.md gives the algorithm in
full.
"""

from hindsearch.hindsight.igsd.driver import pair_record, run_igsd
from hindsearch.hindsight.igsd.propose import (answer_token_ids, propose_pairs, query_start,
                                               select_positions, unseen_answer_positions)
from hindsearch.hindsight.igsd.stages import (QueryCache, answer_split, complete_stage,
                                              control_sampler, execute_stage, gate_stage,
                                              score_stage, verify_pairs)
from hindsearch.hindsight.igsd.types import METRIC_KEYS, SIDES, Completion, Pair, Scored

__all__ = [
    "METRIC_KEYS", "SIDES", "Completion", "Pair", "QueryCache", "Scored", "answer_split",
    "answer_token_ids", "unseen_answer_positions",
    "complete_stage", "control_sampler",
    "execute_stage", "gate_stage", "pair_record", "propose_pairs", "query_start",
    "run_igsd", "score_stage", "select_positions", "verify_pairs",
]
