"""vLLM turn generation (GPU): the ``backend.Backend`` interface of ``HFBackend``, in two modes.

``VLLMBackend`` drives TRL's colocated ``vllm.LLM``; ``VLLMServerBackend`` drives TRL's
``VLLMClient`` against ``trl vllm-serve``. Both return vLLM's sampled ids (never re-tokenised text),
keep the stop strings in the output, decide the finish reason from the ids in the HF backend's
order, and return vLLM's (processed) log-prob of each sampled token, NaN where vLLM gave none.
Server mode sends one request per distinct budget and no seed (not reproducible from
``train.seed``). ``vllm`` is an optional extra: importing this module without it is fine. The
details: docs/gpu.md, "vLLM rollouts".
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Hashable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import torch

from hindsearch.agent import protocol
from hindsearch.core.decode import OnStop
from hindsearch.core.sampling import GREEDY, GenOutput, LogitsHook, SamplingParams, stop_token_ids

SEED_HIGH = 2**31 - 1


def _import_vllm() -> Any:
    try:
        import vllm  # optional: vllm
    except ImportError as e:
        raise RuntimeError(
            "rollout.backend = 'vllm' needs vLLM (a GPU extra): pip install vllm; "
            "or use rollout.backend = 'hf'"
        ) from e
    return vllm


def row_seeds(generator: torch.Generator | None, n: int) -> list[int] | None:
    """``n`` request seeds drawn from the rollout's generator (None without one): reproducible from
    the rollout seed, different for every row and every turn (the generator advances with each
    call)."""
    if generator is None:
        return None
    return torch.randint(0, SEED_HIGH, (n,), generator=generator, device=generator.device).tolist()


def sampling_kwargs(sampling: SamplingParams, max_tokens: int, stop_strings: Sequence[str],
                    seed: int | None = None) -> dict[str, Any]:
    """``vllm.SamplingParams`` keyword arguments of one row: its budget, the stop strings kept in
    the output, the sampled token's log-prob, temperature/top-p (greedy: temperature 0, no seed)."""
    greedy = sampling.is_greedy
    kw: dict[str, Any] = dict(
        n=1, max_tokens=int(max_tokens), stop=list(stop_strings), include_stop_str_in_output=True,
        logprobs=0, temperature=0.0 if greedy else float(sampling.temperature),
        top_p=1.0 if greedy else float(sampling.top_p),
    )
    if seed is not None and not greedy:
        kw["seed"] = int(seed)
    return kw


def classify_finish(ids: Sequence[int], eos_ids: set[int], hit_stop: bool,
                    engine_finish: str | None) -> str:
    """The HF backend's finish reason for vLLM's output: ``eos`` (last id is an EOS id, or vLLM
    stopped on something other than a stop string), ``stop`` (a stop string), ``length``
    (budget)."""
    if ids and ids[-1] in eos_ids:
        return "eos"
    if hit_stop:
        return "stop"
    if engine_finish in (None, "length"):
        return "length"
    if engine_finish == "stop":
        return "eos"  # a stop-token id we were not told about
    raise RuntimeError(f"vLLM finished a request with finish_reason = {engine_finish!r}")


def pick_sampled(ids: Sequence[int], values: Sequence[Sequence[float | None]],
                 token_ids: Sequence[Sequence[int]]) -> list[float]:
    """The sampled token's log-prob at every position: ``values[k][j]`` is the log-prob of
    ``token_ids[k][j]`` at position ``k``; the entry for ``ids[k]`` is taken (NaN if absent or
    None)."""
    if len(values) != len(ids) or len(token_ids) != len(ids):
        raise RuntimeError(f"vLLM returned {len(values)} log-prob positions for {len(ids)} tokens")
    out = []
    for t, vs, ts in zip(ids, values, token_ids):
        v = next((v for v, u in zip(vs, ts) if int(u) == int(t)), None)
        out.append(float("nan") if v is None or math.isnan(float(v)) else float(v))
    return out


def budget_groups(max_new_tokens: Sequence[int]) -> dict[int, list[int]]:
    """Rows with a positive budget grouped by budget (server mode: one request per distinct
    ``max_tokens``)."""
    groups: dict[int, list[int]] = {}
    for i, n in enumerate(max_new_tokens):
        if n > 0:
            groups.setdefault(int(n), []).append(i)
    return groups


def _check(ids: list[int], budget: int) -> None:
    if len(ids) > budget:
        raise RuntimeError(f"vLLM returned {len(ids)} tokens for a budget of {budget}")


class _VLLMBase:
    """The ``Backend.generate`` shared by both modes: checks, empty outputs, statistics; ``_rows``
    fills ``outs``."""

    def __init__(self) -> None:
        self.stats = {"calls": 0, "requests": 0, "generated_tokens": 0, "generate_s": 0.0}

    def generate(
        self,
        contexts: list[list[int]],
        max_new_tokens: list[int],
        sampling: SamplingParams,
        stop_strings: Sequence[str],
        generator: torch.Generator | None = None,
        logits_hook: LogitsHook | None = None,
        on_stop: OnStop | None = None,
    ) -> list[GenOutput]:
        """One turn for each context; with ``on_stop`` turn after turn, the callback called once per
        turn with every row of it, until no row goes on (``backend.Backend``). The last turn of each
        row is returned."""
        if logits_hook is not None:
            raise ValueError("the vLLM backend does not support logits hooks (use the hf backend)")
        outs = self._turn(contexts, max_new_tokens, sampling, stop_strings, generator)
        if on_stop is None:
            return outs
        ctxs, budgets = [list(c) for c in contexts], list(max_new_tokens)
        rows = [i for i, n in enumerate(budgets) if n > 0]
        while rows:
            nxt = on_stop(rows, [outs[i] for i in rows])
            if len(nxt) != len(rows):
                raise ValueError(
                    f"on_stop returned {len(nxt)} entries for {len(rows)} stopped rows")
            going = []
            for i, q in zip(rows, nxt):
                if q is not None:
                    ctxs[i] += outs[i].ids + list(q[0])
                    budgets[i] = int(q[1])
                    going.append(i)
            if not going:
                break
            got = self._turn([ctxs[i] for i in going], [budgets[i] for i in going], sampling,
                             stop_strings, generator)
            for i, o in zip(going, got):
                outs[i] = o
            rows = going
        return outs

    def complete_queries(
        self, prefixes: list[list[int]], max_new_tokens: int,
        groups: Sequence[Hashable] | None = None,
        batch_size: int = 16,
    ) -> list[GenOutput]:
        """Greedy completion to ``</search>`` (``backend.Backend``): one greedy turn of every
        prefix. ``groups`` and ``batch_size`` change nothing here: vLLM's prefix cache reads a
        shared prefix once."""
        return self.generate(prefixes, [max_new_tokens] * len(prefixes), GREEDY,
                             (protocol.SEARCH_CLOSE,))

    def _turn(self, contexts: list[list[int]], max_new_tokens: list[int], sampling: SamplingParams,
              stop_strings: Sequence[str], generator: torch.Generator | None) -> list[GenOutput]:
        """One turn for each context (rows with a zero budget stay empty); statistics."""
        t0 = time.perf_counter()
        outs = [GenOutput([], [], "length") for _ in contexts]
        if any(n > 0 for n in max_new_tokens):
            requests = self._rows(contexts, max_new_tokens, sampling, stop_strings, generator, outs)
            self.stats["calls"] += 1
            self.stats["requests"] += requests
            self.stats["generated_tokens"] += sum(len(o.ids) for o in outs)
            self.stats["generate_s"] += time.perf_counter() - t0
        return outs

    def _rows(self, contexts: list[list[int]], max_new_tokens: list[int], sampling: SamplingParams,
              stop_strings: Sequence[str], generator: torch.Generator | None,
              outs: list[GenOutput]) -> int:
        """Generate the rows with a positive budget into ``outs``; returns the number of requests
        sent."""
        raise NotImplementedError


class VLLMBackend(_VLLMBase):
    """Colocate mode: turn generation through a ``vllm.LLM`` (TRL's, or one built by
    ``from_model``)."""

    def __init__(self, llm: Any, eos_ids: set[int] | None = None, vllm_module: Any = None) -> None:
        super().__init__()
        self.vllm = vllm_module if vllm_module is not None else _import_vllm()
        self.llm = llm
        self.eos_ids = set(eos_ids or ())

    @classmethod
    def from_model(cls, model: Any, tokenizer: Any, **llm_kwargs: Any) -> VLLMBackend:
        """Build an ``LLM`` over the same checkpoint as an HF model (its ``name_or_path``), outside
        training."""
        vllm = _import_vllm()
        path = getattr(model, "name_or_path", None)
        if not path:
            raise ValueError("vLLM backend needs a model loaded from a path or hub id "
                             "(model.name_or_path is empty)")
        kw = {"gpu_memory_utilization": 0.3, "enable_prefix_caching": True,
              "logprobs_mode": "processed_logprobs", **llm_kwargs}
        try:
            llm = vllm.LLM(model=path, **kw)
        except TypeError:  # vLLM without logprobs_mode: its default (raw log-probs)
            kw.pop("logprobs_mode")
            llm = vllm.LLM(model=path, **kw)
        return cls(llm, stop_token_ids(tokenizer, model), vllm)

    def _rows(self, contexts: list[list[int]], max_new_tokens: list[int], sampling: SamplingParams,
              stop_strings: Sequence[str], generator: torch.Generator | None,
              outs: list[GenOutput]) -> int:
        rows = [i for i, n in enumerate(max_new_tokens) if n > 0]
        seeds = None if sampling.is_greedy else row_seeds(generator, len(rows))
        params = [self.vllm.SamplingParams(**sampling_kwargs(
                      sampling, max_new_tokens[i], stop_strings, seeds[j] if seeds else None))
                  for j, i in enumerate(rows)]
        results = self.llm.generate([{"prompt_token_ids": list(contexts[i])} for i in rows], params,
                                    use_tqdm=False)
        if len(results) != len(rows):
            raise RuntimeError(f"vLLM returned {len(results)} results for {len(rows)} prompts")
        for i, res in zip(rows, results):
            c = res.outputs[0]
            ids = [int(t) for t in c.token_ids]
            _check(ids, max_new_tokens[i])
            if c.logprobs is None:
                raise RuntimeError("vLLM returned no log-probs (SamplingParams.logprobs = 0 was "
                                   "not honoured)")
            lps = pick_sampled(ids, [[lp.logprob for lp in d.values()] for d in c.logprobs],
                               [list(d.keys()) for d in c.logprobs])
            outs[i] = GenOutput(ids, lps,
                                classify_finish(ids, self.eos_ids, isinstance(c.stop_reason, str),
                                                          c.finish_reason))
        return len(rows)


class VLLMServerBackend(_VLLMBase):
    """Server mode: turn generation through TRL's ``VLLMClient`` (``client.generate`` on token-id
    prompts).

    ``decode(ids) -> str`` (the tokenizer's, special tokens kept) finds the stop string the client
    does not report. ``max_workers``: budget groups sent at once.
    """

    def __init__(self, client: Any, decode: Callable[[list[int]], str],
                 eos_ids: set[int] | None = None, max_workers: int = 8) -> None:
        super().__init__()
        self.client, self.decode = client, decode
        self.eos_ids, self.max_workers = set(eos_ids or ()), max_workers

    def request(self, prompts: list[list[int]], max_tokens: int, sampling: SamplingParams,
                stop_strings: Sequence[str]) -> dict[str, Any]:
        """One ``client.generate`` call: token-id prompts sharing one budget (no seed, see the
        module doc)."""
        kw = sampling_kwargs(sampling, max_tokens, stop_strings)
        extra = {"stop": kw["stop"], "include_stop_str_in_output": True}
        return self.client.generate(prompts=prompts, n=1, temperature=kw["temperature"],
                                    top_p=kw["top_p"], max_tokens=kw["max_tokens"], logprobs=0,
                                    generation_kwargs=extra)

    def _rows(self, contexts: list[list[int]], max_new_tokens: list[int], sampling: SamplingParams,
              stop_strings: Sequence[str], generator: torch.Generator | None,
              outs: list[GenOutput]) -> int:
        groups = list(budget_groups(max_new_tokens).items())

        def send(group: tuple[int, list[int]]) -> dict[str, Any]:
            budget, rows = group
            return self.request([list(contexts[i]) for i in rows], budget, sampling, stop_strings)

        if len(groups) == 1:
            replies = [send(groups[0])]
        else:
            with ThreadPoolExecutor(max_workers=min(self.max_workers, len(groups))) as pool:
                replies = list(pool.map(send, groups))
        for (budget, rows), rep in zip(groups, replies):
            comp, lps, lp_ids = rep["completion_ids"], rep.get("logprobs"), rep.get(
                "logprob_token_ids")
            if len(comp) != len(rows):
                raise RuntimeError(f"vLLM server returned {len(comp)} completions for {len(rows)} "
                                   "prompts")
            if lps is None or lp_ids is None:
                raise RuntimeError("vLLM server returned no log-probs (is it a `trl vllm-serve` / "
                                   "vLLM >= 0.10 server?)")
            for k, i in enumerate(rows):
                ids = [int(t) for t in comp[k]]
                _check(ids, budget)
                hit = any(s in self.decode(ids) for s in stop_strings)
                finish = classify_finish(ids, self.eos_ids, hit,
                                         "length" if len(ids) >= budget else "stop")
                outs[i] = GenOutput(ids, pick_sampled(ids, lps[k], lp_ids[k]), finish)
        return len(groups)
