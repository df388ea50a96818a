"""The main job: ``run_train(cfg)`` = data and index -> policy -> warm-up -> dev eval -> the
method's steps -> dev eval.

Everything a bad config can break fails in ``preflight`` before a model loads; it also builds the
run's ``Parts`` (terms, reward functions) once. ``RUN_DIR`` holds ``config.toml``,
``metrics.jsonl``, ``samples.jsonl``, ``checkpoints/``, ``eval/<stage>/`` and ``summary.json``; one
trainer at a time (``.hindsearch.lock``). A resume (``resume=RUN_DIR``) continues from the last
complete checkpoint and writes no step twice; SIGTERM/SIGINT stop at a step's end with a checkpoint.
docs/runs.md describes the folder, resumes and stops in full.
"""

from __future__ import annotations

import contextlib
import copy
import gc
import json
import os
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from hindsearch.config import Config, ConfigError, flat_keys
from hindsearch.fsutil import BadJsonl, read_jsonl
from hindsearch.inputs import eval_engine, prepare
from hindsearch.train.dev_eval import (STAGE_NAMES, dev_curve_callback, evaluate_dev, format_table,
                                       summary_row)
from hindsearch.train.grpo_config import grpo_args, route_every_n_layers


# ---------------------------------------------------------------- validation (no model loads)
@dataclass
class Parts:
    """What a run assembles once from its config, before any model loads: the method's terms and the
    reward functions with TRL's ``reward_weights`` (None: 1 each)."""

    terms: list[Any]
    reward_funcs: list[Any]
    reward_weights: list[float] | None

    @classmethod
    def of(cls, cfg: Config, reward_funcs: list[Any] | None = None) -> "Parts":
        """``cfg.method``'s terms (objects only, no model) and ``reward_funcs`` (None:
        ``train.reward_funcs``)."""
        from hindsearch.hindsight.registry import make_terms
        from hindsearch.train.reward_funcs import reward_funcs_of

        # builds the term objects only (no model): bad term options fail here
        terms = make_terms(cfg)
        try:
            # a module:function that does not import fails
            funcs, weights = reward_funcs_of(cfg.train, reward_funcs)
        except (KeyError, ValueError) as e:
            raise ConfigError(str(e.args[0]) if isinstance(e, KeyError) else str(e)) from None
        return cls(terms, funcs, weights)


def preflight(cfg: Config, reward_funcs: list[Any] | None = None) -> Parts:
    """Validate everything that does not need a model and build the run's ``Parts``; errors name the
    key and what is allowed (``reward_funcs``: the ones given from Python instead of
    ``train.reward_funcs``)."""
    from hindsearch.hindsight.registry import resolve_methods
    from hindsearch.retrieval.factory import check_kind

    # the method checked and its tables parsed, then the whole config validated
    resolve_methods(cfg)
    check_kind(cfg.retrieval)
    for key in ("train", "dev", "test"):
        p = getattr(cfg.data, key)
        if p is not None and not Path(p).exists():
            raise ConfigError(f"data.{key} = {p!r}: file not found")
    from hindsearch.retrieval.registry import RETRIEVERS

    if cfg.retrieval.index_dir is not None and RETRIEVERS.get(cfg.retrieval.kind).index:
        if not (Path(cfg.retrieval.index_dir) / "index.json").exists():
            raise ConfigError(f"retrieval.index_dir = {cfg.retrieval.index_dir!r}: "
                              f"no index.json there (run `hindsearch index`)")
    if cfg.warmup.enabled and cfg.warmup.demos is not None and not Path(cfg.warmup.demos).exists():
        raise ConfigError(f"warmup.demos = {cfg.warmup.demos!r}: file not found")
    if cfg.rollout.backend == "vllm":
        try:
            import vllm  # noqa: F401  # optional: vllm
        except ImportError as e:
            raise ConfigError("rollout.backend = 'vllm' needs the vllm package "
                              "(pip install 'hindsearch[vllm]'); "
                              "use rollout.backend = 'hf' on CPU") from e
    if cfg.train.questions_per_step < 1:
        raise ConfigError("train.questions_per_step must be > 0")
    return Parts.of(cfg, reward_funcs)


# ---------------------------------------------------------------- trainer
def ensure_on_disk(model: Any, tokenizer: Any, folder: Path) -> None:
    """TRL builds its reference from ``config._name_or_path``: give in-memory models a folder."""
    p = getattr(model.config, "_name_or_path", "") or ""
    if p and (Path(p).is_dir() or not Path(p).is_absolute()):
        return
    folder.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    model.config._name_or_path = str(folder)


def build_trainer(cfg: Config, model: Any, tokenizer: Any, engine: Any, train_records: list[Any],
                  run_dir: Path, parts: Parts | None = None) -> Any:
    """``HindsearchGRPOTrainer`` over ``engine``'s rollouts with the run's ``parts``
    (``preflight``'s; None: ``Parts.of(cfg)``): the method's terms (their own models loaded here)
    and the reward functions."""
    from hindsearch.models import lora_peft_config
    from hindsearch.train.trainer import HindsearchGRPOTrainer

    parts = parts if parts is not None else Parts.of(cfg)
    terms = parts.terms
    for term in terms:
        # a term's own models (HindSearch's judge_model), not in prepare
        if hasattr(term, "load_models"):
            term.load_models(cfg.model)
    peft_config = lora_peft_config(cfg.model.lora)  # None without LoRA; TRL wraps the policy with it
    # the saved adapter names its base: `--resume` and `eval --model RUN/final` load it
    if peft_config is not None:
        base = getattr(model.config, "_name_or_path", "") or ""
        model.name_or_path = str(Path(base).resolve()) if base and Path(base).is_dir() else base
    # with LoRA TRL keeps no reference copy (the reference is the adapter-disabled base): copy the
    # initial policy
    needs_frozen = terms and (cfg.train.kl_coef == 0 or peft_config is not None)
    frozen = copy.deepcopy(model).eval() if needs_frozen else None
    # one EMA copy of the policy per decay some term asks for (terms with the same decay read the
    # same copy)
    decays = dict.fromkeys(getattr(t, "ema_decay", None) for t in terms)
    emas = {d: copy.deepcopy(model).eval() for d in decays if d is not None}
    nproc = int(os.environ.get("WORLD_SIZE", "1"))
    if cfg.train.gradient_checkpointing:
        route_every_n_layers(model)
    trainer = HindsearchGRPOTrainer(
        model=model, args=grpo_args(cfg, run_dir / "checkpoints", nproc),
        train_records=train_records, engine=engine, tokenizer=tokenizer, terms=terms, frozen=frozen,
        run_dir=run_dir,
        samples_per_step=cfg.train.samples_per_step, reward_funcs=parts.reward_funcs,
        reward_weights=parts.reward_weights, rollout_seed=cfg.train.seed, emas=emas,
        grad_share_steps=cfg.train.grad_share_steps, grpo_scale=cfg.train.grpo_scale,
        keep_steps=cfg.train.keep_steps, peft_config=peft_config)
    # RUN/tb/, not RUN/checkpoints/runs/<date>_<host>/
    tensorboard_to(trainer, Path(run_dir) / TB_DIR)
    return trainer


def last_checkpoint(run_dir: Path, log: Any = None) -> Path | None:
    """The newest complete checkpoint of ``run_dir``; incomplete ones (a save that was killed) are
    skipped, moved aside to ``checkpoints/.torn-checkpoint-N`` and reported through ``log``. With
    ``log`` (a resume) the one returned also passes ``corrupted_checkpoint`` (bytes overwritten in
    place): a corrupted one is set aside the same way and the next newer one is checked."""
    from hindsearch.fsutil import complete_checkpoints, corrupted_checkpoint

    good, skipped = complete_checkpoints(run_dir / "checkpoints")
    for p, why in skipped:
        if log is not None:
            set_aside(p, why, log)
    if log is not None:
        while good and (why := corrupted_checkpoint(good[0])):
            set_aside(good.pop(0), why, log)
    return good[0] if good else None


def set_aside(ckpt: Path, why: str, log: Any) -> Path:
    """Rename ``ckpt`` to ``.torn-<name>`` beside it (kept for inspection, never resumed from;
    ``.torn-<name>.2`` when that is taken) and say why through ``log``."""
    aside, n = ckpt.with_name(f".torn-{ckpt.name}"), 1
    while aside.exists():  # one set aside earlier: keep both
        n += 1
        aside = ckpt.with_name(f".torn-{ckpt.name}.{n}")
    ckpt.rename(aside)
    log(f"skipping {ckpt.name}: {why}; kept as {aside.name}")
    return aside


def checkpoint_step(ckpt: Path) -> int:
    return int(ckpt.name.rsplit("-", 1)[-1])


def read_jsonl_rows(path: Path, log: Any = None) -> list[dict[str, Any]]:
    """The rows of a run log (``fsutil.read_jsonl``, ``drop-torn-tail``). A torn last line (a write
    cut by a kill) is dropped, with a message naming it; any other bad line is an error naming the
    file and line."""
    torn: list[str] = []
    try:
        rows = read_jsonl(path, "drop-torn-tail", torn)
    except BadJsonl as e:
        raise BadJsonl(f"{e}; remove the line to resume") from None
    if log is not None:
        for msg in torn:
            log(f"{msg}; its step is redone")
    return rows


def truncate_jsonl(path: Path, max_step: int, log: Any = None) -> int:
    """Drop rows whose ``step`` is past ``max_step`` (they are redone on resume), and a torn last
    line. Returns rows dropped. The file is replaced atomically (a crash keeps the old or the new
    file)."""
    if not path.exists():
        return 0
    rows = read_jsonl_rows(path, log)
    keep = []
    for i, r in enumerate(rows):
        step = r.get("step", 0)
        if not isinstance(step, (int, float)) or isinstance(step, bool):
            raise ValueError(f"{path}: row {i + 1} has a non-numeric step {step!r}; "
                             f"remove the row to resume")
        if step <= max_step:
            keep.append(r)
    text = "".join(json.dumps(r) + "\n" for r in keep)
    if text.encode() != path.read_bytes():
        tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
        tmp.write_text(text, encoding="utf-8")
        tmp.replace(path)
    return len(rows) - len(keep)


NOT_TRAINING = ("out", "train.save_steps", "train.keep_steps", "train.eval_steps",
                "train.eval_limit", "train.samples_per_step", "train.threads",
                "eval.", "rollout.vllm_server_host", "rollout.vllm_server_port",
                "rollout.vllm_server_timeout", "retrieval.timeout_s", "retrieval.retries")
"""Config keys (``eval.``: a whole section) that change no training step: where the run is, how
often it saves and evaluates dev, what it logs and how it reaches its servers. A resume accepts
changes to these (and says so)."""


def config_changes(old: dict[str, Any], new: dict[str, Any]) -> list[tuple[str, Any, Any]]:
    """``[(key, old value, new value)]`` of each differing key (``None`` where a side lacks it)."""
    a, b = flat_keys(old), flat_keys(new)
    return [(k, a.get(k), b.get(k)) for k in sorted(set(a) | set(b)) if a.get(k) != b.get(k)]


def affects_training(key: str) -> bool:
    return not any(key == n or (n.endswith(".") and key.startswith(n)) for n in NOT_TRAINING)


def _normal(d: dict[str, Any]) -> dict[str, Any]:
    """A config dict as the current code reads it (defaults of newer fields filled in) and as JSON
    holds it (tuples as lists): a record and a reloaded config compare equal if nothing changed."""
    from hindsearch.hindsight.registry import resolve_methods

    try:
        d = resolve_methods(Config.from_dict(d)).to_dict()
    except (ConfigError, ValueError, TypeError):
        pass
    return json.loads(json.dumps(d, default=str))


def check_resume_config(cfg: Config, run_dir: Path, allow_change: bool, log: Any) -> dict[str, Any]:
    """Compare ``RUN_DIR/config.toml`` (as resumed) with the config the run started with (recorded
    in the folder's marker). A change to a key that changes training is refused, naming the key and
    both values, unless ``allow_change``: then it is used, recorded in the marker (with the first
    step it applies to), and said. Returns the marker to write back."""
    from hindsearch.fsutil import read_marker

    marker = read_marker(run_dir) or {"kind": "run"}
    from hindsearch.provenance import provenance

    # what made each resume (the marker's own provenance is the start's): the report names a commit
    # or machine change
    now_utc = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    marker.setdefault("resumes", []).append({"time": now_utc, "provenance": provenance()})
    started = marker.get("config")
    now = _normal(cfg.to_dict())
    if not isinstance(started, dict):
        raise ConfigError(f"{run_dir}: no record of the config the run started with: "
                          f"the folder was written by an older hindsearch and cannot be resumed; "
                          f"start a new run")
    # a resume runs in RUN_DIR
    changes = [c for c in config_changes(_normal(started), now) if c[0] != "out"]
    training = [c for c in changes if affects_training(c[0])]
    other = [c for c in changes if not affects_training(c[0])]
    if training and not allow_change:
        key, a, b = training[0]
        named = ", ".join(k for k, _, _ in training[1:4])
        more = f" (and {len(training) - 1} more: {named})" if len(training) > 1 else ""
        raise ConfigError(f"{run_dir / 'config.toml'} was edited since the run started: "
                          f"{key} = {a!r} -> {b!r}{more}; "
                          f"this changes the training, so the resume is refused; "
                          f"restore the old value, start a new run with another --out, "
                          f"or resume with --allow-config-change to use it from here on "
                          f"(recorded in the run)")
    for key, a, b in training:
        log(f"config change allowed by --allow-config-change: {key} = {a!r} -> {b!r} "
            f"(recorded in {run_dir})")
    for key, a, b in other:
        log(f"config change: {key} = {a!r} -> {b!r} (changes no training step)")
    if changes:
        marker.setdefault("config_changes", []).append(
            {"time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "allowed": bool(training),
             "changes": [{"key": k, "old": a, "new": b} for k, a, b in changes]})
        marker["config"] = now
    return marker


TB_DIR = "tb"
"""Where a run's TensorBoard event files go (``report_to = ["tensorboard"]``): ``RUN/tb/``."""


def tensorboard_to(trainer: Any, path: Path) -> bool:
    """Point the trainer's TensorBoard callback (if ``report_to`` has one) at ``path`` instead of
    transformers' ``RUN/checkpoints/runs/<date>_<host>/``; a user's ``TENSORBOARD_LOGGING_DIR``
    wins. Returns whether it did."""
    from transformers.integrations import TensorBoardCallback

    done = False
    for cb in trainer.callback_handler.callbacks:
        if isinstance(cb, TensorBoardCallback) and cb.logging_dir is None:
            cb.logging_dir = str(path)
            done = True
    return done


# ---------------------------------------------------------------- signals
class TrainingStopped(KeyboardInterrupt):
    """A run stopped by SIGTERM or SIGINT: the message says what was kept and how to continue;
    ``exit_code`` is 128 + the signal (the CLI exits with it). A ``KeyboardInterrupt``, so no
    ``except Exception`` swallows it."""

    def __init__(self, message: str, signum: int) -> None:
        super().__init__(message)
        self.exit_code = 128 + signum


class StopRequest:
    """What ``stop_on_signals`` shares with the training loop: the signal received (None: none yet)
    and whether a stop now waits for the end of the step in progress (``at_step_end``, set while the
    trainer runs)."""

    def __init__(self, run_dir: Path) -> None:
        self.run_dir = run_dir
        self.signum: int | None = None
        self.at_step_end = False

    def stopped(self, how: str, signum: int) -> TrainingStopped:
        import signal

        name = signal.Signals(signum).name
        return TrainingStopped(f"stopped by {name} {how}; the lock is released; "
                               f"continue with: hindsearch train --resume {self.run_dir}", signum)


@contextlib.contextmanager
def stop_on_signals(run_dir: Path, log: Any = print) -> Any:
    """SIGTERM and SIGINT while the block runs: during training (``StopRequest.at_step_end``) the
    first one asks for a checkpoint at the end of the step in progress (``callbacks.StopAtStepEnd``,
    the caller raises ``TrainingStopped`` after it); otherwise, or on a second signal,
    ``TrainingStopped`` is raised at once. Yields the ``StopRequest``; the previous handlers are
    restored after the block. Off the main thread signals cannot be caught: the block runs with the
    handlers as they are."""
    import signal
    import threading

    req = StopRequest(run_dir)

    def handler(signum: int, frame: Any) -> None:
        if req.signum is not None:
            raise req.stopped("again, at once (the newest complete checkpoint is kept)", signum)
        if not req.at_step_end:
            raise req.stopped("before training (finished evaluations are kept)", signum)
        req.signum = signum
        log(f"{signal.Signals(signum).name}: stopping at the end of the step in progress, "
            f"with a checkpoint (a second signal stops at once)")

    if threading.current_thread() is not threading.main_thread():
        yield req
        return
    sigs = (signal.SIGTERM, signal.SIGINT)
    prev = {s: signal.signal(s, handler) for s in sigs}
    try:
        yield req
    finally:
        for s, h in prev.items():
            signal.signal(s, h)


# ---------------------------------------------------------------- main job
def run_train(cfg: Config | None = None, resume: str | Path | None = None, log: Any = print,
              allow_config_change: bool = False, threads: int | None = None, retriever: Any = None,
              reward_funcs: list[Any] | None = None) -> dict[str, Any]:
    """Run (or resume) the whole job; returns the summary dict (also written to
    ``RUN_DIR/summary.json``).

    From Python, ``retriever`` (any object with
    ``retrieve(queries: list[str], k: int) -> list[list[Passage]]``) replaces the configured
    ``[retrieval]`` (no index is built; the protocol warm-up's cache is keyed by the config, so give
    it ``warmup.enabled = false`` or its own ``warmup.demos``), and ``reward_funcs`` (TRL reward
    functions or registered names) replace ``train.reward_funcs``; the configured format reward is
    still added.

    A new run writes only into a new or empty folder, or a run folder hindsearch made (its marker
    ``.hindsearch-output.json`` says ``run``) that holds no checkpoint. A resume refuses a
    ``config.toml`` edited since the start in a key that changes training, unless
    ``allow_config_change`` (recorded in the run). ``threads`` (``--threads`` with ``--resume``)
    overrides ``train.threads`` for this process: a machine setting, not a training key."""
    from hindsearch.fsutil import (FolderLock, UnsafeOutput, complete_checkpoints, expand_out,
                                   guard_output, output_kind)

    t_start = time.time()
    ckpt = None
    if resume is not None:
        run_dir = expand_out(resume)
        if not (run_dir / "config.toml").exists():
            raise FileNotFoundError(f"--resume {run_dir}: no config.toml there (not a run folder)")
        if output_kind(run_dir) not in (None, "run"):
            raise UnsafeOutput(f"--resume {run_dir}: is a hindsearch {output_kind(run_dir)} folder, "
                               f"not a run folder")
        cfg = Config.load(run_dir / "config.toml")
    if cfg is None:
        raise ValueError("run_train needs a config or a run folder to resume")
    if resume is None and not str(cfg.out).strip():
        raise ConfigError("out = '': no run folder given (it would write into the current folder); "
                          "set out in the config or pass --out")
    parts = preflight(cfg, reward_funcs)
    from hindsearch import upstream_warnings

    # also from Python, not only the CLI: known upstream notices once each
    upstream_warnings.install()
    from hindsearch.memory import tune_malloc
    from hindsearch.progress import quiet_upstream_bars

    quiet_upstream_bars()  # from Python too: no upstream bar redraws in a log (as the CLI does)
    tune_malloc()  # as the CLI does (a no-op there, done already): fewer malloc arenas from here on
    from hindsearch.models import set_threads

    used_threads = set_threads(threads or cfg.train.threads, log)
    if resume is None:
        run_dir = expand_out(cfg.out)
    good, torn = complete_checkpoints(run_dir / "checkpoints") if run_dir.is_dir() else ([], [])
    if resume is None and (good or torn):
        raise FileExistsError(f"{run_dir} already holds checkpoints; "
                              f"use --resume {run_dir} or another --out")
    if resume is None:  # a new run: only into a new or empty folder, or a run folder of ours
        run_dir = guard_output(cfg.out, "run", "run folder")
        if str(run_dir) != cfg.out:
            cfg.out = str(run_dir)  # '~' expanded: config.toml names the folder the run is in
    # distributed: the first process holds the lock for all (one trainer per folder)
    rank0 = int(os.environ.get("RANK", "0")) == 0
    lock = FolderLock(run_dir, "run folder", log=log) if rank0 else contextlib.nullcontext()
    with lock:
        # SIGTERM/SIGINT: a checkpoint, the lock released, one line
        with stop_on_signals(run_dir, log) as stop:
            marker = None
            if resume is not None:
                marker = check_resume_config(cfg, run_dir, allow_config_change, log)
            if resume is not None:
                ckpt = last_checkpoint(run_dir, log=log if rank0 else None)
            job = _Job(cfg, run_dir, log, parts, retriever=retriever, stop=stop)
            job.threads = {"count": used_threads[0], "why": used_threads[1]}
            return _run_locked(job, resume, ckpt, t_start, marker if rank0 else None)


def _run_locked(job: "_Job", resume: str | Path | None, ckpt: Path | None, t_start: float,
                marker: dict[str, Any] | None = None) -> dict[str, Any]:
    cfg, run_dir, log = job.cfg, job.run_dir, job.log
    done = _reset_logs(cfg, run_dir, resume, ckpt, log, marker)
    job.data()
    model = job.load()
    job.dev_eval("base", model)
    model = job.warmup(model)
    ensure_on_disk(model, job.tok, run_dir / "init")
    model = job.rl(model, ckpt, done)
    log("[5/5] dev evaluation after RL")
    job.dev_eval("rl", model)
    return job.finish(t_start)


# a run folder's per-step JSONL logs
STEP_LOGS = ("metrics.jsonl", "samples.jsonl", "dev_curve.jsonl")


def _reset_logs(cfg: Config, run_dir: Path, resume: str | Path | None, ckpt: Path | None, log: Any,
                marker: dict[str, Any] | None = None) -> int:
    """A new run marks its folder (recording its config) and starts with empty logs; a resumed one
    drops the rows past its checkpoint (all step rows when no complete checkpoint is left, so no
    step is written twice) and a torn last line. Saves the resolved config; returns the number of
    steps already done."""
    from hindsearch.fsutil import claim_output, write_json_atomic

    rank0 = int(os.environ.get("RANK", "0")) == 0
    if resume is None:
        if rank0:
            claim_output(run_dir, "run", config=cfg.to_dict())
        for name in STEP_LOGS:
            (run_dir / name).unlink(missing_ok=True)
    done = checkpoint_step(ckpt) if ckpt else 0
    if resume is not None and rank0 and marker is not None:
        from hindsearch.fsutil import OUTPUT_MARKER

        for change in marker.get("config_changes", []):
            # the first step trained with the changed config
            change.setdefault("from_step", done + 1)
        write_json_atomic(run_dir / OUTPUT_MARKER, marker)
    cfg.save(run_dir / "config.toml")
    if resume is not None:
        logs = STEP_LOGS if rank0 else ()
        dropped = {name: truncate_jsonl(run_dir / name, done, log) for name in logs}
        gone = ", ".join(f"{n} rows of {name}" for name, n in dropped.items() if n)
        if ckpt is not None:
            log(f"resuming {run_dir} from {ckpt.name} ({done}/{cfg.train.steps} steps done)"
                + (f"; dropped {gone} past step {done} (redone)" if gone else ""))
        else:
            log(f"resuming {run_dir}: no complete checkpoint, starting from step 0"
                + (f"; dropped {gone} (redone)" if gone else ""))
    return done


class _Job:
    """The main job's stages, each measured by ``StageMemory`` (peak RSS, wall and CPU time)."""

    def __init__(self, cfg: Config, run_dir: Path, log: Any, parts: Parts, retriever: Any = None,
                 stop: StopRequest | None = None) -> None:
        from hindsearch.memory import StageMemory

        # set by stop_on_signals: a SIGTERM/SIGINT during training stops at a step's end
        self.stop = stop

        self.cfg, self.run_dir, self.log = cfg, run_dir, log
        self.parts = parts  # the terms and reward functions, built once (preflight)
        self.retriever = retriever  # from Python (run_train), else the config's
        self.mem = StageMemory()
        self.rows: dict[str, dict[str, Any]] = {}
        self.timings: dict[str, float] = {}
        self.distributed = int(os.environ.get("WORLD_SIZE", "1")) > 1
        self.tok: Any = None
        # eval.model_identity of the policy now in memory
        self.model_id: dict[str, Any] | None = None
        # hindsearch.inputs.prepare's result: paths, train/dev records, retriever
        self.setup: Any = None
        # the torch thread count the run used and why (summary.json)
        self.threads: dict[str, Any] = {}

    def data(self) -> None:
        what = self.cfg.retrieval.kind if self.retriever is None else type(self.retriever).__name__
        self.log(f"[1/5] data and index ({what})")
        with self.mem.stage("data"):
            self.setup = setup = prepare(self.cfg, retriever=self.retriever)
        self.log(f"      {len(setup.train)} train questions ({setup.paths['train']}), "
                 f"{len(setup.dev)} dev ({setup.paths['dev']})")
        from hindsearch.inputs import belonging_warning

        # e.g. the world's questions against a user's server
        if warning := belonging_warning(self.cfg, setup):
            self.log(f"      {warning}")

    def load(self) -> Any:
        from hindsearch.models import load_policy

        self.log(f"[2/5] policy {self.cfg.model.name}")
        from hindsearch.eval import model_identity

        with self.mem.stage("load"):
            model, self.tok = load_policy(self.cfg.model)
        self.model_id = model_identity(self.cfg.model.name, self.cfg.model.gguf_file)
        return model

    def make_engine(self, m: Any) -> Any:
        return eval_engine(self.cfg, m, self.tok, self.setup.retriever)

    def dev_eval(self, stage: str, m: Any) -> None:
        # sharded weights: evaluate the saved model with `hindsearch eval` instead
        if self.distributed:
            self.log(f"      (distributed run: dev evaluation '{stage}' skipped; "
                     f"run `hindsearch eval --model {self.run_dir}/final`)")
            return
        t0 = time.time()
        with self.mem.stage(f"eval_{stage}"):
            out = self.run_dir / "eval" / stage
            result = evaluate_dev(self.make_engine(m), self.setup.dev, out, self.cfg, self.model_id,
                                  log=self.log)
            self.rows[stage] = summary_row(result)
        self.timings[f"eval_{stage}"] = time.time() - t0
        self.log(f"      dev EM {STAGE_NAMES[stage]}: {self.rows[stage]['em']}")

    def warmup(self, model: Any) -> Any:
        """The cached protocol warm-up; returns the policy reloaded from disk (or ``model``)."""
        if not self.cfg.warmup.enabled:
            self.log("[3/5] protocol warm-up disabled")
            return model
        from hindsearch.models import cache_dir, load_policy
        from hindsearch.train.warmup import ensure_warmup, warmup_dir

        final = warmup_dir(self.cfg, self.setup.train, cache_dir() / "warmup")
        cached = (final / "warmup.json").exists()
        self.log("[3/5] protocol warm-up: " + (f"cached ({final.name})" if cached else
                                               f"training (cached for later runs as {final.name})"))
        t0 = time.time()
        with self.mem.stage("warmup"):
            wdir = ensure_warmup(self.cfg, model, self.tok, self.setup.retriever, self.setup.train,
                                 cache_dir() / "warmup")
            self.timings["warmup"] = time.time() - t0
            del model  # the SFT'd copy in memory: the policy is reloaded from the saved folder
            gc.collect()
            model, self.tok = load_policy(replace(self.cfg.model, name=str(wdir), gguf_file=None))
        from hindsearch.eval import model_identity

        self.model_id = model_identity(str(wdir))
        self.log(f"      warmed-up checkpoint: {wdir}")
        self.dev_eval("warmup", model)
        return model

    def rl(self, model: Any, ckpt: Path | None, done: int) -> Any:
        """``train.steps`` steps of the method (or a finished run's weights); returns the policy."""
        cfg = self.cfg
        self.log(f"[4/5] {cfg.method} for {cfg.train.steps} steps "
                 f"({cfg.train.questions_per_step} questions x {cfg.rollout.num_generations} "
                 f"rollouts per step)")
        t0 = time.time()
        from hindsearch.eval import model_identity

        with self.mem.stage("rl"):
            # training already finished: reuse its weights
            if ckpt is not None and done >= cfg.train.steps:
                from hindsearch.models import load_policy

                final = self.run_dir / "final"
                src = final if final.is_dir() else ckpt
                model, self.tok = load_policy(replace(cfg.model, name=str(src), gguf_file=None))
                self.log(f"      all {cfg.train.steps} steps already done; using {src}")
                self.model_id = model_identity(str(src))
            elif cfg.train.steps > 0:
                model = self._train(model, ckpt)
                self.model_id = model_identity(str(self.run_dir / "final"))
        self.timings["rl"] = time.time() - t0
        return model

    def _train(self, model: Any, ckpt: Path | None) -> Any:
        """Train from ``ckpt``; when the first step after it makes a weight non-finite (its
        optimizer state is poisoned), that checkpoint is set aside and training falls back to the
        one before it (or to step 0)."""
        from hindsearch.fsutil import NonFiniteWeights

        # what step 0 starts from (ensure_on_disk)
        source = getattr(model.config, "_name_or_path", "") or ""
        while True:
            try:
                return self._train_from(model, ckpt)
            except NonFiniteWeights as e:
                if ckpt is None or e.step != checkpoint_step(ckpt) + 1 or self.distributed:
                    last = last_checkpoint(self.run_dir)
                    where = (f"the last complete checkpoint is {last.name}" if last
                             else "no checkpoint was written")
                    raise RuntimeError(f"{e}; nothing of that step is saved ({where}); "
                                       f"lower train.lr or check the data, "
                                       f"then resume with --resume {self.run_dir}") from None
                why = (f"resuming from it made weight {e.name} non-finite at step {e.step} "
                       f"(its optimizer state is corrupted)")
                set_aside(ckpt, why, self.log)
            gc.collect()
            ckpt = last_checkpoint(self.run_dir, log=self.log)
            _reset_logs(self.cfg, self.run_dir, "fallback", ckpt, self.log)
            # the weights in memory are poisoned: reload the policy RL started from (the checkpoint,
            # if any, loads its weights into it; the frozen and EMA copies are taken from it)
            from hindsearch.models import load_policy

            start = self.cfg.model
            if Path(source).is_dir():
                start = replace(start, name=source, gguf_file=None)
            model, self.tok = load_policy(start)

    def _train_from(self, model: Any, ckpt: Path | None) -> Any:
        from hindsearch.memory import release_memory_callback
        from hindsearch.train.aux_loss import NonFiniteLoss

        cfg, run_dir, setup = self.cfg, self.run_dir, self.setup
        model.train()
        trainer = build_trainer(cfg, model, self.tok, self.make_engine(model), setup.train, run_dir,
                                self.parts)
        from hindsearch.train.callbacks import use_progress

        # a bar on a terminal, plain lines in a log
        if not getattr(trainer.args, "disable_tqdm", False):
            use_progress(trainer, f"{cfg.method} steps", postfix=("loss", "rollout/reward_mean"))
        trainer.add_callback(release_memory_callback())
        if cfg.train.eval_steps > 0 and not self.distributed:
            curve = dev_curve_callback(cfg, trainer, self.make_engine, setup.dev, run_dir)
            trainer.add_callback(curve)
        stop = self.stop
        if stop is not None:
            from hindsearch.train.callbacks import StopAtStepEnd

            trainer.add_callback(StopAtStepEnd(lambda: stop.signum is not None))
            stop.at_step_end = True
        try:
            trainer.train(resume_from_checkpoint=str(ckpt) if ckpt else None)
        except NonFiniteLoss as e:
            trainer._save_checkpoint(trainer.model, trial=None)
            raise RuntimeError(f"{e}; the last good weights are saved in {run_dir / 'checkpoints'} "
                               f"(lower train.lr or check the data)") from e
        finally:
            if stop is not None:
                stop.at_step_end = False
        if stop is not None and stop.signum is not None:
            step = trainer.state.global_step
            saved = f"checkpoint-{step} is saved in {run_dir / 'checkpoints'}"
            raise stop.stopped(f"after step {step} of {cfg.train.steps}: {saved}", stop.signum)
        trainer.save_model(str(run_dir / "final"))
        model = trainer.accelerator.unwrap_model(trainer.model)
        # its optimizer state (2x the trainable weights) is not needed by the last evaluation
        del trainer
        gc.collect()
        return model

    def finish(self, t_start: float) -> dict[str, Any]:
        """Write ``summary.json``, print the EM and memory tables; returns the summary."""
        from hindsearch.memory import format_memory_table

        cfg, run_dir, log = self.cfg, self.run_dir, self.log
        self.timings["total"] = time.time() - t_start
        summary = {"run_dir": str(run_dir), "method": cfg.method, "steps": cfg.train.steps,
                   "dev": self.rows, "timings_s": self.timings, "memory": self.mem.summary(),
                   "threads": self.threads,
                   "paths": {k: str(v) for k, v in self.setup.paths.items() if v is not None}}
        (run_dir / "summary.json").write_text(json.dumps(summary, indent=1))
        log("\n" + format_table(self.rows))
        log("\n" + format_memory_table(summary["memory"]))
        log(f"\noutputs: {run_dir}/ (config.toml, metrics.jsonl, samples.jsonl, checkpoints/, "
            f"final/, eval/, summary.json); total {self.timings['total'] / 60:.1f} min")
        return summary
