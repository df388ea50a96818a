"""The built-in methods, one file each (options, term, metrics): importing this package registers them
(``hindsearch.config.registry.METHODS`` imports it on first read)."""

from hindsearch.config.registry import METHODS
from hindsearch.hindsight.methods import grpo, hindsearch, igsd  # noqa: F401 - registers them, in this order

METHODS.list_composition("hindsearch+igsd")
