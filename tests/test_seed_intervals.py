"""Intervals that count seeds: the t-interval over seed means and the two-level bootstrap (hand numbers), and the
results section that puts them beside the per-seed rows, over run folders written here."""

from __future__ import annotations

import json

import pytest

from hindsearch.study.paired import seed_level_markdown, seed_level_rows, seed_t_interval, two_level_bootstrap
from hindsearch.records import Trajectory, Turn
from hindsearch.study.results import run_name


def test_t_interval_over_seed_means_hand_numbers():
    # mean 2, sd 1, n 3: half width t(0.975, 2) * 1 / sqrt(3) = 4.302653 / 1.732051 = 2.484138
    m, lo, hi = seed_t_interval([1.0, 2.0, 3.0])
    assert m == 2.0 and lo == pytest.approx(2 - 2.484138, abs=1e-5) and hi == pytest.approx(2 + 2.484138, abs=1e-5)
    m, lo, hi = seed_t_interval([0.5])
    assert m == 0.5 and lo != lo and hi != hi  # one seed: no interval (NaN)


def test_two_level_bootstrap_sees_seed_spread_that_pooling_hides():
    """Two seeds whose questions agree within each seed but whose means differ: the pooled question bootstrap would
    be tight; resampling seeds first spans both seeds' means."""
    per_seed = [[-0.1] * 50, [0.3] * 50]
    m, lo, hi = two_level_bootstrap(per_seed, n_boot=400)
    assert m == pytest.approx(0.1) and lo == pytest.approx(-0.1) and hi == pytest.approx(0.3)
    assert two_level_bootstrap([[0.2] * 10] * 3, n_boot=50) == pytest.approx((0.2, 0.2, 0.2))


def _write(tmp_path, method, seed, em_of):
    rd = tmp_path / run_name(method, seed)
    d = rd / "eval" / "test-world"
    d.mkdir(parents=True)
    rows = []
    for i in range(20):
        hops = 2 if i % 2 else 1
        t = Trajectory(qid=f"q{i}", question="q?", golden_answers=["x"], prompt_ids=[], em=em_of(i, hops), hops=hops,
                       evidence=["A"], turns=[Turn(action="search", doc_titles=['"A"'])])
        rows.append({"benchmark": "world", **t.to_dict()})
    (d / "trajectories.jsonl").write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    (rd / "done.json").write_text("{}")


def test_seed_level_section_over_run_folders(tmp_path):
    """hindsearch solves 2, 4 and 6 more of 20 questions than GRPO in seeds 0, 1, 2: per-seed +10/+20/+30 points,
    mean +20, t-interval 20 +- 4.302653 * 10 / sqrt(3) = [-4.8, +44.8]."""
    for s, extra in ((0, 2), (1, 4), (2, 6)):
        _write(tmp_path, "grpo", s, lambda i, h: 0.0)
        _write(tmp_path, "hindsearch", s, lambda i, h, extra=extra: 1.0 if i < extra else 0.0)
    run_dir = lambda m, s: tmp_path / run_name(m, s)  # noqa: E731
    rows = [r for r in seed_level_rows(run_dir, ["grpo", "hindsearch"], [0, 1, 2]) if r["metric"] == "greedy EM"]
    assert len(rows) == 1 and rows[0]["seeds"] == [0, 1, 2]
    assert rows[0]["per_seed"] == pytest.approx({0: 0.1, 1: 0.2, 2: 0.3})
    m, lo, hi = rows[0]["t"]
    assert m == pytest.approx(0.2) and lo == pytest.approx(0.2 - 0.248414, abs=1e-5)
    md = seed_level_markdown(run_dir, ["grpo", "hindsearch"], [0, 1, 2])
    assert "| hindsearch | grpo | greedy EM | 3 | +20.0 | [-4.8, +44.8] |" in md and "+10.0 | +20.0 | +30.0" in md
    assert seed_level_markdown(run_dir, ["grpo", "hindsearch"], [0]) == ""  # one seed: no interval over seeds


def test_seed_level_section_warns_when_runs_came_from_different_starts(tmp_path):
    for s in (0, 1):
        _write(tmp_path, "grpo", s, lambda i, h: 0.0)
        _write(tmp_path, "hindsearch", s, lambda i, h, s=s: 1.0 if i < 2 + s else 0.0)
        for m in ("grpo", "hindsearch"):
            (tmp_path / run_name(m, s) / "results.json").write_text(json.dumps({"start_sha256": f"{s}" * 64}))
    run_dir = lambda m, s: tmp_path / run_name(m, s)  # noqa: E731
    md = seed_level_markdown(run_dir, ["grpo", "hindsearch"], [0, 1])
    assert "trained from 2 different starts" in md and "00000000...: grpo-s0, hindsearch-s0" in md
    (tmp_path / run_name("grpo", 1) / "results.json").write_text(json.dumps({"start_sha256": "0" * 64}))
    (tmp_path / run_name("hindsearch", 1) / "results.json").write_text(json.dumps({"start_sha256": "0" * 64}))
    assert "different starts" not in seed_level_markdown(run_dir, ["grpo", "hindsearch"], [0, 1])
