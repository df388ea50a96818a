"""Pure glue between our multi-turn rollouts and TRL's ``GRPOTrainer`` (no TRL import here).

Prompt ``i`` of TRL's ``rollout_func`` is one trajectory ``i`` (``records_for_prompts``; no
regrouping). ``rollout_output`` hands TRL exactly the engine's ids, the sampling log-probs,
``env_mask`` = ``gen_mask`` (no loss on injected text) and, per sample, the reward functions'
columns: ``model_text``, ``em`` (the engine's exact match, computed once per rollout), ``answered``,
``num_searches`` (the dataset adds ``golden_answers``). Step statistics come from small per-row
records (gathered over processes first), and the vLLM log-prob mismatch metrics from sums.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch

from hindsearch.records import QARecord, Trajectory


def record_key(record: QARecord) -> str:
    """The dataset ``prompt`` string that identifies a training record (its id)."""
    return record.id


def records_for_prompts(prompts: Sequence[Any], by_key: Mapping[str, QARecord]) -> list[QARecord]:
    """One record per prompt (same order, repeats kept). Unknown keys raise naming the key."""
    out = []
    for p in prompts:
        key = p if isinstance(p, str) else str(p)
        if key not in by_key:
            raise KeyError(f"rollout_func got prompt {key!r}, which is not a training record id")
        out.append(by_key[key])
    return out


def nonempty(traj: Trajectory, filler_id: int) -> tuple[list[int], list[int], list[float]]:
    """``(completion_ids, env_mask, logprobs)``; an empty completion becomes one masked filler
    token.

    TRL indexes ``ids[-1]`` of every completion, so a rollout that produced nothing (error before
    the first token) is represented by a single ``filler_id`` with mask 0 (no loss, no reward
    signal).
    """
    ids, mask, lps = list(traj.completion_ids), list(traj.gen_mask), list(traj.logprobs)
    if not (len(ids) == len(mask) == len(lps)):
        raise ValueError(
            f"trajectory {traj.qid}: completion_ids/gen_mask/logprobs lengths differ "
            f"({len(ids)}/{len(mask)}/{len(lps)})"
        )
    if not ids:
        return [filler_id], [0], [0.0]
    return ids, [int(m) for m in mask], [float(x) for x in lps]


def model_answered(traj: Trajectory) -> bool:
    """The model itself ended with a well-formed ``<answer>`` turn (the injected invalid-action
    notice also contains ``<answer> and </answer>``, so ``traj.answer`` alone is not proof of a
    model answer)."""
    return bool(traj.turns) and traj.turns[-1].action == "answer"


def rollout_output(trajs: Sequence[Trajectory], filler_id: int,
                   decode: Callable[[list[int]], str]) -> dict[str, list]:
    """The ``rollout_func`` return value for trajectories aligned with TRL's prompts (``decode``:
    ids -> text, as the engine decodes, for ``model_text``)."""
    out: dict[str, list] = {k: [] for k in ("prompt_ids", "completion_ids", "logprobs", "env_mask")}
    for t in trajs:
        ids, mask, lps = nonempty(t, filler_id)
        out["prompt_ids"].append(list(t.prompt_ids))
        out["completion_ids"].append(ids)
        out["env_mask"].append(mask)
        out["logprobs"].append(lps)
    out["model_text"] = [t.model_text(decode) for t in trajs]
    out["em"] = [t.em for t in trajs]
    out["answered"] = [model_answered(t) for t in trajs]
    out["num_searches"] = [t.num_searches for t in trajs]
    return out


def _mean(xs: Sequence[float]) -> float:
    return sum(xs) / len(xs) if xs else 0.0


def _std(xs: Sequence[float]) -> float:
    if len(xs) < 2:
        return 0.0
    m = _mean(xs)
    return math.sqrt(sum((x - m) ** 2 for x in xs) / (len(xs) - 1))


def row_stats(t: Trajectory) -> dict[str, float]:
    """The per-trajectory numbers ``rollout_metrics`` averages (small: gathered across
    processes)."""
    return {
        "reward": float(t.reward), "em": float(t.em), "f1": float(t.f1),
        "searches": float(t.num_searches), "invalid": float(t.num_invalid),
        "turns": float(len(t.turns)),
        "valid": float(any(tn.action in ("search", "answer") for tn in t.turns)),
        "answered": float(model_answered(t)), "completion_len": float(len(t.completion_ids)),
        "generated_len": float(sum(t.gen_mask)), "prompt_len": float(len(t.prompt_ids)),
        "errors": float(len(t.errors)),
    }


def rollout_metrics(rows: Sequence[Mapping[str, float]], num_generations: int) -> dict[str, float]:
    """Step statistics of a batch of ``row_stats`` (record-major, groups of ``num_generations``).

    ``frac_solved_groups`` / ``frac_zero_std_groups``: groups with at least one success / with all
    rewards equal (no GRPO signal).
    """
    rewards = [r["reward"] for r in rows]
    n = len(rows)
    groups = ([rewards[i : i + num_generations] for i in range(0, n, num_generations)]
              if num_generations else [])

    def mean(key: str) -> float:
        return _mean([r[key] for r in rows])

    return {
        "reward_mean": _mean(rewards),
        "reward_std": _std(rewards),
        "em": mean("em"),
        "f1": mean("f1"),
        "searches_per_rollout": mean("searches"),
        "invalid_turn_rate": (sum(r["invalid"] for r in rows)
                              / max(sum(r["turns"] for r in rows), 1)),
        "validity_rate": mean("valid"),
        "answered_rate": mean("answered"),
        "completion_len": mean("completion_len"),
        "generated_len": mean("generated_len"),
        "prompt_len": mean("prompt_len"),
        "errors": float(sum(r["errors"] for r in rows)),
        "frac_solved_groups": _mean([float(max(g) > 0) for g in groups if g]),
        "frac_zero_std_groups": _mean([float(max(g) == min(g)) for g in groups if g]),
    }


def sample_order(rewards: Sequence[float], k: int) -> list[int]:
    """Indices of the ``k`` rollouts a step writes to ``samples.jsonl``: failures and successes
    (reward > 0) in their shares of the step (``k * successes / n`` rounded, at least one of each
    when both occur and ``k`` > 1), so the file's rewards agree with the step's
    ``rollout/reward_mean``; the first of each kind, failures first. All of them when ``k >= n``."""
    ok = [i for i, r in enumerate(rewards) if r > 0]
    bad = [i for i, r in enumerate(rewards) if not r > 0]
    n, k = len(rewards), max(0, min(k, len(rewards)))
    if k == n:
        return bad + ok
    n_ok = round(k * len(ok) / n) if n else 0
    if ok and bad and k > 1:
        n_ok = min(max(n_ok, 1), k - 1)
    n_ok = min(n_ok, len(ok), k)
    n_bad = min(k - n_ok, len(bad))
    n_ok = min(k - n_bad, len(ok))
    return bad[:n_bad] + ok[:n_ok]


def sample_records(
    trajs: Sequence[Trajectory], aux_samples: Mapping[str, Sequence[dict]], k: int, step: int
) -> list[dict[str, Any]]:
    """Up to ``k`` rollouts for ``samples.jsonl`` (``sample_order``: successes and failures in the
    step's shares, failed ones first: they carry the aux samples). Each carries its ``turns``
    (``Turn.record``: action, query or answer, retrieved ids and titles) and its question's
    ``evidence`` titles, so readers parse nothing and need no QA file.

    ``aux_samples[name][i]`` is term ``name``'s record for trajectory ``i`` (may be shorter).
    """
    order = sample_order([t.reward for t in trajs], k)
    out = []
    for i in order:
        t = trajs[i]
        rec = {
            "step": step,
            "index": i,
            "qid": t.qid,
            "question": t.question,
            "golden_answers": t.golden_answers,
            "hops": t.hops,
            # the question's evidence titles: the report's retrieval quality needs no QA file
            "evidence": list(t.evidence),
            "completion": t.completion_text,
            "answer": t.answer,
            "reward": t.reward,
            "queries": t.queries,
            "turns": [tn.record() for tn in t.turns],
            "stop_reason": t.stop_reason,
            "errors": t.errors,
        }
        for name, recs in aux_samples.items():
            if i < len(recs) and recs[i]:
                rec[name] = recs[i]
        out.append(rec)
    return out


# ---------------------------------------------------------------- vLLM log-prob mismatch
MISMATCH_FIELDS = ("tokens", "abs_diff_sum", "abs_diff_max", "ratio_sum", "ratio_min", "ratio_max",
                   "capped", "nan")


def truncated_is_ratio(trainer_logps: torch.Tensor, sampler_logps: torch.Tensor, mask: torch.Tensor,
                       cap: float) -> torch.Tensor:
    """TRL's ``token_truncate`` importance ratio: ``min(exp((lp_train - lp_vllm) * mask), cap)``.

    All inputs ``[B, T]`` (``mask``: 1 on generated, non-padding tokens); -> ``[B, T]``. A NaN
    sampler log-prob (vLLM could not score the token) gives ratio 1, as in TRL; masked positions
    give 1.
    """
    diff = torch.nan_to_num((trainer_logps - sampler_logps) * mask, nan=0.0)
    return torch.exp(diff).clamp(max=cap)


def mismatch_sums(trainer_logps: torch.Tensor, sampler_logps: torch.Tensor, mask: torch.Tensor,
                  cap: float) -> torch.Tensor:
    """One process's reducible mismatch statistics -> ``[8]`` float (``MISMATCH_FIELDS``): scored
    tokens, sum and max of ``|lp_train - lp_vllm|``, sum/min/max of the truncated ratio, tokens
    whose raw ratio exceeded ``cap``, generated tokens without a sampler log-prob (NaN, left out of
    the rest).

    ``trainer_logps``, ``sampler_logps``, ``mask``: ``[B, T]``.
    """
    m = mask.bool()
    nan = torch.isnan(sampler_logps) & m
    ok = m & ~nan
    d = (trainer_logps - sampler_logps)[ok].float()
    r = truncated_is_ratio(trainer_logps, sampler_logps, mask, cap)[ok].float()
    n = d.numel()
    z = torch.zeros((), device=d.device)
    return torch.stack([
        torch.tensor(float(n), device=d.device), d.abs().sum(), d.abs().max() if n else z, r.sum(),
        r.min() if n else z + float("inf"), r.max() if n else z, (d > math.log(cap)).sum().float(),
        nan.sum().float(),
    ]).float()


def mismatch_metrics(sums: torch.Tensor) -> dict[str, float]:
    """Combine ``mismatch_sums`` rows of all processes (``[P, 8]`` or ``[8]``) into the logged
    metrics: ``logp_diff_mean`` / ``logp_diff_max`` (|lp_train - lp_vllm| per generated token),
    ``is_ratio_mean`` / ``_min`` / ``_max`` (truncated ratio), ``is_capped_frac`` (share of tokens
    at the cap), ``logp_nan_tokens``."""
    s = sums.reshape(-1, len(MISMATCH_FIELDS)).double()
    n = float(s[:, 0].sum())
    if n == 0:
        return {"logp_nan_tokens": float(s[:, 7].sum())}
    return {
        "logp_diff_mean": float(s[:, 1].sum()) / n,
        "logp_diff_max": float(s[:, 2].max()),
        "is_ratio_mean": float(s[:, 3].sum()) / n,
        "is_ratio_min": float(s[:, 4].min()),
        "is_ratio_max": float(s[:, 5].max()),
        "is_capped_frac": float(s[:, 6].sum()) / n,
        "logp_nan_tokens": float(s[:, 7].sum()),
    }
