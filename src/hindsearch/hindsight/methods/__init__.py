"""The built-in methods, one file each (options, term, metrics): importing this package registers
them (``hindsearch.hindsight.registry.METHODS`` imports one when its name is first looked up)."""

from hindsearch.hindsight.methods import grpo, hindsearch, igsd  # noqa: F401 - registers them
