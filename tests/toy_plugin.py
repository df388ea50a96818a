"""A plugin outside ``src/``: a third method (its options, a small real term, its metric declarations) and a
retriever kind, registered the way a user's file would (``plugins = ["tests/toy_plugin.py"]``). Used by
tests/test_plugins.py; nothing under ``src/`` names them."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path

import torch

from hindsearch.config.fields import bounded, choice
from hindsearch.hindsight import losses
from hindsearch.hindsight.contract import AuxBatch, at, mask_positions
from hindsearch.hindsight.registry import Metrics, register_method
from hindsearch.records import Passage
from hindsearch.retrieval.base import register_retriever


@dataclass
class ToyConfig:
    lam: float = bounded(0.05, ge=0.0)
    """Weight of L_toy."""
    rows: str = choice("all", ("all", "failed"))
    """Which rollouts' generated tokens are imitated: ``all`` or only the ``failed`` ones."""


@register_method("toy", config=ToyConfig)
class SelfImitationTerm:
    """NLL of the rollouts' own generated tokens (a sharpening term): small, but it takes positions and gradient."""

    name = "toy"
    aggregation = "token-mean"
    ema_decay = None
    metrics = Metrics(reductions={"rows": "sum", "gen_tokens": "sum", "frac_rows": "mean", "L_toy": "mean"},
                      loss="L_toy", panels={"Toy self-imitation": ("frac_rows", "gen_tokens")})

    def __init__(self, cfg: ToyConfig, seed: int = 0):
        self.cfg, self.lam = cfg, cfg.lam

    def prepare(self, trajectories, completion_len, ctx):
        mask = torch.zeros(len(trajectories), completion_len)
        rows = [i for i, t in enumerate(trajectories) if self.cfg.rows == "all" or t.failed]
        for i in rows:
            g = trajectories[i].gen_mask[:completion_len]
            mask[i, : len(g)] = torch.tensor(g, dtype=torch.float)
        return AuxBatch({"toy_mask": mask}, {"rows": float(len(rows)), "gen_tokens": float(mask.sum()),
                                             "frac_rows": len(rows) / max(len(trajectories), 1)})

    def positions(self, inputs, completion_len):
        return mask_positions(inputs["toy_mask"], completion_len)

    def loss(self, logits, idx, completion_ids, inputs):
        m = at(inputs["toy_mask"], idx).to(logits.device)
        lS = losses.token_logprobs(logits, at(completion_ids, idx).to(logits.device))
        L = -(lS * m).sum() / m.sum().clamp(min=1.0)
        return L, {"L_toy": float(L.detach())}


WORD = re.compile(r"\w+")
OPENED: list[OverlapRetriever] = []
"""Every retriever ``open_toy`` built (the test checks that the run used one)."""


@register_retriever("toy")
def open_toy(cfg, index_dir, corpus):
    """Word-overlap search over the ``corpus.jsonl`` of ``retrieval.index_dir`` (else the world's corpus)."""
    path = Path(index_dir) / "corpus.jsonl" if index_dir is not None else corpus
    if path is None:
        raise ValueError("retrieval.kind = 'toy' needs retrieval.index_dir: a folder with corpus.jsonl")
    OPENED.append(OverlapRetriever([Passage(r["id"], r["contents"]) for r in map(json.loads, Path(path).open())]))
    return OPENED[-1]


class OverlapRetriever:
    """The ``k`` passages sharing the most words with the query (ties: corpus order)."""

    def __init__(self, passages):
        self.passages = passages
        self.words = [set(WORD.findall(p.contents.lower())) for p in passages]
        self.calls = 0

    def retrieve(self, queries, k):
        self.calls += 1
        out = []
        for q in queries:
            qw = set(WORD.findall(q.lower()))
            if not qw:
                out.append([])
                continue
            scored = sorted(((len(qw & w), -i) for i, w in enumerate(self.words)), reverse=True)[:k]
            out.append([Passage(self.passages[-i].id, self.passages[-i].contents, float(s)) for s, i in scored])
        return out
