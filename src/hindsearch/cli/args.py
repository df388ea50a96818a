"""Argument types and shared flags of the ``hindsearch`` commands: each type's error names the flag
(argparse adds it)."""

from __future__ import annotations

import argparse
from typing import Any


def _int_at_least(text: str, least: int, rule: str) -> int:
    """``text`` as an integer of at least ``least``; else an error quoting it (``rule`` says the
    bound)."""
    try:
        v = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
    if v < least:
        raise argparse.ArgumentTypeError(f"{text!r} {rule}")
    return v


def positive_int(text: str) -> int:
    """An integer >= 1."""
    return _int_at_least(text, 1, "must be at least 1")


def nonneg_int(text: str) -> int:
    """An integer >= 0."""
    return _int_at_least(text, 0, "must be 0 or more")


def positive_float(text: str) -> float:
    """A finite number > 0."""
    import math

    try:
        v = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not math.isfinite(v) or v <= 0:
        raise argparse.ArgumentTypeError(f"{text!r} must be a finite number > 0")
    return v


def port_number(text: str) -> int:
    """A TCP port, 0..65535 (0: any free port)."""
    try:
        v = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a port number") from None
    if not 0 <= v <= 65535:
        raise argparse.ArgumentTypeError(f"{text!r} is not a port number (0..65535)")
    return v


def http_url(text: str) -> str:
    """An ``http://`` or ``https://`` URL with a host (the rule of the config's
    ``retrieval.url``)."""
    from hindsearch.config.fields import url_problem

    if (why := url_problem(text)) is not None:
        raise argparse.ArgumentTypeError(f"{text!r} {why}")
    return text


def assembled(cfg: Any) -> Any:
    """``cfg`` (a loaded ``Config``) with the names its registries hold checked and its method
    tables parsed, as a run's assembly does: what a command does right after loading a config,
    before it writes or loads anything."""
    from hindsearch.hindsight.registry import resolve_methods
    from hindsearch.retrieval.factory import check_kind
    from hindsearch.train.reward_funcs import REWARDS

    resolve_methods(cfg)
    check_kind(cfg.retrieval)
    REWARDS.check(cfg.train.reward_funcs, "train.reward_funcs")
    return cfg


RETRIEVAL_URL = "--retrieval-url"
"""The retrieval server's URL flag of every command (config key ``retrieval.url``)."""
