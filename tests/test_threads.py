"""``hindsearch train --threads N`` / ``train.threads``: the count is set, printed, and not a training key."""

from __future__ import annotations

import pytest
import torch

from hindsearch.config import Config


def test_set_threads_sets_and_says_the_count():
    from hindsearch.models import set_threads

    old = torch.get_num_threads()
    lines: list[str] = []
    try:
        assert set_threads(1, lines.append) == (1, "train.threads / --threads") and torch.get_num_threads() == 1
        assert lines == ["torch CPU threads: 1 (train.threads / --threads)"]
        n, why = set_threads(None, lines.append)  # None: the machine's default count, said with its reason
        assert n == torch.get_num_threads() and "--threads N overrides" in lines[-1] and why in lines[-1]
    finally:
        torch.set_num_threads(old)


def test_threads_flag_becomes_the_config_key(monkeypatch):
    from hindsearch import cli
    from hindsearch.train import run

    seen = {}
    monkeypatch.setattr(run, "run_train", lambda cfg=None, **kw: seen.update(cfg=cfg, **kw) or {})
    assert cli.main(["train", "--config", "tiny-cpu", "--threads", "1", "--out", "x"]) == 0
    assert seen["cfg"].train.threads == 1
    seen.clear()  # with --resume the count goes to run_train, which sets and prints it (not the config)
    assert cli.main(["train", "--resume", "some-run", "--threads", "1"]) == 0
    assert seen["resume"] == "some-run" and seen["threads"] == 1
    with pytest.raises(SystemExit):
        cli.build_parser().parse_args(["train", "--threads", "0"])
    with pytest.raises(Exception, match="train.threads"):
        Config.load(None, ["train.threads=0"])


def test_a_resume_may_change_the_thread_count():
    from hindsearch.train.run import affects_training

    assert not affects_training("train.threads") and affects_training("train.lr")
