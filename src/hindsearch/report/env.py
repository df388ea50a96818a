"""The jinja2 environment of the report's templates (``hindsearch/templates``, shipped as package data)."""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any

TEMPLATES = Path(__file__).resolve().parent.parent / "templates"
"""The jinja2 templates of the page (shipped as package data)."""


@functools.cache
def environment() -> Any:
    """The jinja2 environment of the templates: autoescape on, undefined names fail loudly."""
    import jinja2

    return jinja2.Environment(loader=jinja2.FileSystemLoader(TEMPLATES), autoescape=True,
                              undefined=jinja2.StrictUndefined, trim_blocks=True, lstrip_blocks=True)
