"""``python -m hindsearch.cli``: the ``hindsearch`` command (as ``accelerate launch -m
hindsearch.cli`` runs it)."""

from hindsearch.cli import entry

entry()
