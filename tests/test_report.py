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
from hindsearch.models.micro import train_tokenizer
from hindsearch.models import tiny_random_model
from hindsearch.report import load_run, render, shade_css, token_spans, turns_of, write_report
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
    trainer = build_trainer(cfg, model, tok, engine, retriever, w.splits["train"][:4], run)
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
    rows = re.findall(r"<tr>(.*?)</tr>", text, re.S)
    cells = [re.findall(r"<td>(.*?)</td>", r) for r in rows]
    # columns: method, seeds, world EM, 1-hop, 2-hop, zero-advantage groups (not recorded here), step s, vs GRPO
    assert ["grpo", "2", "30.0 ± 14.1", "30.0 ± 14.1", "-", "-", "2.0", "1.00x"] in cells
    assert ["igsd", "2", "60.0 ± 14.1", "60.0 ± 14.1", "-", "-", "3.0", "1.50x"] in cells
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
    assert img.shape[:2] == (900, 1200) and colours > 200 and ink > 0.05, (colours, ink)


def test_every_recorded_field_is_escaped(tmp_path):
    """step, hops, metric keys, questions and critiques from a run folder can carry markup: all show as text."""
    import json as _json

    from hindsearch.report import render

    bad = "<script>alert(1)</script>"
    run = tmp_path / "run"
    run.mkdir()
    (run / "metrics.jsonl").write_text(_json.dumps({"step": 1, "reward_mean": 0.5, f"loss/{bad}": 1.0}) + "\n"
                                       + _json.dumps({"step": 2, "reward_mean": 0.6, f"loss/{bad}": 0.5}) + "\n")
    (run / "samples.jsonl").write_text(_json.dumps({"step": bad, "hops": bad, "question": bad, "reward": 0.0,
                                                    "golden_answers": [bad], "hind": {"critique": bad}}) + "\n")
    page = render(run)
    assert "<script>" not in page and "&lt;script&gt;" in page
