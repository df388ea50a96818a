"""Teacher probes (``hindsearch probe``, ``compare --probe``): is a checkpoint's hindsight teacher
better than its student, and where?

``run_probe`` measures, on failed greedy training rollouts and for each hindsight line (neutral
control, critique with and without gold, IGSD's answer line), the hint's gain, the failed state's
next search, the sampled decision, the token gap and IGSD's proposal and gate; ``probe_checkpoint``
loads a checkpoint, runs it and writes ``probe.json`` + ``probe.md`` (``format_probe``). What each
measure means: docs/methods.md, "Teacher probes".
"""

from __future__ import annotations

import json
import statistics
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from hindsearch.agent import protocol
from hindsearch.core.scoring import score_continuations
from hindsearch.hindsight.teacher import NEUTRAL_CRITIQUE
from hindsearch.records import QARecord, Trajectory, title_key
from hindsearch.tables import markdown_table

HINTS = ("neutral", "critique_gold", "critique_nogold", "answer")


def hint_lines(trajs: Sequence[Trajectory], cfg: Any,
               judges: dict[str, Any]) -> dict[str, list[str | None]]:
    """The hint line of every failed trajectory, per hint kind (None where a critique was
    unusable)."""
    neutral = protocol.FEEDBACK_TEMPLATE.format(critique=NEUTRAL_CRITIQUE)
    out: dict[str, list[str | None]] = {
        "neutral": [neutral] * len(trajs),
        "answer": [protocol.GOLD_HINDSIGHT_TEMPLATE.format(answer=t.golden_answers[0])
                   for t in trajs]}
    for name, judge in judges.items():
        crits = judge.critique(list(trajs))
        out[name] = [protocol.FEEDBACK_TEMPLATE.format(critique=c.text) if c.usable else None
                     for c in crits]
    return out


def _mean(xs: Sequence[float]) -> float:
    return float(statistics.fmean(xs)) if xs else 0.0


def first_info_end(traj: Trajectory) -> int | None:
    """Completion index right after the first information block (None when no search got one)."""
    for turn in traj.turns:
        if turn.action == "search" and turn.inject_span[1] > turn.inject_span[0]:
            return turn.inject_span[1]
    return None


def rerun_stats(trajs: Sequence[Trajectory]) -> dict[str, float]:
    """EM, gold-evidence recall and searches per question of reruns."""
    return {"n": float(len(trajs)), "em": _mean([t.em for t in trajs]),
            "evidence_recall": _mean([t.evidence_recall for t in trajs]),
            "searches": _mean([float(t.num_searches) for t in trajs])}


def hit_missed(cont: Trajectory, failed: Trajectory) -> tuple[bool, bool]:
    """``(searched, hit)``: whether ``cont`` (a continuation from ``failed``'s state after its first
    information block) opens with a search, and whether that search retrieved an evidence passage
    ``failed``'s first search missed (the bridge query)."""
    first = cont.turns[0] if cont.turns else None
    searched = bool(first and first.action == "search")
    missed = ({title_key(e) for e in failed.evidence}
              - {title_key(t) for t in failed.turns[0].doc_titles})
    got = {title_key(t) for t in first.doc_titles} if searched and first is not None else set()
    return searched, bool(missed & got)


def sampled_at_t1(engine: Any, records: Sequence[QARecord], k: int,
                  seed: int, **kw: Any) -> list[Trajectory]:
    """``k`` rollouts per record at temperature 1, top-p 1 (the engine's own settings restored
    after)."""
    from dataclasses import replace

    old = engine.cfg
    engine.cfg = replace(old, temperature=1.0, top_p=1.0)
    try:
        return engine.rollout(list(records), num_generations=k, greedy=False, seed=seed, **kw)
    finally:
        engine.cfg = old


def state_stats(engine: Any, tokenizer: Any, student_prompts: Sequence[list[int]],
                prefixes: Sequence[list[int]], conts: Sequence[Trajectory],
                failed: Sequence[Trajectory]) -> dict[str, float]:
    """Decision, query quality and EM of continuations from the failed states (see the module doc,
    probe 2)."""
    searched, hits, us, em = [], [], [], []
    states, ans = [], []
    for sp, pre, c, f in zip(student_prompts, prefixes, conts, failed):
        first = c.turns[0] if c.turns else None
        s, hit = hit_missed(c, f)
        searched.append(float(s))
        em.append(c.em)
        hits.append(float(hit))
        if s and first is not None and first.inject_span[1] > first.inject_span[0]:
            ctx = list(tokenizer(protocol.ANSWER_OPEN + " ", add_special_tokens=False)["input_ids"])
            gold = list(tokenizer(f.golden_answers[0], add_special_tokens=False)["input_ids"])[:16]
            states.append(list(sp) + list(pre) + list(c.completion_ids[: first.inject_span[1]])
                          + ctx)
            ans.append(gold)
    if states:
        lp, _, _ = score_continuations(engine.model, states, ans)
        for j, a in enumerate(ans):
            us.append(float(lp[j, : len(a)].mean()))
    return {"n": float(len(conts)), "search_again": _mean(searched), "hit_missed": _mean(hits),
            "u_D": _mean(us), "u_D_n": float(len(us)), "em_from_state": _mean(em)}


def token_gaps(model: Any, tokenizer: Any, failed: Sequence[Trajectory],
               hints: Sequence[str | None], neutral: Sequence[str],
               student_prompts: Sequence[list[int]]) -> dict[str, float]:
    """``lT - lS`` and ``lT - lN`` on the failed rollouts' own query and action tokens (probe 4)."""
    rows = [i for i, h in enumerate(hints) if h is not None]
    if not rows:
        return {}
    comps = [list(failed[i].completion_ids) for i in rows]
    hinted = [protocol.encode_prompt(tokenizer, failed[i].question, hints[i]) for i in rows]
    neutral_ids = [protocol.encode_prompt(tokenizer, failed[i].question, neutral[i]) for i in rows]
    lT = score_continuations(model, hinted, comps)[0]
    lN = score_continuations(model, neutral_ids, comps)[0]
    lS = score_continuations(model, [student_prompts[i] for i in rows], comps)[0]
    out: dict[str, float] = {}
    for name, get in (("query", lambda t: t.query_mask),
                      ("action", lambda t: protocol.action_mask(t, tokenizer))):
        ts, tn = [], []
        for j, i in enumerate(rows):
            m = torch.tensor(get(failed[i])[: len(comps[j])], dtype=torch.bool)
            n = len(comps[j])
            ts.append((lT[j, :n] - lS[j, :n])[m])
            tn.append((lT[j, :n] - lN[j, :n])[m])
        a, b = torch.cat(ts), torch.cat(tn)
        out[f"{name}_tokens"] = float(a.numel())
        out[f"{name}_lT_minus_lS"] = float(a.mean()) if a.numel() else 0.0
        out[f"{name}_lT_minus_neutral"] = float(b.mean()) if b.numel() else 0.0
    return out


def decision_probability(engine: Any, records: Sequence[QARecord], prefixes: Sequence[list[int]],
                         hints: Sequence[str | None], k: int, seed: int) -> float:
    """P(the next action opens ``<search>``) from each state: ``k`` samples at temperature 1
    each."""
    if not records or k <= 0:
        return 0.0
    outs = sampled_at_t1(engine, records, k, seed, hints=list(hints), prefixes=list(prefixes))
    return _mean([float(bool(t.turns) and t.turns[0].action == "search") for t in outs])


def _probe_judges(engine: Any, cfg: Any) -> dict[str, Any]:
    """The gold and no-gold judges of the probe (oracle, the OpenAI-compatible endpoint, or the LM
    judge on ``judge_model`` / the policy)."""
    from hindsearch.hindsight.methods.hindsearch import load_judge_model, make_judge

    h = cfg.hindsearch
    jm, jt = (load_judge_model(cfg.model, h.judge_model) if h.judge_kind == "lm" and h.judge_model
              else (engine.model, engine.tokenizer))
    return {name: make_judge(_replace_gold(h, gold), jm, jt)
            for name, gold in (("critique_gold", True), ("critique_nogold", False))}


@dataclass
class _ProbeState:
    """The failures a probe works on and the student's state after its first information block."""

    failed: list[Trajectory]
    recs: list[QARecord]
    prompts: list[list[int]]
    st_rows: list[int]
    st_pref: list[list[int]]


def _probe_hint(engine: Any, st: _ProbeState, hint: list[str | None], neutral: list[str | None],
                name: str, samples: int, seed: int) -> dict[str, Any]:
    """Probes of one hint line: full rerun, rerun from the student's state, P(search again), token
    gaps."""
    tok, failed, st_rows = engine.tokenizer, st.failed, st.st_rows
    rows = [i for i, x in enumerate(hint) if x is not None]
    rer = (engine.rollout([st.recs[i] for i in rows], greedy=True, hints=[hint[i] for i in rows])
           if rows else [])
    entry: dict[str, Any] = {"usable": len(rows), "rerun": rerun_stats(rer)}
    srows = [j for j, i in enumerate(st_rows) if hint[i] is not None]
    recs_s = [st.recs[st_rows[j]] for j in srows]
    pref_s = [st.st_pref[j] for j in srows]
    hints_s = [hint[st_rows[j]] for j in srows]
    sc = engine.rollout(recs_s, greedy=True, hints=hints_s, prefixes=pref_s) if srows else []
    entry["state"] = state_stats(engine, tok, [st.prompts[st_rows[j]] for j in srows], pref_s, sc,
                                 [failed[st_rows[j]] for j in srows])
    t2 = [j for j in srows if failed[st_rows[j]].hops == 2]
    entry["p_search_two_hop"] = decision_probability(
        engine, [st.recs[st_rows[j]] for j in t2], [st.st_pref[j] for j in t2],
        [hint[st_rows[j]] for j in t2], samples, seed)
    if name != "neutral":
        entry["gap"] = token_gaps(engine.model, tok, failed, hint, neutral, st.prompts)
    if name.startswith("critique"):
        entry["example"] = next((x for x in hint if x), None)
    return entry


def run_probe(engine: Any, records: Sequence[QARecord], cfg: Any, n: int = 64, samples: int = 4,
              seed: int = 0, log: Any = print) -> dict[str, Any]:
    """All probes on the first ``n`` greedy failures among ``records`` (see the module
    docstring)."""
    t0 = time.time()
    base = engine.rollout(list(records), greedy=True)
    failed = [t for t in base if t.failed][:n]
    by_id = {r.id: r for r in records}
    log(f"probe: {len(failed)} failed of {len(base)} greedy training rollouts (student EM "
        f"{_mean([t.em for t in base]):.3f})")
    lines = hint_lines(failed, cfg, _probe_judges(engine, cfg))
    st_rows = [i for i, t in enumerate(failed) if first_info_end(t) is not None]
    st = _ProbeState(failed, [by_id[t.qid] for t in failed],
                     [engine.prompt_ids(t.question) for t in failed], st_rows,
                     [list(failed[i].completion_ids[: first_info_end(failed[i])]) for i in st_rows])
    result: dict[str, Any] = {"n_questions": len(base), "n_failed": len(failed),
                              "student_em": _mean([t.em for t in base]),
                              "judge_kind": cfg.hindsearch.judge_kind, "hints": {}}
    # probe 1: hint gain (the student rerun is the failures themselves, EM 0 by construction)
    result["student"] = {"rerun": rerun_stats(failed)}
    st_recs = [st.recs[i] for i in st_rows]
    conts = engine.rollout(st_recs, greedy=True, prefixes=st.st_pref) if st_rows else []
    result["student"]["state"] = state_stats(engine, engine.tokenizer,
                                             [st.prompts[i] for i in st_rows], st.st_pref, conts,
                                             [failed[i] for i in st_rows])
    two = [j for j, i in enumerate(st_rows) if failed[i].hops == 2]
    result["student"]["p_search_two_hop"] = decision_probability(
        engine, [st_recs[j] for j in two], [st.st_pref[j] for j in two], [None] * len(two), samples,
        seed)
    for name in HINTS:
        result["hints"][name] = _probe_hint(engine, st, lines[name], lines["neutral"], name,
                                            samples, seed)
    result["igsd"] = igsd_probe(engine, failed, cfg, seed)
    result["seconds"] = time.time() - t0
    return result


def igsd_probe(engine: Any, failed: Sequence[Trajectory], cfg: Any,
               seed: int = 0) -> dict[str, float]:
    """Probe 5: IGSD's proposal and gate on ``failed`` (see the module docstring); ``{}`` without a
    query.

    Returns ``positions_considered`` (the failures' query tokens), ``teacher_differs`` (share of
    them where the answer-line teacher's top token is not the student's), ``pairs_verified``,
    ``delta_pos_pairs`` / ``delta_nonpos_pairs`` and ``precision_pos`` / ``precision_nonpos`` (share
    of each whose teacher query hit an evidence passage; 0 where there is no such pair).
    """
    import random

    from hindsearch.hindsight.contract import AuxContext
    from hindsearch.hindsight.igsd import run_igsd

    rows = [t for t in failed if any(t.query_mask)]
    if not rows:
        return {}
    T = max(len(t.completion_ids) for t in rows)
    _, m, _ = run_igsd(rows, T, AuxContext.of_engine(engine), cfg.igsd, rng=random.Random(seed),
                       teacher=engine.model)
    n = m["positions_considered"]
    out = {"positions_considered": n, "teacher_differs": (n - m["teacher_agree"]) / n if n else 0.0,
           "pairs_verified": m["positions_verified"], "frac_delta_pos": m["frac_delta_pos"]}
    for side in ("pos", "nonpos"):
        pairs = m[f"delta_{side}_pairs"]
        out[f"delta_{side}_pairs"] = pairs
        out[f"precision_{side}"] = m[f"delta_{side}_teacher_hits"] / pairs if pairs else 0.0
    return out


def pair_outcomes(trajs: Sequence[Trajectory],
                  samples: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """Each verified pair of ``run_igsd``'s samples as ``{delta, gate, t_hit, s_hit, identical}``:
    whether the teacher's / the student's query retrieved an evidence passage of the question, and
    whether both retrieved the same titles."""
    out = []
    for tr, smp in zip(trajs, samples):
        ev = {title_key(e) for e in tr.evidence}
        for rec in smp.get("igsd_pairs", []):
            t_titles = {title_key(x) for x in rec["titles_T"]}
            s_titles = {title_key(x) for x in rec["titles_S"]}
            out.append({"delta": rec["delta"], "gate": rec["gate"], "t_hit": bool(ev & t_titles),
                        "s_hit": bool(ev & s_titles), "identical": t_titles == s_titles})
    return out


def gate_separation(pairs: Sequence[dict[str, Any]]) -> dict[str, float]:
    """Does the gate open where the teacher's query found evidence the student's missed? Over
    verified pairs: the opening rate (gate > 0) and mean gate on "teacher hit, student missed",
    "identical documents", "both missed" and the rest; the share of "teacher hit, student missed"
    among open and among shut pairs, and the one-sided Fisher exact p-value that open pairs hold
    more of them (NaN without both kinds)."""
    from scipy.stats import fisher_exact

    cats = {"t_hit_s_miss": lambda p: p["t_hit"] and not p["s_hit"],
            "identical": lambda p: p["identical"],
            "both_miss": lambda p: not p["t_hit"] and not p["s_hit"] and not p["identical"],
            "s_hit_t_miss": lambda p: p["s_hit"] and not p["t_hit"]}
    out: dict[str, float] = {"pairs": float(len(pairs))}
    for name, fn in cats.items():
        sel = [p for p in pairs if fn(p)]
        out[f"n_{name}"] = float(len(sel))
        out[f"open_{name}"] = _mean([float(p["gate"] > 0) for p in sel]) if sel else float("nan")
        out[f"gate_{name}"] = _mean([p["gate"] for p in sel]) if sel else float("nan")
    is_c = cats["t_hit_s_miss"]
    a = sum(1 for p in pairs if p["gate"] > 0 and is_c(p))
    b = sum(1 for p in pairs if p["gate"] > 0 and not is_c(p))
    c = sum(1 for p in pairs if p["gate"] <= 0 and is_c(p))
    d = sum(1 for p in pairs if p["gate"] <= 0 and not is_c(p))
    out["precision_open"] = a / (a + b) if a + b else float("nan")
    out["precision_shut"] = c / (c + d) if c + d else float("nan")
    out["fisher_p"] = (float(fisher_exact([[a, b], [c, d]], alternative="greater")[1]) if (a + b)
                       and (c + d) else float("nan"))
    return out


def igsd_settings_probe(engine: Any, failed: Sequence[Trajectory], cfg: Any,
                        settings: Sequence[str], seed: int = 0,
                        log: Any = print) -> dict[str, dict[str, float]]:
    """IGSD's proposals and gate on ``failed`` under each setting (``"key=value,key=value"`` over
    ``[igsd]``; ``""`` = the config as it is): proposals, the share of them that are gold-answer
    tokens the student never saw, pairs verified, and ``gate_separation``. Rows with the group
    hindsight need their group: ``failed`` is then the step-like batch of every rollout (failed or
    not)."""
    import copy
    import random

    from hindsearch.hindsight.contract import AuxContext
    from hindsearch.hindsight.igsd import run_igsd
    from hindsearch.hindsight.igsd import hint_lines
    from hindsearch.hindsight.methods.hindsearch import HindSearchConfig, make_judge

    rows = list(failed)
    T = max((len(t.completion_ids) for t in rows), default=0)
    res: dict[str, dict[str, float]] = {}
    for setting in settings:
        c2 = copy.deepcopy(cfg)
        for kv in filter(None, (x.strip() for x in setting.split(","))):
            c2.set(f"igsd.{kv}")
        icfg = c2.validate().igsd
        hints = None
        if icfg.hindsight != "answer":
            judge = make_judge(HindSearchConfig(judge_kind=icfg.judge_kind), engine.model,
                               engine.tokenizer)
            hints = hint_lines(rows, [i for i, t in enumerate(rows) if t.failed],
                               icfg.hindsight, judge)
        _, m, samples = run_igsd(rows, T, AuxContext.of_engine(engine), icfg,
                                 rng=random.Random(seed), teacher=engine.model, hints=hints)
        g = gate_separation(pair_outcomes(rows, samples))
        g.update(proposals=m["proposals"],
                 gold_share=m["proposals_gold"] / m["proposals"] if m["proposals"] else 0.0,
                 unreachable=m["positions_unreachable"], alias_dropped=m["alias_queries_dropped"],
                 verified=m["positions_verified"], mean_delta=m["mean_delta"],
                 hint_rows=m["hindsight_rows"])
        res[setting or "(config)"] = g
        log(f"igsd probe [{setting or 'config'}]: {g['verified']:.0f} pairs verified, open on "
            f"teacher-hit/student-miss {g['open_t_hit_s_miss']:.2f} vs identical "
            f"{g['open_identical']:.2f}, Fisher p {g['fisher_p']:.3g}")
    return res


def format_igsd_settings(res: dict[str, dict[str, float]]) -> str:
    """One markdown table of ``igsd_settings_probe``: a row per setting."""
    head = ["setting", "proposals", "gold-token share", "verified", "open: T hit, S missed (n)",
            "open: identical (n)", "open: both missed (n)", "open: S hit, T missed (n)",
            "T-hit-S-miss share, open / shut", "Fisher p"]

    def cell(g: dict[str, float], k: str) -> str:
        return f"{g['open_' + k]:.2f} ({g['n_' + k]:.0f})"

    return markdown_table(head, [
        [name, f"{g['proposals']:.0f}", f"{100 * g['gold_share']:.1f}%", f"{g['verified']:.0f}",
         cell(g, "t_hit_s_miss"), cell(g, "identical"), cell(g, "both_miss"),
         cell(g, "s_hit_t_miss"), f"{g['precision_open']:.2f} / {g['precision_shut']:.2f}",
         f"{g['fisher_p']:.3g}"] for name, g in res.items()])


def format_igsd_probe(g: dict[str, float]) -> str:
    """One line of ``igsd_probe``'s result (empty without one)."""
    if not g:
        return ""
    return (f"IGSD, answer-line teacher: its top query token differs from the student's at "
            f"{100 * g['teacher_differs']:.1f}% of {g['positions_considered']:.0f} query "
            f"positions; {g['pairs_verified']:.0f} pairs verified; the teacher's query hit an "
            f"evidence passage in {100 * g['precision_pos']:.1f}% of the "
            f"{g['delta_pos_pairs']:.0f} pairs with delta > 0 and "
            f"{100 * g['precision_nonpos']:.1f}% of the {g['delta_nonpos_pairs']:.0f} with delta "
            "<= 0 (the gate's precision).")


def _replace_gold(hcfg: Any, gold: bool) -> Any:
    from dataclasses import replace

    return replace(hcfg, judge_sees_gold=gold)


def format_probe(res: dict[str, Any]) -> str:
    """One markdown table of a ``run_probe`` result (rows: student and each hint)."""
    head = ["context", "usable", "rerun EM", "evidence recall", "searches/q", "search again",
            "hit missed", "u(D)", "EM from state", "P(search) 2-hop", "query lT-lS", "query lT-lN",
            "action lT-lS", "action lT-lN"]

    def row(name: str, e: dict[str, Any], usable: Any) -> list[Any]:
        r, s, g = e["rerun"], e["state"], e.get("gap", {})
        gap = [f"{g[k]:+.3f}" if k in g else "-"
               for k in ("query_lT_minus_lS", "query_lT_minus_neutral",
                                                            "action_lT_minus_lS",
                                                            "action_lT_minus_neutral")]
        return [name, usable, f"{100 * r['em']:.1f}", f"{100 * r['evidence_recall']:.1f}",
                f"{r['searches']:.2f}", f"{100 * s['search_again']:.1f}",
                f"{100 * s['hit_missed']:.1f}", f"{s['u_D']:.2f}",
                f"{100 * s['em_from_state']:.1f}", f"{100 * e['p_search_two_hop']:.1f}", *gap]

    rows = [row("student (no hint)", res["student"], res["n_failed"])]
    rows += [row(name, e, e["usable"]) for name, e in res["hints"].items()]
    lines = [f"Teacher probes on {res['n_failed']} failed greedy training rollouts (of "
             f"{res['n_questions']}; student EM {100 * res['student_em']:.1f}), judge: "
             f"{res['judge_kind']}. Rates in %, u(D) and gaps in nats per token.", "",
             markdown_table(head, rows)]
    if res.get("igsd"):
        lines += ["", format_igsd_probe(res["igsd"])]
    return "\n".join(lines)


PROBE_SUMMARY = (("student P(search) 2-hop", ("student", "p_search_two_hop")),
                 ("gold-critique P(search) 2-hop", ("hints", "critique_gold", "p_search_two_hop")),
                 ("gold-critique hit missed", ("hints", "critique_gold", "state", "hit_missed")),
                 ("IGSD teacher differs", ("igsd", "teacher_differs")),
                 ("gate precision delta>0", ("igsd", "precision_pos")),
                 ("gate precision delta<=0", ("igsd", "precision_nonpos")))
"""The few numbers of a probe quoted per run in a comparison's results: (label, path into
``run_probe``'s result)."""


def probe_summary(res: dict[str, Any]) -> dict[str, float | None]:
    """``{label: value}`` of ``PROBE_SUMMARY`` (None where the probe has no such number)."""
    out: dict[str, float | None] = {}
    for label, path in PROBE_SUMMARY:
        v: Any = res
        for k in path:
            v = v.get(k) if isinstance(v, dict) else None
        out[label] = float(v) if isinstance(v, (int, float)) else None
    return out


def write_probe(res: dict[str, Any], out_dir: str | Path) -> Path:
    """``out_dir/probe.json`` and ``out_dir/probe.md``; returns the json path."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    (out / "probe.json").write_text(json.dumps(res, indent=1))
    (out / "probe.md").write_text(format_probe(res) + "\n")
    return out / "probe.json"


# ---------------------------------------------------------------- held-out failed states (issue 21)
@dataclass
class HeldOutStates:
    """Failed two-hop states of one (starting) checkpoint, cut right after the first information
    block: ``records[i]`` with ``prefixes[i]`` (completion ids through that block) of the failure
    ``failed[i]``."""

    records: list[QARecord]
    prefixes: list[list[int]]
    failed: list[Trajectory]

    def to_dict(self) -> dict[str, Any]:
        return {"failed": [t.to_dict() for t in self.failed], "prefixes": self.prefixes}

    @classmethod
    def from_dict(cls, d: dict[str, Any], records: Sequence[QARecord]) -> "HeldOutStates":
        by_id = {r.id: r for r in records}
        failed = [Trajectory.from_dict(x) for x in d["failed"]]
        missing = [t.qid for t in failed if t.qid not in by_id]
        if missing:
            raise ValueError(f"held-out states name questions not in the test split: {missing[:3]}")
        return cls([by_id[t.qid] for t in failed], [list(p) for p in d["prefixes"]], failed)


def held_out_states(engine: Any, records: Sequence[QARecord], n: int) -> HeldOutStates:
    """The first ``n`` greedy failures of ``engine`` on the two-hop questions among ``records`` that
    searched and got an information block (for the test split: states no training step has seen)."""
    two = [r for r in records if r.hops == 2]
    base = engine.rollout(two, greedy=True) if two else []
    by_id = {r.id: r for r in two}
    failed = [t for t in base if t.failed and first_info_end(t) is not None][:n]
    return HeldOutStates([by_id[t.qid] for t in failed],
                         [list(t.completion_ids[: first_info_end(t)]) for t in failed],
                         failed)


def state_measures(engine: Any, st: HeldOutStates,
                   samples: int, seed: int) -> list[dict[str, float]]:
    """Per held-out state (in order): ``p_search`` (share of ``samples`` continuations at
    temperature 1 that open ``<search>`` next), and of the greedy continuation ``search_again``,
    ``hit_missed`` (its next query retrieves an evidence passage the first search missed: the bridge
    query) and ``em``."""
    if not st.records:
        return []
    sampled = sampled_at_t1(engine, st.records, samples, seed, prefixes=st.prefixes)
    greedy = engine.rollout(st.records, greedy=True, prefixes=st.prefixes)
    out = []
    for i, (c, f) in enumerate(zip(greedy, st.failed)):
        mine = sampled[i * samples: (i + 1) * samples]
        searched, hit = hit_missed(c, f)
        out.append({"p_search": _mean([float(bool(t.turns) and t.turns[0].action == "search")
                                       for t in mine]),
                    "search_again": float(searched), "hit_missed": float(hit),
                    "em": float(c.em or 0.0)})
    return out


def summarize_states(rows: Sequence[dict[str, float]]) -> dict[str, float]:
    """Means of ``state_measures`` rows, plus ``hit_given_search`` (the bridge-query hit rate among
    the states whose greedy continuation searched again)."""
    keys = ("p_search", "search_again", "hit_missed", "em")
    out = {k: _mean([r[k] for r in rows]) for k in keys}
    searched = [r for r in rows if r["search_again"]]
    out["hit_given_search"] = _mean([r["hit_missed"] for r in searched])
    out["n"] = float(len(rows))
    return out


def probe_checkpoint(cfg: Any, checkpoint: str | None, n: int = 64, questions: int = 256,
                     samples: int = 4, out: str | Path | None = None, log: Any = print,
                     loaded: tuple[Any, Any] | None = None,
                     igsd_settings: list[str] | None = None) -> dict[str, Any]:
    """Load the checkpoint (or warm the preset up), probe it, write ``probe.json``; returns the
    result. ``loaded``: the checkpoint's model and tokenizer, when the caller has them (not loaded
    again). ``igsd_settings``: run only IGSD's proposal-and-gate probe, once per setting, on sampled
    training-like rollouts (``rollout.num_generations`` per question, as a training step draws
    them)."""
    from dataclasses import replace

    from hindsearch.hindsight.registry import resolve_methods
    from hindsearch.inputs import eval_engine, prepare
    from hindsearch.models import cache_dir, load_policy
    from hindsearch.train.warmup import ensure_warmup, select_records

    resolve_methods(cfg)
    setup = prepare(cfg)
    train, retriever = setup.train, setup.retriever
    if checkpoint is None:
        model, tok = load_policy(cfg.model)
        if cfg.warmup.enabled:
            checkpoint = str(ensure_warmup(cfg, model, tok, retriever, train,
                                           cache_dir() / "warmup"))
        else:
            checkpoint = cfg.model.name
    model, tok = loaded or load_policy(replace(cfg.model, name=str(checkpoint), gguf_file=None))
    model.eval()
    engine = eval_engine(cfg, model, tok, retriever)
    recs = select_records(train, questions, cfg.train.seed + 7)
    import torch

    if igsd_settings is not None:
        return _igsd_only(cfg, engine, recs, igsd_settings, checkpoint, out, log)
    with torch.no_grad():
        res = run_probe(engine, recs, cfg, n=n, samples=samples, seed=cfg.train.seed, log=log)
    res["checkpoint"] = str(checkpoint)
    where = Path(out) if out else (Path(checkpoint) if Path(checkpoint).is_dir() else Path(cfg.out))
    path = write_probe(res, guard_probe_out(where))
    log(format_probe(res))
    log(f"probe: {path} ({res['seconds']:.0f}s)")
    return res


def guard_probe_out(out: str | Path) -> Path:
    """Where ``probe.json`` / ``probe.md`` may go: a new or empty folder, a probe folder, or a
    folder hindsearch made that a probe belongs in (a model or checkpoint folder, a run or
    comparison folder, one with an earlier probe). Anything else (a user's folder, the current
    folder) is refused in one line, before the probe runs."""
    from hindsearch.fsutil import UnsafeOutput, check_replaceable, claim_output, output_kind

    def ours(f: Path) -> bool:
        kind = output_kind(f)
        # one of ours, or a model
        return (kind in ("probe", "run", "compare")
                or (kind is None and (f / "config.json").exists()))

    if not str(out).strip():
        raise UnsafeOutput("--out is empty (it would write into the current folder); give a new "
                           "folder")
    folder = check_replaceable(out, ours, "probe folder")
    if not folder.exists() or not any(folder.iterdir()):
        claim_output(folder, "probe")
    return folder


def _igsd_only(cfg: Any, engine: Any, recs: Any, settings: list[str], checkpoint: str,
               out: str | Path | None, log: Any) -> dict[str, Any]:
    """IGSD's proposal-and-gate probe alone: ``igsd.json`` + ``igsd.md`` in the output folder."""
    import json
    import time

    import torch

    t0 = time.time()
    with torch.no_grad():
        trajs = engine.rollout(list(recs), num_generations=cfg.rollout.num_generations,
                               seed=cfg.train.seed)
        log(f"probe: {sum(t.failed for t in trajs)} failed of {len(trajs)} sampled rollouts "
            f"({len(recs)} questions x {cfg.rollout.num_generations})")
        res = igsd_settings_probe(engine, trajs, cfg, settings, seed=cfg.train.seed, log=log)
    where = guard_probe_out(Path(out) if out
                            else (Path(checkpoint) if Path(checkpoint).is_dir() else Path(cfg.out)))
    doc = {"checkpoint": str(checkpoint), "rollouts": len(trajs),
           "failed": sum(t.failed for t in trajs), "settings": res, "seconds": time.time() - t0}
    (where / "igsd.json").write_text(json.dumps(doc, indent=1))
    table = format_igsd_settings(res)
    (where / "igsd.md").write_text(table + "\n")
    log(table)
    return doc
