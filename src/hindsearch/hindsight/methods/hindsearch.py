"""HindSearch (method ``hindsearch``, term ``hind``): its options (``[hindsearch]``), its term and
its metrics.

Judge critiques of failed rollouts → teacher log-probs with the critique in the prompt → ``L_hind``
on the distilled tokens of the failed rollouts with a usable critique (docs/methods.md). A judge on
``hindsearch.judge_model`` is loaded where the run is assembled (``HindSearchTerm.load_models``), so
``prepare`` never loads a checkpoint; every rank goes through ``prepare``'s judge and teacher calls,
even with nothing to judge (``core.lockstep``). ``loss`` returns the *unweighted* loss (the trainer
adds ``lam * loss``); with nothing to distil, an exact 0 still attached to the logits' graph.
"""

from __future__ import annotations

import dataclasses
import random
import time
from dataclasses import dataclass
from typing import Any

import torch

from hindsearch.config.fields import (AGG_MODES, CRITIQUE_SOURCES, DISTILL_ON, TEACHERS,
                                      ConfigError, bounded, choice)
from hindsearch.hindsight import losses
from hindsearch.hindsight.contract import AuxBatch, AuxContext, at, mask_positions, scatter
from hindsearch.hindsight.judge import LMJudge, OracleJudge
from hindsearch.hindsight.openai_judge import OpenAIJudge
from hindsearch.hindsight.registry import Metrics, register_method
from hindsearch.hindsight.teacher import (
    NEUTRAL_CRITIQUE,
    READY_CRITIQUE,
    ready_decision_mask,
    ready_turn_spans,
    distill_weights,
    hindsearch_prompt_ids,
    igsd_prompt_ids,
    select_teacher,
    teacher_token_logprobs,
    through_last_query,
)
from hindsearch.records import Trajectory


@dataclass
class HindSearchConfig:
    lam: float = bounded(0.01, ge=0.0)
    """Weight lambda of L_hind in L = L_GRPO + lambda * L_hind."""
    judge_kind: str = choice("lm", ("lm", "oracle", "openai"))
    """``lm`` (frozen LM judge in this process, the paper's setting), ``openai`` (a judge served
    behind an OpenAI-compatible chat-completions endpoint at ``judge_url``: vLLM, SGLang, TGI, a
    hosted API) or ``oracle`` (fictional world only: critique from recorded evidence)."""
    judge_model: str | None = None
    """``lm``: the judge's weights (None = the initial policy checkpoint; else an HF id or path).
    ``openai``: the model name the endpoint serves (required)."""
    judge_url: str | None = None
    """``openai``: the endpoint's base URL, e.g. ``http://host:8000/v1`` (requests go to
    ``{judge_url}/chat/completions``)."""
    judge_api_key_env: str | None = None
    """``openai``: the name of the environment variable holding the endpoint's API key (sent as a
    bearer token; the key itself is never in the config). None = no key."""
    judge_concurrency: int = bounded(8, gt=0)
    """``openai``: judge requests in flight at once."""
    judge_timeout_s: float = bounded(60.0, gt=0.0)
    """``openai``: seconds one request may take (connecting, waiting and reading) before it is
    retried."""
    judge_retries: int = bounded(3, ge=0)
    """``openai``: retries of a request after a timeout, a dropped connection, a 429 or a 5xx; after
    the last one the rollout's critique is an error (no distillation for it)."""
    judge_backoff_s: float = bounded(1.0, gt=0.0)
    """``openai``: the pause before the first retry, doubled before each next one (at least the
    server's ``Retry-After``, at most ``judge_timeout_s``)."""
    judge_sees_gold: bool = True
    """The judge prompt contains the gold answers (False = the paper's no-gold ablation)."""
    critique_max_tokens: int = bounded(64, gt=0)
    """Greedy critique length cap."""
    judge_max_prompt_tokens: int = bounded(768, gt=0)
    """Judge prompt budget; longer prompts drop retrieved snippets first, then the oldest turns."""
    redact_gold_in_critique: bool = True
    """Replace gold-answer strings in critiques with a placeholder."""
    teacher: str = choice("frozen", TEACHERS)
    """Teacher weights: ``frozen`` (initial policy), ``live`` (current policy, no grad) or ``ema``.
    With ``live`` nothing anchors the student (the loss is lowest for an output that ignores the
    critique): on micro-scarce at lambda 2 the student lost the format by step ~115 and every test
    answer by step 200 (docs/results/2026-12-04-scarce-live-teacher.md)."""
    ema_decay: float = bounded(0.99, ge=0.0, le=1.0)
    """EMA decay when ``teacher = ema`` (this term's own EMA of the policy)."""
    divergence: str = choice("clamped_sampled",
                             ("clamped_sampled", "signed", "one_sided", "reverse_kl", "jsd"))
    """``clamped_sampled`` (DESIGN's reading of the paper), ``signed`` (unclamped ``lT - lS`` as a
    per-token advantage), ``one_sided`` (its lowering half: a failed token is lowered where the
    teacher likes it less, nothing is raised), ``reverse_kl`` or ``jsd`` (teacher top-k ids plus one
    tail bucket for the remaining mass)."""
    topk: int = bounded(50, gt=0)
    """Vocabulary top-k for ``reverse_kl`` / ``jsd``."""
    signed_clip: float = bounded(1.0, gt=0.0)
    """``signed``: the per-token advantage ``lT - lS`` is clipped to ``[-signed_clip,
    signed_clip]``; ``one_sided``: to ``[-signed_clip, 0]``."""
    distill_on: str = choice("query", DISTILL_ON)
    """Tokens distilled on failed rollouts: ``query`` (the query text inside ``<search>``);
    ``action`` (the query tokens plus, in every turn after an information block, the turn's first
    token and the tokens of its ``<search>``/``<answer>`` opening tag: where the
    search-again-or-answer choice is made); ``decision`` (every token of each post-information turn
    up to and including its first action tag, and no query token: the decision alone, also where the
    tokenizer spreads it over several tokens); ``decision_query`` (the decision plus the query
    tokens of the post-information turns: the second query); ``answer_decision`` (the decision
    tokens of the post-information turns that answered: with ``divergence = one_sided`` the term
    only lowers "answer now" where the teacher would search again, and touches neither queries nor a
    decision to search)."""
    action_weight: float = bounded(1.0, gt=0.0)
    """Weight of each action/decision token against a query token (1) in ``L_hind``'s reduction, for
    ``distill_on = action`` or ``decision_query``: above 1, query tokens where teacher and student
    agree cannot dilute the decision under a token mean."""
    critique_source: str = choice("own", CRITIQUE_SOURCES)
    """Whose critique the teacher reads: ``own`` (the judge's critique of this rollout) or
    ``shuffled`` (the critique of a failed rollout of *another* question, from this step or the last
    steps: the control that keeps the prompt shift and the extra gradient at the same positions but
    removes the critique's information)."""
    aggregation: str = choice("token-mean", AGG_MODES)
    """How ``L_hind`` is reduced over the distilled tokens
    (``hindsearch.hindsight.losses.AGG_MODES`` reads this tuple)."""
    ready_states: str = choice("critique", ("critique", "answer_now", "answer_line"))
    """What the teacher reads at a failed rollout's search-again-or-answer decision whose retrieved
    text already holds a gold answer string: ``critique`` (the judge's critique of the rollout, like
    every other distilled token), ``answer_now`` (``teacher.READY_CRITIQUE``: answer from what was
    retrieved) or ``answer_line`` (IGSD's ``(The correct answer is: {A[0]}.)``: the gold is already
    in the student's context there, so the line adds no unseen token, and a teacher whose warm-up
    never paired a critique with answering may still answer on it). With either of the last two,
    that turn's second query is not distilled. The term acts on failed rollouts only, so without it
    nothing distils "answer now" where the answer is already in the context, and a critique that
    says "search for X" teaches searching again there too (one-hop over-search)."""
    neutral_control: bool = False
    """Also score the student's tokens under a neutral-feedback teacher ("Feedback on a previous
    attempt: none.") and log ``critique_minus_neutral``: what the critique itself changes, net of
    the prompt shift. One more teacher forward per failed rollout; on in the micro presets."""
    judge_template: str = (
        "You are reviewing a failed attempt by a search assistant.\n"
        "Question: {question}\n"
        "{gold_line}"
        "Searches and what they returned:\n{searches}\n"
        "Predicted answer: {prediction}\n"
        "In 1-2 sentences, say what the searches should have looked for. Do not state the answer.\n"
        "Critique:"
    )
    """Judge prompt template; fields: question, gold_line, searches, prediction."""

    def check(self) -> None:
        """The judge template names the fields the judge fills in; an ``openai`` judge has an
        http(s) URL, a model name and, when ``judge_api_key_env`` names one, that environment
        variable set."""
        for fld in ("question", "searches", "prediction"):
            if "{" + fld + "}" not in self.judge_template:
                raise ConfigError(f"hindsearch.judge_template must contain {{{fld}}}")
        if self.judge_kind == "openai":
            check_openai_judge(self)


def check_openai_judge(c: HindSearchConfig) -> None:
    """The ``openai`` judge's options, each failure one line naming its key."""
    from urllib.parse import urlsplit

    from hindsearch.hindsight.openai_judge import api_key

    url = urlsplit(c.judge_url or "")
    if url.scheme not in ("http", "https") or not url.netloc:
        raise ConfigError(f"hindsearch.judge_url = {c.judge_url!r} must be an http:// or https:// "
                          "URL of an OpenAI-compatible endpoint, e.g. http://host:8000/v1 "
                          "(hindsearch.judge_kind = 'openai')")
    if not c.judge_model:
        raise ConfigError("hindsearch.judge_model must name the model the endpoint serves "
                          "(hindsearch.judge_kind = 'openai'), e.g. \"Qwen/Qwen2.5-7B-Instruct\"")
    try:
        api_key(c.judge_api_key_env)
    except ValueError as e:
        raise ConfigError(str(e)) from None


METRICS = Metrics(
    reductions={
        # prepare: counts and seconds of a process's own rows add up; fractions and means are
        # averaged
        "failed": "sum", "eligible": "sum", "critiques": "sum", "redactions": "sum",
        "degenerate": "sum", "judge_errors": "sum", "judge_requests": "sum", "judge_time": "sum",
        "teacher_time": "sum", "distill_tokens": "sum", "action_tokens": "sum",
        "shuffle_missing": "sum", "ready_decisions": "sum",
        "failed_frac": "mean", "judge_kind_oracle": "mean", "critique_minus_neutral": "mean",
        "frac_critique_above_neutral": "mean",
        # loss (per micro-batch)
        "L_hind": "mean", "mean_lT_minus_lS": "mean", "frac_w_pos": "mean", "mean_w": "mean",
        "tokens": "mean",
    },
    loss="L_hind",
    panels={"HindSearch weights": ("mean_w", "frac_w_pos", "mean_lT_minus_lS",
                                   "critique_minus_neutral", "failed_frac")},
)
"""``hind/*``: how each is reduced over processes, the loss key and the report's panel."""


SHUFFLE_POOL = 64
"""Critiques (with their question ids) the shuffled control keeps from earlier steps to draw
from."""


def _hind_tensors(B: int, T: int, k: int) -> dict[str, torch.Tensor]:
    """``HindSearchTerm``'s zero term tensors: mask and teacher log-probs ``[B, T]``, plus the
    teacher's top-``k`` ids and log-probs ``[B, T, k]`` when the divergence needs them (``k >
    0``)."""
    tens = {"hind_mask": torch.zeros(B, T), "hind_lT": torch.zeros(B, T)}
    if k:
        tens["hind_topk_ids"] = torch.zeros(B, T, k, dtype=torch.long)
        tens["hind_topk_logp"] = torch.zeros(B, T, k)
    return tens


def _hind_metrics(B: int, failed: list[int], elig: list[int], judge: Any,
                  neutral_control: bool) -> dict[str, float]:
    """``HindSearchTerm``'s metrics before any judge call: the failed/eligible counts, every other
    one at 0."""
    met: dict[str, float] = {
        "failed_frac": len(failed) / max(B, 1), "failed": float(len(failed)),
        "eligible": float(len(elig)), "judge_kind_oracle": float(judge.kind == "oracle"),
        "critiques": 0.0, "redactions": 0.0, "degenerate": 0.0, "judge_errors": 0.0,
        "judge_time": 0.0, "teacher_time": 0.0, "distill_tokens": 0.0,
        "action_tokens": 0.0,
    }
    if neutral_control:
        met["critique_minus_neutral"] = 0.0
        met["frac_critique_above_neutral"] = 0.0
    return met


def _critique(judge: Any, trajectories: list[Trajectory], elig: list[int], met: dict[str, float],
              samples: list[dict[str, Any]]) -> list[Any]:
    """The judge's critiques of the rows ``elig`` (one per row, in order); counts redactions,
    degenerate critiques, judge errors and the judge time into ``met`` and records each critique in
    ``samples``."""
    t0, sent = time.perf_counter(), getattr(judge, "requests", None)
    crits = judge.critique([trajectories[i] for i in elig])
    if elig:
        met["judge_time"] = time.perf_counter() - t0
    if sent is not None:  # a judge behind an endpoint: the HTTP requests it sent (retries included)
        met["judge_requests"] = float(judge.requests - sent)
    for i, cr in zip(elig, crits):
        met["redactions"] += cr.redactions
        met["degenerate"] += float(cr.degenerate and cr.error is None)
        met["judge_errors"] += float(cr.error is not None)
        samples[i] = {"judge_kind": judge.kind, "critique": cr.text, "critique_raw": cr.raw,
                      "critique_usable": cr.usable, "redactions": cr.redactions,
                      "judge_error": cr.error, "judge_truncation": cr.truncation}
    return crits


@dataclass
class _TeacherRows:
    """The teacher's log-probs for the rows ``use`` (row ``j`` of each tensor is trajectory
    ``use[j]``), scored on ``comps[j]``: ``lT`` of the sampled tokens, the top-k ids/log-probs (None
    without top-k) and the neutral-critique control ``lN`` (None without ``neutral_control``)."""

    use: list[int]
    comps: list[list[int]]
    lT: torch.Tensor
    top_ids: torch.Tensor | None
    top_lp: torch.Tensor | None
    lN: torch.Tensor | None


def _write_rows(rows: _TeacherRows, trajectories: list[Trajectory], masks: dict[int, list[int]],
                tokenizer: Any, tens: dict[str, torch.Tensor], met: dict[str, float],
                samples: list[dict[str, Any]]) -> None:
    """Write the teacher's rows into the term tensors, count the distilled and action tokens into
    ``met``, record each row's distilled tokens (and its critique-minus-neutral gaps) in
    ``samples``, and summarise the gaps over every row."""
    gaps = []
    for j, i in enumerate(rows.use):
        tr, n = trajectories[i], len(rows.comps[j])
        m = torch.tensor(masks[i][:n], dtype=torch.float)  # per-token weights (0 = not distilled)
        tens["hind_mask"][i, :n] = m
        tens["hind_lT"][i, :n] = rows.lT[j, :n]
        if rows.top_ids is not None and rows.top_lp is not None:
            tens["hind_topk_ids"][i, :n] = rows.top_ids[j, :n]
            tens["hind_topk_logp"][i, :n] = rows.top_lp[j, :n]
        on = m.bool()
        met["distill_tokens"] += float(on.sum())
        qmask = torch.tensor(tr.query_mask[:n], dtype=torch.bool)
        met["action_tokens"] += float((on & ~qmask).sum())
        samples[i]["distill_tokens"] = [tokenizer.decode([tr.completion_ids[t]]) for t in range(n)
                                        if on[t]]
        samples[i]["lT"] = [round(float(x), 4) for x in rows.lT[j, :n][on]]
        if rows.lN is not None:
            g = (rows.lT[j, :n] - rows.lN[j, :n])[on]
            gaps.append(g)
            samples[i]["lT_minus_neutral"] = [round(float(x), 4) for x in g]
    if gaps and sum(g.numel() for g in gaps):
        g = torch.cat(gaps)
        met["critique_minus_neutral"] = float(g.mean())
        met["frac_critique_above_neutral"] = float((g > 1e-4).float().mean())


@register_method("hindsearch", config=HindSearchConfig)
class HindSearchTerm:
    """HindSearch: critique-conditioned self-distillation on the search tokens of failed
    rollouts."""

    name = "hind"
    metrics = METRICS

    def __init__(self, cfg: HindSearchConfig, seed: int = 0, judge: Any = None):
        self.cfg, self.lam, self.aggregation = cfg, cfg.lam, cfg.aggregation
        self.ema_decay = cfg.ema_decay if cfg.teacher == "ema" else None
        self._judge = judge
        # (question id, critique) of recent steps: the shuffled control's draw
        self._pool: list[tuple[str, str]] = []

    def load_models(self, model_cfg: Any) -> None:
        """Where the run is assembled: load the LM judge on ``judge_model`` when one is named (with
        the policy's ``model_cfg`` dtype and device settings)."""
        c = self.cfg
        if self._judge is None and c.judge_kind == "lm" and c.judge_model:
            self._judge = make_judge(c, *load_judge_model(model_cfg, c.judge_model))

    def judge(self, ctx: AuxContext) -> Any:
        """The judge injected at assembly (``judge=`` or ``load_models``), else the oracle or the LM
        judge on the frozen initial policy from the context. A term never loads a checkpoint in
        ``prepare``: a ``judge_model`` is loaded where the run is assembled (``load_models``)."""
        if self._judge is None:
            c = self.cfg
            if c.judge_model is not None and c.judge_kind == "lm":
                raise RuntimeError("hindsearch.judge_model is loaded where the run is assembled: "
                                   "call term.load_models(cfg.model) before training")
            self._judge = make_judge(c, ctx.frozen, ctx.tokenizer)
        return self._judge

    def prepare(self, trajectories: list[Trajectory], completion_len: int,
                ctx: AuxContext) -> AuxBatch:
        """Judge the failed rollouts with a distillable token, score the usable critiques' teacher
        log-probs on those tokens, and lay them out as ``[B, T]`` term tensors with metrics and
        per-row samples."""
        c, B, T = self.cfg, len(trajectories), completion_len
        k = c.topk if losses.divergence(c.divergence).needs_topk else 0
        tens = _hind_tensors(B, T, k)
        judge = self.judge(ctx)
        failed = [i for i, tr in enumerate(trajectories) if tr.failed]
        masks = {
            i: distill_weights(trajectories[i], ctx.tokenizer, c.distill_on, c.action_weight)[:T]
            for i in failed}
        ready: dict[int, list[int]] = {}
        # the ready decisions; their turns' query tokens leave masks[i]
        if c.ready_states != "critique":
            for i in failed:
                ready[i] = self._ready(trajectories[i], ctx.tokenizer, masks[i], T)
        elig = [i for i in failed if any(masks[i])]
        met = _hind_metrics(B, failed, elig, judge, c.neutral_control)
        if c.critique_source == "shuffled":
            met["shuffle_missing"] = 0.0
        samples: list[dict[str, Any]] = [{} for _ in trajectories]
        crits = _critique(judge, trajectories, elig, met, samples)
        use = [i for i, cr in zip(elig, crits) if cr.usable]
        texts = {i: cr.text for i, cr in zip(elig, crits)}
        if c.critique_source == "shuffled":
            use, texts = self._shuffle(trajectories, use, texts, ctx.step, met, samples)
        met["critiques"] = float(len(use))
        t0 = time.perf_counter()
        teacher = select_teacher(c.teacher, ctx, self.ema_decay)
        prompts = [hindsearch_prompt_ids(ctx.tokenizer, trajectories[i].question, texts[i])
                   for i in use]
        # exact
        comps = [through_last_query(trajectories[i].completion_ids, masks[i], T) for i in use]
        lT, top_ids, top_lp = teacher_token_logprobs(teacher, prompts, comps, topk=k)
        lN = None
        if c.neutral_control:
            neutral = [
                hindsearch_prompt_ids(ctx.tokenizer, trajectories[i].question, NEUTRAL_CRITIQUE)
                for i in use]
            lN = teacher_token_logprobs(teacher, neutral, comps)[0]
        if use:
            met["teacher_time"] = time.perf_counter() - t0
        if c.ready_states != "critique":
            met["ready_decisions"] = 0.0
            self._answer_now(trajectories, use, comps, ready, teacher, ctx.tokenizer, k, lT,
                             top_ids, top_lp, met)
        rows = _TeacherRows(use, comps, lT, top_ids if k else None, top_lp if k else None, lN)
        _write_rows(rows, trajectories, masks, ctx.tokenizer, tens, met, samples)
        return AuxBatch(tens, met, samples)

    def _ready(self, traj: Trajectory, tokenizer: Any, mask: list[float], T: int) -> list[int]:
        """``answer_now``: the row's ready decision tokens; the query tokens of those turns leave
        ``mask``."""
        r = ready_decision_mask(traj, tokenizer, traj.golden_answers)[:T]
        for s, e in ready_turn_spans(traj, r):
            for t in range(s, min(e, len(mask))):
                if not r[t]:
                    mask[t] = 0.0
        return r

    def _answer_now(self, trajectories: list[Trajectory], use: list[int], comps: list[list[int]],
                    ready: dict[int, list[int]], teacher: Any, tokenizer: Any, k: int,
                    lT: torch.Tensor, top_ids: torch.Tensor, top_lp: torch.Tensor,
                    met: dict[str, float]) -> None:
        """At ready decisions the teacher reads ``READY_CRITIQUE`` (``answer_now``) or the answer
        line (``answer_line``): its log-probs there replace the critique teacher's in ``lT`` /
        ``top_ids`` / ``top_lp`` (rows of ``use``, in place)."""
        rows = [j for j, i in enumerate(use) if any(ready[i][: len(comps[j])])]
        if not rows:
            return
        if self.cfg.ready_states == "answer_line":
            prompts = [igsd_prompt_ids(tokenizer, trajectories[use[j]].question,
                                       trajectories[use[j]].golden_answers)
                       for j in rows]
        else:
            prompts = [
                hindsearch_prompt_ids(tokenizer, trajectories[use[j]].question, READY_CRITIQUE)
                for j in rows]
        rT, r_ids, r_lp = teacher_token_logprobs(teacher, prompts, [comps[j] for j in rows], topk=k)
        for r, j in enumerate(rows):
            n = len(comps[j])
            on = torch.tensor(ready[use[j]][:n], dtype=torch.bool)
            lT[j, :n][on] = rT[r, :n][on]
            if k:
                top_ids[j, :n][on] = r_ids[r, :n][on]
                top_lp[j, :n][on] = r_lp[r, :n][on]
            met["ready_decisions"] += float(on.sum())

    def _shuffle(self, trajectories: list[Trajectory], use: list[int], texts: dict[int, str],
                 step: int, met: dict[str, float],
                 samples: list[dict[str, Any]]) -> tuple[list[int], dict[int, str]]:
        """The shuffled-critique control: each row in ``use`` gets the usable critique of a failed
        rollout of another question, drawn (seeded by the step) from this step's critiques and the
        last steps' (a pool of ``SHUFFLE_POOL``); a row with none available is dropped and counted
        in ``shuffle_missing``."""
        rng = random.Random(1_000_003 * step + 17)
        pool = list(self._pool) + [(trajectories[i].qid, texts[i]) for i in use]
        kept, shown = [], {}
        for i in use:
            others = [t for q, t in pool if q != trajectories[i].qid]
            if not others:
                met["shuffle_missing"] += 1.0
                continue
            shown[i] = rng.choice(others)
            samples[i]["critique_shown"] = shown[i]
            kept.append(i)
        self._pool.extend((trajectories[i].qid, texts[i]) for i in use)
        del self._pool[:-SHUFFLE_POOL]
        return kept, shown

    def positions(self, inputs: dict[str, torch.Tensor], completion_len: int) -> torch.Tensor:
        """The distilled tokens of failed rollouts with a usable critique: ``hind_mask > 0``."""
        return mask_positions(inputs["hind_mask"], completion_len)

    def unit_weights(self, inputs: dict[str, torch.Tensor], completion_len: int) -> torch.Tensor:
        """``[B, completion_len]`` float: each distilled token's weight in the reduction
        (``hind_mask``: 1 on query tokens, ``action_weight`` on action/decision tokens), which
        micro-batches count as their units."""
        m = inputs["hind_mask"]
        out = torch.zeros(m.shape[0], completion_len, dtype=torch.float, device=m.device)
        T = min(completion_len, m.shape[1])
        out[:, :T] = m[:, :T].float().clamp(min=0.0)
        return out

    def loss(self, logits: torch.Tensor, idx: torch.Tensor, completion_ids: torch.Tensor,
             inputs: dict[str, torch.Tensor]) -> tuple[torch.Tensor, dict[str, float]]:
        """``L_hind`` from the live temperature-1 student logits at the selected positions, plus the
        teacher-minus-student diagnostics.

        ``logits [N, V]`` at ``idx [N, 2]`` (the union of every term's positions; this term's mask
        selects its own). The diagnostics compare the teacher's and the student's log-probs at the
        same temperature (1): they are exactly what the loss sees, never the rollout's sampling
        log-probs.
        """
        c = self.cfg
        dev = logits.device
        shape = (completion_ids.shape[0], completion_ids.shape[1])
        mask = at(inputs["hind_mask"], idx).to(dev)
        lS = losses.token_logprobs(logits, at(completion_ids, idx).to(dev))  # [N]
        lT = at(inputs["hind_lT"], idx).to(dev)
        div = losses.divergence(c.divergence)
        x = losses.DistillInputs(lS, lT, logits, signed_clip=c.signed_clip)
        if div.needs_topk:
            x.topk_ids = at(inputs["hind_topk_ids"], idx).to(dev)
            x.topk_logp = at(inputs["hind_topk_logp"], idx).to(dev)
        v = div.fn(x)
        L = losses.agg(scatter(v, idx, shape), scatter(mask, idx, shape), c.aggregation)
        met = {"L_hind": float(L.detach()), **losses.gap_diagnostics(lT, lS, mask > 0)}
        return L, met


def make_judge(hcfg: Any, model: Any, tokenizer: Any) -> Any:
    """The judge a ``[hindsearch]`` config asks for: the oracle (no model), the ``OpenAIJudge`` on
    ``judge_url`` (``tokenizer`` counts its prompt budget), or an ``LMJudge`` on ``model``."""
    if hcfg.judge_kind == "oracle":
        return OracleJudge(hcfg.judge_sees_gold, hcfg.judge_template, hcfg.redact_gold_in_critique)
    if hcfg.judge_kind == "openai":
        return OpenAIJudge(hcfg, tokenizer)
    return LMJudge(model, tokenizer, hcfg)


def load_judge_model(model_cfg: Any, judge_model: str) -> tuple[Any, Any]:
    """``(model, tokenizer)`` of ``judge_model`` in eval mode, loaded with the policy's
    ``model_cfg`` dtype and device settings. Called where a run is assembled (never by
    ``prepare``)."""
    from hindsearch.models import load_policy

    model, tok = load_policy(dataclasses.replace(model_cfg, name=judge_model, gguf_file=None))
    return model.eval(), tok
