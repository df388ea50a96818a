"""``hindsearch report RUN_DIR``: one static HTML page per training run or comparison.

The page needs no server and no network: plots are matplotlib PNGs inlined as base64, styles
are inline. It holds

- **metrics plots** from ``metrics.jsonl`` (reward, EM, searches per rollout, loss parts, the
  HindSearch weights and IGSD gate statistics, step time split); a metric that was not logged
  shows "not recorded";
- a **trajectory browser** over ``samples.jsonl``: question, gold answers, each turn (query and
  retrieved titles), the answer and reward; for failed rollouts the judge's critique and the
  per-token teacher-minus-student log-probs on the query tokens (coloured spans: green = the
  teacher, who saw the critique, prefers the token more than the student did; red = less); for
  IGSD the verified pairs (student vs teacher query, what each retrieved, IG_S, IG_T, delta, gate).

A *compare dir* (``hindsearch compare --out DIR``: ``results.md``, ``curves.png`` and one run
folder per (method, seed)) gets the results table and curves, then one section per run.

Field names are read tolerantly (several spellings); whatever is missing is reported as "not
recorded" rather than failing, so the page works for runs of every method and version.

``register(sub)`` adds both ``report`` and ``compare`` (the latter implemented in
``hindsearch.compare``, imported lazily).
"""

from __future__ import annotations

import argparse
import base64
import html
import io
import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ACTION_OR_INFO_RE = re.compile(r"<(search|answer)>(.*?)</\1>|<information>(.*?)(?:</information>|$)", re.DOTALL)
"""Actions and information blocks of a completion (a block cut by the length budget has no closing tag)."""
DOC_TITLE_RE = re.compile(r"Doc \d+\(Title: (.*?)\) ")
MAX_SAMPLES = 200
"""Rollouts shown per run (the most recent steps first are kept when there are more)."""


# --------------------------------------------------------------------------- loading
@dataclass
class Run:
    """What a run folder holds (anything missing is empty)."""

    path: Path
    metrics: list[dict[str, Any]] = field(default_factory=list)
    samples: list[dict[str, Any]] = field(default_factory=list)
    config_text: str = ""
    results: dict[str, Any] = field(default_factory=dict)
    bad_lines: list[str] = field(default_factory=list)


def read_jsonl(path: Path, bad: list[str]) -> list[dict[str, Any]]:
    """Rows of a JSONL file; unparsable lines are reported in ``bad`` as ``file:line: reason`` (not dropped silently)."""
    rows: list[dict[str, Any]] = []
    if not path.exists():
        return rows
    with path.open() as f:
        for i, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                obj = json.loads(line)
            except json.JSONDecodeError as e:
                bad.append(f"{path}:{i}: {e}")
                continue
            if isinstance(obj, dict):
                rows.append(obj)
            else:
                bad.append(f"{path}:{i}: not a JSON object")
    return rows


def load_run(path: str | Path) -> Run:
    """Read ``metrics.jsonl``, ``samples.jsonl``, ``config.toml`` and ``results.json`` of a run folder."""
    p = Path(path)
    if not p.is_dir():
        raise FileNotFoundError(f"run folder not found: {p}")
    run = Run(path=p)
    run.metrics = read_jsonl(p / "metrics.jsonl", run.bad_lines)
    run.samples = read_jsonl(p / "samples.jsonl", run.bad_lines)
    if (p / "config.toml").exists():
        run.config_text = (p / "config.toml").read_text()
    if (p / "results.json").exists():
        try:
            run.results = json.loads((p / "results.json").read_text())
        except json.JSONDecodeError as e:
            run.bad_lines.append(f"{p / 'results.json'}: {e}")
    return run


def is_compare_dir(path: Path) -> bool:
    """A compare dir holds ``results.md`` or sub-folders that are runs (``metrics.jsonl``) and no metrics itself."""
    if (path / "metrics.jsonl").exists():
        return False
    return (path / "results.md").exists() or any((d / "metrics.jsonl").exists() for d in sub_runs(path))


def sub_runs(path: Path) -> list[Path]:
    return sorted(d for d in path.iterdir() if d.is_dir() and (d / "metrics.jsonl").exists())


# --------------------------------------------------------------------------- metrics
def pick(d: dict[str, Any], *names: str, default: Any = None) -> Any:
    """The value of the first key of ``names`` present in ``d`` (and not None)."""
    for n in names:
        if n in d and d[n] is not None:
            return d[n]
    return default


def series(rows: list[dict[str, Any]], key: str) -> tuple[list[float], list[float]]:
    """``(steps, values)`` of a numeric metric over the rows that have it (step = ``step`` or row index + 1)."""
    xs, ys = [], []
    for i, r in enumerate(rows):
        v = r.get(key)
        if isinstance(v, (int, float)) and not isinstance(v, bool):
            xs.append(float(r.get("step", i + 1)))
            ys.append(float(v))
    return xs, ys


def metric_groups(keys: set[str]) -> dict[str, list[str]]:
    """Group logged metric names into the report's panels (a panel lists the keys it found)."""

    def first(*cands: str) -> list[str]:
        for c in cands:
            for k in (f"rollout/{c}", c):
                if k in keys:
                    return [k]
        return []

    def present(*cands: str) -> list[str]:
        return [x for c in cands for x in first(c)]

    numeric = sorted(keys)
    return {
        "Reward": first("reward_mean", "reward", "rewards/em_reward/mean") + first("reward_std"),
        "Exact match (training rollouts)": first("em", "train/em") + [k for k in numeric if k.startswith("dev") and "em" in k],
        "Searches per rollout": first("searches_per_rollout", "num_searches"),
        "Validity": present("validity_rate", "invalid_turn_rate", "answered_rate"),
        "Loss parts": [k for k in numeric if k == "loss" or k.startswith("loss/") or k in ("hind/L_hind", "igsd/L_igsd")],
        "HindSearch weights": present("hind/mean_w", "hind/frac_w_pos", "hind/mean_lT_minus_lS", "hind/critique_minus_neutral",
                                      "hind/failed_frac"),
        "Share of the update": present("hind/grad_share", "igsd/grad_share"),
        "IGSD gate statistics": [k for k in numeric if k.startswith("igsd/") and any(s in k for s in ("gate", "delta"))],
        "Lengths": present("completion_len", "generated_len", "prompt_len"),
    }


def time_keys(keys: set[str]) -> list[str]:
    """Step time parts (``time/*`` except the wall and CPU totals)."""
    return sorted(k for k in keys if k.startswith("time/") and k not in ("time/step", "time/step_cpu"))


def fig_to_b64(fig: Any) -> str:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=80, bbox_inches="tight")
    import matplotlib.pyplot as plt

    plt.close(fig)
    return base64.b64encode(buf.getvalue()).decode()


def line_plot(rows: list[dict[str, Any]], keys: list[str], title: str) -> str | None:
    """Base64 PNG of the ``keys`` against step (None when none has a value)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    data = [(k, *series(rows, k)) for k in keys]
    data = [d for d in data if d[1]]
    if not data:
        return None
    fig, ax = plt.subplots(figsize=(4.2, 2.6))
    for k, xs, ys in data:
        ax.plot(xs, ys, marker="o" if len(xs) < 30 else None, ms=3, label=k)
    ax.set_title(title, fontsize=10)
    ax.set_xlabel("step", fontsize=8)
    ax.tick_params(labelsize=7)
    ax.legend(fontsize=6, framealpha=0.6)
    ax.grid(alpha=0.3)
    return fig_to_b64(fig)


def time_plot(rows: list[dict[str, Any]], keys: list[str]) -> str | None:
    """Base64 PNG: stacked bars of the step time split (seconds) per step."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    steps = [float(r.get("step", i + 1)) for i, r in enumerate(rows)]
    if not keys or not rows:
        return None
    fig, ax = plt.subplots(figsize=(4.2, 2.6))
    bottom = [0.0] * len(rows)
    for k in keys:
        vals = [float(r.get(k) or 0.0) for r in rows]
        ax.bar(steps, vals, bottom=bottom, label=k.removeprefix("time/"))
        bottom = [b + v for b, v in zip(bottom, vals)]
    ax.set_title("Step time split (s)", fontsize=10)
    ax.set_xlabel("step", fontsize=8)
    ax.tick_params(labelsize=7)
    ax.legend(fontsize=6)
    return fig_to_b64(fig)


def summary_table(rows: list[dict[str, Any]]) -> str:
    """Median step time and first/last values of the main metrics."""
    cands = ("reward_mean", "em", "searches_per_rollout", "validity_rate")
    keys = [x for c in cands for x in (c, f"rollout/{c}") if any(x in r for r in rows)]
    keys += ["time/step"] if any("time/step" in r for r in rows) else []
    if not keys:
        return "<p class=nr>not recorded</p>"
    out = ["<table><tr><th>metric</th><th>first</th><th>last</th><th>median</th></tr>"]
    for k in keys:
        _, ys = series(rows, k)
        if not ys:
            continue
        med = sorted(ys)[len(ys) // 2]
        out.append(f"<tr><td>{html.escape(str(k))}</td><td>{ys[0]:.3g}</td><td>{ys[-1]:.3g}</td><td>{med:.3g}</td></tr>")
    out.append("</table>")
    return "".join(out)


def metrics_section(run: Run) -> str:
    """HTML of the metrics panels of one run."""
    if not run.metrics:
        return "<h3>Metrics</h3><p class=nr>not recorded (no metrics.jsonl rows)</p>"
    keys = {k for r in run.metrics for k, v in r.items() if isinstance(v, (int, float)) and not isinstance(v, bool)}
    parts = [f"<h3>Metrics</h3><p>{len(run.metrics)} logged steps.</p>", summary_table(run.metrics), "<div class=grid>"]
    for title, ks in metric_groups(keys).items():
        img = line_plot(run.metrics, ks, title) if ks else None
        parts.append(_panel(title, img))
    parts.append(_panel("Step time split", time_plot(run.metrics, time_keys(keys))))
    parts.append("</div>")
    return "".join(parts)


def _panel(title: str, img: str | None) -> str:
    body = f'<img alt="{html.escape(title)}" src="data:image/png;base64,{img}">' if img else "<p class=nr>not recorded</p>"
    return f'<div class=panel data-panel="{html.escape(title)}"><b>{html.escape(title)}</b><br>{body}</div>'


# --------------------------------------------------------------------------- trajectories
def turns_of(sample: dict[str, Any]) -> list[dict[str, Any]]:
    """The turns of a sample as ``{"action", "content", "titles"}``.

    From ``turns`` (``Trajectory.to_dict``) when present, else parsed from the completion text:
    each ``<search>``/``<answer>`` action, with the titles of the ``<information>`` block after it.
    """
    if isinstance(sample.get("turns"), list) and sample["turns"]:
        return [{"action": t.get("action", "?"), "content": t.get("content", ""),
                 "titles": list(t.get("doc_titles") or [])} for t in sample["turns"] if isinstance(t, dict)]
    text = pick(sample, "completion", "completion_text", default="") or ""
    turns: list[dict[str, Any]] = []
    for m in ACTION_OR_INFO_RE.finditer(text):
        if m.group(1):
            turns.append({"action": m.group(1), "content": m.group(2).strip(), "titles": []})
        elif turns and turns[-1]["action"] == "search":
            turns[-1]["titles"] = DOC_TITLE_RE.findall(m.group(3))
    if not turns and sample.get("queries"):
        turns = [{"action": "search", "content": q, "titles": []} for q in sample["queries"]]
    return turns


def token_spans(tokens: list[str], diffs: list[float]) -> str:
    """Query tokens as coloured spans: green when teacher-minus-student log-prob > 0, red when < 0.

    Opacity grows with ``|diff|`` (saturating at 2 nats); the value is in the ``title`` tooltip.
    """
    out = []
    for tok, d in zip(tokens, diffs):
        a = min(abs(d) / 2.0, 1.0) * 0.85 + 0.05
        rgb = "0,160,60" if d > 0 else "210,40,40"
        out.append(f'<span class=tok style="background:rgba({rgb},{a:.2f})" title="{d:+.3f}">{html.escape(tok)}</span>')
    return "".join(out)


def hind_block(h: Any) -> str:
    """HTML of a HindSearch sample: critique and per-token teacher-minus-student log-probs."""
    if not isinstance(h, dict):
        return ""
    crit = pick(h, "critique", "critique_text", "text")
    parts = ["<div class=hind><b>HindSearch critique</b>"]
    if crit is None:
        parts.append(" <span class=nr>not recorded</span>")
    else:
        parts.append(f' <span class=crit>{html.escape(str(crit))}</span>')
    for k in ("judge_kind", "critique_usable", "redactions", "judge_error", "judge_truncation"):
        if k in h:
            parts.append(f" <small>{k}={html.escape(str(h[k]))}</small>")
    toks = pick(h, "distill_tokens", "query_tokens", "tokens", "query_token_strs")
    label = "critique teacher &minus; neutral-feedback teacher log-prob on distilled tokens"
    diffs = pick(h, "lT_minus_neutral")
    if diffs is None:  # runs without the neutral control: the teacher's own log-probs (older runs: lT_minus_lS)
        label, diffs = "teacher log-prob on distilled tokens", pick(h, "lT")
    if diffs is None:
        label, diffs = "teacher &minus; student log-prob on query tokens", pick(h, "lT_minus_lS", "teacher_minus_student")
    if isinstance(toks, list) and isinstance(diffs, list) and toks:
        parts.append(f"<div class=toks>{label}: {token_spans([str(t) for t in toks], [float(x) for x in diffs])}</div>")
    else:
        parts.append("<div class=nr>per-token teacher log-probs: not recorded</div>")
    parts.append("</div>")
    return "".join(parts)


def igsd_pairs(g: Any) -> list[dict[str, Any]]:
    if isinstance(g, list):
        return [p for p in g if isinstance(p, dict)]
    if isinstance(g, dict):
        inner = pick(g, "igsd_pairs", "pairs", "verified_pairs", "positions")
        if isinstance(inner, list):
            return [p for p in inner if isinstance(p, dict)]
        if any(k in g for k in ("delta", "gate")):
            return [g]
    return []


def _fmt(v: Any) -> str:
    if isinstance(v, float):
        return f"{v:+.3f}"
    if isinstance(v, list):
        return "; ".join(html.escape(str(x)) for x in v)
    return html.escape(str(v)) if v is not None else '<span class=nr>not recorded</span>'


def igsd_block(g: Any) -> str:
    """HTML table of IGSD verified pairs (student vs teacher query, retrieved titles, IG_S, IG_T, delta, gate)."""
    pairs = igsd_pairs(g)
    if not pairs:
        return "<div class=igsd><b>IGSD</b> <span class=nr>no verified pairs recorded</span></div>" if g else ""
    rows = ["<div class=igsd><b>IGSD verified pairs</b><table><tr><th>student query</th><th>student retrieved</th>"
            "<th>teacher query</th><th>teacher retrieved</th><th>token S / T</th><th>IG_S</th><th>IG_T</th><th>delta</th><th>gate</th></tr>"]
    for p in pairs:
        gate = pick(p, "gate", "g")
        gcls = " class=open" if isinstance(gate, (int, float)) and gate > 0.5 else ""
        rows.append(
            f"<tr><td>{_fmt(pick(p, 'q_S', 'student_query', 'q_s'))}</td>"
            f"<td>{_fmt(pick(p, 'titles_S', 'student_titles', 'titles_s'))}</td>"
            f"<td>{_fmt(pick(p, 'q_T', 'teacher_query', 'q_t'))}</td>"
            f"<td>{_fmt(pick(p, 'titles_T', 'teacher_titles', 'titles_t'))}</td>"
            f"<td><code>{html.escape(str(p.get('student_token', '?')))}</code> / "
            f"<code>{html.escape(str(p.get('teacher_token', '?')))}</code></td>"
            f"<td>{_fmt(pick(p, 'ig_S', 'ig_s', 'IG_S'))}</td><td>{_fmt(pick(p, 'ig_T', 'ig_t', 'IG_T'))}</td>"
            f"<td>{_fmt(pick(p, 'delta'))}</td><td{gcls}>{_fmt(gate)}</td></tr>"
        )
    rows.append("</table></div>")
    return "".join(rows)


def sample_html(s: dict[str, Any]) -> str:
    """One rollout of the trajectory browser as a ``<details>`` element."""
    reward = float(pick(s, "reward", "em", default=0.0) or 0.0)
    ok = reward > 0
    q = html.escape(str(s.get("question", "?")))
    gold = html.escape(", ".join(str(a) for a in s.get("golden_answers") or []))
    head = (f"<summary><span class={'ok' if ok else 'fail'}>{'✔' if ok else '✘'} r={reward:g}</span> "
            f"step {html.escape(str(s.get('step', '?')))} · {q} <small>(hops {html.escape(str(s.get('hops', '?')))})</small></summary>")
    body = [f"<div>gold: <b>{gold or '<span class=nr>not recorded</span>'}</b></div><ol class=turns>"]
    for t in turns_of(s):
        if t["action"] == "search":
            titles = ", ".join(html.escape(x) for x in t["titles"]) or "<span class=nr>titles not recorded</span>"
            body.append(f"<li><b>search</b> <code>{html.escape(t['content'])}</code><br><small>retrieved: {titles}</small></li>")
        else:
            body.append(f"<li><b>{html.escape(t['action'])}</b> <code>{html.escape(t['content'])}</code></li>")
    body.append("</ol>")
    body.append(f"<div>answer: <code>{html.escape(str(s.get('answer')))}</code> · reward {reward:g}"
                f" · stop {html.escape(str(s.get('stop_reason', '')))}</div>")
    if not ok:
        body.append(hind_block(pick(s, "hind", "hindsearch")))
    body.append(igsd_block(s.get("igsd")))
    comp = pick(s, "completion", "completion_text")
    if comp:
        body.append(f"<details><summary>raw completion</summary><pre>{html.escape(str(comp))}</pre></details>")
    return f"<details class='traj {'ok' if ok else 'fail'}'>{head}{''.join(body)}</details>"


def browser_section(run: Run) -> str:
    if not run.samples:
        return "<h3>Trajectories</h3><p class=nr>not recorded (no samples.jsonl rows)</p>"
    samples = run.samples[-MAX_SAMPLES:]
    n_fail = sum(1 for s in samples if float(pick(s, "reward", default=0.0) or 0.0) <= 0)
    n_hind = sum(1 for s in samples if isinstance(pick(s, "hind", "hindsearch"), dict))
    n_igsd = sum(len(igsd_pairs(s.get("igsd"))) for s in samples)
    head = (f"<h3>Trajectories</h3><p>{len(samples)} rollouts shown (of {len(run.samples)}); {n_fail} failed, "
            f"{n_hind} with a critique, {n_igsd} IGSD verified pairs.</p>")
    return head + "".join(sample_html(s) for s in reversed(samples))


def results_section(run: Run) -> str:
    if not run.results:
        return ""
    return f"<h3>Evaluation</h3><pre>{html.escape(json.dumps(run.results, indent=1)[:5000])}</pre>"


def run_section(run: Run, title: str | None = None) -> str:
    """The full section of one run: metrics, evaluation, trajectories, config."""
    bad = ""
    if run.bad_lines:
        bad = "<p class=fail>Unreadable lines: " + "; ".join(html.escape(b) for b in run.bad_lines[:10]) + "</p>"
    cfg = f"<details><summary>config.toml</summary><pre>{html.escape(run.config_text)}</pre></details>" if run.config_text else ""
    return (f"<section class=run id='run-{html.escape(run.path.name)}'><h2>{html.escape(title or run.path.name)}</h2>"
            f"{bad}{metrics_section(run)}{results_section(run)}{probe_section(run.path)}{browser_section(run)}{cfg}</section>")


def probe_section(path: Path) -> str:
    """The teacher-probe table of ``path/probe.json`` (``hindsearch probe``), or nothing when absent."""
    p = Path(path) / "probe.json"
    if not p.exists():
        return ""
    from hindsearch.hindsight.probe import format_probe

    try:
        md = format_probe(json.loads(p.read_text()))
    except (ValueError, KeyError, TypeError) as e:
        return f"<p class=fail>probe.json unreadable: {html.escape(str(e))}</p>"
    return "<h3>Teacher probes</h3>" + markdown_table_html(md)


# --------------------------------------------------------------------------- compare dirs
def markdown_table_html(md: str) -> str:
    """Render the pipe tables of a markdown text as HTML tables; other lines become paragraphs."""
    out, table = [], []

    def flush() -> None:
        if table:
            rows = [r for r in table if not re.fullmatch(r"\|?[\s:|-]+\|?", r)]
            cells = [[c.strip() for c in r.strip().strip("|").split("|")] for r in rows]
            h = "".join(f"<th>{html.escape(c)}</th>" for c in cells[0])
            body = "".join("<tr>" + "".join(f"<td>{html.escape(c)}</td>" for c in r) + "</tr>" for r in cells[1:])
            out.append(f"<table class=results><tr>{h}</tr>{body}</table>")
            table.clear()

    for line in md.splitlines():
        if line.strip().startswith("|"):
            table.append(line)
            continue
        flush()
        if line.strip():
            tag = "h3" if line.startswith("#") else "p"
            out.append(f"<{tag}>{html.escape(line.lstrip('#').strip())}</{tag}>")
    flush()
    return "".join(out)


def compare_section(path: Path) -> str:
    parts = ["<section id=results><h2>Comparison results</h2>"]
    md = path / "results.md"
    parts.append(markdown_table_html(md.read_text()) if md.exists() else "<p class=nr>results.md not recorded</p>")
    png = path / "curves.png"
    if png.exists():
        parts.append(f'<img alt="curves" src="data:image/png;base64,{base64.b64encode(png.read_bytes()).decode()}">')
    else:
        parts.append("<p class=nr>curves.png not recorded</p>")
    parts.append("</section>")
    return "".join(parts)


CSS = """
body{font-family:system-ui,sans-serif;margin:1.5em;background:#fff;color:#222;max-width:1300px}
h1{border-bottom:2px solid #345}h2{background:#eef2f7;padding:.3em}
.grid{display:flex;flex-wrap:wrap;gap:.6em}.panel{border:1px solid #ccd;padding:.4em;min-width:200px}
.nr{color:#888;font-style:italic}.ok{color:#170}.fail{color:#b11}
details.traj{border-left:4px solid #ccc;margin:.3em 0;padding:.2em .5em}details.traj.fail{border-color:#d66}
details.traj.ok{border-color:#6b6}code{background:#f4f4f4}.tok{padding:0 1px;border-radius:2px;font-family:monospace}
.crit{background:#fff6d0}table{border-collapse:collapse;margin:.4em 0}td,th{border:1px solid #ccd;padding:2px 6px;font-size:90%}
td.open{background:#c8f0c8}pre{white-space:pre-wrap;font-size:80%;background:#f8f8f8;padding:.4em}
"""


def render(path: str | Path) -> str:
    """The HTML page of a run folder or a compare folder."""
    p = Path(path)
    if not p.is_dir():
        raise FileNotFoundError(f"run folder not found: {p}")
    if not is_compare_dir(p) and not any((p / f).exists() for f in ("metrics.jsonl", "summary.json", "config.toml")):
        raise ValueError(f"{p} is not a run or comparison folder (no metrics.jsonl, summary.json or config.toml)")
    if is_compare_dir(p):
        runs = sub_runs(p)
        toc = "".join(f"<li><a href='#run-{html.escape(r.name)}'>{html.escape(r.name)}</a></li>" for r in runs)
        body = compare_section(p) + f"<h2>Runs</h2><ul>{toc}</ul>" + "".join(run_section(load_run(r)) for r in runs)
        title = f"hindsearch comparison: {p.name}"
    else:
        body = run_section(load_run(p))
        title = f"hindsearch run: {p.name}"
    return (f"<!DOCTYPE html><html><head><meta charset='utf-8'><title>{html.escape(title)}</title>"
            f"<style>{CSS}</style></head><body><h1>{html.escape(title)}</h1>{body}</body></html>")


def write_report(path: str | Path, out: str | Path | None = None) -> Path:
    """Write the page (default ``RUN_DIR/report.html``) and return its path."""
    out_path = Path(out) if out else Path(path) / "report.html"
    text = render(path)
    out_path.parent.mkdir(parents=True, exist_ok=True)
    out_path.write_text(text, encoding="utf-8")
    return out_path


# --------------------------------------------------------------------------- CLI
def _cmd_report(args: argparse.Namespace) -> int:
    out = write_report(args.run_dir, args.out)
    print(f"wrote {out} ({out.stat().st_size / 1024:.0f} KiB)")
    return 0


def _cmd_compare(args: argparse.Namespace) -> int:
    from hindsearch.compare import main_compare

    return main_compare(args)


def register(sub: Any) -> None:
    """Add the ``report`` and ``compare`` subcommands."""
    p = sub.add_parser("report", help="static HTML report of a run or comparison folder")
    p.add_argument("run_dir", help="run folder (metrics.jsonl, samples.jsonl) or compare folder")
    p.add_argument("--out", default=None, help="output file (default RUN_DIR/report.html)")
    p.add_argument("--debug", action="store_true", help="show tracebacks")
    p.set_defaults(func=_cmd_report)

    c = sub.add_parser("compare", help="train and evaluate several methods x seeds from one warmed-up checkpoint")
    c.add_argument("--config", default="configs/tiny-cpu.toml", help="base preset (TOML)")
    c.add_argument("--methods", default="grpo,hindsearch,hindsearch-nogold,igsd",
                   help="comma list of grpo, hindsearch, hindsearch-nogold, igsd, hindsearch+igsd")
    c.add_argument("--seeds", default="0,1", help="comma list of training seeds")
    c.add_argument("--steps", type=int, default=None, help="RL steps per run (default: the preset's train.steps)")
    c.add_argument("--mini", default=None, help="folder from 'hindsearch data mini' (adds the seven mini benchmarks)")
    c.add_argument("--mini-limit", type=int, default=None, help="questions per mini benchmark (default eval.limit)")
    c.add_argument("--test-limit", type=int, default=None, help="world test questions (default all)")
    c.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                   help="config override applied to every run")
    c.add_argument("--out", required=True, help="comparison folder (resumable)")
    c.add_argument("--no-report", action="store_true", help="do not write DIR/report.html")
    c.add_argument("--jobs", type=int, default=1,
                   help="runs trained at once, each with cpu_count/jobs torch threads (2 on a 2-core CPU for micro)")
    c.add_argument("--probe", type=int, default=0, metavar="N",
                   help="first probe the starting checkpoint on N failed training rollouts (DIR/probe.json; 0 = no probe)")
    c.add_argument("--debug", action="store_true", help="show tracebacks")
    c.set_defaults(func=_cmd_compare)
