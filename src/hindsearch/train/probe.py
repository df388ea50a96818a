"""Probe a checkpoint (``hindsearch probe``, ``compare --probe``): is its hindsight teacher better than its student?

Runs ``hindsearch.hindsight.probe.run_probe`` on failed greedy training rollouts of one checkpoint (the preset's
warm-up, built and cached when none is given) and writes ``probe.json`` + ``probe.md`` (one table) into ``--out``
(default: the checkpoint folder, or the config's run folder when the checkpoint is the preset's warm-up). The
command's flags are in ``hindsearch.cli.probe``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any


def probe_checkpoint(cfg: Any, checkpoint: str | None, n: int = 64, questions: int = 256, samples: int = 4,
                     out: str | Path | None = None, log: Any = print,
                     loaded: tuple[Any, Any] | None = None, igsd_settings: list[str] | None = None) -> dict[str, Any]:
    """Load the checkpoint (or warm the preset up), probe it, write ``probe.json``; returns the result.
    ``loaded``: the checkpoint's model and tokenizer, when the caller has them (not loaded again).
    ``igsd_settings``: run only IGSD's proposal-and-gate probe, once per setting, on sampled training-like
    rollouts (``rollout.num_generations`` per question, as a training step draws them)."""
    from dataclasses import replace

    from hindsearch.hindsight.probe import format_probe, run_probe, write_probe
    from hindsearch.hindsight.registry import resolve_methods
    from hindsearch.models import cache_dir, load_policy
    from hindsearch.inputs import eval_engine, prepare
    from hindsearch.train.warmup import ensure_warmup, select_records

    resolve_methods(cfg)
    setup = prepare(cfg)
    train, retriever = setup.train, setup.retriever
    if checkpoint is None:
        model, tok = load_policy(cfg.model)
        if cfg.warmup.enabled:
            checkpoint = str(ensure_warmup(cfg, model, tok, retriever, train, cache_dir() / "warmup"))
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
    """Where ``probe.json`` / ``probe.md`` may go: a new or empty folder, a probe folder, or a folder hindsearch
    made that a probe belongs in (a model or checkpoint folder, a run or comparison folder, one with an earlier
    probe). Anything else (a user's folder, the current folder) is refused in one line, before the probe runs."""
    from hindsearch.fsutil import UnsafeOutput, check_replaceable, claim_output, output_kind

    def ours(f: Path) -> bool:
        kind = output_kind(f)
        return kind in ("probe", "run", "compare") or (kind is None and (f / "config.json").exists())  # a model

    if not str(out).strip():
        raise UnsafeOutput("--out is empty (it would write into the current folder); give a new folder")
    folder = check_replaceable(out, ours, "probe folder")
    if not folder.exists() or not any(folder.iterdir()):
        claim_output(folder, "probe")
    return folder


def _igsd_only(cfg: Any, engine: Any, recs: Any, settings: list[str], checkpoint: str, out: str | Path | None,
               log: Any) -> dict[str, Any]:
    """IGSD's proposal-and-gate probe alone: ``igsd.json`` + ``igsd.md`` in the output folder."""
    import json
    import time

    import torch

    from hindsearch.hindsight.probe import format_igsd_settings, igsd_settings_probe

    t0 = time.time()
    with torch.no_grad():
        trajs = engine.rollout(list(recs), num_generations=cfg.rollout.num_generations, seed=cfg.train.seed)
        log(f"probe: {sum(t.failed for t in trajs)} failed of {len(trajs)} sampled rollouts "
            f"({len(recs)} questions x {cfg.rollout.num_generations})")
        res = igsd_settings_probe(engine, trajs, cfg, settings, seed=cfg.train.seed, log=log)
    where = guard_probe_out(Path(out) if out else (Path(checkpoint) if Path(checkpoint).is_dir() else Path(cfg.out)))
    doc = {"checkpoint": str(checkpoint), "rollouts": len(trajs), "failed": sum(t.failed for t in trajs),
           "settings": res, "seconds": time.time() - t0}
    (where / "igsd.json").write_text(json.dumps(doc, indent=1))
    table = format_igsd_settings(res)
    (where / "igsd.md").write_text(table + "\n")
    log(table)
    return doc
