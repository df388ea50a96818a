"""Reading a run folder for the report: ``metrics.jsonl``, ``samples.jsonl``, ``summary.json``,
``results.json`` (tolerant: a bad line is named and skipped), and the metric series and groups
plotted from them."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from collections.abc import Iterator
from typing import Any

from hindsearch.fsutil import NotRegularFile, iter_jsonl, open_regular

# --------------------------------------------------------------------------- values
MAX_INT_DIGITS = 308
"""JSON integers with more digits than this are not numbers to the report (no float holds them):
they are read as ``OutOfRange`` text, shown as such and never plotted (Python refuses to even parse
past 4,300 digits)."""

PLOT_LIMIT = 1e100
"""Numbers beyond this magnitude are shown in the tables but left out of the plots (matplotlib's
axis arithmetic overflows near 1e308)."""

MAX_BAD_SHOWN = 20
"""Unreadable lines listed by name on the page (all of them are counted)."""

MAX_DOC_BYTES = 64 << 20
"""A whole-file read (``config.toml``, ``summary.json``, ``results.json``, a marker) over this is
not read."""

MAX_JSONL_BYTES = 2 << 30
"""A JSONL file is read up to this many bytes (the rest is named as not read), a line up to
``MAX_LINE_BYTES``."""

MAX_LINE_BYTES = 64 << 20


class OutOfRange(str):
    """A JSON integer too long for a float, kept as its leading digits and its length."""

    @classmethod
    def of(cls, digits: str) -> "OutOfRange":
        n = len(digits.lstrip("-"))
        return cls(f"{digits[:13]}… ({n}-digit integer, out of range)")


def _parse_int(s: str) -> int | OutOfRange:
    return int(s) if len(s.lstrip("-")) <= MAX_INT_DIGITS else OutOfRange.of(s)


def parse_json(text: str) -> Any:
    """``json.loads`` with integers past ``MAX_INT_DIGITS`` read as ``OutOfRange``; raises
    ``ValueError`` with the reason (``RecursionError`` of a deeply nested value included)."""
    try:
        return json.loads(text, parse_int=_parse_int)
    except json.JSONDecodeError as e:
        raise ValueError(f"invalid JSON: {e.msg} (column {e.colno})") from None
    except RecursionError:
        raise ValueError("nested too deep to read") from None


def clean(s: str) -> str:
    """``s`` as text that encodes to UTF-8: a lone surrogate (from JSON ``\\ud800`` or a non-UTF-8
    file name) is shown as its escape ``\\ud800``."""
    try:
        s.encode("utf-8")
        return s
    except UnicodeEncodeError:
        return s.encode("utf-8", "backslashreplace").decode("utf-8")


def text(v: Any) -> str:
    """Any value read from a run folder as display text (never raises: a value too nested to print
    says so)."""
    if isinstance(v, str):
        return clean(v)
    if isinstance(v, float) or is_number(v):
        return show_number(v)
    try:
        return clean(str(v))
    except (RecursionError, ValueError):
        return f"({type(v).__name__} too nested to show)"


def is_number(v: Any) -> bool:
    """An int or float (NaN, infinities and huge ints included; bools are not numbers)."""
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def finite(v: Any) -> float | None:
    """``v`` as a finite float, else None (not a number, NaN, an infinity, or an int past the float
    range)."""
    if not is_number(v):
        return None
    try:
        f = float(v)
    except OverflowError:
        return None
    return f if math.isfinite(f) else None


def plottable(v: Any) -> bool:
    """A number the plots can draw: finite and within ``PLOT_LIMIT``."""
    f = finite(v)
    return f is not None and abs(f) <= PLOT_LIMIT


def show_number(v: Any, spec: str = ".4g") -> str:
    """A number as text: ``NaN``, ``inf``, ``-inf`` as such, an out-of-range int as its length, else
    ``spec``."""
    if isinstance(v, OutOfRange):
        return str(v)
    if not is_number(v):
        return text(v)
    if isinstance(v, int):
        return str(v) if abs(v) < 10 ** 30 else f"{str(v)[:13]}… ({len(str(abs(v)))}-digit integer)"
    if math.isnan(v):
        return "NaN"
    if math.isinf(v):
        return "inf" if v > 0 else "-inf"
    return format(v, spec)


def scaled(v: Any, scale: float, spec: str) -> str:
    """``scale * v`` formatted with ``spec`` when finite; otherwise ``v`` shown as such
    (``show_number``)."""
    f = finite(v)
    if f is None or not math.isfinite(f * scale) or abs(f * scale) >= 1e15:
        return show_number(v)
    return format(f * scale, spec)


# --------------------------------------------------------------------------- loading
@dataclass
class Run:
    """What a run folder holds (anything missing is empty)."""

    path: Path
    metrics: list[dict[str, Any]] = field(default_factory=list)
    samples: list[dict[str, Any]] = field(default_factory=list)
    config_text: str = ""
    results: dict[str, Any] = field(default_factory=dict)
    summary: dict[str, Any] = field(default_factory=dict)
    marker: dict[str, Any] = field(default_factory=dict)
    """``.hindsearch-output.json``: when the run started (``created``), its ``provenance`` (commit,
    machine)."""
    config: dict[str, Any] = field(default_factory=dict)
    """``config.toml`` parsed ({} when absent or unreadable: the page says why)."""
    bad_lines: list[str] = field(default_factory=list)


def _reason(e: BaseException) -> str:
    return text(str(e))[:200]


def _parse_row(line: str) -> Any:
    # iter_jsonl names a decode error as parse_json does
    return json.loads(line, parse_int=_parse_int)


def run_rows(path: Path, bad: list[str], name: str | None = None) -> Iterator[dict[str, Any]]:
    """The objects of a run folder's JSONL file, one at a time (nothing when absent):
    ``fsutil.iter_jsonl`` in ``skip-bad`` mode (a bad line is named in ``bad`` and skipped, a FIFO
    is never read), up to ``MAX_JSONL_BYTES``, with integers past ``MAX_INT_DIGITS`` read as
    ``OutOfRange``. ``name``: how the file is named in ``bad`` (default: its path)."""
    for _, row in iter_jsonl(path, "skip-bad", bad, name=name, parse=_parse_row,
                             max_bytes=MAX_JSONL_BYTES, max_line=MAX_LINE_BYTES):
        yield row


def read_text(path: Path, bad: list[str]) -> str:
    """A text file ("" when absent); bytes that are not UTF-8 are shown as U+FFFD and reported in
    ``bad``, as is a file that is not a regular one or is over ``MAX_DOC_BYTES`` ("" then: it is not
    read)."""
    if not path.exists():
        return ""
    try:
        with open_regular(path, MAX_DOC_BYTES) as f:
            data = f.read(MAX_DOC_BYTES + 1)
        if len(data) > MAX_DOC_BYTES:  # grew while read, or a file that says it is empty (/proc)
            raise NotRegularFile(f"over the {MAX_DOC_BYTES >> 20} MiB this reads; not read")
    except NotRegularFile as e:
        bad.append(f"{path}: {e}")
        return ""
    except OSError as e:
        bad.append(f"{path}: unreadable ({type(e).__name__}: {_reason(e)})")
        return ""
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        line = data.count(b"\n", 0, e.start) + 1
        bad.append(f"{path}:{line}: not UTF-8 (byte 0x{data[e.start]:02x}); shown with \ufffd in "
                   "its place")
        return data.decode("utf-8", "replace")


def read_json(path: Path, bad: list[str]) -> dict[str, Any]:
    """A JSON object file ({} when absent; a parse error or a non-object is reported in ``bad``)."""
    if not path.exists():
        return {}
    errs: list[str] = []
    raw = read_text(path, errs)
    if errs:
        bad.extend(errs)
        return {}
    try:
        obj = parse_json(raw)
    except ValueError as e:
        bad.append(f"{path}: {_reason(e)}")
        return {}
    if not isinstance(obj, dict):
        bad.append(f"{path}: not a JSON object")
        return {}
    return obj


def load_run(path: str | Path) -> Run:
    """Read ``metrics.jsonl``, ``samples.jsonl``, ``config.toml``, ``results.json`` and
    ``summary.json`` of a run folder."""
    p = Path(path)
    if not p.is_dir():
        raise FileNotFoundError(f"run folder not found: {p}")
    run = Run(path=p)
    run.metrics = list(run_rows(p / "metrics.jsonl", run.bad_lines))
    run.samples = list(run_rows(p / "samples.jsonl", run.bad_lines))
    run.config_text = read_text(p / "config.toml", run.bad_lines)
    run.results = read_json(p / "results.json", run.bad_lines)
    run.summary = read_json(p / "summary.json", run.bad_lines)
    if not isinstance(run.summary.get("dev"), dict) and (
            dev := finished_dev_evals(p, run.bad_lines)):
        # a stopped run (no summary.json yet): the stage evaluations that had finished
        run.summary["dev"] = dev
    run.marker = read_json(p / MARKER, run.bad_lines)
    run.config = parse_toml(run.config_text, p / "config.toml", run.bad_lines)
    load_run_plugins(run.config, p / "config.toml", run.bad_lines)
    return run


def finished_dev_evals(run_dir: Path, bad: list[str]) -> dict[str, dict[str, Any]]:
    """The dev rows (``eval.bench_row``) of the stage evaluations a run finished
    (``RUN/eval/<stage>/summary.json``, written when a stage's evaluation ends), by stage in the
    job's order: what a stopped run's summary would hold."""
    from hindsearch.eval import bench_row
    from hindsearch.train.dev_eval import STAGES

    out: dict[str, dict[str, Any]] = {}
    for stage in STAGES:
        f = run_dir / "eval" / stage / "summary.json"
        if f.is_file():
            res = read_json(f, bad)
            dev = (res.get("benchmarks", {}).get("dev") if isinstance(res.get("benchmarks"), dict)
                   else None)
            if isinstance(dev, dict):
                out[stage] = bench_row(dev)
    return out


def load_run_plugins(config: dict[str, Any], path: Path, bad: list[str]) -> None:
    """Import the plugins a run's config names (its methods' panels are then known); one that cannot
    be imported is reported in ``bad`` (the page says why) and its panels are left out."""
    from hindsearch.config.registry import load_plugin

    plugins = config.get("plugins", [])
    for spec in plugins if isinstance(plugins, list) else []:
        try:
            load_plugin(str(spec))
        # a user's module: any error is reported, the page still renders
        except Exception as e:  # noqa: BLE001
            bad.append(f"{path}: plugin {spec!r} cannot be imported ({type(e).__name__}: {e})")


MARKER = ".hindsearch-output.json"
"""The marker every hindsearch output folder holds (``fsutil.OUTPUT_MARKER``)."""


def parse_toml(raw: str, path: Path, bad: list[str]) -> dict[str, Any]:
    """``raw`` TOML as a dict ({} when empty; a parse error is reported in ``bad``)."""
    import tomllib

    if not raw.strip():
        return {}
    try:
        return tomllib.loads(raw)
    except (tomllib.TOMLDecodeError, RecursionError) as e:
        bad.append(f"{path}: not TOML ({_reason(e)})")
        return {}


def is_eval_dir(path: Path) -> bool:
    """An evaluation folder (``hindsearch eval --out``): its marker says ``eval``, or it holds the
    ``summary.json`` of an evaluation (``benchmarks``) with ``trajectories.jsonl`` and no
    ``metrics.jsonl``."""
    if (path / "metrics.jsonl").exists():
        return False
    if read_json(path / MARKER, []).get("kind") == "eval":
        return True
    return (path / "trajectories.jsonl").exists() and isinstance(
        read_json(path / "summary.json", []).get("benchmarks"), dict)


def is_compare_dir(path: Path) -> bool:
    """A compare dir holds ``results.md`` or sub-folders that are runs (``metrics.jsonl``) and no
    metrics itself."""
    if (path / "metrics.jsonl").exists():
        return False
    return (path / "results.md").exists() or any((d / "metrics.jsonl").exists()
                                                 for d in sub_runs(path))


def sub_runs(path: Path) -> list[Path]:
    return sorted(d for d in path.iterdir() if d.is_dir() and (d / "metrics.jsonl").exists())


# --------------------------------------------------------------------------- metrics
def step_of(r: dict[str, Any], i: int) -> float:
    """The x of row ``i``: its ``step`` when plottable, else the row number (1-based)."""
    step = r.get("step")
    return float(step) if plottable(step) else float(i + 1)


def is_value(v: Any) -> bool:
    """A metric value as the report shows it: a number (NaN and infinities too) or an out-of-range
    integer."""
    return is_number(v) or isinstance(v, OutOfRange)


def series(rows: list[dict[str, Any]], key: str) -> tuple[list[float], list[float]]:
    """``(steps, values)`` of a numeric metric over the rows where it is plottable (``plottable``;
    step = ``step`` or row index + 1). The values left out are listed by ``left_out``."""
    xs, ys = [], []
    for i, r in enumerate(rows):
        v = r.get(key)
        if plottable(v):
            xs.append(step_of(r, i))
            ys.append(float(v))
    return xs, ys


def left_out(rows: list[dict[str, Any]], key: str) -> list[str]:
    """``"<value> (step N)"`` for each value of ``key`` that is a number but not plottable (NaN,
    inf, past ``PLOT_LIMIT``, an out-of-range integer)."""
    out = []
    for i, r in enumerate(rows):
        v = r.get(key)
        if is_value(v) and not plottable(v):
            out.append(f"{show_number(v)} (step "
                       f"{show_number(r['step']) if is_value(r.get('step')) else i + 1})")
    return out


def metric_groups(keys: set[str]) -> dict[str, list[str]]:
    """Group logged metric names into the report's panels (a panel lists the keys it found); the
    headline panels (reward, EM) come first, then the losses and each registered term's own panels
    (``hindsight.registry.Metrics``)."""
    from hindsearch.hindsight.registry import term_methods

    def first(*cands: str) -> list[str]:
        for c in cands:
            for k in (f"rollout/{c}", c):
                if k in keys:
                    return [k]
        return []

    def present(*cands: str) -> list[str]:
        return [x for c in cands for x in first(c)]

    numeric = sorted(keys)
    terms = [(s.term.name, s.metrics) for s in term_methods()]
    term_losses = {f"{name}/{m.loss}" for name, m in terms}
    groups = {
        "Reward": first("reward_mean", "reward", "rewards/em_reward/mean") + first("reward_std"),
        "Exact match (training rollouts, greedy dev)": first("em", "train/em")
        + [k for k in numeric if k.startswith("dev") and "em" in k],
        "Searches per rollout": first("searches_per_rollout", "num_searches"),
        "Validity": present("validity_rate", "invalid_turn_rate", "answered_rate")
        + present("completions/clipped_ratio"), "Loss parts": [
            k for k in numeric if k == "loss" or k.startswith("loss/") or k in term_losses],
    }
    for name, m in terms:
        groups.update({title: present(*(f"{name}/{k}" for k in ks))
                       for title, ks in m.panels.items()})
    groups["Share of the update"] = present(*(f"{name}/grad_share" for name, _ in terms))
    groups["Lengths"] = present("completion_len", "generated_len", "prompt_len")
    return groups


CLIP_KEYS = ("clip_ratio/region_mean", "clip_ratio/low_mean", "clip_ratio/high_mean",
             "clip_ratio/low_min", "clip_ratio/high_max")
"""TRL's PPO-clip statistics, in the order drawn: the share of tokens whose ratio was clipped (both
sides), below 1 - epsilon, above 1 + epsilon, and the extreme shares over processes."""


def health_groups(keys: set[str]) -> dict[str, list[str]]:
    """The training-health panels (TRL's names in ``metrics.jsonl``): learning rate, gradient norm,
    KL to the reference model, token entropy and the clip ratios (any other ``clip_ratio/*`` after
    the known ones)."""
    clip = [k for k in CLIP_KEYS if k in keys] + sorted(
        k for k in keys if k.startswith("clip_ratio/") and k not in CLIP_KEYS)
    return {"Learning rate": [k for k in ("learning_rate",) if k in keys],
            "Gradient norm (before clipping)": [k for k in ("grad_norm",) if k in keys],
            "KL to the reference model": [k for k in ("kl",) if k in keys],
            "Entropy (nats per token)": [k for k in ("entropy",) if k in keys],
            "Clip ratios": clip}


def time_keys(keys: set[str]) -> list[str]:
    """Step time parts (``time/*`` except the wall and CPU totals)."""
    return sorted(k for k in keys if k.startswith("time/")
                  and k not in ("time/step", "time/step_cpu"))


def summary_rows(rows: list[dict[str, Any]]) -> list[list[str]]:
    """``[metric, first, last, median]`` of the main metrics and the step time: first and last as
    logged (NaN, inf or out of range shown as such), the median over the finite values."""
    cands = ("reward_mean", "em", "searches_per_rollout", "validity_rate")
    keys = [x for c in cands for x in (c, f"rollout/{c}") if any(x in r for r in rows)]
    keys += ["time/step"] if any("time/step" in r for r in rows) else []
    out = []
    for k in keys:
        vals = [r[k] for r in rows if is_value(r.get(k))]
        if vals:
            fin = sorted(f for f in map(finite, vals) if f is not None)
            out.append([k, show_number(vals[0], ".3g"), show_number(vals[-1], ".3g"),
                        format(fin[len(fin) // 2], ".3g") if fin else "-"])
    return out
