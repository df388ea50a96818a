"""Greedy query completion for IGSD: the model core's decode loop, stopping at ``</search>`` (the text rules of a
completed query are ``agent.protocol``'s).

``greedy_complete`` (batched greedy ``core.decode``) and ``cached_greedy_complete`` (rows of one rollout read their
common prefix from one KV cache, identical rows run once: ``core.decode.decode_shared``); the answer scoring is
the core's (``core.scoring``).
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from typing import Any

from hindsearch.agent import protocol
from hindsearch.core.decode import decode, decode_shared
from hindsearch.core.sampling import GREEDY, GenOutput, Stop

def _stop(tokenizer: Any) -> Stop:
    """IGSD's completions stop at ``</search>`` or the tokenizer's EOS (``core.sampling.stop_reason``)."""
    return Stop(tokenizer, {tokenizer.eos_token_id} if tokenizer.eos_token_id is not None else set(), (protocol.SEARCH_CLOSE,))


def _finish(tokenizer: Any, out: GenOutput, prefix: Sequence[int]) -> tuple[list[int], str, bool]:
    """``(new ids, new text, closed)`` of one decoded row: an EOS is dropped, ids are cut after ``</search>``."""
    ids = out.ids[:-1] if out.finish == "eos" else out.ids
    kept, closed = protocol.cut_at_search_close(tokenizer, ids, list(prefix[-1:]))
    return kept, tokenizer.decode(kept), closed


def greedy_complete(model: Any, tokenizer: Any, prefixes: list[list[int]], max_tokens: int) -> list[tuple[list[int], str, bool]]:
    """Matched completion without a shared-prefix cache: batched greedy ``core.decode``, left-padded, each row
    stopping at ``</search>`` or EOS; ``(new ids, new text, closed)``."""
    outs = decode(model, prefixes, _stop(tokenizer), GREEDY, [max_tokens] * len(prefixes))
    return [_finish(tokenizer, o, p) for o, p in zip(outs, prefixes)]


def cached_greedy_complete(
    model: Any, tokenizer: Any, prefixes: list[list[int]], max_tokens: int, groups: Sequence[Hashable] | None = None,
    batch_size: int = 16,
) -> list[tuple[list[int], str, bool]]:
    """``greedy_complete`` with shared prefixes computed once (``core.decode.decode_shared``): prefixes of one group
    (e.g. one rollout) are decoded from one KV cache of their common prefix; identical prefixes are completed once.
    ``(new ids, new text, closed)`` per prefix, as ``greedy_complete``; up to ``2 * batch_size`` rows decode together."""
    outs = decode_shared(model, prefixes, _stop(tokenizer), GREEDY, max_tokens, groups, batch_size)
    return [_finish(tokenizer, o, p) for o, p in zip(outs, prefixes)]
