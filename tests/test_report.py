"""``hindsearch report``: the HTML page of a real two-step HindSearch+IGSD run parses and holds its sections.

The run is real (TRL trainer, rollout engine, BM25 over a small generated world, oracle judge,
teacher forward, IGSD verification); only the tiny random model's sampled tokens are scripted so
that rollouts search (query tokens exist) and half of them fail (critiques and IGSD pairs exist).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from html.parser import HTMLParser
from pathlib import Path

import pytest
import torch

from hindsearch.agent.engine import RolloutEngine
from hindsearch.agent.hf_backend import HFBackend
from hindsearch.config import Config
from hindsearch.data.world import generate_world
from recipes.micro.build import train_tokenizer
from hindsearch.models import tiny_random_model
from hindsearch.study.report import load_run, render, shade_css, token_spans, turns_of, write_report
from hindsearch.retrieval.factory import build_index, load_index
from hindsearch.train.run import build_trainer, ensure_on_disk

OVERRIDES = [
    'method="hindsearch+igsd"', 'model.name="tiny-random"', 'model.device="cpu"', "train.steps=2",
    "train.questions_per_step=2", "rollout.num_generations=2", "rollout.max_turns=1",
    "rollout.max_new_tokens_per_turn=24", "rollout.max_total_tokens=512", "train.lr=0.01", "train.save_steps=2",
    "train.kl_coef=0.04", "warmup.enabled=false", "train.samples_per_step=4", 'hindsearch.judge_kind="oracle"',
    "igsd.max_positions_per_rollout=2", "igsd.max_query_tokens=6", "retrieval.topk=2",
]


def scripted_engine(model, tok, retriever, cfg):
    """The real engine whose sampled tokens follow a script: every rollout searches its question;
    even rollouts then answer the gold, odd ones answer ``nobody``."""
    state: dict[str, list] = {"scripts": []}
    enc = lambda s: tok(s, add_special_tokens=False)["input_ids"]  # noqa: E731

    def force(rows, new_ids, logits):
        out = torch.full_like(logits, float("-inf"))
        for j, ((traj, turn, _qid), ids) in enumerate(zip(rows, new_ids)):
            script = state["scripts"][traj][turn] if turn < len(state["scripts"][traj]) else []
            out[j, script[len(ids)] if len(ids) < len(script) else tok.eos_token_id] = 0.0
        return out

    class Engine(RolloutEngine):
        def rollout(self, records, num_generations=1, **kw):
            state["scripts"] = [
                [enc(f"<search> {r.question} </search>"),
                 enc(f"<answer> {r.golden_answers[0] if i % 2 == 0 else 'nobody'} </answer>")]
                for i, r in enumerate(r for r in records for _ in range(num_generations))
            ]
            return super().rollout(records, num_generations, **kw)

    return Engine(model, tok, retriever, cfg, topk=2, backend=HFBackend(model, tok), logits_hook=force)


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    w = generate_world(seed=0, n_entities=60)
    d = tmp_path_factory.mktemp("report")
    build_index(w.passages, d / "bm25", kind="bm25", show_progress=False)
    retriever = load_index(d / "bm25")
    tok = train_tokenizer([p.contents for p in w.passages] + [r.question for r in w.splits["train"]], vocab_size=1024)
    cfg = Config.load(None, OVERRIDES + [f'out="{(d / "run").as_posix()}"'])
    run = d / "run"
    run.mkdir()
    cfg.save(run / "config.toml")
    model = tiny_random_model(tok, seed=0, num_hidden_layers=1)
    ensure_on_disk(model, tok, run / "init")
    model.train()
    engine = scripted_engine(model, tok, retriever, cfg.rollout)
    trainer = build_trainer(cfg, model, tok, engine, w.splits["train"][:4], run)
    trainer.train()
    return run


class Collector(HTMLParser):
    def __init__(self):
        super().__init__()
        self.tags: dict[str, int] = {}
        self.text: list[str] = []
        self.imgs: list[str] = []
        self.spans: list[dict] = []

    def handle_starttag(self, tag, attrs):
        self.tags[tag] = self.tags.get(tag, 0) + 1
        a = dict(attrs)
        if tag == "img":
            self.imgs.append(a.get("src", ""))
        if tag == "span" and "tok" in (a.get("class") or "").split():
            self.spans.append(a)

    def handle_data(self, data):
        self.text.append(data)


def parse(html_text: str) -> Collector:
    c = Collector()
    c.feed(html_text)
    c.close()
    return c


def test_report_of_real_two_step_run(run_dir, tmp_path):
    rows = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2]
    out = write_report(run_dir, tmp_path / "r.html")
    page = parse(out.read_text())
    text = " ".join(page.text)
    for section in ("Metrics", "Reward", "Exact match", "Searches per rollout", "Loss parts", "HindSearch weights",
                    "IGSD gate statistics", "Step time split", "Trajectories", "HindSearch critique",
                    "IGSD verified pairs", "config.toml"):
        assert section in text, section
    # plots are inline PNGs, nothing is fetched from elsewhere
    assert page.imgs and all(s.startswith("data:image/png;base64,") for s in page.imgs)
    assert "http://" not in out.read_text() and "https://" not in out.read_text()
    # the failed rollouts' critiques and coloured per-token teacher-minus-student log-probs are shown
    samples = load_run(run_dir).samples
    failed = [s for s in samples if s["reward"] <= 0]
    assert failed and all(s.get("hind", {}).get("critique") for s in failed)
    assert failed[0]["hind"]["critique"] in out.read_text().replace("&#x27;", "'").replace("&quot;", '"')
    assert len(page.spans) >= sum(len(s["hind"].get("distill_tokens", [])) for s in failed) > 0
    assert all(sp["title"].startswith(("+", "-")) for sp in page.spans)
    style = re.search(r"<style>(.*?)</style>", out.read_text(), re.S).group(1)
    assert all(f".{sp['class'].split()[1]}{{background:rgba(" in style for sp in page.spans)  # every shade is defined
    # every sample carries its turns as the engine recorded them (nothing parsed from the completion text),
    # and the browser shows each query and the titles it retrieved
    for s in samples:
        assert [t["action"] for t in s["turns"]][:1] == ["search"], s["completion"]
        search = s["turns"][0]
        assert search["content"] == s["question"] and len(search["doc_ids"]) == len(search["doc_titles"]) == 2
        assert turns_of(s)[0] == {"action": "search", "content": s["question"], "titles": search["doc_titles"],
                                  "error": None}
        assert search["doc_titles"][0] in text
    assert page.tags.get("details", 0) >= len(samples)
    assert "turns not recorded" not in text


def test_samples_without_turns_say_not_recorded(tmp_path):
    """Samples of runs from before samples carried their turns: the page says "turns not recorded" and does
    not parse the completion text (a search tag in it is not shown as a turn)."""
    (tmp_path / "metrics.jsonl").write_text(json.dumps({"step": 1, "loss": 0.5}) + "\n")
    old = {"step": 1, "question": "Who?", "reward": 0.0, "golden_answers": ["x"], "answer": "y",
           "completion": "<search> parsed query </search>\n<information>Doc 1(Title: \"T\") t</information>"}
    new = {**old, "question": "Where?", "turns": [
        {"action": "search", "content": "written query", "doc_ids": ["7"], "doc_titles": ["Written title"], "error": None},
        {"action": "answer", "content": "y", "doc_ids": [], "doc_titles": [], "error": None}]}
    (tmp_path / "samples.jsonl").write_text(json.dumps(old) + "\n" + json.dumps(new) + "\n")
    assert turns_of(old) is None and turns_of(new)[0]["titles"] == ["Written title"]
    text = " ".join(parse(render(tmp_path)).text)
    assert text.count("turns not recorded") == 1
    assert "written query" in text and "Written title" in text
    assert "parsed query" not in text.replace("<search> parsed query </search>", "")  # only in the raw completion


def test_token_spans_colour_and_escape():
    h = token_spans(["<a>", " b"], [1.5, -0.2])
    assert h == '<span class="tok g7" title="+1.500">&lt;a&gt;</span><span class="tok r1" title="-0.200"> b</span>'
    css = {c["name"]: c["rgba"] for c in shade_css()}
    assert css["g7"] == "rgba(0,160,60,0.52)" and css["r1"] == "rgba(210,40,40,0.12)" and len(css) == 20


def test_missing_parts_say_not_recorded(tmp_path):
    (tmp_path / "metrics.jsonl").write_text(json.dumps({"step": 1, "loss": 0.5}) + "\n{bad json\n")
    text = render(tmp_path)
    assert "not recorded" in text and "Unreadable lines" in text and "metrics.jsonl:2" in text
    with pytest.raises(FileNotFoundError, match="run folder not found"):
        render(tmp_path / "nope")


def test_compare_dir_report(run_dir, tmp_path):
    """A comparison folder: the results table and the bars come from the runs' results.json (mean ± std over
    seeds) and per-question test trajectories (paired bootstrap against GRPO), not from results.md."""
    from hindsearch.records import Trajectory

    cmp = tmp_path / "cmp"
    cmp.mkdir()
    (cmp / "compare.json").write_text(json.dumps({"methods": ["grpo", "igsd"], "seeds": [0, 1]}))
    for m, s, em in (("grpo", 0, 0.2), ("grpo", 1, 0.4), ("igsd", 0, 0.5), ("igsd", 1, 0.7)):
        rd = cmp / f"{m}-s{s}"
        if (m, s) == ("grpo", 0):  # one real run section; the others hold only what the table needs
            shutil.copytree(run_dir, rd, ignore=shutil.ignore_patterns("checkpoints", "init"))
        else:
            rd.mkdir()
            (rd / "metrics.jsonl").write_text(json.dumps({"step": 1, "rollout/reward_mean": em}) + "\n")
        (rd / "results.json").write_text(json.dumps({"method": m, "seed": s, "step_s": 2.0 if m == "grpo" else 3.0,
                                                     "benchmarks": {"world": {"em": em, "em_1hop": em, "n": 10}}}))
        (rd / "done.json").write_text("{}")
        traj = rd / "eval" / "test-world" / "trajectories.jsonl"
        traj.parent.mkdir(parents=True)
        traj.write_text("".join(json.dumps(Trajectory(qid=f"q{i}", question="?", golden_answers=["a"], prompt_ids=[],
                                                      em=float(i < 10 * em), hops=1 + i % 2).to_dict()) + "\n"
                                for i in range(10)))
    out = write_report(cmp)
    text = out.read_text()
    page = parse(text)
    words = " ".join(page.text)
    assert "Comparison results" in words and "grpo-s0" in words and "igsd-s1" in words
    assert "curves.png not recorded" in words and "results.md" not in words
    assert "Runs overlaid (4)" in words  # the runs' curves on common axes, under the comparison's numbers
    rows = re.findall(r"<tr>(.*?)</tr>", text, re.S)
    cells = [re.findall(r"<td>(.*?)</td>", r) for r in rows]
    # columns: method, seeds, world EM, 1-hop, 2-hop, 1-hop searched 2+ (not recorded), zero-advantage groups (not recorded here), step s, vs GRPO
    assert ["grpo", "2", "30.0 ± 14.1", "30.0 ± 14.1", "-", "-", "-", "2.0", "1.00x"] in cells
    assert ["igsd", "2", "60.0 ± 14.1", "60.0 ± 14.1", "-", "-", "-", "3.0", "1.50x"] in cells
    assert any(c[:3] == ["igsd", "2", "10"] and c[3].startswith("+30.0 [") for c in cells), cells  # bootstrap row
    alts = re.findall(r'<img alt="([^"]*)"', text)
    assert "EM per method, mean ± std over seeds" in alts
    assert "each method minus GRPO, paired bootstrap 95% interval" in alts
    # a damaged results.json is named on the page, the other runs still make the table
    (cmp / "igsd-s1" / "results.json").write_text("{broken")
    text = render(cmp)
    assert "igsd-s1/results.json" in text and "<td>igsd</td><td>1</td><td>50.0</td>" in text
    # before any run finished: the page says so instead of an empty table
    for rd in cmp.glob("*-s*"):
        (rd / "results.json").unlink()
        (rd / "done.json").unlink()
    assert "no finished run yet" in render(cmp)


def test_cli_report(run_dir, tmp_path):
    from hindsearch.cli import main

    assert main(["report", str(run_dir), "--out", str(tmp_path / "x.html")]) == 0
    assert (tmp_path / "x.html").stat().st_size > 10_000
    assert main(["report", str(tmp_path / "missing")]) == 1


CHROMIUM_FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                  "--disable-background-networking", "--disable-component-update", "--disable-sync",
                  "--enable-logging=stderr", "--v=0", "--window-size=1200,900"]
PLANT = "<script>document.title='PW'+'NED';document.body.insertAdjacentHTML('afterbegin','<b id=pw'+'ned>x</b>')</script>"
"""Markup planted in a question and a critique: if it ran, the title would read PWNED and an element with id pwned would exist."""


def chromium() -> str:
    """Debian's chromium (``.ci/run`` installs it); missing: skip, or fail under ``CI=true``."""
    exe = next((shutil.which(n) for n in ("chromium", "chromium-browser", "google-chrome") if shutil.which(n)), None)
    if exe is None:
        if os.environ.get("CI") == "true":
            pytest.fail("chromium is not installed; CI must run the browser test (.ci/run installs it: apt-get install -y chromium)")
        pytest.skip("chromium is not installed (apt-get install -y chromium): no headless browser check")
    return exe


def open_in_chromium(exe: str, page: Path, profile: Path, action: str) -> tuple[str, list[str]]:
    """Load ``page`` in headless Chromium with ``action`` (``--dump-dom`` or ``--screenshot=PNG``);
    returns stdout (the DOM after load, with ``--dump-dom``) and the page's console messages."""
    proc = subprocess.run([exe, *CHROMIUM_FLAGS, f"--user-data-dir={profile}", action, page.as_uri()],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc.stdout, [line for line in proc.stderr.splitlines() if ":CONSOLE" in line]


def planted_scripts(dom: str) -> dict[str, object]:
    """What the checks look at in a DOM after load: the title, script elements, the planted element, the text."""
    page = parse(dom)
    return {"title": re.search(r"<title>(.*?)</title>", dom, re.S).group(1), "scripts": page.tags.get("script", 0),
            "pwned": 'id="pwned"' in dom, "text": " ".join(page.text)}


def test_missing_chromium_fails_under_ci_and_skips_elsewhere(monkeypatch):
    monkeypatch.setenv("PATH", "/nonexistent")
    monkeypatch.setenv("CI", "true")
    with pytest.raises(pytest.fail.Exception, match="CI must run the browser test"):
        chromium()
    monkeypatch.delenv("CI")
    with pytest.raises(pytest.skip.Exception, match="chromium is not installed"):
        chromium()


def test_chromium_checks_catch_a_running_script(tmp_path):
    """The browser checks below can fail: on a page where the planted markup is not escaped, the script runs
    (title and element change) and a console message is seen."""
    exe = chromium()
    bad = tmp_path / "bad.html"
    bad.write_text(f"<!DOCTYPE html><html><head><title>t</title></head><body>{PLANT}"
                   "<script>console.error('boom')</script></body></html>")
    dom, console = open_in_chromium(exe, bad, tmp_path / "profile", "--dump-dom")
    seen = planted_scripts(dom)
    assert seen["title"] == "PWNED" and seen["pwned"] and seen["scripts"] == 2
    assert any('"boom"' in line for line in console), console


def test_report_in_headless_chromium(run_dir, tmp_path):
    """The report of the real two-step run, with a planted <script> in a question and a critique, in Debian's
    chromium: the screenshot is not blank, no console message (the page has no script; a blocked script or
    fetch would log one), and the planted script shows as text and never runs."""
    import numpy as np
    from matplotlib.image import imread

    exe = chromium()
    run = tmp_path / "run"
    shutil.copytree(run_dir, run, ignore=shutil.ignore_patterns("checkpoints", "init"))
    rows = [json.loads(x) for x in (run / "samples.jsonl").read_text().splitlines()]
    failed = next(r for r in rows if r["reward"] <= 0 and r.get("hind", {}).get("critique"))
    failed["question"] = PLANT + failed["question"]
    failed["hind"]["critique"] = PLANT + failed["hind"]["critique"]
    (run / "samples.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    page = write_report(run, tmp_path / "report.html")

    dom, console = open_in_chromium(exe, page, tmp_path / "profile", "--dump-dom")
    assert console == []
    seen = planted_scripts(dom)
    assert seen["title"] == "hindsearch run: run" and seen["scripts"] == 0 and not seen["pwned"]
    assert seen["text"].count(PLANT) == 2  # the question and the critique, as text
    assert "Trajectories" in seen["text"] and "HindSearch critique" in seen["text"]

    png = tmp_path / "shot.png"
    _, console = open_in_chromium(exe, page, tmp_path / "profile", f"--screenshot={png}")
    assert console == []
    img = imread(png)[..., :3]
    colours = len(np.unique((img * 255).astype(np.uint8).reshape(-1, 3), axis=0))
    ink = float((img.min(axis=-1) < 0.9).mean())
    # not blank: a blank page has 1 colour and no ink; the run header's white table now fills the top (ink ~5%)
    assert img.shape[:2] == (900, 1200) and colours > 200 and ink > 0.02, (colours, ink)


def test_every_recorded_field_is_escaped(tmp_path):
    """step, hops, metric keys, questions and critiques from a run folder can carry markup: all show as text."""
    import json as _json

    from hindsearch.study.report import render

    bad = "<script>alert(1)</script>"
    run = tmp_path / "run"
    run.mkdir()
    (run / "metrics.jsonl").write_text(_json.dumps({"step": 1, "reward_mean": 0.5, f"loss/{bad}": 1.0}) + "\n"
                                       + _json.dumps({"step": 2, "reward_mean": 0.6, f"loss/{bad}": 0.5}) + "\n")
    (run / "samples.jsonl").write_text(_json.dumps({"step": bad, "hops": bad, "question": bad, "reward": 0.0,
                                                    "golden_answers": [bad], "hind": {"critique": bad}}) + "\n")
    page = render(run)
    assert "<script>" not in page and "&lt;script&gt;" in page


# --------------------------------------------------------------------------- header, health, evaluations, overlays
def git_head() -> str | None:
    """HEAD of the checkout hindsearch is imported from (None when it is not one)."""
    from hindsearch.provenance import git_source

    src = git_source()
    return None if src is None else src["commit"]


def marked_run(run_dir: Path, dst: Path, **summary) -> Path:
    """A copy of the real run as ``hindsearch train`` leaves it: its marker (with provenance) and summary.json."""
    from hindsearch.fsutil import claim_output

    shutil.copytree(run_dir, dst, ignore=shutil.ignore_patterns("checkpoints", "init"))
    claim_output(dst, "run", config={})
    (dst / "summary.json").write_text(json.dumps({
        "method": "hindsearch+igsd", "steps": 2, "dev": {"base": {"em": 0.2, "n": 10}, "rl": {"em": 0.3, "n": 10}},
        "timings_s": {"rl": 1100.0, "total": 1234.0}, "memory": {"peak_rss_mb": 2048.0}, **summary}))
    return dst


def words(page: str) -> str:
    """The page's text with its whitespace collapsed (a value split across tags reads as one phrase)."""
    return re.sub(r"\s+", " ", " ".join(parse(page).text))


def header_of(page: str) -> dict[str, str]:
    """The header table's ``{label: value text}`` (the first header of the page)."""
    table = re.search(r'<table class="header">(.*?)</table>', page, re.S).group(1)
    rows = re.findall(r"<tr><th>(.*?)</th><td>(.*?)</td></tr>", table, re.S)
    return {k: re.sub(r"<[^>]+>", "", v).strip() for k, v in rows}


def panel_img(page: str, title: str) -> bool:
    """Whether the panel titled ``title`` holds a plot (not "not recorded")."""
    m = re.search(rf'<div class="panel" data-panel="{re.escape(title)}"><b>[^<]*</b><br>\s*(<img|<p)', page)
    assert m, f"no panel {title!r}"
    return m.group(1) == "<img"


HEALTH = ("Learning rate", "Gradient norm (before clipping)", "KL to the reference model", "Entropy (nats per token)",
          "Clip ratios")


def test_run_header_and_training_health(run_dir, tmp_path):
    """A run's header says what a GRPO user checks first, from config.toml, summary.json, metrics.jsonl and the
    marker's provenance; TRL's learning rate, grad norm, KL, entropy and clip ratios are plotted. A run from before
    the marker recorded provenance says "not recorded" for the commit and the hardware."""
    run = marked_run(run_dir, tmp_path / "run")
    page = render(run)
    head = header_of(page)
    assert head["model"].startswith("tiny-random") and "device cpu" in head["model"]
    assert head["method"] == "hindsearch+igsd" and head["LoRA"].startswith("off")
    assert head["steps"] == "2 of 2 logged" and head["per step"] == "2 questions × 2 rollouts = 4 rollouts"
    assert head["wall time"].startswith("20.6 min (RL 18.3 min; median step")
    assert re.fullmatch(r"\d{4}-\d\d-\d\d \d\d:\d\d UTC", head["started"])
    commit = git_head()
    assert head["git commit"].startswith(commit[:12] if commit else "not recorded"), head["git commit"]
    assert "cores" in head["hardware"] and "torch " in head["hardware"] and "peak RSS 2.0 GiB" in head["hardware"]
    for title in HEALTH:
        assert panel_img(page, title), title
    text = words(page)
    assert "learning_rate = 0.01 at every step" in text  # a flat line is named, not mistaken for a missing one
    assert "all 5 lines = 0 at every step" in text  # the five clip ratios lie on one another at 0
    order = [text.index(s) for s in ("Step time split", "Training health", "Learning rate", "More curves", "Loss parts")]
    assert order == sorted(order)
    # the run as the test trainer left it: no marker, no summary.json
    old = header_of(render(run_dir))
    assert old["git commit"] == "not recorded" and old["hardware"].startswith("not recorded")
    assert old["started"] == "not recorded" and old["wall time"].startswith("at least")


def test_plots_have_integer_steps_and_readable_legends(monkeypatch):
    from hindsearch.study.report import plots

    figs = []
    monkeypatch.setattr(plots, "fig_to_b64", lambda fig: figs.append(fig) or "png")
    three = [(k, [1.0, 2.0], [0.1 * i, 0.2 * i]) for i, k in enumerate(("a", "b", "c"), 1)]
    assert plots.plot_lines(three, "t") == "png"
    assert plots.time_plot([{"step": 1, "time/a": 1.0}, {"step": 2, "time/a": 2.0}], ["time/a"]) == "png"
    assert plots.plot_lines([("lr", [1.0, 2.0], [2e-05, 2e-05])], "Learning rate") == "png"
    for fig in figs:
        ax = fig.axes[0]
        lo, hi = ax.get_xlim()
        ticks = [t for t in ax.get_xticks() if lo <= t <= hi]
        assert ticks and all(float(t).is_integer() for t in ticks), ticks
        assert all(t.get_fontsize() >= 7.5 for t in ax.get_legend().get_texts())
    assert figs[0].axes[0].get_legend().get_bbox_to_anchor().y0 < figs[0].axes[0].bbox.y0  # 3 entries: below the plot
    lr = figs[2].axes[0]
    assert lr.yaxis.get_major_formatter()(2e-05, 0) == "2e-05"
    assert plots.moving_average([1.0, 2.0, 3.0, 4.0], 2) == [1.0, 1.5, 2.5, 3.5]  # results.moving_average, one copy


BENCHES = ("nq", "triviaqa", "popqa", "hotpotqa", "2wiki", "musique", "bamboogle")


def make_eval_dir(root: Path, n: int = 8) -> Path:
    """A real ``hindsearch eval`` folder (``eval.evaluate``: marker, summary.json, results.md, trajectories.jsonl)
    over the seven benchmarks' names, from an engine whose rollouts are scripted: the multi-hop sets' rows carry
    evidence titles (even questions search twice and retrieve both), the others' QA rows name the passage holding
    the answer (retrieved on even questions); a third of the answers are wrong."""
    from hindsearch.data.qa import load_qa
    from hindsearch.eval import evaluate, qa_file_record
    from hindsearch.records import Trajectory, Turn

    files = {}
    (root / "qa").mkdir(parents=True)
    for b in BENCHES:
        rows = []
        for i in range(n):
            row = {"id": f"{b}-{i}", "question": f"Question {i} of {b}?", "golden_answers": [f"ans{i}"]}
            if b in ("hotpotqa", "2wiki", "musique"):
                row["evidence"] = [f"Page {i}", f"Bridge {i}"]
            else:
                row["metadata"] = {"answer_passage_ids": [f"{b}-p{i}"]}
            rows.append(row)
        files[b] = root / "qa" / f"{b}.jsonl"
        files[b].write_text("".join(json.dumps(r) + "\n" for r in rows))

    class Engine:
        def rollout(self, records, num_generations=1, greedy=True, seed=None):
            out = []
            for r in records:
                b, i = r.id.rsplit("-", 1)[0], int(r.id.rsplit("-", 1)[1])
                ok, multi = (i + len(b)) % 3 != 0, bool(r.evidence)
                turns = [Turn(action="search", content=r.question,
                              doc_ids=[f"{b}-p{i}" if i % 2 == 0 else f"{b}-x{i}", f"{b}-y{i}"],
                              doc_titles=[f"Page {i}" if multi else f"Title {i}", f"Other {i}"])]
                if multi and i % 2 == 0:
                    turns.append(Turn(action="search", content=f"bridge of {i}", doc_ids=["z"], doc_titles=[f"Bridge {i}"]))
                answer = r.golden_answers[0] if ok else "wrong"
                turns.append(Turn(action="answer", content=answer))
                out.append(Trajectory(qid=r.id, question=r.question, golden_answers=r.golden_answers, prompt_ids=[1],
                                      completion_ids=[2], gen_mask=[1], query_mask=[0], logprobs=[0.0], turns=turns,
                                      answer=answer, reward=float(ok), em=float(ok), f1=float(ok), stop_reason="answer",
                                      hops=r.hops, evidence=r.evidence, completion_text=f"<answer> {answer} </answer>"))
            return out

    out = root / "eval"
    evaluate(Engine(), {b: load_qa(p) for b, p in files.items()}, out, progress=False, log=lambda *a: None,
             record={"model": {"name": "tiny-random"}, "data": {b: qa_file_record(p) for b, p in files.items()}})
    return out


def links_resolve(page: str) -> None:
    """Every ``href="#x"`` of the page has its ``id="x"``, and no id is given twice."""
    ids = re.findall(r' id="([^"]+)"', page)
    assert len(ids) == len(set(ids)), [i for i in ids if ids.count(i) > 1][:5]
    missing = set(re.findall(r'href="#([^"]+)"', page)) - set(ids)
    assert not missing, sorted(missing)[:5]


def test_eval_folder_report(tmp_path):
    """``hindsearch report EVAL_DIR``: the header, the 7-benchmark table with each EM's 95% interval and the
    macro average's, EM bars with the intervals, the data, and the trajectories grouped by outcome and benchmark
    with each search's retrieval quality (evidence titles in the rows, answer passages from the QA files)."""
    from hindsearch.cli import main

    ev = make_eval_dir(tmp_path)
    summary = json.loads((ev / "summary.json").read_text())
    assert main(["report", str(ev)]) == 0
    page = (ev / "report.html").read_text()
    assert "<title>hindsearch evaluation: eval</title>" in page and "no finished run yet" not in page
    head = header_of(page)
    assert head["model"] == "tiny-random" and head["decoding"] == "greedy" and head["questions"] == "56 over 7 benchmarks"
    cells = [re.findall(r"<td>(.*?)</td>", r) for r in re.findall(r"<tr>(.*?)</tr>", page, re.S)]
    by_name = {c[0]: c for c in cells if c}
    for name, label in zip(BENCHES, ("NQ", "TriviaQA", "PopQA", "HotpotQA", "2Wiki", "MuSiQue", "Bamboogle")):
        b = summary["benchmarks"][name]
        row = by_name[f"{label} ({name})"]
        assert row[1:5] == ["8", f"{100 * b['em']:.1f}", f"{100 * b['em_ci95'][0]:.1f} – {100 * b['em_ci95'][1]:.1f}",
                            f"{100 * b['f1']:.1f}"], row
    avg = summary["avg"]
    assert by_name["Avg of 7"][2:4] == [f"{100 * avg['em']:.1f}", f"{100 * avg['em_ci95'][0]:.1f} – {100 * avg['em_ci95'][1]:.1f}"]
    assert "EM per benchmark with 95% intervals" in re.findall(r'<img alt="([^"]*)"', page)
    text = words(page)
    assert "8 rows, all evaluated" in text and "MOVER" in text
    # the browser: counts by benchmark and outcome, each linking into its group
    assert by_name["NQ"][1:] == ['<a href="#eval-fail-0">3</a>', '<a href="#eval-ok-0">5</a>']
    links_resolve(page)
    assert "failed (20)" in text and "succeeded (36)" in text
    assert "evidence recall 1/2 (50%) so far" in text and "evidence recall 2/2 (100%) so far" in text
    assert "answer passage retrieved so far" in text and "answer passage not retrieved so far" in text
    assert '<span class="hit" title="evidence">✓ Page 0</span>' in page
    assert "HotpotQA (3) evidence recall 67%" in text and "NQ (3) answer passage retrieved 33%" in text
    assert main(["report", str(ev)]) == 0  # the earlier page is replaced


def test_folder_of_train_runs_overlay(run_dir, tmp_path):
    """A folder of finished ``train`` runs (no comparison: no compare.json, no results.json) renders their header
    table and one overlay plot per curve, a line per run, then each run; not "no finished run yet"."""
    runs = tmp_path / "runs"
    for name, em in (("grpo-s0", 0.1), ("hind-s0", 0.3), ("hind-s1", 0.4)):
        marked_run(run_dir, runs / name, dev={"base": {"em": 0.1}, "rl": {"em": em}},
                   method="grpo" if name.startswith("grpo") else "hindsearch+igsd")
    page = render(runs)
    text = words(page)
    assert "<title>hindsearch runs: runs</title>" in page and "Runs overlaid (3)" in text
    assert "Comparison results" not in text and "no finished run yet" not in text
    for title in ("Reward (training rollouts)", "EM (training rollouts)", "Dev EM (greedy)", "Loss",
                  "KL to the reference model", "Entropy (nats per token)", "Gradient norm (before clipping)",
                  "Learning rate", "Clip ratio (region mean)", "Step time (s)"):
        assert panel_img(page, title), title
    overlay = page.split('<section class="overlay"')[1].split("</section>")[0]
    head = re.findall(r"<th>(.*?)</th>", overlay)
    table = {c[0]: dict(zip(head, c)) for c in (re.findall(r"<td>(.*?)</td>", r)
                                                for r in re.findall(r"<tr>(.*?)</tr>", overlay, re.S)) if c}
    assert list(table) == ["grpo-s0", "hind-s0", "hind-s1"]
    assert head == ["run", "method", "dev EM base → RL"]  # the columns that differ between the runs
    assert table["hind-s1"]["method"] == "hindsearch+igsd" and table["grpo-s0"]["dev EM base → RL"] == "10.0 → 10.0"
    assert re.search(r"Every run: .*per step 2 questions × 2 rollouts", text)  # the same for all: said once
    assert all(f"run-{n}" in page for n in ("grpo-s0", "hind-s0", "hind-s1"))  # each run's own section follows
    links_resolve(page)


def test_trajectory_browser_groups_and_retrieval_quality(tmp_path, monkeypatch):
    """Rollouts grouped by outcome (failed with a critique, failed without, succeeded) and hop count, as nested
    <details> a count table links into; a training sample's searches are scored against its question's evidence
    in the run's QA file (found from config.toml's relative ``out`` and ``data.train``, from any folder), used
    only when that row holds the same question."""
    run = tmp_path / "work" / "runs" / "x"
    run.mkdir(parents=True)
    (tmp_path / "work" / "qa").mkdir()
    (tmp_path / "work" / "qa" / "train.jsonl").write_text("".join(json.dumps(r) + "\n" for r in (
        {"id": "q1", "question": "Where was A born?", "golden_answers": ["B"], "evidence": ["Page A", "Page B"]},
        {"id": "q2", "question": "Who wrote C?", "golden_answers": ["D"], "evidence": ["Page C"]},
        {"id": "q3", "question": "Another question", "golden_answers": ["E"], "evidence": ["Page E"]})))
    (run / "config.toml").write_text('out = "runs/x"\n[data]\ntrain = "qa/train.jsonl"\n')
    (run / "metrics.jsonl").write_text(json.dumps({"step": 1, "loss": 0.5}) + "\n")

    def sample(qid, question, reward, hops, titles, critique=None):
        s = {"step": 1, "qid": qid, "question": question, "reward": reward, "hops": hops, "golden_answers": ["x"],
             "answer": "y", "turns": [{"action": "search", "content": f"query {i}", "doc_ids": [f"d{i}"],
                                       "doc_titles": [t]} for i, t in enumerate(titles)]
             + [{"action": "answer", "content": "y", "doc_ids": [], "doc_titles": []}]}
        if critique:
            s["hind"] = {"critique": critique}
        return s

    rows = [sample("q1", "Where was A born?", 0.0, 2, ["Page A", "Page Z"], critique="Look up B."),
            sample("q2", "Who wrote C?", 0.0, 1, ["Page Y"]),
            sample("q2", "Who wrote C?", 1.0, 1, ["Page C"]),
            sample("q3", "A question the QA file does not hold under q3", 1.0, 1, ["Page E"])]
    (run / "samples.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    monkeypatch.chdir(tmp_path)  # not the folder the run was started from: found from the run folder's own path
    page = render(run)
    text = words(page)
    assert "<script" not in page
    cells = {c[0]: c[1:] for c in (re.findall(r"<td>(.*?)</td>", r) for r in re.findall(r"<tr>(.*?)</tr>", page, re.S)) if c}
    assert cells["1 hop"] == ['<span class="nr">0</span>', '<a href="#run-fail-0">1</a>', '<a href="#run-ok-0">2</a>']
    assert cells["2 hops"] == ['<a href="#run-crit-1">1</a>', '<span class="nr">0</span>', '<span class="nr">0</span>']
    links_resolve(page)
    groups = re.findall(r'<details class="group" id="run-(\w+)" open>', page)
    assert groups == ["crit", "fail", "ok"]
    crit = page.split('id="run-crit"')[1].split('id="run-fail"')[0]
    assert "Where was A born?" in crit and "Look up B." in crit and "Who wrote C?" not in crit
    assert "evidence recall 1/2 (50%) so far" in crit and '<span class="hit" title="evidence">✓ Page A</span>' in crit
    assert re.findall(r"(\d hops?) \((\d)\) (evidence recall \d+%(?: of \d)?)", text) == [
        ("2 hops", "1", "evidence recall 50%"), ("1 hop", "1", "evidence recall 0%"),
        ("1 hop", "2", "evidence recall 100% of 1")]  # per group: the mean over its rollouts with evidence
    assert "qa/train.jsonl" in text.split("Retrieval quality per search")[1].split(")")[0]
    q3 = page.split("A question the QA file does not hold")[1].split("</details>")[0]
    assert "evidence recall" not in q3  # another question under that id: not scored against it


def test_new_sections_in_headless_chromium(run_dir, tmp_path):
    """The run page (header, training health, grouped trajectories), the evaluation page and the overlay of a
    folder of runs in Debian's chromium: no console message, no script, the new sections render, a count's link
    opens its closed group (no script), and the screenshots are not blank (saved to $REPORT_SHOTS when set)."""
    import numpy as np
    from matplotlib.image import imread

    exe = chromium()
    run = marked_run(run_dir, tmp_path / "run")
    runs = tmp_path / "runs"
    for name in ("a-s0", "b-s0", "b-s1"):
        marked_run(run_dir, runs / name)
    pages = {"run": (write_report(run, tmp_path / "run.html"), ("Training health", "git commit", "Clip ratios",
                                                                 "failed, with a critique", "succeeded")),
             "eval": (write_report(make_eval_dir(tmp_path / "ev"), tmp_path / "eval.html"),
                      ("Benchmarks", "EM 95% CI", "Avg of 7", "failed", "succeeded", "evidence recall")),
             "overlay": (write_report(runs, tmp_path / "overlay.html"), ("Runs overlaid (3)", "Every run:",
                                                                         "Gradient norm (before clipping)"))}
    shots = os.environ.get("REPORT_SHOTS")
    for name, (page, needles) in pages.items():
        dom, console = open_in_chromium(exe, page, tmp_path / "profile", "--dump-dom")
        assert console == [], (name, console)
        seen = planted_scripts(dom)
        assert seen["scripts"] == 0, name
        for needle in needles:
            assert needle in seen["text"], (name, needle)
        png = tmp_path / f"{name}.png"
        _, console = open_in_chromium(exe, page, tmp_path / "profile", f"--screenshot={png}")
        assert console == []
        img = imread(png)[..., :3]
        colours = len(np.unique((img * 255).astype(np.uint8).reshape(-1, 3), axis=0))
        assert img.shape[:2] == (900, 1200) and colours > 100 and float((img.min(axis=-1) < 0.9).mean()) > 0.03, name
        if shots:
            Path(shots).mkdir(parents=True, exist_ok=True)
            shutil.copy(png, Path(shots) / f"test-{name}.png")
    # following a count's link opens the closed group it points into (Chromium expands a <details> on a fragment)
    page = pages["eval"][0]
    proc = subprocess.run([exe, *CHROMIUM_FLAGS, f"--user-data-dir={tmp_path / 'profile'}", "--dump-dom",
                           page.as_uri() + "#eval-fail-3"], capture_output=True, text=True, timeout=120)
    before = proc.stdout.split('id="eval-fail-3"')[0]
    assert before.rsplit('<details class="sub"', 1)[1].startswith(' open'), before[-300:]
    assert '<details class="sub" open' not in before.rsplit('<details class="sub"', 1)[0]  # only that one


def test_claimed_folders_record_provenance(tmp_path):
    """Every output folder's marker records the hindsearch commit (of this checkout, when it is one) and the
    machine, which the report's header shows."""
    from hindsearch.fsutil import claim_output

    meta = claim_output(tmp_path / "x", "run")
    prov = json.loads((tmp_path / "x" / ".hindsearch-output.json").read_text())["provenance"]
    assert prov == json.loads(json.dumps(meta["provenance"]))
    assert prov["hindsearch"]["commit"] == git_head()
    host = prov["host"]
    assert host["cpus"] == os.cpu_count() and host["torch"] == torch.__version__ and isinstance(host["gpus"], list)
    assert not any(k in json.dumps(prov) for k in (os.uname().nodename, os.environ.get("USER") or "\0"))


def test_a_resume_records_what_made_it_and_the_header_names_a_change(tmp_path):
    """The marker's provenance is the start's; each resume appends its own, and the run header says when the last
    resume ran on another commit."""
    import copy

    from hindsearch.config import Config
    from hindsearch.fsutil import claim_output, read_marker
    from hindsearch.study.report.header import run_header
    from hindsearch.study.report.runs import Run
    from hindsearch.train.run import check_resume_config

    run = tmp_path / "run"
    cfg = Config.load(None, [f'out="{run.as_posix()}"'])
    claim_output(run, "run", config=cfg.to_dict())  # as a run records the config it started with
    marker = check_resume_config(cfg, run, False, lambda *_: None)
    assert len(marker["resumes"]) == 1 and marker["resumes"][0]["provenance"]["hindsearch"]["commit"] == git_head()
    started = read_marker(run)
    moved = copy.deepcopy(marker)
    moved["resumes"][0]["provenance"]["hindsearch"]["commit"] = "f" * 40  # resumed on another commit
    note = next(x for x in run_header(Run(path=run, marker=moved)) if x["label"] == "git commit")["note"]
    assert "resumed 1 time" in note and "last resume on commit ffffffffffff" in note
    same = next(x for x in run_header(Run(path=run, marker=marker)) if x["label"] == "git commit")["note"]
    assert "resumed 1 time" in same and "last resume on" not in same  # same commit and machine: only the count
    assert started.get("provenance", {}).get("hindsearch", {}).get("commit") == git_head()
