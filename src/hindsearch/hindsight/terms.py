"""The two auxiliary terms the GRPO trainer adds (``hindsearch.hindsight.contract.AuxTerm``).

- ``HindSearchTerm`` (name ``hind``): judge critiques of failed rollouts → teacher log-probs with the
  critique in the prompt → ``L_hind`` on the distilled tokens (query tokens, or with ``distill_on =
  action`` also the action-choice tokens) of failed rollouts with a usable critique (``clamped_sampled``,
  ``signed``, or ``reverse_kl`` / ``jsd`` on the teacher's top-k ids plus a tail bucket). Its
  teacher-minus-student diagnostics are computed in ``loss`` from the live temperature-1 logits, and
  the optional neutral-feedback control reports what the critique changes net of the prompt shift.
- ``IGSDTerm`` (name ``igsd``): gold-hindsight teacher proposals on query tokens, verified by matched
  completion + retrieval + answer-likelihood gain (``hindsearch.hindsight.igsd``) → gated pair KL.
- ``make_terms(cfg, judge=None)``: the terms of ``cfg.method``; a judge on ``hindsearch.judge_model`` is built by
  the caller (``load_judge_model``), so a term never loads a checkpoint.

Every rank goes through the judge and teacher calls of ``prepare``, even with nothing to judge: each is a call
of the model core, which keeps several processes in lockstep (``core.lockstep``) and costs nothing without rows.

Both return the *unweighted* loss; the trainer adds ``term.lam * loss``. A term with nothing to
distil returns an exact 0 that is still attached to the logits' graph.
"""

from __future__ import annotations

import dataclasses
import random
import time
from typing import Any

import torch

from hindsearch.hindsight import losses
from hindsearch.hindsight.igsd import run_igsd
from hindsearch.hindsight.judge import LMJudge, OracleJudge
from hindsearch.hindsight.teacher import (
    NEUTRAL_CRITIQUE,
    distill_weights,
    hindsearch_prompt_ids,
    select_teacher,
    teacher_token_logprobs,
    through_last_query,
)
from hindsearch.records import Trajectory
from hindsearch.hindsight.contract import AuxBatch, AuxContext, AuxTerm


SHUFFLE_POOL = 64
"""Critiques (with their question ids) the shuffled control keeps from earlier steps to draw from."""


def mask_positions(mask: torch.Tensor, completion_len: int) -> torch.Tensor:
    """Bool ``[B, completion_len]`` of ``mask > 0`` (a term tensor ``[B, T]``; padded or cut to the length)."""
    out = torch.zeros(mask.shape[0], completion_len, dtype=torch.bool, device=mask.device)
    T = min(completion_len, mask.shape[1])
    out[:, :T] = mask[:, :T] > 0
    return out


def at(t: torch.Tensor, idx: torch.Tensor) -> torch.Tensor:
    """Values of a per-token tensor ``[B, T, ...]`` at the selected positions ``idx [N, 2]`` → ``[N, ...]``."""
    idx = idx.to(t.device)
    return t[idx[:, 0], idx[:, 1]]


def scatter(v: torch.Tensor, idx: torch.Tensor, shape: tuple[int, int]) -> torch.Tensor:
    """Per-position values ``[N]`` back into a zero ``[B, T]`` tensor (differentiable), for ``losses.agg``."""
    out = torch.zeros(shape, dtype=v.dtype, device=v.device)
    return out.index_put((idx[:, 0].to(v.device), idx[:, 1].to(v.device)), v)


def _hind_tensors(B: int, T: int, k: int) -> dict[str, torch.Tensor]:
    """``HindSearchTerm``'s zero term tensors: mask and teacher log-probs ``[B, T]``, plus the teacher's
    top-``k`` ids and log-probs ``[B, T, k]`` when the divergence needs them (``k > 0``)."""
    tens = {"hind_mask": torch.zeros(B, T), "hind_lT": torch.zeros(B, T)}
    if k:
        tens["hind_topk_ids"] = torch.zeros(B, T, k, dtype=torch.long)
        tens["hind_topk_logp"] = torch.zeros(B, T, k)
    return tens


def _hind_metrics(B: int, failed: list[int], elig: list[int], judge: Any, neutral_control: bool) -> dict[str, float]:
    """``HindSearchTerm``'s metrics before any judge call: the failed/eligible counts, every other one at 0."""
    met: dict[str, float] = {
        "failed_frac": len(failed) / max(B, 1), "failed": float(len(failed)), "eligible": float(len(elig)),
        "judge_kind_oracle": float(judge.kind == "oracle"), "critiques": 0.0, "redactions": 0.0,
        "degenerate": 0.0, "judge_errors": 0.0, "judge_time": 0.0, "teacher_time": 0.0, "distill_tokens": 0.0,
        "action_tokens": 0.0,
    }
    if neutral_control:
        met["critique_minus_neutral"] = 0.0
        met["frac_critique_above_neutral"] = 0.0
    return met


def _critique(judge: Any, trajectories: list[Trajectory], elig: list[int], met: dict[str, float],
              samples: list[dict[str, Any]]) -> list[Any]:
    """The judge's critiques of the rows ``elig`` (one per row, in order); counts redactions, degenerate
    critiques, judge errors and the judge time into ``met`` and records each critique in ``samples``."""
    t0 = time.perf_counter()
    crits = judge.critique([trajectories[i] for i in elig])
    if elig:
        met["judge_time"] = time.perf_counter() - t0
    for i, cr in zip(elig, crits):
        met["redactions"] += cr.redactions
        met["degenerate"] += float(cr.degenerate and cr.error is None)
        met["judge_errors"] += float(cr.error is not None)
        samples[i] = {"judge_kind": judge.kind, "critique": cr.text, "critique_raw": cr.raw,
                      "critique_usable": cr.usable, "redactions": cr.redactions, "judge_error": cr.error,
                      "judge_truncation": cr.truncation}
    return crits


@dataclasses.dataclass
class _TeacherRows:
    """The teacher's log-probs for the rows ``use`` (row ``j`` of each tensor is trajectory ``use[j]``), scored on
    ``comps[j]``: ``lT`` of the sampled tokens, the top-k ids/log-probs (None without top-k) and the neutral-critique
    control ``lN`` (None without ``neutral_control``)."""

    use: list[int]
    comps: list[list[int]]
    lT: torch.Tensor
    top_ids: torch.Tensor | None
    top_lp: torch.Tensor | None
    lN: torch.Tensor | None


def _write_rows(rows: _TeacherRows, trajectories: list[Trajectory], masks: dict[int, list[int]], tokenizer: Any,
                tens: dict[str, torch.Tensor], met: dict[str, float], samples: list[dict[str, Any]]) -> None:
    """Write the teacher's rows into the term tensors, count the distilled and action tokens into ``met``,
    record each row's distilled tokens (and its critique-minus-neutral gaps) in ``samples``, and summarise
    the gaps over every row."""
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
        met["action_tokens"] += float((on & ~torch.tensor(tr.query_mask[:n], dtype=torch.bool)).sum())
        samples[i]["distill_tokens"] = [tokenizer.decode([tr.completion_ids[t]]) for t in range(n) if on[t]]
        samples[i]["lT"] = [round(float(x), 4) for x in rows.lT[j, :n][on]]
        if rows.lN is not None:
            g = (rows.lT[j, :n] - rows.lN[j, :n])[on]
            gaps.append(g)
            samples[i]["lT_minus_neutral"] = [round(float(x), 4) for x in g]
    if gaps and sum(g.numel() for g in gaps):
        g = torch.cat(gaps)
        met["critique_minus_neutral"] = float(g.mean())
        met["frac_critique_above_neutral"] = float((g > 1e-4).float().mean())


class HindSearchTerm:
    """HindSearch: critique-conditioned self-distillation on the search tokens of failed rollouts."""

    name = "hind"

    def __init__(self, cfg: Any, judge: Any = None):
        self.cfg, self.lam, self.aggregation = cfg, cfg.lam, cfg.aggregation
        self.needs_ema = cfg.teacher == "ema"
        self.ema_decay = cfg.ema_decay
        self._judge = judge
        self._pool: list[tuple[str, str]] = []  # (question id, critique) of recent steps: the shuffled control's draw

    def judge(self, ctx: AuxContext) -> Any:
        """The judge injected at assembly (``make_terms(cfg, judge=...)``), else the oracle or the LM judge on the
        frozen initial policy from the context. A term never loads a checkpoint: a ``judge_model`` is loaded
        where the run is assembled (``load_judge_model``)."""
        if self._judge is None:
            c = self.cfg
            if c.judge_model is not None and c.judge_kind == "lm":
                raise RuntimeError("hindsearch.judge_model is loaded where the run is assembled: pass "
                                   "make_terms(cfg, judge=LMJudge(*load_judge_model(cfg), cfg.hindsearch))")
            self._judge = make_judge(c, ctx.frozen, ctx.tokenizer)
        return self._judge

    def prepare(self, trajectories: list[Trajectory], completion_len: int, ctx: AuxContext) -> AuxBatch:
        """Judge the failed rollouts with a distillable token, score the usable critiques' teacher log-probs
        on those tokens, and lay them out as ``[B, T]`` term tensors with metrics and per-row samples."""
        c, B, T = self.cfg, len(trajectories), completion_len
        k = c.topk if losses.divergence(c.divergence).needs_topk else 0
        tens = _hind_tensors(B, T, k)
        judge = self.judge(ctx)
        failed = [i for i, tr in enumerate(trajectories) if tr.failed]
        masks = {i: distill_weights(trajectories[i], ctx.tokenizer, c.distill_on, c.action_weight)[:T] for i in failed}
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
        teacher = select_teacher(c.teacher, ctx)
        prompts = [hindsearch_prompt_ids(ctx.tokenizer, trajectories[i].question, texts[i]) for i in use]
        comps = [through_last_query(trajectories[i].completion_ids, masks[i], T) for i in use]  # exact
        lT, top_ids, top_lp = teacher_token_logprobs(teacher, prompts, comps, topk=k)
        lN = None
        if c.neutral_control:
            neutral = [hindsearch_prompt_ids(ctx.tokenizer, trajectories[i].question, NEUTRAL_CRITIQUE) for i in use]
            lN = teacher_token_logprobs(teacher, neutral, comps)[0]
        if use:
            met["teacher_time"] = time.perf_counter() - t0
        rows = _TeacherRows(use, comps, lT, top_ids if k else None, top_lp if k else None, lN)
        _write_rows(rows, trajectories, masks, ctx.tokenizer, tens, met, samples)
        return AuxBatch(tens, met, samples)

    def _shuffle(self, trajectories: list[Trajectory], use: list[int], texts: dict[int, str], step: int,
                 met: dict[str, float], samples: list[dict[str, Any]]) -> tuple[list[int], dict[int, str]]:
        """The shuffled-critique control: each row in ``use`` gets the usable critique of a failed rollout of
        another question, drawn (seeded by the step) from this step's critiques and the last steps' (a pool of
        ``SHUFFLE_POOL``); a row with none available is dropped and counted in ``shuffle_missing``."""
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
        """``[B, completion_len]`` float: each distilled token's weight in the reduction (``hind_mask``: 1 on query
        tokens, ``action_weight`` on action/decision tokens), which micro-batches count as their units."""
        m = inputs["hind_mask"]
        out = torch.zeros(m.shape[0], completion_len, dtype=torch.float, device=m.device)
        T = min(completion_len, m.shape[1])
        out[:, :T] = m[:, :T].float().clamp(min=0.0)
        return out

    def loss(self, logits: torch.Tensor, idx: torch.Tensor, completion_ids: torch.Tensor,
             inputs: dict[str, torch.Tensor]) -> tuple[torch.Tensor, dict[str, float]]:
        """``L_hind`` from the live temperature-1 student logits at the selected positions, plus the
        teacher-minus-student diagnostics.

        ``logits [N, V]`` at ``idx [N, 2]`` (the union of every term's positions; this term's mask selects its
        own). The diagnostics compare the teacher's and the student's log-probs at the same temperature (1):
        they are exactly what the loss sees, never the rollout's sampling log-probs.
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
            x.topk_ids, x.topk_logp = at(inputs["hind_topk_ids"], idx).to(dev), at(inputs["hind_topk_logp"], idx).to(dev)
        v = div.fn(x)
        L = losses.agg(scatter(v, idx, shape), scatter(mask, idx, shape), c.aggregation)
        met = {"L_hind": float(L.detach()), **losses.gap_diagnostics(lT, lS, mask > 0)}
        return L, met


class IGSDTerm:
    """IGSD: information-gain-gated candidate-pair self-distillation of query tokens."""

    name = "igsd"

    def __init__(self, cfg: Any, corpus: Any = None, seed: int = 0):
        self.cfg, self.lam, self.corpus, self.seed = cfg, cfg.lam, corpus, seed
        self.aggregation = cfg.aggregation
        self.needs_ema = cfg.teacher == "ema"

    def prepare(self, trajectories: list[Trajectory], completion_len: int, ctx: AuxContext) -> AuxBatch:
        eng = ctx.rollout_engine
        complete = getattr(eng, "query_completer", None)
        topk = getattr(eng, "topk", None) or (ctx.config.retrieval.topk if ctx.config is not None else 3)
        tens, met, samples = run_igsd(
            trajectories, completion_len, policy=ctx.policy, teacher=select_teacher(self.cfg.teacher, ctx),
            tokenizer=ctx.tokenizer, retriever=ctx.retriever, cfg=self.cfg, topk=topk, complete=complete,
            corpus=self.corpus, rng=random.Random(self.seed * 1_000_003 + ctx.step),
        )
        return AuxBatch(tens, met, samples)

    def positions(self, inputs: dict[str, torch.Tensor], completion_len: int) -> torch.Tensor:
        """The verified query positions of failed rollouts: ``igsd_mask > 0``."""
        return mask_positions(inputs["igsd_mask"], completion_len)

    def loss(self, logits: torch.Tensor, idx: torch.Tensor, completion_ids: torch.Tensor,
             inputs: dict[str, torch.Tensor]) -> tuple[torch.Tensor, dict[str, float]]:
        """``L_igsd`` from the student logits ``[N, V]`` at the selected positions ``idx [N, 2]``."""
        g = {k: at(v, idx) for k, v in inputs.items() if k.startswith("igsd_")}
        L = losses.igsd_pair_loss(logits, g["igsd_b"], g["igsd_a"], g["igsd_pT"], g["igsd_gate"], g["igsd_mask"],
                                  self.cfg.aggregation)
        return L, {"L_igsd": float(L.detach()), "positions": float(inputs["igsd_mask"].sum())}


def make_judge(hcfg: Any, model: Any, tokenizer: Any) -> Any:
    """The judge a ``[hindsearch]`` config asks for: the oracle (no model), or an ``LMJudge`` on ``model``."""
    if hcfg.judge_kind == "oracle":
        return OracleJudge(hcfg.judge_sees_gold, hcfg.judge_template, hcfg.redact_gold_in_critique)
    return LMJudge(model, tokenizer, hcfg)


def load_judge_model(cfg: Any) -> tuple[Any, Any]:
    """``(model, tokenizer)`` of ``hindsearch.judge_model`` in eval mode, loaded with the policy's dtype and
    device settings. Called where a run is assembled (never by a loss term)."""
    from hindsearch.models import load_policy

    model, tok = load_policy(dataclasses.replace(cfg.model, name=cfg.hindsearch.judge_model, gguf_file=None))
    return model.eval(), tok


def make_terms(cfg: Any, judge: Any = None) -> list[AuxTerm]:
    """Terms of ``cfg.method``: grpo → [], hindsearch → [hind], igsd → [igsd], hindsearch+igsd → both.

    ``judge``: the HindSearch judge built where the run is assembled (required with ``hindsearch.judge_model``;
    by default the term builds the oracle or the LM judge on the frozen policy from its context)."""
    method = cfg.method
    terms: list[AuxTerm] = []
    if method not in ("grpo", "hindsearch", "igsd", "hindsearch+igsd"):
        raise ValueError(f"method = {method!r} is not one of grpo, hindsearch, igsd, hindsearch+igsd")
    if "hindsearch" in method:
        terms.append(HindSearchTerm(cfg.hindsearch, judge=judge))
    if "igsd" in method:
        terms.append(IGSDTerm(cfg.igsd, seed=cfg.train.seed))
    return terms
