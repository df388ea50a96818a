"""Dependencies point one way: each rule reads the imports of the package's source (AST, every
``import``/``from`` at any depth, lazy ones included)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[1] / "src" / "hindsearch"


def imports_of(path: Path) -> set[str]:
    """Every module ``path`` imports (absolute names; relative imports resolved against the package)."""
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            out.add(node.module)
            out.update(f"{node.module}.{a.name}" for a in node.names)
    return out


@pytest.mark.parametrize(
    "files, forbidden",
    [
        ("hindsight/*.py", "hindsearch.train"),  # the aux-term contract lives in hindsight/contract.py
        ("retrieval/base.py", "hindsearch.retrieval.bm25"),  # factory.py is the one module that knows them
        ("retrieval/base.py", "hindsearch.retrieval.dense"),
        ("retrieval/base.py", "hindsearch.retrieval.client"),
        ("config/*.py", "torch"),  # validation runs before any model (or torch) loads
        ("report/*.py", "hindsearch.compare"),  # compare writes the report; the report reads hindsearch.results
        ("results.py", "hindsearch.compare"),
        ("results.py", "hindsearch.report"),
        # the backend interface imports no backend and no engine; the backends never import the engine
        # (engine.make_backend picks one): no rollout <-> vllm_backend cycle
        ("agent/backend.py", "hindsearch.agent.hf_backend"),
        ("agent/backend.py", "hindsearch.agent.vllm_backend"),
        ("agent/backend.py", "hindsearch.agent.engine"),
        ("agent/hf_backend.py", "hindsearch.agent.engine"),
        ("agent/vllm_backend.py", "hindsearch.agent.engine"),
        ("agent/vllm_backend.py", "hindsearch.agent.hf_backend"),
    ],
)
def test_dependency_rules(files, forbidden):
    paths = sorted(SRC.glob(files))
    assert paths, files
    bad = {p.relative_to(SRC).as_posix(): sorted(m for m in imports_of(p) if m == forbidden or m.startswith(forbidden + "."))
           for p in paths}
    assert not {k: v for k, v in bad.items() if v}, f"{files} must not import {forbidden}"


def test_model_core_imports_nothing_else_of_hindsearch():
    """The model core (``core/``) sits under every model user (engine, judge, teachers, IGSD): its modules import
    only each other of the package (torch and transformers besides), function-local imports included."""
    paths = sorted((SRC / "core").glob("*.py"))
    assert paths
    bad = {p.name: sorted(m for m in imports_of(p) if m.split(".")[0] == "hindsearch"
                          and m != "hindsearch.core" and not m.startswith("hindsearch.core."))
           for p in paths}
    assert not {k: v for k, v in bad.items() if v}, bad
