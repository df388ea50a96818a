"""``recipes/micro/ready_fork.py``: the teacher's probability at the micro search-again fork, by critique kind."""

from __future__ import annotations

import json
import math

import pytest

from recipes.micro.ready_fork import fork_rows, main, read_samples, table


def _row(step, critique, toks, lt, dn):
    return {"step": step, "hind": {"critique": critique, "distill_tokens": toks, "lT": lt, "lT_minus_neutral": dn}}


def test_fork_tokens_are_read_by_kind_and_window(tmp_path, capsys):
    rows = [
        _row(3, "The passages about X were retrieved; read them again and answer from them.",
             ["<think>", " The", " passages", " point", " to"], [0.0, 0.0, 0.0, math.log(0.25), 0.0],
             [0.0, 0.0, 0.0, 0.5, 0.0]),
        _row(80, "The searches never retrieved the passage about Y; search for it.",
             ["<think>", " The", " passages", " say", " the"], [0.0, 0.0, 0.0, math.log(0.5), 0.0],
             [0.0, 0.0, 0.0, -0.75, 0.0]),
        {"step": 4, "reward": 1.0},  # a success: no hind, not read
    ]
    run = tmp_path / "run"
    run.mkdir()
    (run / "samples.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    got = fork_rows(read_samples(run / "samples.jsonl"))
    assert [(r["kind"], r["token"], round(r["p_teacher"], 6)) for r in got] == [
        ("ready", " point", 0.25), ("missing", " say", 0.5)]
    text = table(got, 50)
    assert "| ready | 1-50 | `point` (search again) | 1 | 0.250 | +0.500 |" in text
    assert "| missing | 51- | `say` (answer) | 1 | 0.500 | -0.750 |" in text
    main([str(run)])
    assert "| ready | 1-50 |" in capsys.readouterr().out


def test_a_bad_line_and_a_missing_file_are_named(tmp_path):
    (tmp_path / "samples.jsonl").write_text('{"step": 1}\n{not json\n')
    with pytest.raises(SystemExit, match=r"samples.jsonl:2: "):
        read_samples(tmp_path / "samples.jsonl")
    with pytest.raises(SystemExit, match=r"nowhere/samples.jsonl: no such file"):
        main([str(tmp_path / "nowhere")])
