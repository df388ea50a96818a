"""IGSD: verify the teacher's query-token proposals by executing them, then distil gated pairs.

For every failed rollout (teacher context = prompt + ``(The correct answer is: {A[0]}.)``,
teacher-forced on the student's completion):

1. **Positions** (``select_positions``): query tokens where the teacher's top token ``b_t`` differs
   from the student's sampled token ``a_t`` (``disagree``; the ``max_positions_per_rollout`` with the
   largest teacher preference ``log pT(b) - log pT(a)`` are kept), or ``all`` (the first ones) or
   ``random`` query tokens.
2. **Matched completion**: ``prefix + a_t`` and ``prefix + b_t`` (prefix = prompt + completion[:t])
   are completed greedily by the *current policy* (no hindsight) until ``</search>``, at most
   ``max_query_tokens`` new tokens, all in one batched call per step of THE query completer
   (``agent.backend.Backend.complete_queries``: the rollout engine's backend when it does not decode the policy in
   this process, e.g. vLLM, else an ``HFBackend`` of the policy); a completion that never closes
   is cut there and still executed (counted).
3. **Execution**: both query strings go through the rollout's retriever with its top-k, one batched
   ``retrieve`` call per step for the queries not in the per-step cache (keyed by query string).
4. **Utility** ``u(D)``: mean log-prob, under the current policy, of the first gold answer's tokens
   (cut to ``max_answer_tokens``, counted) after ``state + information_block(D) + "<answer> "``, where
   ``state`` = prompt + completion[:t] + proposed token + its completion (+ ``</search>`` when it
   never closed). The answer tokens are those of ``info + "<answer> " + gold`` beyond its longest
   common token prefix with ``info + "<answer>"`` (the natural tokenization of `` gold``).
5. **Controls**: ``n_controls`` random passage sets (``control = random``: ``topk`` passages from the
   corpus, drawn once per pair) or empty blocks (``control = empty``), shared by both queries of the
   pair, each scored with the query's own state: ``IG(q) = u(D_q) - mean_j u(C_j | q)``.
6. ``delta = IG(q_T) - IG(q_S)``; gate per config (``losses.gate``).
7. The teacher's pair distribution ``p_T`` over ``(b_t, a_t)`` is stored; the student's pair logits
   are read from the live logits at loss time (``losses.pair_kl``).

Cost (``prefix_cache=True``, the default): all completions and utility evaluations of one search of
one rollout share ``prompt + completion[:q_start]``; that prefix is run once per (rollout, search)
into a KV cache and only the suffixes are run against row copies of it (``complete_queries`` with ``groups``,
``core.scoring.shared_prefix_utilities``; identical prefixes / sequences once; only answer-position logits kept). Same
numbers as the plain full-sequence path (``prefix_cache=False``) up to float noise (tested).

Several processes: the proposal (teacher), the matched completion and the scoring (policy) are calls of the
model core that every rank makes, even with no failed rollout or no pair (each is a lockstep region of the core),
so ranks run the same number of forwards through sharded weights.
"""

from hindsearch.hindsight.igsd.driver import pair_record, run_igsd
from hindsearch.hindsight.igsd.propose import (answer_token_ids, propose_pairs, query_start, select_positions,
                                              unseen_answer_positions)
from hindsearch.hindsight.igsd.stages import (QueryCache, answer_split, complete_stage, control_sampler, execute_stage,
                                             gate_stage, score_stage, verify_pairs)
from hindsearch.hindsight.igsd.types import METRIC_KEYS, SIDES, Completion, Pair, Scored

__all__ = [
    "METRIC_KEYS", "SIDES", "Completion", "Pair", "QueryCache", "Scored", "answer_split",
    "answer_token_ids", "unseen_answer_positions",
    "complete_stage", "control_sampler",
    "execute_stage", "gate_stage", "pair_record", "propose_pairs", "query_start",
    "run_igsd", "score_stage", "select_positions", "verify_pairs",
]
