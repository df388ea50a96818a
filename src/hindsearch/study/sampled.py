"""Sampled behaviour (``compare --sampled K --states N``): what greedy EM cannot see.

Per run, ``K`` samples per test question (``sampled_rows``: mean EM, pass@K, evidence recall) and
the measures of ``probe.state_measures`` on the start's held-out failed states, written as rows
keyed by ``id`` to ``<run>/eval/sampled-world/per_question.jsonl`` and
``<run>/eval/states/per_state.jsonl``, so that ``study.paired`` can pair two runs item by item.
"""

from __future__ import annotations

import json
import statistics
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from hindsearch.fsutil import iter_jsonl
from hindsearch.records import QARecord
from hindsearch.tables import markdown_table

SAMPLED_FILE = Path("eval") / "sampled-world" / "per_question.jsonl"
STATES_FILE = Path("eval") / "states" / "per_state.jsonl"


def sampled_rows(engine: Any, records: Sequence[QARecord], k: int, seed: int,
                 batch: int = 8) -> list[dict[str, Any]]:
    """``k`` samples per question at the engine's rollout temperature; one row per question (see the
    module doc).

    The questions are rolled out ``batch`` at a time (``batch * k`` rows per call, chunk ``j``
    seeded ``seed + j``): all 600 test questions x 4 samples in one call held 2,400 rows' caches at
    once and were killed for memory (18 GB resident on the micro model)."""
    if batch < 1:
        raise ValueError(f"sampled_rows: batch must be >= 1, got {batch}")
    rows = []
    for j, start in enumerate(range(0, len(records), batch)):
        chunk = list(records[start: start + batch])
        trajs = engine.rollout(chunk, num_generations=k, greedy=False, seed=seed + j)
        for i, r in enumerate(chunk):
            mine = trajs[i * k: (i + 1) * k]
            ems = [float(t.em or 0.0) for t in mine]
            rows.append({"id": r.id, "hops": float(r.hops or 0), "em": statistics.fmean(ems),
                         "pass_k": float(max(ems)),
                         "recall": statistics.fmean(t.evidence_recall for t in mine), "k": k})
    return rows


def write_rows(path: Path, rows: Sequence[dict[str, Any]]) -> None:
    """One JSON object per line, written whole (a temporary file, then a rename)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text("".join(json.dumps(r) + "\n" for r in rows))
    tmp.replace(path)


def read_rows(path: Path) -> dict[str, dict[str, Any]]:
    """``{id: row}`` of a rows file (empty when it does not exist)."""
    out = {}
    for n, row in iter_jsonl(path):
        if "id" not in row:
            raise ValueError(f"{path}:{n}: bad row (no 'id')")
        out[str(row["id"])] = row
    return out


def state_rows(measures: Sequence[dict[str, float]], qids: Sequence[str]) -> list[dict[str, Any]]:
    """``state_measures`` rows with their ids (``<index>:<question id>``: a question may give
    several states)."""
    return [{"id": f"{i}:{q}", **m} for i, (q, m) in enumerate(zip(qids, measures))]


def summary(run_dir: Path) -> dict[str, float]:
    """Means of a run's sampled and state rows: ``sampled_em``, ``sampled_em_2hop``,
    ``pass_k_2hop``, ``sampled_recall``, ``p_search``, ``search_again``, ``hit_missed`` (empty keys
    when a file is missing)."""
    out: dict[str, float] = {}
    q = list(read_rows(run_dir / SAMPLED_FILE).values())
    if q:
        two = [r for r in q if r["hops"] == 2] or [{"em": 0.0, "pass_k": 0.0}]
        out.update(sampled_em=statistics.fmean(r["em"] for r in q),
                   sampled_em_2hop=statistics.fmean(r["em"] for r in two),
                   pass_k_2hop=statistics.fmean(r["pass_k"] for r in two),
                   sampled_recall=statistics.fmean(r["recall"] for r in q), k=float(q[0]["k"]))
    s = list(read_rows(run_dir / STATES_FILE).values())
    if s:
        out.update({k: statistics.fmean(r[k] for r in s)
                    for k in ("p_search", "search_again", "hit_missed")})
        out["states"] = float(len(s))
    return out


SUMMARY_COLUMNS = (("sampled_em", "sampled EM"), ("sampled_em_2hop", "sampled EM 2-hop"),
                   ("pass_k_2hop", "pass@k 2-hop"), ("sampled_recall", "sampled evidence recall"),
                   ("p_search", "P(search again)"), ("search_again", "greedy search again"),
                   ("hit_missed", "bridge hit"))


def summary_markdown(run_dir: Any, methods: Sequence[str], seeds: Sequence[int]) -> str:
    """Per method, mean ± standard deviation over its finished seeds of ``summary`` ('' when no run
    has sampled rows). ``run_dir(method, seed)`` names a run's folder."""
    body = []
    for m in methods:
        sums = [summary(run_dir(m, s)) for s in seeds if (run_dir(m, s) / "done.json").exists()]
        sums = [x for x in sums if x]
        if not sums:
            continue
        cells = []
        for key, _ in SUMMARY_COLUMNS:
            xs = [100 * x[key] for x in sums if key in x]
            cells.append("-" if not xs else f"{statistics.fmean(xs):.1f}"
                         + (f" ± {statistics.stdev(xs):.1f}" if len(xs) > 1 else ""))
        body.append([m, len(sums), *cells])
    if not body:
        return ""
    k = next((summary(run_dir(m, s)).get("k") for m in methods for s in seeds
              if summary(run_dir(m, s)).get("k")), None)
    table = markdown_table(["method", "seeds", *(label for _, label in SUMMARY_COLUMNS)], body)
    return "\n".join([f"### Sampled behaviour on the test split ({int(k) if k else '?'} samples "
                      "per question at the rollout temperature; the held-out failed states of the "
                      "starting checkpoint, temperature 1)", "",
                      table]) + "\n"


# ----------------------------------------------------------------- per run (``hindsearch compare``)
def load_engine(cfg: Any, name: str | Path, index_dir: Any,
                loaded: tuple[Any, Any] | None = None) -> Any:
    """The evaluation engine (``inputs.eval_engine``) of the checkpoint ``name`` over the index
    ``index_dir``; ``loaded = (model, tokenizer)`` reuses a checkpoint the caller has already
    loaded."""
    from dataclasses import replace

    from hindsearch.models import load_policy
    from hindsearch.retrieval.factory import load_retriever
    from hindsearch.inputs import eval_engine

    model, tok = loaded or load_policy(replace(cfg.model, name=str(name), gguf_file=None))
    return eval_engine(cfg, model.eval(), tok, load_retriever(cfg.retrieval, index_dir))


def save_states(cfg: Any, init: str | None, test: tuple[str, list, Any], path: Path, n: int,
                log: Any = print) -> None:
    """The starting checkpoint's held-out failed states (``probe.held_out_states`` on the two-hop
    questions of ``test = (name, records, index_dir)``) into ``path``, with the start's weight
    digest."""
    import torch

    from hindsearch.study.probe import held_out_states
    from hindsearch.models import weights_digest

    name = init or cfg.model.name
    _, records, index_dir = test
    with torch.no_grad():
        st = held_out_states(load_engine(cfg, name, index_dir), records, n)
    path.write_text(json.dumps({"start": str(name), "start_sha256": weights_digest(name),
                                **st.to_dict()}))
    log(f"held-out states: {len(st.records)} two-hop test failures of the start, after their first "
        "information block")


def measure_run(run_dir: Path, cfg: Any, test: tuple[str, list, Any], k: int, seed: int,
                states: Path, loaded: tuple[Any, Any] | None = None) -> None:
    """``k`` samples per test question and the held-out states (``states``, when it exists) of
    ``run_dir/final`` (``loaded``: its model and tokenizer, when the caller has them); rows already
    written are kept."""
    import torch

    from hindsearch.study.probe import HeldOutStates, state_measures

    _, records, index_dir = test
    engine = load_engine(cfg, run_dir / "final", index_dir, loaded)
    with torch.no_grad():
        if k > 0 and not (run_dir / SAMPLED_FILE).exists():
            # as many rows per call as a greedy evaluation batch
            per_call = max(1, cfg.eval.batch_size // k)
            write_rows(run_dir / SAMPLED_FILE,
                       sampled_rows(engine, records, k, seed, batch=per_call))
        if states.exists() and not (run_dir / STATES_FILE).exists():
            st = HeldOutStates.from_dict(json.loads(states.read_text()), records)
            rows = state_rows(state_measures(engine, st, max(k, 4), seed),
                              [r.id for r in st.records])
            write_rows(run_dir / STATES_FILE, rows)
