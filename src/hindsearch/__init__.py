"""hindsearch: GRPO, HindSearch and IGSD for Search-R1 style search agents.

The package is laid out along the data flow (see README):
data -> retrieval -> agent (protocol, rollouts) -> rewards -> hindsight (judge,
teacher, losses, IGSD) -> train (TRL subclass) -> eval / report.
"""

__version__ = "0.1.0"
