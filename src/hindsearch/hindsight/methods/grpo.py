"""GRPO (method ``grpo``): TRL's loss alone; no options of its own and no term (it composes with
nothing)."""

from __future__ import annotations

from hindsearch.hindsight.registry import register_method

register_method("grpo")(None)
