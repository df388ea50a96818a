"""The jinja2 environment of the report's templates (``templates/`` beside this module, shipped as
package data)."""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any

TEMPLATES = Path(__file__).resolve().parent / "templates"
"""The jinja2 templates of the page (shipped as package data)."""


def shown(value: Any) -> Any:
    """Every ``{{ ... }}`` of the page goes through this before it is escaped: a number as
    ``show_number`` writes it (NaN, inf, an integer of hundreds of digits as such), any other value
    as text that encodes to UTF-8 (a lone surrogate as its escape); markup the templates made is
    left alone."""
    import markupsafe

    from hindsearch.study.report.runs import text

    if isinstance(value, markupsafe.Markup):
        return value
    return text(value)


@functools.cache
def environment() -> Any:
    """The jinja2 environment of the templates: autoescape on, undefined names fail loudly, every
    value rendered through ``shown``."""
    import jinja2

    return jinja2.Environment(loader=jinja2.FileSystemLoader(TEMPLATES), autoescape=True,
                              undefined=jinja2.StrictUndefined, trim_blocks=True,
                              lstrip_blocks=True, finalize=shown)
