"""Evaluation end to end over a small fictional-world BM25 index: in-process, over real HTTP, resume, CLI."""

from __future__ import annotations

import json

import pytest
import torch

from hindsearch.agent.engine import RolloutEngine
from hindsearch.config import RolloutConfig
from hindsearch.data.world import generate_world
from hindsearch.eval import (canonical, column_order, describe_data, evaluate, format_table, macro_interval, read_done,
                             results_markdown, summarize, wilson_interval)
from hindsearch.records import Trajectory, Turn
from hindsearch.retrieval.factory import build_index, load_index
from hindsearch.retrieval.client import RemoteRetriever
from hindsearch.retrieval.server import BackgroundServer, create_app


pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def world():
    return generate_world(seed=0, n_entities=120)


@pytest.fixture(scope="module")
def index_dir(world, tmp_path_factory):
    d = tmp_path_factory.mktemp("world") / "index-bm25"
    build_index(world.passages, d, kind="bm25", show_progress=False)
    return d


class QuestionScript:
    """Force, per question id, turn 0 = a search for the question, turn 1 = an answer (gold or wrong)."""

    def __init__(self, tok, records, correct: set[str]):
        self.tok, self.eos = tok, tok.eos_token_id
        self.scripts = {}
        for r in records:
            ans = r.golden_answers[0] if r.id in correct else "Nobody Knows"
            self.scripts[r.id] = [self.ids(f"<search> {r.question} </search>"), self.ids(f"<answer> {ans} </answer>")]

    def ids(self, text):
        return self.tok(text, add_special_tokens=False)["input_ids"]

    def __call__(self, rows, new_ids, logits):
        out = torch.full_like(logits, float("-inf"))
        for j, ((_, turn, qid), ids) in enumerate(zip(rows, new_ids)):
            s = self.scripts[qid][turn] if turn < 2 else []
            out[j, s[len(ids)] if len(ids) < len(s) else self.eos] = 0.0
        return out


class CountingEngine:
    """Wraps an engine and records the question ids it rolls out."""

    def __init__(self, engine):
        self.engine, self.seen = engine, []

    def rollout(self, records, **kw):
        self.seen += [r.id for r in records]
        return self.engine.rollout(records, **kw)


def make_engine(model, tok, retriever, records, correct):
    cfg = RolloutConfig(max_turns=2, max_new_tokens_per_turn=64, max_total_tokens=2048)
    return RolloutEngine(model, tok, retriever, cfg, topk=3, retries=1, retry_wait_s=0.0,
                         logits_hook=QuestionScript(tok, records, correct))


def test_names_and_order():
    assert canonical("2WikiMultihopQA") == "2wiki" and canonical("NQ") == "nq" and canonical("world-dev") is None
    assert column_order(["dev", "bamboogle", "nq", "test", "hotpotqa"]) == ["nq", "hotpotqa", "bamboogle", "dev", "test"]


def test_searches_by_hop_count_show_over_search_on_one_hop_questions():
    """Searches per question and the share searched at least twice, per hop count; questions without hops
    count in the totals only."""
    def traj(hops, n_search, em):
        turns = [Turn("search", "q")] * n_search + [Turn("answer", "a")]
        return Trajectory(qid="q", question="q", golden_answers=["a"], prompt_ids=[], turns=turns, em=em, hops=hops)

    s = summarize([traj(1, 1, 1.0), traj(1, 2, 0.0), traj(1, 3, 0.0), traj(1, 1, 1.0), traj(2, 2, 1.0),
                   traj(2, 1, 0.0), traj(None, 4, 0.0)])
    assert s["n_by_hops"] == {"1": 4, "2": 2} and s["em_by_hops"] == {"1": 0.5, "2": 0.5}
    assert s["searches_by_hops"] == {"1": 7 / 4, "2": 1.5} and s["multi_search_by_hops"] == {"1": 0.5, "2": 0.5}
    assert s["searches_per_question"] == 14 / 7
    assert "searches_by_hops" not in summarize([traj(None, 2, 1.0)])


def test_eval_two_questions_end_to_end_and_resume(world, index_dir, model, tok, tmp_path):
    dev = world.splits["dev"][:2]
    bamboo = world.splits["test"][:1]
    retriever = load_index(index_dir)
    eng = CountingEngine(make_engine(model, tok, retriever, dev + bamboo, correct={dev[0].id}))
    data = {"world-dev": dev, "bamboogle": bamboo}
    res = evaluate(eng, data, out_dir=tmp_path, batch_size=2, progress=False)
    b = res["benchmarks"]
    assert b["world-dev"]["n"] == 2 and b["world-dev"]["em"] == 0.5 and b["bamboogle"]["em"] == 0.0
    assert b["world-dev"]["searches_per_question"] == 1.0 and b["world-dev"]["validity_rate"] == 1.0
    assert b["world-dev"]["invalid_rate"] == 0.0 and b["world-dev"]["stop_reasons"] == {"answer": 2}
    assert res["avg"]["em"] == pytest.approx(0.25)
    assert set(b["world-dev"]["em_by_hops"]) <= {"1", "2"}
    header = res["table"].splitlines()[0]
    assert header.index("Bamboogle") < header.index("world-dev") < header.index("Avg")
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["benchmarks"]["world-dev"]["em"] == 0.5
    rows = [json.loads(x) for x in (tmp_path / "trajectories.jsonl").read_text().splitlines()]
    assert sorted((r["benchmark"], r["qid"]) for r in rows) == sorted([("world-dev", dev[0].id), ("world-dev", dev[1].id), ("bamboogle", bamboo[0].id)])
    # the retrieved docs are the real BM25 hits for the scripted query
    t0 = next(r for r in rows if r["qid"] == dev[0].id)
    assert t0["turns"][0]["doc_ids"] == [p.id for p in retriever.retrieve([dev[0].question], 3)[0]]
    assert t0["answer"] == dev[0].golden_answers[0]

    # resume: a rerun redoes nothing; a run cut after the first batch (plus a torn line) redoes only the rest
    eng.seen = []
    res2 = evaluate(eng, data, out_dir=tmp_path, batch_size=2, progress=False)
    assert eng.seen == [] and res2["benchmarks"] == res["benchmarks"]
    lines = (tmp_path / "trajectories.jsonl").read_text().splitlines()
    (tmp_path / "trajectories.jsonl").write_text("\n".join(lines[:2]) + "\n" + lines[2][:50])
    res3 = evaluate(eng, data, out_dir=tmp_path, batch_size=2, progress=False)
    assert eng.seen == [bamboo[0].id] and res3["benchmarks"] == res["benchmarks"]
    assert len(read_done(tmp_path / "trajectories.jsonl")) == 3
    # a corrupt line in the middle is an error naming the line
    lines = (tmp_path / "trajectories.jsonl").read_text().splitlines()
    (tmp_path / "trajectories.jsonl").write_text(lines[0] + "\n{oops\n" + lines[1] + "\n")
    with pytest.raises(ValueError, match="trajectories.jsonl:2"):
        evaluate(eng, data, out_dir=tmp_path, progress=False)




def test_eval_over_http_matches_in_process_and_records_outage(world, index_dir, model, tok, tmp_path):
    dev = world.splits["dev"][:2]
    local = load_index(index_dir)
    srv = BackgroundServer(create_app(local, default_topk=3))
    try:
        remote = RemoteRetriever(srv.url, timeout_s=10, retries=0)
        res_http = evaluate(make_engine(model, tok, remote, dev, {dev[1].id}), {"dev": dev}, out_dir=tmp_path / "http", progress=False)
        res_local = evaluate(make_engine(model, tok, local, dev, {dev[1].id}), {"dev": dev}, out_dir=tmp_path / "local", progress=False)
        assert res_http["benchmarks"] == res_local["benchmarks"] and res_http["benchmarks"]["dev"]["em"] == 0.5
        read = lambda p: [{k: v for k, v in json.loads(x).items()} for x in (p / "trajectories.jsonl").read_text().splitlines()]  # noqa: E731
        assert read(tmp_path / "http") == read(tmp_path / "local")
    finally:
        srv.stop()
    # the server is gone: retrieval errors are recorded on the trajectories and counted, the eval finishes
    res = evaluate(make_engine(model, tok, remote, dev, {dev[1].id}), {"dev": dev}, out_dir=tmp_path / "down", progress=False)
    d = res["benchmarks"]["dev"]
    assert d["errors"] == 2 and d["n"] == 2 and d["stop_reasons"] == {"answer": 2}
    rows = [json.loads(x) for x in (tmp_path / "down" / "trajectories.jsonl").read_text().splitlines()]
    assert all(r["errors"] and r["turns"][0]["doc_ids"] == [] for r in rows)


def test_cli_eval(world, index_dir, tmp_path, capsys):
    pytest.importorskip("hindsearch.data.qa")  # the QA loaders (issue 2) provide load_qa
    from hindsearch.cli import main

    path = tmp_path / "q.jsonl"
    path.write_text("".join(json.dumps(r.to_dict()) + "\n" for r in world.splits["dev"][:3]))
    mini = tmp_path / "mini"  # a `hindsearch data mini` folder: its mini.json names nq.jsonl
    mini.mkdir()
    (mini / "nq.jsonl").write_text(path.read_text())
    (mini / "mini.json").write_text(json.dumps({"passages": 99, "benchmarks": {"nq": {
        "source": "ros-subsample/nq/test.jsonl", "rule": "single", "total": 50, "kept": 3}}}))
    args = ["eval", "--model", "tiny-random", "--index", str(index_dir),
            "--data", f"nq={mini / 'nq.jsonl'},world={path}",
            "--limit", "2", "--out", str(tmp_path / "out"), "--set", "rollout.max_new_tokens_per_turn=8",
            "--set", "rollout.max_turns=1", "--no-progress"]
    assert main(args) == 0
    out = capsys.readouterr().out
    assert "| metric | NQ | world | Avg of 2 |" in out  # "Avg" says how many benchmarks it averages
    for label in ("| EM 95% CI |", "| invalid turns % |", "| valid questions % |", "Wilson", "MOVER"):
        assert label in out, label
    assert "| invalid % |" not in out
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert summary["benchmarks"]["nq"]["n"] == 2 and summary["order"] == ["nq", "world"]
    assert summary["avg"]["n_benchmarks"] == 2 and len(summary["avg"]["em_ci95"]) == 2
    lo, hi = summary["benchmarks"]["nq"]["em_ci95"]
    assert lo <= summary["benchmarks"]["nq"]["em"] <= hi and hi - lo > 0.3  # 2 questions: a wide interval
    alo, ahi = summary["avg"]["em_ci95"]
    assert alo <= summary["avg"]["em"] <= ahi and ahi - alo > 0.2  # 4 questions in all: wide too
    # results.md names the data: the file, its rows (3, of which --limit 2 evaluated), mini-wiki or not
    md = (tmp_path / "out" / "results.md").read_text()
    assert summary["data"]["nq"] == {"file": str((mini / "nq.jsonl").resolve()), "rows": 3, "evaluated": 2,
                                     "mini_wiki": {"source": "ros-subsample/nq/test.jsonl", "kept": 3, "total": 50,
                                                   "rule": "single", "passages": 99}}
    assert f"- NQ (`nq`): `{(mini / 'nq.jsonl').resolve()}`, 3 rows, 2 evaluated; a mini-wiki subset: 3 of the 50" in md
    assert f"- world: `{path.resolve()}`, 3 rows, 2 evaluated; not a mini-wiki subset" in md
    bad = list(args)
    bad[bad.index("--data") + 1] = "no-equals-sign"
    assert main(bad) == 1
    assert "--data item 'no-equals-sign' must be name=path" in capsys.readouterr().err


@pytest.mark.parametrize("how", ["path", "preset name"])
def test_cli_eval_loads_the_model_a_preset_names(how, world, index_dir, model, tok, tmp_path, monkeypatch, capsys):
    """``hindsearch eval --config PRESET`` goes through the one setup path and loads ``model.name`` as the preset
    writes it (a model folder, as the micro recipes name theirs); ``--config NAME`` finds a preset by its name from
    a folder's ``configs/``, as for ``train`` and ``compare``."""
    from hindsearch.cli import main

    folder = tmp_path / "micro-model"
    model.save_pretrained(folder)
    tok.save_pretrained(folder)
    path = tmp_path / "q.jsonl"
    path.write_text("".join(json.dumps(r.to_dict()) + "\n" for r in world.splits["dev"][:2]))
    (tmp_path / "configs").mkdir()
    preset = tmp_path / "configs" / "mine.toml"
    preset.write_text(f'[model]\nname = "{folder.as_posix()}"\ndevice = "cpu"\n')
    if how == "preset name":
        monkeypatch.chdir(tmp_path)
    args = ["eval", "--config", str(preset) if how == "path" else "mine", "--index", str(index_dir),
            "--data", f"world={path}", "--limit", "2",
            "--out", str(tmp_path / "out"), "--set", "rollout.max_new_tokens_per_turn=8", "--set", "rollout.max_turns=1",
            "--no-progress"]
    assert main(args) == 0, capsys.readouterr().err
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert summary["benchmarks"]["world"]["n"] == 2


def test_cli_eval_config_that_is_neither_file_nor_preset_is_one_line(tmp_path, capsys):
    from hindsearch.cli import main

    assert main(["eval", "--config", "no-such-preset", "--out", str(tmp_path / "o")]) == 1
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert "config 'no-such-preset' not found" in err and "tiny-cpu" in err  # the presets are listed


def test_cli_eval_retrieval_url(world, index_dir, tmp_path, capsys):
    """``--retrieval-url`` (the config's ``retrieval.url``) reaches the server; ``--retriever-url``, a name no
    release shipped, is an unknown flag."""
    from hindsearch.cli import main

    with pytest.raises(SystemExit):
        main(["eval", "--retriever-url", "http://x", "--out", str(tmp_path / "o")])
    assert "unrecognized arguments: --retriever-url" in capsys.readouterr().err
    flag = "--retrieval-url"

    path = tmp_path / "q.jsonl"
    path.write_text("".join(json.dumps(r.to_dict()) + "\n" for r in world.splits["dev"][:2]))
    srv = BackgroundServer(create_app(load_index(index_dir), default_topk=3))
    try:
        rc = main(["eval", "--model", "tiny-random", flag, srv.url, "--data", f"d={path}", "--out", str(tmp_path / "o"),
                   "--set", "rollout.max_new_tokens_per_turn=8", "--set", "rollout.max_turns=1", "--no-progress"])
    finally:
        srv.stop()
    err = capsys.readouterr().err
    assert rc == 0, err
    assert "deprecated" not in err
    marker = json.loads((tmp_path / "o" / ".hindsearch-output.json").read_text())
    assert marker["retriever"]["config"] == "remote" and marker["retriever"]["url"] == srv.url
    assert marker["config"]["retrieval"]["url"] == srv.url


def _traj(qid: str, actions: list[str], em: float) -> Trajectory:
    return Trajectory(qid=qid, question="q", golden_answers=["a"], prompt_ids=[1],
                      turns=[Turn(action=a) for a in actions], em=em, answer="a" if "answer" in actions else None)


def test_invalid_turns_are_a_share_of_turns_and_validity_one_of_questions():
    """Issue 24's case: 3 invalid turns before an answer on one question reads 75% of turns, while every question
    is valid; a question with only invalid turns is the invalid one."""
    one = summarize([_traj("a", ["invalid", "invalid", "invalid", "answer"], 1.0)])
    assert one["invalid_rate"] == 0.75 and one["validity_rate"] == 1.0
    three = summarize([_traj("a", ["invalid", "invalid", "invalid", "answer"], 1.0),
                       _traj("b", ["search", "answer"], 0.0), _traj("c", ["invalid", "invalid"], 0.0)])
    assert three["invalid_rate"] == pytest.approx(5 / 8) and three["validity_rate"] == pytest.approx(2 / 3)
    table = format_table({"x": three}, ["x"], {"em": three["em"], "f1": three["f1"], "em_ci95": [0.1, 0.9]})
    assert "| invalid turns % | 62.5 |  |" in table and "| valid questions % | 66.7 |  |" in table
    assert "| EM 95% CI | 6.1-79.2 | 10.0-90.0 |" in table  # Wilson for 1 of 3


def test_em_intervals():
    # Wilson score interval (the values of statsmodels' proportion_confint(..., method="wilson"))
    assert wilson_interval(40, 100) == pytest.approx((0.30940, 0.49800), abs=1e-4)
    assert wilson_interval(0, 3) == pytest.approx((0.0, 0.56150), abs=1e-4)  # not empty at 0 hits
    assert wilson_interval(3, 3) == pytest.approx((0.43850, 1.0), abs=1e-4)
    # macro average: the Wilson intervals combined by MOVER; with many questions it agrees with a bootstrap over
    # each benchmark's questions, with few it does not collapse to 0-0 when every answer is wrong
    import numpy as np

    a, b = [1.0] * 400 + [0.0] * 600, [1.0] * 90 + [0.0] * 10
    lo, hi = macro_interval([(sum(x) / len(x), *wilson_interval(sum(x), len(x))) for x in (a, b)])
    rng = np.random.default_rng(0)
    boot = sum(np.asarray(x)[rng.integers(0, len(x), (4000, len(x)))].mean(axis=1) for x in (a, b)) / 2
    assert (lo, hi) == pytest.approx(tuple(np.percentile(boot, [2.5, 97.5])), abs=0.006)
    assert macro_interval([(0.0, *wilson_interval(0, 2))] * 2) == pytest.approx((0.0, 0.4650), abs=1e-4)
    assert macro_interval([(1.0, *wilson_interval(2, 2)), (0.0, *wilson_interval(0, 2))]) == pytest.approx(
        (0.1712, 0.8288), abs=1e-4)


def test_results_markdown_without_files_and_the_avg_interval(world, index_dir, model, tok, tmp_path):
    dev, test = world.splits["dev"][:3], world.splits["test"][:2]
    eng = make_engine(model, tok, load_index(index_dir), dev + test, correct={dev[0].id, test[0].id})
    res = evaluate(eng, {"hotpotqa": dev, "mine": test}, out_dir=tmp_path, progress=False)
    assert res["avg"]["em"] == pytest.approx((1 / 3 + 1 / 2) / 2) and res["avg"]["n_benchmarks"] == 2
    lo, hi = res["avg"]["em_ci95"]
    assert lo < res["avg"]["em"] < hi
    md = (tmp_path / "results.md").read_text()
    assert md == results_markdown(res)
    assert "| metric | HotpotQA | mine | Avg of 2 |" in md and f"| {100 * lo:.1f}-{100 * hi:.1f} |" in md
    assert "- HotpotQA (`hotpotqa`): questions given in memory (no file), 3 questions evaluated; not a mini-wiki" in md
    # rows that carry mini-wiki evidence ids are a subset even without a mini.json beside them
    dev[0].metadata["evidence_ids"] = ["mw0"]
    try:
        assert describe_data({"h": dev}, None)["h"]["mini_wiki"] == {"source": None}
    finally:
        del dev[0].metadata["evidence_ids"]
