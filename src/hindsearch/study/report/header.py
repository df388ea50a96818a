"""The header of a run's (or an evaluation's) page: what a GRPO user checks first.

A run: model, method, LoRA, steps, questions and rollouts per step, wall time, date, git commit and
hardware, read from ``config.toml``, ``summary.json``, ``metrics.jsonl`` and the folder's marker
(``.hindsearch-output.json``: its ``created`` time and the ``provenance`` that
``fsutil.claim_output`` records: the hindsearch commit and the machine). An evaluation folder:
model, decoding, questions, retriever, date, commit, hardware. A value no file holds is None (the
page says "not recorded": runs from before the marker recorded provenance have no commit and no
hardware).
"""

from __future__ import annotations

import math
from typing import Any

from hindsearch.study.report.runs import Run, finite, is_value, step_of, text


def dig(d: Any, *keys: str) -> Any:
    """``d[k1][k2]...``, None where a level is missing or not a table."""
    for k in keys:
        if not isinstance(d, dict):
            return None
        d = d.get(k)
    return d


def row(label: str, value: Any, note: Any = None) -> dict[str, Any]:
    """One header line: ``value`` None shows "not recorded"; ``note`` is the small text after it."""
    return {"label": label, "value": None if value is None or value == "" else text(value),
            "note": None if note is None or note == "" else text(note)}


def duration(seconds: Any) -> str | None:
    """``45 s``, ``18.8 min`` or ``2.31 h`` (None when not a finite number)."""
    s = finite(seconds)
    if s is None or s < 0:
        return None
    if s < 120:
        return f"{s:.0f} s" if s >= 10 else f"{s:.2g} s"
    return f"{s / 60:.1f} min" if s < 2 * 3600 else f"{s / 3600:.2f} h"


def when(created: Any) -> str | None:
    """The marker's ``2026-12-01T23:04:50Z`` as ``2026-12-01 23:04 UTC``."""
    if not isinstance(created, str) or len(created) < 16 or created[10] != "T":
        return None if not created else text(created)
    return f"{created[:10]} {created[11:16]} UTC"


def lora_text(cfg: dict[str, Any]) -> tuple[str | None, str | None]:
    lora = dig(cfg, "model", "lora")
    if not isinstance(lora, dict) or not is_value(lora.get("r")):
        return None, None
    r = lora["r"]
    if not finite(r):
        return "off", "full fine-tuning: model.lora.r = 0"
    targets = lora.get("target_modules")
    targets = ", ".join(text(t) for t in targets) if isinstance(targets, list) else text(targets)
    return (f"r = {text(r)}", f"alpha {text(lora.get('alpha', '?'))}, dropout "
                              f"{text(lora.get('dropout', '?'))}, targets {targets}")


def commit_text(marker: dict[str, Any]) -> tuple[str | None, str | None]:
    """The hindsearch commit a folder was made with (12 hex digits) and whether tracked files were
    edited."""
    src = dig(marker, "provenance", "hindsearch")
    if not isinstance(src, dict):
        return None, None
    commit, version = src.get("commit"), src.get("version")
    note = f"hindsearch {text(version)}" if version else None
    if not isinstance(commit, str) or not commit:
        return None, (note + "; not a git checkout" if note else None)
    dirty = src.get("dirty")
    extra = {True: "with uncommitted changes to tracked files", False: "clean checkout"}.get(dirty)
    return commit[:12], "; ".join(x for x in (extra, note) if x) or None


def hardware_text(marker: dict[str, Any]) -> str | None:
    """The machine of the marker's ``provenance.host``: CPU and cores, memory, GPUs, torch /
    transformers / TRL."""
    h = dig(marker, "provenance", "host")
    if not isinstance(h, dict):
        return None
    parts = []
    cpu = text(h["cpu"]) if h.get("cpu") else "CPU"
    cores = h.get("cpus")
    if is_value(cores):
        usable = h.get("cpus_usable")
        cpu += f", {text(cores)} cores" + (f" ({text(usable)} usable)" if is_value(usable)
                                           and usable != cores else "")
    parts.append(cpu)
    if is_value(h.get("memory_gb")):
        parts.append(f"{text(h['memory_gb'])} GB RAM")
    gpus = h.get("gpus")
    if isinstance(gpus, list) and gpus:
        names: dict[str, int] = {}
        for g in gpus:
            if isinstance(g, dict):
                mem = finite(g.get("memory_mib"))
                name = text(g.get("name", "GPU")) + (f" ({mem / 1024:.0f} GiB)" if mem else "")
                names[name] = names.get(name, 0) + 1
        parts.append("GPUs: " + ", ".join(f"{n} x {k}" for k, n in names.items()))
    else:
        parts.append("no GPU")
    if is_value(h.get("world_size")) and h.get("world_size") != 1:
        parts.append(f"{text(h['world_size'])} processes")
    libs = [f"{k} {text(h[k])}" for k in ("torch", "transformers", "trl") if h.get(k)]
    if libs:
        parts.append(", ".join(libs))
    if h.get("os"):
        parts.append(f"{text(h['os'])}, Python {text(h.get('python', '?'))}")
    return "; ".join(parts)


def logged_steps(run: Run) -> int:
    steps = [step_of(r, i) for i, r in enumerate(run.metrics)]
    return int(max(steps)) if steps else 0


def wall_time(run: Run) -> tuple[str | None, str | None]:
    """``summary.json``'s total (with the RL stage and the median step), else the sum of the logged
    step times."""
    timings = run.summary.get("timings_s")
    steps = sorted(f for f in (finite(r.get("time/step")) for r in run.metrics) if f is not None)
    median = f"median step {duration(steps[len(steps) // 2])}" if steps else None
    if isinstance(timings, dict) and duration(timings.get("total")):
        rl = duration(timings.get("rl"))
        return duration(timings["total"]), "; ".join(x for x in (f"RL {rl}" if rl else None, median)
                                                     if x) or None
    if steps:
        return (f"at least {duration(math.fsum(steps))}",
                "no summary.json (the run has not finished): the sum of the logged step times"
                + (f"; {median}" if median else ""))
    return None, None


def run_header(run: Run) -> list[dict[str, Any]]:
    """The header lines of one run (``row`` dicts)."""
    cfg, summary, marker = run.config, run.summary, run.marker
    model = dig(cfg, "model", "name")
    model_note = ", ".join(f"{k} {text(v)}" for k, v in (("dtype", dig(cfg, "model", "dtype")),
                                                          ("device", dig(cfg, "model", "device")))
                           if v)
    method = summary.get("method") or cfg.get("method")
    lora, lora_note = lora_text(cfg)
    configured = summary.get("steps") if is_value(summary.get("steps")) else dig(
        cfg, "train", "steps")
    logged = logged_steps(run)
    if is_value(configured):
        steps = f"{logged} of {text(configured)} logged"
    else:
        steps = f"{logged} logged" if logged else None
    changes = marker.get("config_changes")
    steps_note = (f"config changed on resume {len(changes)} time{'s' * (len(changes) != 1)}"
                  if isinstance(changes, list) and changes else None)
    q, g = dig(cfg, "train", "questions_per_step"), dig(cfg, "rollout", "num_generations")
    per_step = None
    if finite(q) and finite(g):
        per_step = f"{text(q)} questions × {text(g)} rollouts = {text(q * g)} rollouts"
    wall, wall_note = wall_time(run)
    commit, commit_note = commit_text(marker)
    resumes = ([r for r in marker.get("resumes", []) if isinstance(r, dict)]
               if isinstance(marker.get("resumes"), list) else [])
    if resumes:  # a resume on another commit or machine is named beside the start's
        last_commit, _ = commit_text(resumes[-1])
        last_hw = hardware_text(resumes[-1])
        said = [f"resumed {len(resumes)} time{'s' * (len(resumes) != 1)}"]
        if last_commit and last_commit != commit:
            said.append(f"last resume on commit {last_commit}")
        if last_hw and last_hw != hardware_text(marker):
            said.append(f"last resume on {last_hw}")
        commit_note = "; ".join(x for x in (commit_note, *said) if x)
    hw = hardware_text(marker)
    hw_note = []
    if dig(cfg, "model", "device"):
        hw_note.append(f"model.device = {text(dig(cfg, 'model', 'device'))}")
    if is_value(dig(cfg, "train", "threads")):
        hw_note.append(f"train.threads = {text(dig(cfg, 'train', 'threads'))}")
    elif is_value(dig(summary, "threads", "count")):  # the count the run chose itself
        count, why = dig(summary, "threads", "count"), dig(summary, "threads", "why")
        hw_note.append(f"torch threads {text(count)}"
                       + (f" ({text(why)})" if isinstance(why, str) and why else ""))
    peak = finite(dig(summary, "memory", "peak_rss_mb"))
    if peak:
        hw_note.append(f"peak RSS {peak / 1024:.1f} GiB")
    return [row("model", model, model_note), row("method", method), row("LoRA", lora, lora_note),
            row("steps", steps, steps_note), row("per step", per_step),
            row("wall time", wall, wall_note), row("started", when(marker.get("created"))),
            row("git commit", commit, commit_note), row("hardware", hw, "; ".join(hw_note))]


def describe_model(m: Any) -> str | None:
    """An evaluation marker's ``model`` (``eval.model_identity``): the hub name or the folder."""
    if isinstance(m, dict):
        name = m.get("name") or m.get("path")
        gguf = f" ({text(m['gguf_file'])})" if m.get("gguf_file") else ""
        return None if name is None else text(name) + gguf
    return None if m is None else text(m)


def describe_retriever(marker: dict[str, Any]) -> str | None:
    r = marker.get("retriever")
    if isinstance(r, dict):
        return ", ".join(f"{text(k)} {text(v)}" for k, v in r.items()
                         if isinstance(v, (str, int, float)))
    ret = dig(marker, "config", "retrieval")
    if isinstance(ret, dict) and ret.get("kind"):
        return f"{text(ret['kind'])}, top-{text(ret.get('topk', '?'))}" + (
            f", {text(ret['url'])}" if ret.get("url") else "")
    return None


def eval_header(summary: dict[str, Any], marker: dict[str, Any]) -> list[dict[str, Any]]:
    """The header lines of an evaluation folder."""
    greedy = summary.get("greedy", dig(marker, "settings", "greedy"))
    seed = summary.get("seed", dig(marker, "settings", "seed"))
    decoding = None if greedy is None else ("greedy" if greedy else f"sampled, seed {text(seed)}")
    overall = summary.get("overall") if isinstance(summary.get("overall"), dict) else {}
    benches = summary.get("benchmarks") if isinstance(summary.get("benchmarks"), dict) else {}
    n = overall.get("n")
    questions = (None if n is None else f"{text(n)} over {len(benches)} "
                                        f"benchmark{'s' * (len(benches) != 1)}")
    roll = dig(marker, "config", "rollout")
    roll_note = None
    if isinstance(roll, dict):
        roll_note = ", ".join(f"{k} {text(roll[k])}"
                              for k in ("max_turns", "max_new_tokens_per_turn", "max_total_tokens")
                              if k in roll)
    model_cfg = dig(marker, "config", "model")
    model_note = ", ".join(f"{k} {text(model_cfg[k])}" for k in ("dtype", "device")
                           if isinstance(model_cfg, dict)
                           and model_cfg.get(k))
    commit, commit_note = commit_text(marker)
    return [row("model", describe_model(marker.get("model")), model_note),
            row("decoding", decoding, roll_note), row("questions", questions),
            row("retriever", describe_retriever(marker)),
            row("evaluated", when(marker.get("created")), "the folder's last (re)start"),
            row("git commit", commit, commit_note), row("hardware", hardware_text(marker))]
