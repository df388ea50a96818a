"""The README's and the docs' examples cannot rot (issue 24): every TOML block loads as a config (its
``[train.trl]`` table through TRL's own ``GRPOConfig``), every shell line that runs ``hindsearch`` (or a
benchmark script, or ``accelerate launch -m hindsearch.cli``) parses with the real argument parser, its
``--config`` resolves and its ``--set`` values validate, every ``pip install -e ".[extra]"`` names an extra
of pyproject.toml, the Python recipe runs (the training call replaced by a check of the config it gets), the
``/retrieve`` JSON examples are what the server accepts and answers, and no page cites a repository file
that is not there."""

from __future__ import annotations

import argparse
import importlib.util
import json
import re
import shlex
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md")), *sorted((ROOT / "recipes").rglob("*.md"))]
FENCE = re.compile(r"```(\w*)\n(.*?)```", re.S)


def blocks(lang: str) -> list[tuple[Path, str]]:
    """``(page, text)`` of every fenced block in ``lang`` ('shell': bash/sh/shell, and unlabelled blocks whose
    first word is a command)."""
    out = []
    for page in PAGES:
        for m in FENCE.finditer(page.read_text(encoding="utf-8")):
            tag, text = m.group(1), m.group(2)
            if lang == "shell":
                first = next((x.split()[0] for x in text.splitlines() if x.strip() and not x.startswith("#")), "")
                if tag in ("bash", "sh", "shell") or (not tag and (first in ("hindsearch", "python", "pip")
                                                                    or "=" in first)):
                    out.append((page, text))
            elif tag == lang:
                out.append((page, text))
    return out


def shell_commands(text: str) -> list[list[str]]:
    """The commands of a shell block: continuations joined, comments dropped, split at && and ;, a trailing &
    dropped, leading VAR=value assignments dropped."""
    joined = re.sub(r"\\\n\s*", " ", text)
    cmds = []
    for line in joined.splitlines():
        line = line.split(" #", 1)[0].strip()
        if not line or line.startswith("#"):
            continue
        for part in re.split(r"&&|;", line):
            words = shlex.split(part.strip().rstrip("&").strip())
            while words and re.match(r"^[A-Z_][A-Z0-9_]*=", words[0]):
                words = words[1:]
            if words:
                cmds.append(words)
    return cmds


def test_the_pages_have_examples_to_check():
    assert len(blocks("toml")) >= 2 and len(blocks("shell")) >= 8 and blocks("python") and len(blocks("json")) >= 2


@pytest.mark.parametrize("page,text", blocks("toml"), ids=lambda x: x.name if isinstance(x, Path) else "")
def test_toml_blocks_load_as_configs_and_trl_knows_their_fields(page, text, tmp_path):
    from hindsearch.config import Config
    from hindsearch.train.grpo_config import grpo_args

    tomllib.loads(text)  # valid TOML at all
    f = tmp_path / "example.toml"
    f.write_text(text)
    cfg = Config.load(f)
    if "train.trl" in text or "[train.trl]" in text:
        grpo_args(cfg, tmp_path / "out")  # GRPOConfig(**fields): an unknown or removed TRL field fails here


def _parse_hindsearch(words: list[str], where: str) -> None:
    from hindsearch.cli import build_parser
    from hindsearch.config import Config
    from hindsearch.cli.train import find_config

    parser = build_parser()
    parser.exit = lambda status=0, message=None: (_ for _ in ()).throw(AssertionError(f"{where}: {message}"))
    parser.error = lambda message: (_ for _ in ()).throw(AssertionError(f"{where}: {message}"))
    try:
        args = parser.parse_args(words)
    except SystemExit as e:  # a subparser's own error
        raise AssertionError(f"{where}: {' '.join(words)} does not parse") from e
    config = getattr(args, "config", None)
    sets = getattr(args, "set", None) or getattr(args, "overrides", None) or []
    if config is not None or sets:
        from hindsearch.hindsight.registry import resolve_methods

        resolve_methods(Config.load(find_config(config) if config else None, list(sets)))  # the values validate


def _parse_script(words: list[str], where: str) -> None:
    """``python benchmarks/X.py ARGS`` (or ``recipes/...``): the script exists and its own argparse accepts ARGS
    (stopped there)."""
    import sys

    script = ROOT / words[0]
    assert script.is_file(), f"{where}: {words[0]} is not in the repository"
    spec = importlib.util.spec_from_file_location(f"docs_example_{script.stem}", script)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod  # as a script runs: its dataclasses look their module up there
    try:
        spec.loader.exec_module(mod)
    finally:
        sys.modules.pop(spec.name, None)

    class Parsed(Exception):
        pass

    real = argparse.ArgumentParser.parse_args

    def parse_then_stop(self, args=None, namespace=None):
        ns, extra = self.parse_known_args(args, namespace)
        assert not extra, f"{where}: {script.name} does not know {extra}"
        raise Parsed

    argparse.ArgumentParser.parse_args = parse_then_stop
    try:
        with pytest.raises(Parsed):
            mod.main(words[1:])
    finally:
        argparse.ArgumentParser.parse_args = real


def _extras() -> set[str]:
    return set(tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"])


@pytest.mark.parametrize("page,text", blocks("shell"), ids=lambda x: x.name if isinstance(x, Path) else "")
def test_shell_blocks_parse_with_the_real_commands(page, text):
    checked = 0
    for words in shell_commands(text):
        where = f"{page.relative_to(ROOT)}: {' '.join(words)[:90]}"
        if words[0] == "hindsearch":
            _parse_hindsearch(words[1:], where)
            checked += 1
        elif words[:2] == ["accelerate", "launch"] and "-m" in words:
            i = words.index("-m")
            assert words[i + 1] == "hindsearch.cli", where
            _parse_hindsearch(words[i + 2:], where)
            checked += 1
        elif words[0] in ("python", "python3") and len(words) > 1 and words[1].startswith(("benchmarks/", "recipes/")):
            _parse_script(words[1:], where)
            checked += 1
        elif words[0] == "pip" or words[1:3] == ["-m", "pip"]:
            for w in words:
                m = re.fullmatch(r"\.?\[([\w,-]+)\]|-?e?\.\[([\w,-]+)\]|\.\[([\w,-]+)\]", w.strip("'\""))
                if m:
                    named = set(next(g for g in m.groups() if g).split(","))
                    assert named <= _extras(), f"{where}: no extra {named - _extras()} in pyproject.toml"
            checked += 1
    assert checked, f"{page.name}: a shell block with no command checked:\n{text}"


def test_the_python_recipe_runs(monkeypatch, tmp_path):
    """The README's Python recipe, run as written; the whole job is replaced by a check of the config it is
    given (the job itself is the end-to-end test of ``run_train``)."""
    from hindsearch.config import Config
    from hindsearch.train import run

    seen: list[Config] = []

    def fake_run_train(cfg=None, **kw):
        assert isinstance(cfg, Config)
        seen.append(cfg)
        return {"dev": {"rl": {"em": 0.0}}, "run_dir": cfg.out}

    monkeypatch.setattr(run, "run_train", fake_run_train)
    monkeypatch.chdir(ROOT)
    for page, text in blocks("python"):
        exec(compile(text, str(page), "exec"), {"__name__": "docs_example"})
    assert seen and seen[0].train.steps == 2 and seen[0].train.threads == 1


def test_the_python_retriever_and_reward_example_trains(monkeypatch, tmp_path):
    """The README's example with a retriever object and a reward function, run for real as written (two steps of
    the tiny random model on the generated world): the trainer and its rollout engine get the notebook's retriever,
    and both rewards are logged."""
    from hindsearch.models import cache_dir
    from hindsearch.train import run

    example = next(text for _, text in blocks("python") if "retriever=notes" in text)
    given: list[object] = []
    build = run.build_trainer

    def spy(cfg, model, tok, engine, *a, **kw):
        given.append(engine.retriever)  # the trainer's retriever is its engine's
        return build(cfg, model, tok, engine, *a, **kw)

    monkeypatch.setenv("HINDSEARCH_CACHE", str(cache_dir().resolve()))  # the tiny model's tokenizer, from tmp_path
    monkeypatch.setattr(run, "build_trainer", spy)
    monkeypatch.chdir(tmp_path)
    scope = {"__name__": "docs_example"}
    exec(compile(example, "README.md", "exec"), scope)
    rows = [json.loads(x) for x in (tmp_path / "runs/notebook-own-search/metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2] and scope["summary"]["steps"] == 2
    assert all("rewards/short_answer/mean" in r and "rewards/em_reward/mean" in r for r in rows)
    assert given == [scope["notes"]]
    assert scope["notes"].retrieve(["who wrote the first program", " "], 1) == [
        [scope["Passage"]("0", '"Ada Lovelace"\nAda Lovelace wrote the first published program.', 3.0)], []]


def test_the_retrieve_json_examples_are_what_the_server_takes_and_gives():
    from hindsearch.records import Passage
    from hindsearch.retrieval.limits import ServerLimits
    from hindsearch.retrieval.server import format_result, parse_request

    found = [json.loads(t) for page, t in blocks("json") if page.name == "protocol.md"]
    request = next(x for x in found if "queries" in x)
    answer = next(x for x in found if "result" in x)
    queries, topk, scores = parse_request(json.dumps(request).encode(), 3, ServerLimits())
    assert queries == request["queries"] and topk == request["topk"] and scores is False
    doc = answer["result"][0][0]
    made = format_result([[Passage(id=doc["id"], contents=doc["contents"])]], False)
    assert made == {"result": [[doc]]}
    assert set(format_result([[Passage(id="1", contents='"T"\nx', score=1.0)]], True)["result"][0][0]) == {"document", "score"}


CITED = re.compile(r"(?<![\w./-])((?:docs|configs|recipes|benchmarks|tests|src|\.ci)/[\w./+{},*-]*[\w/}*])")


def test_no_page_cites_a_file_the_repository_lacks():
    missing = []
    for page in PAGES:
        for m in CITED.finditer(page.read_text(encoding="utf-8")):
            path = m.group(1).rstrip(".")
            if any(c in path for c in "{}*<>") or re.search(r"/(N|X|DIR|RUN|FILE)\b", path):
                continue  # a pattern or a placeholder, not a file
            if not (ROOT / path).exists():
                missing.append(f"{page.relative_to(ROOT)}: {path}")
    assert not missing, missing


def _model_folder(preset: str) -> str | None:
    """The local model folder a preset names that a fresh clone does not have (under ``.hindsearch/``), else None."""
    from hindsearch.cli.train import find_config
    from hindsearch.config import Config

    name = Config.load(find_config(preset), []).model.name
    return name if name.startswith(".hindsearch/") else None


@pytest.mark.parametrize("page", [p for p in PAGES if any(q == p for q, _ in blocks("shell"))],
                         ids=lambda p: str(p.relative_to(ROOT)))
def test_reproduce_commands_build_the_model_they_name(page, monkeypatch):
    """A page's command whose preset names a model folder that a fresh clone lacks (the micro rig's) follows a
    command on the same page that builds that folder (``recipes/micro/build.py --out FOLDER``), so the page runs
    as written on a fresh clone."""
    monkeypatch.chdir(ROOT)
    built: set[str] = set()
    for _, text in [(q, t) for q, t in blocks("shell") if q == page]:
        for words in shell_commands(text):
            if len(words) > 2 and words[0] in ("python", "python3") and words[1].endswith("micro/build.py"):
                if "--out" in words:
                    built.add(words[words.index("--out") + 1].rstrip("/"))
                continue
            if words[0] != "hindsearch" or "--config" not in words or words[1] not in ("compare", "train", "probe"):
                continue
            folder = _model_folder(words[words.index("--config") + 1])
            if folder is not None and not any(f"--set model.name=" in w for w in words):
                assert folder in built, (f"{page.relative_to(ROOT)}: `{' '.join(words)[:80]}...` needs {folder}; "
                                         f"build it earlier on the page: python recipes/micro/build.py --config "
                                         f"{words[words.index('--config') + 1]} --out {folder}")
