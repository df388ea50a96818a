"""The rollout's reward: TRL reward functions by name (``train.reward_funcs``), the ``REWARDS``
registry.

A reward function has TRL's signature, ``f(completions, **columns) -> list[float]`` (one value per
completion), and reads the rollout's columns (``train.rollout_adapter``: ``model_text``,
``answered``, ``num_searches``) and the dataset's ``golden_answers``. ``@register_reward(name)``
adds one; ``em``, ``f1`` and ``format`` are registered here. ``train.reward_funcs`` names registered
functions or ``module:function`` paths; TRL sums them and logs each as ``rewards/<function
name>/mean``; ``train.format_reward > 0`` adds ``format`` with that weight.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from hindsearch.agent.protocol import extract_answer
from hindsearch.config.registry import PluginError, Registry, load_plugin
from hindsearch.answers import exact_match, f1_score

RewardFn = Callable[..., list[float]]


class Rewards(Registry):
    """The reward-function registry: a registered name, or a ``module:function`` path
    (``resolve_reward``)."""

    def __contains__(self, name: object) -> bool:
        return isinstance(name, str) and (_is_path(name) or super().__contains__(name))


def _is_path(name: str) -> bool:
    """Whether ``name`` is a ``module:function`` path (both parts non-empty)."""
    module, _, func = name.partition(":")
    return bool(module and func)


REWARDS = Rewards("reward function")
"""TRL reward functions by name (``register_reward``; the built-ins are registered below)."""


def register_reward(name: str) -> Callable[[RewardFn], RewardFn]:
    """Decorator: make a TRL reward function available as ``train.reward_funcs = ["name"]``."""
    def add(fn: RewardFn) -> RewardFn:
        REWARDS.register(name, fn, fn.__module__)
        return fn
    return add


def _answers(name: str, completions: Sequence[Any], golden_answers: Sequence[Sequence[str]],
             model_text: Sequence[str]) -> list[str | None]:
    """The last ``<answer>`` of each model text (``None`` without one), after checking the columns
    line up."""
    if not (len(golden_answers) == len(model_text) == len(completions)):
        raise ValueError(f"{name}: {len(model_text)} model texts and {len(golden_answers)} gold "
                         f"answer lists for {len(completions)} completions")
    return [extract_answer(text) for text in model_text]


@register_reward("em")
def em_reward(completions: Sequence[Any], golden_answers: Sequence[Sequence[str]],
              model_text: Sequence[str], em: Sequence[float] | None = None,
              **_: Any) -> list[float]:
    """Exact match of the last ``<answer>`` the model wrote (``model_text``, the rollout's extra
    field) against the dataset's ``golden_answers`` column (``hindsearch.answers.exact_match``); the
    rollouts' own ``em`` column (the engine's exact match of the same answer, computed once per
    rollout) when they hand one over."""
    if em is not None and len(em) == len(completions) == len(golden_answers) == len(model_text):
        return [float(e) for e in em]
    answers = _answers("em_reward", completions, golden_answers, model_text)
    return [exact_match(a, gold) for a, gold in zip(answers, golden_answers)]


@register_reward("f1")
def f1_reward(completions: Sequence[Any], golden_answers: Sequence[Sequence[str]],
              model_text: Sequence[str], **_: Any) -> list[float]:
    """Token F1 of the last ``<answer>`` the model wrote against the best gold answer
    (``hindsearch.answers.f1_score``)."""
    answers = _answers("f1_reward", completions, golden_answers, model_text)
    return [f1_score(a, gold) for a, gold in zip(answers, golden_answers)]


@register_reward("format")
def format_reward(completions: Sequence[Any], answered: Sequence[bool], **_: Any) -> list[float]:
    """1.0 when the completion ends with a well-formed ``<answer>`` (extractable answer), else
    0.0."""
    return [1.0 if a else 0.0 for a in answered]


def resolve_reward(spec: str | RewardFn) -> RewardFn:
    """A reward function: a callable as is, a registered name, or ``module:function`` (the module
    imported as a plugin: ``package.module`` or ``path/to/file.py``)."""
    if callable(spec):
        return spec
    if spec in REWARDS.names():
        return REWARDS.get(spec)
    module, sep, func = spec.partition(":")
    if not sep:
        REWARDS.get(spec)  # raises naming the registered ones
    try:
        fn = getattr(load_plugin(module), func)  # a module name or a .py file
    except (ImportError, OSError, AttributeError, PluginError) as e:
        raise ValueError(f"train.reward_funcs: {spec!r} cannot be loaded: {e}") from e
    if not callable(fn):
        raise ValueError(f"train.reward_funcs: {spec!r} is not a function")
    return fn


class RewardError(ValueError):
    """A reward function that raised or returned something other than one finite number (or None)
    per completion; the message names the function."""


def reward_name(fn: Any) -> str:
    """A reward function as messages name it: ``module:function`` (a ``.py`` plugin's module by its
    file)."""
    import sys

    name = getattr(fn, "__qualname__", None) or getattr(fn, "__name__", None) or type(fn).__name__
    module = getattr(fn, "__module__", None) or "?"
    if module.startswith("hindsearch_plugin_"):  # a .py file imported by load_plugin
        module = getattr(sys.modules.get(module), "__file__", None) or module
    return f"{module}:{name}"


def checked_rewards(name: str, out: Any, n: int) -> list[float | None]:
    """``out``, one reward function's answer for ``n`` completions, as a list of floats (None kept:
    TRL reads it as "no reward"); a ``RewardError`` naming the function ``name`` unless it is a
    list, tuple or 1-D array of ``n`` finite numbers or None."""
    import math
    from numbers import Real

    if hasattr(out, "tolist") and getattr(out, "ndim", 1) == 1:  # a numpy array or a torch tensor
        out = out.tolist()
    if not isinstance(out, (list, tuple)):
        shown = repr(out) if len(repr(out)) <= 60 else repr(out)[:57] + "..."
        raise RewardError(f"reward {name} returned {type(out).__name__} {shown}, expected a list "
                          f"of {n} numbers (one per completion; None for no reward)")
    if len(out) != n:
        raise RewardError(f"reward {name} returned {len(out)} values for {n} completions (one per "
                          "completion)")
    values: list[float | None] = []
    for i, v in enumerate(out):
        if v is None:
            values.append(None)
            continue
        if not isinstance(v, Real):
            shown = repr(v) if len(repr(v)) <= 40 else repr(v)[:37] + "..."
            raise RewardError(f"reward {name} returned {type(v).__name__} {shown} for completion "
                              f"{i}, expected a number or None")
        f = float(v)
        if not math.isfinite(f):
            raise RewardError(f"reward {name} returned {f} for completion {i}; a reward must be "
                              f"finite (None for no reward)")
        values.append(f)
    return values


def checked_reward(fn: RewardFn) -> RewardFn:
    """``fn`` as TRL calls it (its name kept: TRL logs rewards by it), its answer checked once per
    call (``checked_rewards``) and an error inside it named: a ``RewardError`` instead of a message
    from torch."""
    import functools

    name = reward_name(fn)

    @functools.wraps(fn)
    def checked(*args: Any, **kwargs: Any) -> list[float | None]:
        completions = (kwargs["completions"] if "completions" in kwargs
                       else (args[0] if args else ()))
        try:
            out = fn(*args, **kwargs)
        except RewardError:
            raise
        except Exception as e:
            msg = " ".join(str(e).split())[:300] or "(no message)"
            raise RewardError(f"reward {name} raised {type(e).__name__}: {msg}") from e
        return checked_rewards(name, out, len(completions))

    return checked


def reward_funcs_of(train_cfg: Any, funcs: Sequence[str | RewardFn] | None = None
                    ) -> tuple[list[RewardFn], list[float] | None]:
    """The reward functions of a run and TRL's ``reward_weights`` (None: 1 each): ``funcs``
    (callables or names; None: ``train.reward_funcs``), then ``format`` with weight
    ``train.format_reward`` when that is > 0. A name nobody registered gets the config's error
    naming ``train.reward_funcs`` and the registered names."""
    if funcs is None:
        REWARDS.check(train_cfg.reward_funcs, "train.reward_funcs")
    fns = [resolve_reward(f) for f in (train_cfg.reward_funcs if funcs is None else funcs)]
    if not fns:
        raise ValueError("train.reward_funcs is empty: name at least one reward function (default: "
                         "['em'])")
    if train_cfg.format_reward <= 0:
        return fns, None
    if format_reward in fns:
        raise ValueError("train.reward_funcs lists 'format' and train.format_reward > 0 adds it "
                         "again: use one")
    return fns + [format_reward], [1.0] * len(fns) + [float(train_cfg.format_reward)]
