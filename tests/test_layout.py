"""Dependencies point one way: each rule reads the imports of the package's source (AST, every
``import``/``from`` at any depth, lazy ones included, and every string that names a module of the package, as
``importlib.import_module("hindsearch.x")`` and a registry's built-in modules do).

``LAYERS`` declares the package's units once, from the bottom up. A unit is the first path component under
``src/hindsearch/`` (a package or a top-level module); it may import units of its own layer or below, never above,
and no two units import each other, directly or round a loop, even within a layer."""

from __future__ import annotations

import ast
import re
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SRC = ROOT / "src" / "hindsearch"

LAYERS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("config, records", ("config", "records", "answers", "progress", "memory", "fsutil", "provenance",
                         "upstream_warnings", "isolated", "tables")),
    ("data", ("data",)),
    ("retrieval", ("retrieval",)),
    ("model core", ("core", "models")),
    ("agent", ("agent", "eval", "inputs")),
    ("methods", ("hindsight",)),
    ("train", ("train",)),
    ("study", ("study",)),  # compare, results, paired, sampled, probe, report: they read run folders
    ("cli", ("cli",)),  # every command's flags; it wires the stages, which never import it
)
"""The layers, bottom up: (name, its units)."""

RANK = {unit: i for i, (_, units) in enumerate(LAYERS) for unit in units}

OPTIONAL = {"faiss": "dense", "sentence_transformers": "dense", "numba": "fast", "peft": "lora", "vllm": "vllm",
            "deepspeed": "gpu", "tensorboard": "tensorboard", "wandb": "wandb", "trackio": "trackio"}
"""Optional dependencies (top-level module -> the pyproject extra that installs it): imported inside functions only,
each import line marked ``# optional: <extra>``."""


def imports_of(path: Path) -> set[str]:
    """Every module ``path`` imports (absolute names; relative imports resolved against the package)."""
    return {name for name, _ in imports_with_lines(path)}


MODULE_NAME = re.compile(r"hindsearch(\.[A-Za-z_]\w*)+")
"""A string that is a module name of the package: code that holds one imports it by name (``importlib``)."""


def imports_with_lines(path: Path) -> list[tuple[str, int]]:
    """``(module, line)`` of every import in ``path``, at any depth: ``from a import b`` gives ``a`` and ``a.b``
    (``b`` may be a module); relative imports are resolved against the file's package; a string constant that is a
    module name of the package (``MODULE_NAME``) counts as an import of it."""
    rel = path.relative_to(SRC.parent).with_suffix("").parts
    package = list(rel[:-1])
    out: list[tuple[str, int]] = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out += [(a.name, node.lineno) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join(package[:len(package) - node.level + 1] + ([node.module] if node.module else []))
            out += [(base, node.lineno)] * bool(node.module or node.level) + [(f"{base}.{a.name}", node.lineno)
                                                                            for a in node.names]
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and MODULE_NAME.fullmatch(node.value):
            out.append((node.value, node.lineno))
    return out


def unit_of(path: Path) -> str:
    return path.relative_to(SRC).parts[0].removesuffix(".py")


def units() -> set[str]:
    """The package's units: its sub-packages and top-level modules (``__init__.py`` is the package itself)."""
    return {unit_of(p) for p in SRC.rglob("*.py") if p.relative_to(SRC).as_posix() != "__init__.py"}


def edges() -> dict[tuple[str, str], list[str]]:
    """``(unit, imported unit) -> ["file:line", ...]`` over the whole package, lazy imports included."""
    out: dict[tuple[str, str], list[str]] = {}
    known = units()
    for path in sorted(SRC.rglob("*.py")):
        if path.relative_to(SRC).as_posix() == "__init__.py":
            continue
        unit = unit_of(path)
        for name, line in imports_with_lines(path):
            parts = name.split(".")
            if parts[0] == "hindsearch" and len(parts) > 1 and parts[1] in known and parts[1] != unit:
                where = f"{path.relative_to(SRC).as_posix()}:{line}"
                if where not in (seen := out.setdefault((unit, parts[1]), [])):
                    seen.append(where)
    return out


def test_every_unit_is_declared_in_one_layer():
    declared = [u for _, us in LAYERS for u in us]
    assert len(declared) == len(set(declared)), "a unit is declared in two layers"
    undeclared = sorted(units() - set(declared))
    assert not undeclared, (f"{undeclared}: not in tests/test_layout.py's LAYERS; declare each in the layer it "
                            "belongs to (what it imports sits at or below it, what imports it at or above)")
    assert not set(declared) - units(), f"LAYERS names units that no longer exist: {sorted(set(declared) - units())}"


def test_the_package_root_imports_nothing_of_hindsearch():
    """``hindsearch/__init__.py`` runs before any unit loads, so it sits under all of them."""
    assert not [m for m in imports_of(SRC / "__init__.py") if m.split(".")[0] == "hindsearch"]


def test_no_import_points_up_a_layer():
    up = [f"{where}: {unit} ({LAYERS[RANK[unit]][0]}) imports hindsearch.{target} ({LAYERS[RANK[target]][0]}), "
          "a layer above"
          for (unit, target), wheres in sorted(edges().items())
          if unit in RANK and target in RANK and RANK[target] > RANK[unit] for where in wheres]  # undeclared: above
    assert not up, "imports point up the layers:\n" + "\n".join(up)


def cycles_of(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one node (Tarjan): each a set of units importing each other
    round a loop."""
    cycles: list[list[str]] = []
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while not comp or comp[-1] != v:
                comp.append(stack.pop())
                on_stack.discard(comp[-1])
            if len(comp) > 1:
                cycles.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return cycles


def test_cycles_of_finds_loops_and_only_loops():
    assert cycles_of({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}, "e": {"f"}, "f": {"e"}}) == [["a", "b", "c"],
                                                                                                  ["e", "f"]]
    assert cycles_of({"a": {"b", "c"}, "b": {"c"}}) == []


def test_no_import_cycle_between_units():
    found = edges()
    graph: dict[str, set[str]] = {}
    for a, b in found:
        graph.setdefault(a, set()).add(b)
    cycles = cycles_of(graph)
    why = [f"{c}: " + "; ".join(f"{a} -> {b} ({found[a, b][0]})" for a in c for b in c if (a, b) in found)
           for c in cycles]
    assert not cycles, "units import each other round a loop:\n" + "\n".join(why)


def test_optional_dependencies_are_lazy_and_marked():
    """faiss, vllm, peft... load only inside the functions that need them, each import line naming its extra
    (``# optional: dense``), so ``import hindsearch.x`` works without them and a reader sees what to install."""
    extras = set(tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"])
    assert set(OPTIONAL.values()) <= extras, sorted(set(OPTIONAL.values()) - extras)
    bad = []
    for path in sorted(SRC.rglob("*.py")):
        text = path.read_text()
        lines, tree = text.splitlines(), ast.parse(text)
        in_function = {id(n) for f in ast.walk(tree) if isinstance(f, (ast.FunctionDef, ast.AsyncFunctionDef))
                       for n in ast.walk(f)}
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
                names = [node.module]
            else:
                continue
            for top in {n.split(".")[0] for n in names} & set(OPTIONAL):
                where = f"{path.relative_to(SRC).as_posix()}:{node.lineno}"
                marker = re.search(r"# optional: ([\w-]+)", " ".join(lines[node.lineno - 1:node.end_lineno]))
                if id(node) not in in_function:
                    bad.append(f"{where}: {top} imported at module level (import it inside the function that needs it)")
                elif not marker or marker.group(1) != OPTIONAL[top]:
                    bad.append(f"{where}: mark the import of {top} with '# optional: {OPTIONAL[top]}'")
    assert not bad, "\n".join(bad)


@pytest.mark.parametrize(
    "files, forbidden",
    [
        ("retrieval/base.py", "hindsearch.retrieval.bm25"),  # factory.py is the one module that knows them
        ("retrieval/base.py", "hindsearch.retrieval.dense"),
        ("retrieval/base.py", "hindsearch.retrieval.client"),
        ("config/*.py", "torch"),  # validation runs before any model (or torch) loads
        ("study/report/*.py", "hindsearch.study.compare"),  # compare writes the report; the report reads results
        ("study/results.py", "hindsearch.study.compare"),
        ("study/results.py", "hindsearch.study.report"),
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
