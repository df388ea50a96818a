"""Progress off a terminal: whole lines, never a bar's redraws (issue 24: bm25s's bars flooded logs)."""

from __future__ import annotations

import io
import os
import subprocess
import sys

from hindsearch import progress as P


class Clock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


def test_plain_progress_writes_whole_lines_at_most_every_interval():
    out, clock = io.StringIO(), Clock()
    bar = P.PlainProgress(100, "warm-up SFT", unit="steps", every_s=30.0, stream=out, clock=clock)
    for _ in range(10):  # 10 updates within 9 s: no line
        clock.t += 0.9
        bar.update()
    clock.t = 40.0
    bar.update(10)  # past the interval: one line, with an estimate from the rate so far
    bar.set_postfix(loss="0.412")
    clock.t = 80.0
    bar.update(80)
    bar.close()
    bar.close()  # closing twice writes once
    lines = out.getvalue().splitlines()
    assert "\r" not in out.getvalue()
    assert lines[0] == "warm-up SFT: 0/100 steps (0%), 0s elapsed"
    assert lines[1] == "warm-up SFT: 20/100 steps (20%), 40s elapsed, eta 2m40s"
    assert lines[2] == "warm-up SFT: 100/100 steps (100%), 1m20s elapsed, loss=0.412"
    assert len(lines) == 3


def test_closing_after_the_last_line_writes_no_second_one():
    """A bar whose last line already gave its end (the trainer's last step) writes no second,
    later-timed copy of it when it is closed (the main job's log held two ``3/3 steps`` lines)."""
    out, clock = io.StringIO(), Clock()
    bar = P.PlainProgress(3, "grpo steps", unit="steps", every_s=30.0, stream=out, clock=clock)
    clock.t = 221.0
    bar.set_postfix(loss="0.000")
    bar.update(3)
    clock.t = 225.0  # saving the model
    bar.close()
    lines = out.getvalue().splitlines()
    assert lines == ["grpo steps: 0/3 steps (0%), 0s elapsed",
                     "grpo steps: 3/3 steps (100%), 3m41s elapsed, loss=0.000"]


def test_progress_bar_is_plain_off_a_terminal_and_a_bar_on_one(monkeypatch):
    monkeypatch.setattr(P, "interactive", lambda stream=None: False)
    assert isinstance(P.progress_bar(3, "eval", unit="q"), P.PlainProgress)
    monkeypatch.setattr(P, "interactive", lambda stream=None: True)
    bar = P.progress_bar(3, "eval", unit="q", file=io.StringIO())
    assert not isinstance(bar, P.PlainProgress) and hasattr(bar, "update")
    bar.close()


def test_interactive_reads_the_stream():
    class Tty(io.StringIO):
        def isatty(self) -> bool:
            return True

    assert P.interactive(Tty()) and not P.interactive(io.StringIO())
    closed = io.StringIO()
    closed.close()
    assert not P.interactive(closed)  # a closed stream is no terminal, and no error


def test_upstream_bars_are_switched_off_in_a_log_but_a_users_setting_wins(monkeypatch):
    monkeypatch.setattr(P, "interactive", lambda stream=None: False)
    env: dict[str, str] = {}
    assert P.quiet_upstream_bars(env) and env == {P.UPSTREAM_BARS_ENV: "1", P.TQDM_ENV: "1"}
    env = {P.UPSTREAM_BARS_ENV: "0"}
    assert not P.quiet_upstream_bars(env) and env[P.UPSTREAM_BARS_ENV] == "0"
    env = {P.TQDM_ENV: "0"}
    assert P.quiet_upstream_bars(env) and env[P.TQDM_ENV] == "0"
    monkeypatch.setattr(P, "interactive", lambda stream=None: True)
    env = {}
    assert not P.quiet_upstream_bars(env) and env == {}


def test_a_plain_tqdm_bar_of_an_upstream_library_is_off_in_a_log():
    """transformers converts a GGUF file under a bare ``tqdm.auto`` bar that huggingface_hub's switch
    does not reach; after the CLI's ``quiet_upstream_bars`` such a bar writes nothing to a log."""
    code = ("from hindsearch.progress import quiet_upstream_bars\n"
            "quiet_upstream_bars()\n"
            "from tqdm.auto import tqdm\n"
            "list(tqdm(range(3), desc='UPSTREAMBAR'))\n")
    env = {k: v for k, v in os.environ.items() if k not in ("TQDM_DISABLE", P.UPSTREAM_BARS_ENV)}
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env,
                          timeout=120)
    assert done.returncode == 0, done.stderr
    assert "UPSTREAMBAR" not in done.stderr


def test_bm25_index_build_draws_no_bar_into_a_log(tmp_path, capfd):
    from hindsearch.retrieval.bm25 import build_bm25

    build_bm25([f"passage {i} about the city of Velmor" for i in range(50)], tmp_path / "bm25", show_progress=True)
    err = capfd.readouterr().err
    assert "\r" not in err and "it/s" not in err  # bm25s's tqdm bars are off when stderr is not a terminal


def test_steps_progress_is_plain_lines_off_a_terminal(capfd):
    """The warm-up's step loop (transformers' Trainer) reports plain lines, not a bar, in a log."""
    import torch

    from hindsearch.train.steps import run_steps

    torch.manual_seed(0)
    model = torch.nn.Linear(2, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0)

    def step(m, batch, backward):
        loss = (m(batch["x"]) ** 2).mean()
        backward(loss)
        return loss

    run_steps(model, 3, lambda i: {"x": torch.ones(4, 2)}, step, opt, sched, max_grad_norm=1.0, seed=0, desc="toy steps",
              progress=True)
    err = capfd.readouterr().err
    assert "\r" not in err
    lines = [x for x in err.splitlines() if x.startswith("toy steps:")]
    assert lines[0].startswith("toy steps: 0/3 steps") and lines[-1].startswith("toy steps: 3/3 steps (100%)")
    assert "loss=" in lines[-1]
