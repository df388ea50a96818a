"""Test-wide settings: offline, quiet TRL experimental warnings, fewer threads fighting on 2 cores."""

import contextlib
import os
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the research rigs: import recipes.micro.build

from hindsearch.memory import tune_malloc

tune_malloc()  # as the CLI does: the suite's peak RSS without glibc arena growth (HINDSEARCH_MALLOC_TUNE=0 turns it off)
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


@pytest.fixture(scope="module")
def one_thread():
    """Tiny models run fastest on one thread (and do not fight over shared CPUs); restored afterwards."""
    import torch

    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


@pytest.fixture(scope="module")
def tok():
    """The tiny-random model's tokenizer (SmolLM2's); a test module may define its own ``tok``."""
    from hindsearch.models import load_tokenizer

    return load_tokenizer("tiny-random")


@pytest.fixture(scope="module")
def model(tok):
    """A tiny random Llama over ``tok``; a test module may define its own ``model``."""
    from hindsearch.models import tiny_random_model

    return tiny_random_model(tok)


@pytest.fixture(scope="session")
def term_context():
    """``term_context(model, tok, retriever=None, frozen=model, topk=2, **kw)``: the ``AuxContext`` a term gets in a
    run, with ``model`` as the policy and an HF backend of it as the query completer."""
    from hindsearch.agent.hf_backend import HFBackend
    from hindsearch.hindsight.contract import AuxContext

    def make(model, tok, retriever=None, frozen=None, topk=2, **kw):
        return AuxContext(policy=model, frozen=model if frozen is None else frozen, tokenizer=tok,
                          retriever=retriever, complete=HFBackend(model, tok), topk=topk, **kw)

    return make


def one_line_error(capsys, *needles: str) -> str:
    """The last stderr line of a CLI call that failed cleanly: no traceback, and every needle in that one line."""
    err = capsys.readouterr().err.strip()
    assert "Traceback" not in err, err
    last = err.splitlines()[-1]
    for n in needles:
        assert n in last, (n, err)
    return last


@contextlib.contextmanager
def registries_restored(modules: tuple[str, ...] = ()):
    """Registrations made inside the block are undone after it: the method, retriever and reward registries, the
    loaded plugins, and the plugin modules (``hindsearch_plugin_*`` and ``modules``) imported meanwhile."""
    from hindsearch.config import registry
    from hindsearch.hindsight.registry import METHODS
    from hindsearch.retrieval.registry import RETRIEVERS
    from hindsearch.train.reward_funcs import REWARDS

    regs = (METHODS, RETRIEVERS, REWARDS)
    for r in regs:
        r.load()
    saved = [(dict(r._entries), dict(r._rank), dict(r._module)) for r in regs]
    plugins, before = dict(registry._PLUGINS), set(sys.modules)
    try:
        yield
    finally:
        for r, (entries, rank, module) in zip(regs, saved):
            r._entries, r._rank, r._module = entries, rank, module
        registry._PLUGINS.clear()
        registry._PLUGINS.update(plugins)
        for name in set(sys.modules) - before:
            if name.startswith("hindsearch_plugin_") or name in modules:
                del sys.modules[name]
