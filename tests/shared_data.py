"""Where the real-data tests find ``../shared/data``, and what happens when it is missing.

Outside CI a missing file skips the test (a contributor's checkout may not have the slices); under
``CI=true`` it fails, because CI must always run the real-data tests.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

SHARED = Path(__file__).resolve().parents[1].parent / "shared" / "data"


def shared(rel: str = "") -> Path:
    """``SHARED / rel``; skip (fail under ``CI=true``) when it does not exist."""
    path = SHARED / rel
    if not path.exists():
        if os.environ.get("CI") == "true":
            pytest.fail(f"{path} is missing; CI must run the real-data tests")
        pytest.skip(f"{path} not present (../shared/data)")
    return path
