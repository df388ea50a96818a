"""``hindsearch report``: the HTML page of a real two-step HindSearch+IGSD run parses and holds its sections.

The run is real (TRL trainer, rollout engine, BM25 over a small generated world, oracle judge,
teacher forward, IGSD verification); only the tiny random model's sampled tokens are scripted so
that rollouts search (query tokens exist) and half of them fail (critiques and IGSD pairs exist).
"""

from __future__ import annotations

import json
import shutil
import subprocess
from html.parser import HTMLParser
from pathlib import Path

import pytest
import torch

from hindsearch.agent.rollout import HFBackend, RolloutEngine
from hindsearch.config import Config
from hindsearch.data.world import generate_world
from hindsearch.micro import train_tokenizer
from hindsearch.models import tiny_random_model
from hindsearch.report import load_run, render, token_spans, turns_of, write_report
from hindsearch.retrieval.base import build_index, load_index
from hindsearch.train.run import build_trainer, ensure_on_disk

OVERRIDES = [
    'method="hindsearch+igsd"', 'model.name="tiny-random"', 'model.device="cpu"', "train.steps=2",
    "train.questions_per_step=2", "rollout.num_generations=2", "rollout.max_turns=1",
    "rollout.max_new_tokens_per_turn=24", "rollout.max_total_tokens=512", "train.lr=0.01", "train.save_steps=2",
    "train.beta=0.04", "warmup.enabled=false", "train.samples_per_step=4", 'hindsearch.judge_kind="oracle"',
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
        if tag == "span" and a.get("class") == "tok":
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
    # the question of every sample and the queries it searched appear in the browser
    for s in samples:
        assert turns_of(s)[0]["action"] == "search" and turns_of(s)[0]["titles"], s["completion"]
    assert page.tags.get("details", 0) >= len(samples)


def test_token_spans_colour_and_escape():
    h = token_spans(["<a>", " b"], [1.5, -0.2])
    assert "&lt;a&gt;" in h and "rgba(0,160,60" in h and "rgba(210,40,40" in h and 'title="+1.500"' in h


def test_missing_parts_say_not_recorded(tmp_path):
    (tmp_path / "metrics.jsonl").write_text(json.dumps({"step": 1, "loss": 0.5}) + "\n{bad json\n")
    text = render(tmp_path)
    assert "not recorded" in text and "Unreadable lines" in text and "metrics.jsonl:2" in text
    with pytest.raises(FileNotFoundError, match="run folder not found"):
        render(tmp_path / "nope")


def test_compare_dir_report(run_dir, tmp_path):
    cmp = tmp_path / "cmp"
    for name in ("grpo-s0", "igsd-s0"):
        shutil.copytree(run_dir, cmp / name, ignore=shutil.ignore_patterns("checkpoints", "init"))
    (cmp / "results.md").write_text("# title\n\n| method | world EM |\n|---|---|\n| grpo | 1.0 ± 0.0 |\n")
    out = write_report(cmp)
    page = parse(out.read_text())
    text = " ".join(page.text)
    assert "Comparison results" in text and "grpo-s0" in text and "igsd-s0" in text
    assert page.tags.get("table", 0) >= 1 and "curves.png not recorded" in text


def test_cli_report(run_dir, tmp_path):
    from hindsearch.cli import main

    assert main(["report", str(run_dir), "--out", str(tmp_path / "x.html")]) == 0
    assert (tmp_path / "x.html").stat().st_size > 10_000
    assert main(["report", str(tmp_path / "missing")]) == 1


def test_headless_screenshot(run_dir, tmp_path):
    exe = next((shutil.which(n) for n in ("chromium", "chromium-browser", "google-chrome") if shutil.which(n)), None)
    if exe is None:
        pytest.skip("chromium is not installed: no headless screenshot (the HTML is still parsed above)")
    html_file = write_report(run_dir, tmp_path / "r.html")
    png = tmp_path / "shot.png"
    subprocess.run([exe, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                    "--disable-background-networking", "--disable-component-update", "--disable-sync",
                    f"--user-data-dir={tmp_path / 'profile'}", f"--screenshot={png}", "--window-size=1200,900",
                    html_file.as_uri()], check=True, timeout=60, capture_output=True)
    import matplotlib.image as mpimg

    img = mpimg.imread(png)
    assert img.std() > 0.01, "screenshot is blank"


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
