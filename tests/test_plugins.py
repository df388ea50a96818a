"""A method, a retriever kind and a reward defined outside ``src/`` (tests/toy_plugin.py, tests/toy_reward.py) are used
through the config alone: a toy third method with its own ``[toy]`` options and a ``toy`` retriever train 2 steps
through ``hindsearch train`` (the CLI, in process, tiny random model), rewarded by EM plus a ``module:function``
reward; the method appears in metrics.jsonl, in ``compare``'s table and in the report. An index-backed kind
(tests/toy_index.py) is built by ``hindsearch index`` and searched by ``hindsearch search``. No file under ``src/``
names them."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from hindsearch.cli import main
from hindsearch.config import Config, ConfigError
from hindsearch.hindsight.registry import METHODS, resolve_methods
from hindsearch.retrieval.registry import RETRIEVERS
from conftest import registries_restored  # the registries and plugins undone after the module

PLUGIN = Path(__file__).with_name("toy_plugin.py")
INDEX_PLUGIN = Path(__file__).with_name("toy_index.py")
SRC = Path(__file__).resolve().parents[1] / "src"


@pytest.fixture(scope="module", autouse=True)
def registries():
    """The plugin's registrations stay in this module: the registries and imported plugins are restored after it."""
    with registries_restored(("toy_reward",)):
        yield


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    from hindsearch.data.world import ensure_world

    return ensure_world(tmp_path_factory.mktemp("toyworld") / "world", seed=0, n_entities=60)


def toy_config(path: Path, world: Path) -> Path:
    path.write_text(f"""
method = "toy"
plugins = ["{PLUGIN.as_posix()}"]
[model]
name = "tiny-random"
device = "cpu"
[data]
world_dir = "{world.as_posix()}"
world_entities = 60
[retrieval]
kind = "toy"
index_dir = "{world.as_posix()}"
topk = 2
[rollout]
max_turns = 1
max_new_tokens_per_turn = 12
max_total_tokens = 400
num_generations = 2
[warmup]
enabled = false
[train]
steps = 2
questions_per_step = 2
save_steps = 2
eval_limit = 2
threads = 1
reward_funcs = ["em", "toy_reward:brevity"]
[toy]
lam = 0.5
rows = "all"
[eval]
batch_size = 4
""")
    return path


def test_a_plugin_method_retriever_and_reward_train_compare_and_report(world, tmp_path, monkeypatch):
    from hindsearch.study.compare import run_compare
    from hindsearch.fsutil import claim_output

    from hindsearch.models import cache_dir

    monkeypatch.setenv("HINDSEARCH_CACHE", str(cache_dir().resolve()))  # the tiny model's tokenizer
    config = toy_config(tmp_path / "toy.toml", world)
    cfg = resolve_methods(Config.load(config))
    assert "toy" in METHODS and "toy" in RETRIEVERS and cfg.toy.lam == 0.5  # the [toy] table, from the registry
    cmp = tmp_path / "cmp"
    cmp.mkdir()
    claim_output(cmp, "compare")
    run = cmp / "toy-s0"
    assert main(["train", "--config", str(config), "--out", str(run)]) == 0
    from hindsearch.config.registry import load_plugin

    opened = load_plugin(str(PLUGIN.resolve())).OPENED  # the retriever kind the run's config named
    assert len(opened) == 1 and len(opened[0].passages) == sum(1 for _ in (world / "corpus.jsonl").open())
    rows = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2]
    assert all(r["toy/gen_tokens"] > 0 and "toy/L_toy" in r and "toy/rows" in r for r in rows)
    assert all("rewards/brevity/mean" in r and "rewards/em_reward/mean" in r for r in rows)
    saved = resolve_methods(Config.load(run / "config.toml"))  # the plugin is recorded: the run's config reads back alone
    assert saved.plugins == [str(PLUGIN.resolve())] and saved.method == "toy" and saved.toy.rows == "all"
    # compare evaluates the trained run (same config, the toy retriever again) and tabulates it
    md = run_compare(str(config), ["toy"], [0], cmp, test_limit=2, isolate=False, log=lambda *_: None)
    assert "| toy | 1 |" in md
    # the report shows the term's declared panel and loss
    assert main(["report", str(run), "--out", str(tmp_path / "run.html")]) == 0
    page = (tmp_path / "run.html").read_text()
    assert "Toy self-imitation" in page  # the panel (its series are drawn into the plot)
    from hindsearch.study.report.runs import metric_groups

    groups = metric_groups(set(rows[0]))
    assert groups["Toy self-imitation"] == ["toy/frac_rows", "toy/gen_tokens"] and "toy/L_toy" in groups["Loss parts"]
    assert "toy/grad_share" not in rows[0] or "toy/grad_share" in groups["Share of the update"]
    assert main(["report", str(cmp), "--out", str(tmp_path / "cmp.html")]) == 0
    assert "toy" in (tmp_path / "cmp.html").read_text()


def test_plugin_flag_and_method_choices(world, tmp_path, capsys):
    """``--plugin`` imports the file before ``--method`` is checked; a method name nobody registered is refused
    naming the registered ones; nothing under src/ names the toy method or retriever."""
    with pytest.raises(SystemExit):
        main(["train", "--method", "no-such-method"])
    assert "invalid choice: 'no-such-method'" in capsys.readouterr().err
    cfg = resolve_methods(Config.load(None, [f'plugins=["{PLUGIN.as_posix()}"]', 'method="hindsearch+toy"',
                                             "toy.lam=0.2"]))
    assert cfg.toy.lam == 0.2 and list(cfg.sections) == ["hindsearch", "igsd", "toy"]
    assert list(METHODS)[:4] == ["grpo", "hindsearch", "igsd", "toy"]  # the built-ins first
    with pytest.raises(ConfigError, match="toy.rows = 'some' is not allowed"):
        resolve_methods(Config.load(None, [f'plugins=["{PLUGIN.as_posix()}"]', 'toy.rows="some"']))
    with pytest.raises(ConfigError, match="plugins = .*no such file"):
        Config.load(None, ['plugins=["nowhere/plugin.py"]'])
    from hindsearch.retrieval.factory import check_kind

    check_kind(Config.load(None, [f'plugins=["{PLUGIN.as_posix()}"]', 'retrieval.kind="toy"']).retrieval)
    with pytest.raises(ConfigError, match="retrieval.kind = 'nope' is not allowed; choose one of bm25, dense, remote"):
        check_kind(Config.load(None, ['retrieval.kind="nope"']).retrieval)
    rc = main(["train", "--plugin", str(PLUGIN), "--method", "toy", "--out", str(tmp_path / "r"),
               "--set", "train.steps=0", "--set", "retrieval.kind=\"nope\""])
    assert rc == 1 and "retrieval.kind = 'nope' is not allowed" in capsys.readouterr().err  # --method toy parsed
    from hindsearch.hindsight.registry import register_method
    from hindsearch.retrieval.base import register_retriever

    with pytest.raises(ValueError, match="method 'hindsearch' is already registered"):  # no shadowing a built-in
        register_method("hindsearch")(None)
    with pytest.raises(ValueError, match="retrieval.kind 'bm25' is already registered"):
        register_retriever("bm25")(lambda cfg, index_dir, corpus: None)
    for p in SRC.rglob("*.py"):
        text = p.read_text()
        assert "toy_plugin" not in text and "SelfImitationTerm" not in text and "OverlapRetriever" not in text, p
        assert "toy_index" not in text and "toyidx" not in text and "KeywordRetriever" not in text, p


def test_a_plugin_index_kind_is_built_searched_and_configured(world, tmp_path, capsys):
    """tests/toy_index.py, one file, registers the index-backed kind ``toyidx``: ``hindsearch index --kind toyidx``
    builds its folder (hindsearch's passage store and index.json, the kind's keywords.json and fields),
    ``hindsearch search --index`` searches it, ``retrieval.kind = "toyidx"`` opens it, ``ensure_index`` builds the
    world's once, and the kind's own options and checks reach it through ``build_index``."""
    from hindsearch.config.registry import load_plugin
    from hindsearch.retrieval.base import index_kinds, is_index_dir
    from hindsearch.retrieval.factory import build_index, ensure_index, load_index, load_retriever

    corpus = world / "corpus.jsonl"
    out = tmp_path / "idx"
    with pytest.raises(SystemExit):
        main(["index", "--kind", "toyidx", "--corpus", str(corpus), "--out", str(out)])
    assert "invalid choice: 'toyidx' (choose from 'bm25', 'dense')" in capsys.readouterr().err
    toy = load_plugin(str(INDEX_PLUGIN))
    assert index_kinds() == ("bm25", "dense", "toyidx") and "toyidx" in RETRIEVERS
    with pytest.raises(SystemExit):
        main(["index", "--help"])
    assert "[--kind {bm25,dense,toyidx}]" in capsys.readouterr().out  # --kind's choices, read from the registry
    assert main(["index", "--kind", "toyidx", "--corpus", str(corpus), "--out", str(out)]) == 0
    rows = [json.loads(x) for x in corpus.open()]
    assert f"indexed {len(rows)} passages (toyidx) into {out}" in capsys.readouterr().out
    meta = json.loads((out / "index.json").read_text())
    assert meta["kind"] == "toyidx" and meta["n_docs"] == len(rows) and meta["min_len"] == 1 and meta["n_words"] > 0
    assert (out / "keywords.json").exists() and (out / "passages.jsonl").exists() and is_index_dir(out)
    query = rows[0]["contents"].splitlines()[0]  # the first passage's title: it holds all its words, first in order
    assert main(["search", "--index", str(out), "-k", "2", query]) == 0
    printed = capsys.readouterr().out.splitlines()
    assert printed[0] == f"query: {query!r} (2 hits)" and printed[1].endswith(f"(id {rows[0]['id']})")
    hits = load_index(out, device="cpu").retrieve([query, "   "], 1)  # search's options reach the kind's load
    assert hits[1] == [] and hits[0][0].id == rows[0]["id"] and hits[0][0].score == len(toy.words(query))
    cfg = Config.load(None, ['retrieval.kind="toyidx"', f'retrieval.index_dir="{out.as_posix()}"']).retrieval
    assert type(load_retriever(cfg)).__name__ == "KeywordRetriever"
    bm25 = Config.load(None, [f'retrieval.index_dir="{out.as_posix()}"']).retrieval
    with pytest.raises(ValueError, match="retrieval.kind = 'bm25' but index .* is a 'toyidx' index"):
        load_retriever(bm25)
    # the Python API: the kind's own option and its check (before anything is read or written)
    with pytest.raises(ValueError, match="toyidx: min_len = 0"):
        build_index(corpus, tmp_path / "bad", kind="toyidx", min_len=0)
    assert not (tmp_path / "bad").exists()
    assert build_index(corpus, tmp_path / "long", kind="toyidx", min_len=6)["min_len"] == 6
    with pytest.raises(ValueError, match="index kind 'nope' is not supported; choose one of bm25, dense, toyidx"):
        build_index(corpus, tmp_path / "nope", kind="nope")
    # the world's index, built on first use and then reused while the corpus is unchanged
    built = ensure_index(corpus, tmp_path / "world-idx", kind="toyidx")
    stamp = (built / "keywords.json").stat().st_mtime_ns
    assert ensure_index(corpus, built, kind="toyidx") == built and (built / "keywords.json").stat().st_mtime_ns == stamp


def test_reward_funcs_resolve_names_and_paths():
    """``train.reward_funcs``: registered names (em, f1, format) or ``module:function``; the default is today's
    reward (EM, plus the format reward with its weight when ``train.format_reward > 0``)."""
    from hindsearch.train.reward_funcs import em_reward, f1_reward, format_reward, reward_funcs_of
    from toy_reward import brevity

    train = Config.load(None, []).train
    assert train.reward_funcs == ["em"] and reward_funcs_of(train) == ([em_reward], None)
    weighted = Config.load(None, ["train.format_reward=0.2"]).train
    assert reward_funcs_of(weighted) == ([em_reward, format_reward], [1.0, 0.2])
    custom = Config.load(None, ['train.reward_funcs=["f1", "toy_reward:brevity"]']).train
    assert reward_funcs_of(custom) == ([f1_reward, brevity], None)
    assert f1_reward(["x"], golden_answers=[["Blue River"]], model_text=["<answer> the blue </answer>"]) == [
        pytest.approx(2 / 3)]
    assert reward_funcs_of(custom, [len]) == ([len], None)  # from Python: callables
    with pytest.raises(ConfigError, match="train.reward_funcs = \\['emm'\\] is not allowed"):
        reward_funcs_of(Config.load(None, ['train.reward_funcs=["emm"]']).train)
    with pytest.raises(ValueError, match="'toy_reward:nothing' cannot be loaded"):
        reward_funcs_of(Config.load(None, ['train.reward_funcs=["toy_reward:nothing"]']).train)
    with pytest.raises(ValueError, match="use one"):
        reward_funcs_of(Config.load(None, ['train.reward_funcs=["em", "format"]', "train.format_reward=0.5"]).train)
