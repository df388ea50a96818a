"""Known upstream warnings once each with a note; an unknown warning is never hidden (issue 24)."""

from __future__ import annotations

import io
import warnings

import pytest

from hindsearch import upstream_warnings as U


@pytest.fixture
def installed():
    shown: list[str] = []
    old = warnings.showwarning
    warnings.showwarning = lambda m, c, f, n, file=None, line=None: shown.append(f"{c.__name__}: {m}")  # the "original"
    U._state["seen"] = set()  # what an earlier test was shown: forgotten
    U.install()
    try:
        yield shown
    finally:
        warnings.showwarning = old
        U._state["seen"] = set()


def _warn_from(n: int, message: str, category: type[Warning]) -> None:
    """Warn from ``n`` distinct code locations (as transformers' callers do)."""
    for i in range(n):
        exec(compile(f"warnings.warn({message!r}, {category.__name__})", f"<caller {i}>", "exec"),
             {"warnings": warnings, category.__name__: category})


def test_a_known_warning_is_shown_once_with_its_note(installed, capsys):
    with warnings.catch_warnings():
        warnings.simplefilter("default")
        warnings.showwarning = U._show  # catch_warnings restored the module's; keep ours inside the block
        _warn_from(4, "`is_gradient_checkpointing` is deprecated and will be removed in v6. Use "
                      "`is_activation_checkpointing` instead.", FutureWarning)
    err = capsys.readouterr().err
    assert err.count("upstream FutureWarning (shown once;") == 1 and "harmless" in err
    assert "is_gradient_checkpointing" in err and installed == []


def test_an_unknown_warning_goes_through_in_full_every_time(installed):
    with warnings.catch_warnings():
        warnings.simplefilter("always")
        warnings.showwarning = U._show
        _warn_from(2, "something new upstream", FutureWarning)
        _warn_from(1, "`gradient_checkpointing` is deprecated", UserWarning)  # the known text, another category
    assert installed == ["FutureWarning: something new upstream"] * 2 + ["UserWarning: `gradient_checkpointing` is deprecated"]


def test_the_known_list_matches_the_installed_libraries_messages():
    """The patterns are the texts transformers and TRL emit today (a renamed message would show in full again)."""
    assert U.match("You are using 'rollout_func', which is an experimental feature. This API may change", UserWarning)
    assert U.match("`gradient_checkpointing` is deprecated and will be removed in v6. Use `activation_checkpointing` "
                   "instead.", FutureWarning)
    assert U.match("`gradient_checkpointing_disable` is deprecated and will be removed in v6. Use "
                   "`activation_checkpointing_disable` instead.", FutureWarning)
    assert U.match("unrelated", FutureWarning) is None


def test_install_is_idempotent_and_a_closed_stream_is_no_error(installed):
    U.install()
    U.install()
    assert warnings.showwarning is U._show
    closed = io.StringIO()
    closed.close()
    U._show("`past_key_values` is deprecated", FutureWarning, "x.py", 1, file=closed)
