"""Batched multi-turn Search-R1 rollouts with exact token masks (``RolloutEngine``).

Each trajectory runs until it answers, stops or runs out of budget: a backend generates each turn
(HF: the model core's decode loop, per-row scheduling; vLLM: turn by turn), ended turns are parsed
(``protocol.parse_action``), their searches are served in one batched ``retrieve`` and the
observation is injected with ``gen_mask = 0``. Generated ids are never re-encoded; log-probs are of
the sampled token before top-p; the answer, EM and F1 are computed once, from the model-written
turns only. The turn and budget rules are in docs/protocol.md.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from hindsearch.agent import protocol
from hindsearch.agent.backend import Backend
from hindsearch.core.sampling import GenOutput, SamplingParams
from hindsearch.records import Passage, QARecord, Trajectory, Turn
from hindsearch.answers import exact_match, f1_score


@dataclass(eq=False)
class _State:
    """A trajectory under construction."""

    traj: Trajectory
    index: int
    done: bool = False
    action_turns: int = 0
    pending_query: str | None = None
    turn: Turn | None = field(default=None, repr=False)


class RolloutEngine:
    """Batched multi-turn Search-R1 rollouts (see the module docstring for the exact rules).

    ``retriever`` implements ``retrieve(queries: list[str], k: int) -> list[list[Passage]]``.
    ``retries``: extra attempts of the engine's own for a failing ``retrieve`` call before the
    failure is recorded; 0 by default, so ``retrieval.retries`` (the remote client's retries with
    backoff) is the one retry setting of a run: the engine's retries nested around the client's cost
    up to 3 x 4 POSTs per batch. ``logits_hook``: optional ``hook(rows, new_ids, logits)`` applied
    before sampling, where ``rows`` are ``(trajectory index, turn index, question id)`` (HF backend
    only; tests use it to script output).
    """

    def __init__(
        self,
        model: Any,
        tokenizer: Any,
        retriever: Any,
        cfg: Any,
        topk: int = 3,
        backend: Backend | None = None,
        retries: int = 0,
        retry_wait_s: float = 0.2,
        logits_hook: Callable[[list[tuple[int, int, str]], list[list[int]], torch.Tensor],
                              torch.Tensor] | None = None,
    ) -> None:
        self.model, self.tokenizer, self.retriever = model, tokenizer, retriever
        self.cfg, self.topk = cfg, topk
        self.backend = backend if backend is not None else make_backend(cfg, model, tokenizer)
        self.retries, self.retry_wait_s, self.logits_hook = retries, retry_wait_s, logits_hook
        self.stats: dict[str, float] = {"retrieve_s": 0.0, "retrieve_calls": 0,
                                        "retrieve_failures": 0, "inject_s": 0.0}

    # ------------------------------------------------------------------ helpers
    def encode_text(self, text: str) -> list[int]:
        """Ids of injected text, tokenized on its own without special tokens."""
        return self.tokenizer(text, add_special_tokens=False)["input_ids"]

    def prompt_ids(self, question: str, hint: str | None = None) -> list[int]:
        """Token ids of the Search-R1 prompt (chat template applied when the tokenizer has one)."""
        return protocol.encode_prompt(self.tokenizer, question, hint)

    def sampling(self, greedy: bool) -> SamplingParams:
        return SamplingParams(self.cfg.temperature, self.cfg.top_p, greedy, draw=self.cfg.sampler)

    def _retrieve(self, queries: list[str]) -> tuple[list[list[Passage]], str | None]:
        """One batched retrieve with bounded retries -> (docs per query, error or None)."""
        t0 = time.perf_counter()
        err = None
        for attempt in range(self.retries + 1):
            try:
                self.stats["retrieve_calls"] += 1
                docs = self.retriever.retrieve(queries, self.topk)
                if len(docs) != len(queries):
                    raise RuntimeError(f"retriever returned {len(docs)} results for {len(queries)} "
                                       "queries")
                self.stats["retrieve_s"] += time.perf_counter() - t0
                return [list(d) for d in docs], None
            except Exception as e:  # noqa: BLE001 - any retriever failure is recorded, never raised
                err = f"retrieval failed after {attempt + 1} attempt(s): {type(e).__name__}: {e}"
                if attempt < self.retries:
                    time.sleep(self.retry_wait_s * (2**attempt))
        self.stats["retrieve_failures"] += 1
        self.stats["retrieve_s"] += time.perf_counter() - t0
        return [[] for _ in queries], err

    def _append(self, s: _State, ids: list[int], gen: int, logprobs: list[float] | None = None,
                qmask: list[int] | None = None) -> tuple[int, int]:
        t = s.traj
        start = len(t.completion_ids)
        t.completion_ids += ids
        t.gen_mask += [gen] * len(ids)
        t.query_mask += qmask if qmask is not None else [0] * len(ids)
        t.logprobs += logprobs if logprobs is not None else [0.0] * len(ids)
        return start, len(t.completion_ids)

    def _room(self, s: _State) -> int:
        return self.cfg.max_total_tokens - len(s.traj.prompt_ids) - len(s.traj.completion_ids)

    def _inject(self, s: _State, text: str) -> None:
        t0 = time.perf_counter()
        ids = self.encode_text(text)
        room = self._room(s)
        if len(ids) > room:
            ids = ids[: max(room, 0)]
            s.done, s.traj.stop_reason = True, "length"
        s.turn.inject_span = self._append(s, ids, 0)
        if not s.done and self._room(s) <= 0:
            s.done, s.traj.stop_reason = True, "length"
        self.stats["inject_s"] += time.perf_counter() - t0

    # ------------------------------------------------------------------ rollout
    def rollout(
        self,
        records: list[QARecord],
        num_generations: int = 1,
        greedy: bool = False,
        seed: int | None = None,
        hints: list[str | None] | None = None,
        prefixes: list[list[int]] | None = None,
    ) -> list[Trajectory]:
        """Roll out ``num_generations`` trajectories per record (all of record 0 first, then record
        1, ...).

        ``hints``: an optional hindsight line per record, appended to the user message.
        ``prefixes``: optional token ids per record appended to the prompt ids (part of
        ``prompt_ids``; the model continues from them).
        """
        if hints is not None and len(hints) != len(records):
            raise ValueError(f"hints has {len(hints)} entries for {len(records)} records")
        if prefixes is not None and len(prefixes) != len(records):
            raise ValueError(f"prefixes has {len(prefixes)} entries for {len(records)} records")
        gen = None
        if seed is not None:
            gen = torch.Generator(device=next(self.model.parameters()).device
                                  if self.model is not None else "cpu")
            gen.manual_seed(seed)
        states: list[_State] = []
        for r, rec in enumerate(records):
            pids = self.prompt_ids(rec.question, hints[r] if hints else None) + list(
                prefixes[r] if prefixes else [])
            for _ in range(num_generations):
                t = Trajectory(qid=rec.id, question=rec.question,
                               golden_answers=list(rec.golden_answers),
                               prompt_ids=list(pids), hops=rec.hops, evidence=list(rec.evidence),
                               data_source=rec.data_source,
                               extra={"metadata": dict(rec.metadata)} if rec.metadata else {})
                s = _State(t, len(states))
                if self._room(s) <= 0:
                    s.done, t.stop_reason = True, "error"
                    t.errors.append(f"prompt has {len(pids)} tokens, over "
                                    f"max_total_tokens={self.cfg.max_total_tokens}")
                states.append(s)
        live = [s for s in states if not s.done]
        budgets = [self.budget(s) for s in live]
        # every rank calls generate once per rollout, even with no row left (the HF backend's
        # lockstep region)
        self.backend.generate([s.traj.prompt_ids + s.traj.completion_ids for s in live], budgets,
                              self.sampling(greedy), protocol.STOP_STRINGS, gen,
                              self.row_hook(live),
                              lambda rows, outs: self._on_stop(live, budgets, rows, outs))
        for s in states:
            self._finish(s.traj)
        return [s.traj for s in states]

    def budget(self, s: _State) -> int:
        """Tokens the next turn of ``s`` may generate: ``min(max_new_tokens_per_turn, room
        left)``."""
        return min(self.cfg.max_new_tokens_per_turn, self._room(s))

    def row_hook(self, states: list[_State]
                 ) -> Callable[[list[int], list[list[int]], torch.Tensor], torch.Tensor] | None:
        """The user's ``logits_hook`` seen through the rows of a call (``rows[j]`` indexes
        ``states``)."""
        if self.logits_hook is None:
            return None
        user_hook = self.logits_hook
        return lambda rows, ids, lg: user_hook(  # noqa: E731
            [(states[i].index, len(states[i].traj.turns), states[i].traj.qid) for i in rows], ids,
            lg)

    def _on_stop(self, live: list[_State], budgets: list[int], rows: list[int],
                 outs: list[GenOutput]) -> list[tuple[list[int], int] | None]:
        """The turns of ``live[i]`` (``i`` in ``rows``) ended with ``outs``: record them
        (``end_turn``), run their searches in one batch (``serve``); per row, its observation's ids
        and next budget, or None when done."""
        ended = [live[i] for i in rows]
        self.serve([s for s, i, o in zip(ended, rows, outs) if self.end_turn(s, o, budgets[i])])
        nxt: list[tuple[list[int], int] | None] = []
        for s, i in zip(ended, rows):
            if s.done:
                nxt.append(None)
                continue
            budgets[i] = self.budget(s)
            a, b = s.turn.inject_span
            nxt.append((s.traj.completion_ids[a:b], budgets[i]))
        return nxt

    def end_turn(self, s: _State, o: GenOutput, budget: int) -> bool:
        """Record the turn ``o`` of ``s`` (generated under ``budget``): parse it, decide whether the
        trajectory ends, inject the invalid notice. True when the turn is a search to serve
        (``serve``)."""
        text = self.tokenizer.decode(o.ids, skip_special_tokens=False)
        action, content = protocol.parse_action(text)
        qmask = (protocol.query_token_mask(self.tokenizer, o.ids, text) if action == "search"
                 else None)
        span = self._append(s, o.ids, 1, o.logprobs, qmask)
        final_turn = s.action_turns >= self.cfg.max_turns
        cut_by_total = o.finish == "length" and budget < self.cfg.max_new_tokens_per_turn
        if action is None and cut_by_total:
            action = "truncated"
        s.turn = Turn(action=action or "invalid", content=content, gen_span=span)
        if qmask is not None and any(qmask):
            first = qmask.index(1)
            last = len(qmask) - qmask[::-1].index(1)
            s.turn.query_span = (span[0] + first, span[0] + last)
        s.traj.turns.append(s.turn)
        if action == "answer":
            s.done, s.traj.stop_reason = True, "answer"
        elif action == "truncated":
            s.done, s.traj.stop_reason = True, "length"
        elif o.finish == "eos" and action is None:
            s.done, s.traj.stop_reason = True, "eos"
        elif final_turn:
            s.done, s.traj.stop_reason = True, "max_turns"
        elif action == "search":
            s.action_turns += 1
            return True
        else:  # invalid turn (no well-formed tag): Search-R1's notice
            s.action_turns += 1
            self._inject(s, protocol.INVALID_NOTICE)
        return False

    def serve(self, searches: list[_State]) -> None:
        """Run the pending searches of ``searches`` in ONE batched retrieve and inject their
        information blocks."""
        if not searches:
            return
        docs, err = self._retrieve([s.turn.content for s in searches])
        for s, d in zip(searches, docs):
            s.turn.doc_ids = [p.id for p in d]
            s.turn.doc_titles = [p.bare_title for p in d]
            s.turn.doc_snippets = [p.text[:160] for p in d]
            if err:
                s.turn.error = err
                s.traj.errors.append(f"turn {len(s.traj.turns) - 1}: {err}")
            self._inject(s, protocol.information_block(d))

    def _finish(self, t: Trajectory) -> None:
        t.completion_text = self.tokenizer.decode(t.completion_ids, skip_special_tokens=False)
        # model-written text only: the invalid notice itself contains "<answer> and </answer>"
        gen_text = "".join(self.tokenizer.decode(t.completion_ids[a:b], skip_special_tokens=False)
                           for a, b in (tr.gen_span for tr in t.turns))
        t.answer = protocol.extract_answer(gen_text)
        t.em = exact_match(t.answer, t.golden_answers)
        t.f1 = f1_score(t.answer, t.golden_answers)
        t.reward = t.em

    # ------------------------------------------------------------------ the policy it decodes
    def use_model(self, model: Any) -> None:
        """Decode ``model`` from now on (the trainer's policy once TRL has wrapped it, e.g. with
        LoRA)."""
        self.model = model
        if hasattr(self.backend, "model"):
            self.backend.model = model

    def complete_queries(self, prefixes: list[list[int]], max_new_tokens: int, groups: Any = None,
                         batch_size: int = 16) -> list[GenOutput]:
        """IGSD's query completer: greedy completion to ``</search>`` by the backend this engine
        decodes with (``Backend.complete_queries``)."""
        return self.backend.complete_queries(prefixes, max_new_tokens, groups, batch_size)


def make_backend(cfg: Any, model: Any, tokenizer: Any) -> Backend:
    """The generation backend named by ``cfg.backend`` (``hf`` or ``vllm``). It lives here, with the
    engine that uses it, and not in ``backend.py``, so that no backend module imports a module that
    imports it back."""
    backend = getattr(cfg, "backend", "hf")
    if backend == "hf":
        from hindsearch.agent.hf_backend import HFBackend

        return HFBackend(model, tokenizer)
    if backend == "vllm":
        from hindsearch.agent.vllm_backend import VLLMBackend

        return VLLMBackend.from_model(model, tokenizer)
    raise ValueError(f"rollout.backend = {backend!r}; choose hf or vllm")
