"""The main job: ``run_train(cfg)`` = world + index -> policy -> warm-up -> dev eval -> GRPO -> dev eval.

Order (everything that can fail on a bad config fails in ``preflight`` before a model loads):

1. ``preflight``: ``Config.validate``, files named by the config exist, the method's terms can be
   built, vLLM importable when asked for;
2. data: the fictional world and its BM25 index are built on first use (cached under
   ``data.world_dir``), or the configured QA files / index / retrieval server are used;
3. the policy (``models.load_policy``), the dev EM of the base model;
4. the protocol warm-up (``train.warmup.ensure_warmup``, cached by config hash) and its dev EM;
5. ``train.steps`` GRPO steps through ``HindsearchGRPOTrainer`` (checkpoints under
   ``RUN_DIR/checkpoints``), then the dev EM after RL;
6. a table base / after warm-up / after RL (EM overall and by hop count, searches per question,
   validity rate) printed and saved to ``RUN_DIR/summary.json``.

``RUN_DIR`` holds ``config.toml`` (resolved), ``metrics.jsonl``, ``samples.jsonl``,
``checkpoints/``, ``eval/<stage>/`` and ``summary.json``. ``run_train(cfg, resume=RUN_DIR)`` reloads
``RUN_DIR/config.toml`` and continues from the last complete checkpoint (checkpoints are written
atomically; an incomplete one is skipped with a message; finished evaluations are reused, metrics
rows past the checkpoint are dropped so no step is logged twice). ``RUN_DIR/.hindsearch.lock``
keeps a second trainer out of the folder while one runs. A non-finite loss
saves a checkpoint of the last good weights and stops with an error.
"""

from __future__ import annotations

import contextlib
import copy
import gc
import json
import os
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

from hindsearch.config import Config, ConfigError
from hindsearch.setup import eval_engine, prepare
from hindsearch.train.dev_eval import STAGE_NAMES, dev_curve_callback, evaluate_dev, format_table, summary_row
from hindsearch.train.grpo_config import grpo_args, route_every_n_layers



# ---------------------------------------------------------------- validation (no model loads)
def preflight(cfg: Config) -> None:
    """Validate everything that does not need a model; errors name the key and what is allowed."""
    cfg.validate()
    for key in ("train", "dev", "test"):
        p = getattr(cfg.data, key)
        if p is not None and not Path(p).exists():
            raise ConfigError(f"data.{key} = {p!r}: file not found")
    if cfg.retrieval.index_dir is not None and cfg.retrieval.kind != "remote":
        if not (Path(cfg.retrieval.index_dir) / "index.json").exists():
            raise ConfigError(f"retrieval.index_dir = {cfg.retrieval.index_dir!r}: no index.json there (run `hindsearch index`)")
    if cfg.warmup.enabled and cfg.warmup.demos is not None and not Path(cfg.warmup.demos).exists():
        raise ConfigError(f"warmup.demos = {cfg.warmup.demos!r}: file not found")
    if cfg.rollout.backend == "vllm":
        try:
            import vllm  # noqa: F401
        except ImportError as e:
            raise ConfigError("rollout.backend = 'vllm' needs the vllm package (pip install 'hindsearch[vllm]'); "
                              "use rollout.backend = 'hf' on CPU") from e
    if cfg.train.questions_per_step < 1:
        raise ConfigError("train.questions_per_step must be > 0")
    make_terms(cfg)  # builds the term objects only (no model): bad term options fail here


def make_terms(cfg: Config, judge: Any = None) -> list[Any]:
    """The method's auxiliary terms (``[]`` for grpo); ``judge`` is injected into the HindSearch term."""
    if cfg.method == "grpo":
        return []
    from hindsearch.hindsight.terms import make_terms as _make

    return list(_make(cfg, judge=judge))


def build_judge(cfg: Config) -> Any:
    """The HindSearch judge on ``hindsearch.judge_model``, loaded here where the run is assembled; None when the
    judge is the oracle or the frozen initial policy (the term builds those from its context)."""
    h = cfg.hindsearch
    if "hindsearch" not in cfg.method or h.judge_kind != "lm" or not h.judge_model:
        return None
    from hindsearch.hindsight.terms import load_judge_model, make_judge

    model, tok = load_judge_model(cfg)
    return make_judge(h, model, tok)


# ---------------------------------------------------------------- trainer
def ensure_on_disk(model: Any, tokenizer: Any, folder: Path) -> None:
    """TRL builds its reference model from ``config._name_or_path``: give in-memory models a folder."""
    p = getattr(model.config, "_name_or_path", "") or ""
    if p and (Path(p).is_dir() or not Path(p).is_absolute()):
        return
    folder.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    model.config._name_or_path = str(folder)


def build_trainer(cfg: Config, model: Any, tokenizer: Any, engine: Any, retriever: Any, train_records: list[Any],
                  run_dir: Path) -> Any:
    """``HindsearchGRPOTrainer`` with the method's terms and their context."""
    from hindsearch.hindsight.contract import AuxContext
    from hindsearch.train.trainer import HindsearchGRPOTrainer

    from hindsearch.models import lora_peft_config

    terms = make_terms(cfg, judge=build_judge(cfg))
    peft_config = lora_peft_config(cfg.model.lora)  # None without LoRA; TRL wraps the policy with it
    if peft_config is not None:  # the saved adapter names its base: `--resume` and `eval --model RUN/final` load it
        base = getattr(model.config, "_name_or_path", "") or ""
        model.name_or_path = str(Path(base).resolve()) if base and Path(base).is_dir() else base
    # with LoRA TRL keeps no reference copy (the reference is the adapter-disabled base): copy the initial policy
    frozen = copy.deepcopy(model).eval() if terms and (cfg.train.kl_coef == 0 or peft_config is not None) else None
    ema = copy.deepcopy(model).eval() if any(getattr(t, "needs_ema", False) for t in terms) else None
    ctx = AuxContext(policy=model, frozen=frozen, tokenizer=tokenizer, retriever=retriever, rollout_engine=engine,
                     config=cfg, device=next(model.parameters()).device, ema=ema) if terms else None
    nproc = int(os.environ.get("WORLD_SIZE", "1"))
    if cfg.train.gradient_checkpointing:
        route_every_n_layers(model)
    trainer = HindsearchGRPOTrainer(
        model=model, args=grpo_args(cfg, run_dir / "checkpoints", nproc), train_records=train_records, engine=engine,
        tokenizer=tokenizer, terms=terms, aux_ctx=ctx, run_dir=run_dir, samples_per_step=cfg.train.samples_per_step,
        format_reward=cfg.train.format_reward, rollout_seed=cfg.train.seed, ema_decay=cfg.hindsearch.ema_decay,
        grad_share_steps=cfg.train.grad_share_steps, grpo_scale=cfg.train.grpo_scale,
        peft_config=peft_config)
    if ctx is not None:
        if ctx.frozen is None:
            ctx.frozen = trainer.ref_model  # the initial policy, already loaded by TRL for the KL term
        for m in (ctx.frozen, ctx.ema):
            for p in m.parameters() if m is not None else ():
                p.requires_grad_(False)
        ctx.device = trainer.accelerator.device
    return trainer


def last_checkpoint(run_dir: Path, log: Any = None) -> Path | None:
    """The newest complete checkpoint of ``run_dir``; incomplete ones (a save that was killed) are
    skipped, moved aside to ``checkpoints/.torn-checkpoint-N`` and reported through ``log``."""
    from hindsearch.fsutil import complete_checkpoints

    good, skipped = complete_checkpoints(run_dir / "checkpoints")
    for p, why in skipped:
        if log is not None:
            aside = p.with_name(f".torn-{p.name}")
            if not aside.exists():
                p.rename(aside)
            log(f"skipping {p.name}: {why}; kept as {aside.name}")
    return good[0] if good else None


def checkpoint_step(ckpt: Path) -> int:
    return int(ckpt.name.rsplit("-", 1)[-1])


def truncate_jsonl(path: Path, max_step: int) -> int:
    """Drop rows whose ``step`` is past ``max_step`` (they are redone on resume). Returns rows dropped."""
    if not path.exists():
        return 0
    rows = [ln for ln in path.read_text().splitlines() if ln.strip()]
    keep = [ln for ln in rows if json.loads(ln).get("step", 0) <= max_step]
    path.write_text("".join(ln + "\n" for ln in keep))
    return len(rows) - len(keep)


# ---------------------------------------------------------------- main job
def run_train(cfg: Config | None = None, resume: str | Path | None = None, log: Any = print) -> dict[str, Any]:
    """Run (or resume) the whole job; returns the summary dict (also written to ``RUN_DIR/summary.json``)."""
    t_start = time.time()
    ckpt = None
    if resume is not None:
        run_dir = Path(resume)
        if not (run_dir / "config.toml").exists():
            raise FileNotFoundError(f"--resume {run_dir}: no config.toml there (not a run folder)")
        cfg = Config.load(run_dir / "config.toml")
    if cfg is None:
        raise ValueError("run_train needs a config or a run folder to resume")
    preflight(cfg)
    from hindsearch.models import resolve_model

    resolve_model(cfg)  # model.name = "micro" -> the world's micro model folder, before the run folder is made
    run_dir = Path(resume) if resume is not None else Path(cfg.out)
    if run_dir.exists() and not run_dir.is_dir():
        raise NotADirectoryError(f"--out {run_dir}: is a file, not a run folder")
    from hindsearch.fsutil import FolderLock, complete_checkpoints

    good, torn = complete_checkpoints(run_dir / "checkpoints")
    if resume is None and (good or torn):
        raise FileExistsError(f"{run_dir} already holds checkpoints; use --resume {run_dir} or another --out")
    rank0 = int(os.environ.get("RANK", "0")) == 0  # distributed: the first process holds the lock for all
    with FolderLock(run_dir, "run folder", log=log) if rank0 else contextlib.nullcontext():  # one trainer per folder
        if resume is not None:
            ckpt = last_checkpoint(run_dir, log=log if rank0 else None)
        return _run_locked(cfg, run_dir, resume, ckpt, t_start, log)


def _run_locked(cfg: Config, run_dir: Path, resume: str | Path | None, ckpt: Path | None, t_start: float,
                log: Any) -> dict[str, Any]:
    done = _reset_logs(cfg, run_dir, resume, ckpt, log)
    job = _Job(cfg, run_dir, log)
    job.data()
    model = job.load()
    job.dev_eval("base", model)
    model = job.warmup(model)
    ensure_on_disk(model, job.tok, run_dir / "init")
    model = job.rl(model, ckpt, done)
    log("[5/5] dev evaluation after RL")
    job.dev_eval("rl", model)
    return job.finish(t_start)


STEP_LOGS = ("metrics.jsonl", "samples.jsonl", "dev_curve.jsonl")  # a run folder's per-step JSONL logs


def _reset_logs(cfg: Config, run_dir: Path, resume: str | Path | None, ckpt: Path | None, log: Any) -> int:
    """A new run starts with empty logs; a resumed one drops the rows past its checkpoint. Saves the resolved
    config; returns the number of steps already done."""
    if resume is None:
        for name in STEP_LOGS:
            (run_dir / name).unlink(missing_ok=True)
    cfg.save(run_dir / "config.toml")
    done = checkpoint_step(ckpt) if ckpt else 0
    if ckpt is not None:
        for name in STEP_LOGS:
            truncate_jsonl(run_dir / name, done)
        log(f"resuming {run_dir} from {ckpt.name} ({done}/{cfg.train.steps} steps done)")
    return done


class _Job:
    """The main job's stages, each measured by ``StageMemory`` (peak RSS, wall and CPU time into summary.json)."""

    def __init__(self, cfg: Config, run_dir: Path, log: Any) -> None:
        from hindsearch.memory import StageMemory

        self.cfg, self.run_dir, self.log = cfg, run_dir, log
        self.mem = StageMemory()
        self.rows: dict[str, dict[str, Any]] = {}
        self.timings: dict[str, float] = {}
        self.distributed = int(os.environ.get("WORLD_SIZE", "1")) > 1
        self.tok: Any = None
        self.setup: Any = None  # hindsearch.setup.prepare's result: paths, train/dev records, retriever

    def data(self) -> None:
        self.log(f"[1/5] data and index ({self.cfg.retrieval.kind})")
        with self.mem.stage("data"):
            self.setup = setup = prepare(self.cfg)
        self.log(f"      {len(setup.train)} train questions ({setup.paths['train']}), "
                 f"{len(setup.dev)} dev ({setup.paths['dev']})")

    def load(self) -> Any:
        from hindsearch.models import load_policy

        self.log(f"[2/5] policy {self.cfg.model.name}")
        with self.mem.stage("load"):
            model, self.tok = load_policy(self.cfg.model)
        return model

    def make_engine(self, m: Any) -> Any:
        return eval_engine(self.cfg, m, self.tok, self.setup.retriever)

    def dev_eval(self, stage: str, m: Any) -> None:
        if self.distributed:  # sharded weights: evaluate the saved model with `hindsearch eval` instead
            self.log(f"      (distributed run: dev evaluation '{stage}' skipped; "
                     f"run `hindsearch eval --model {self.run_dir}/final`)")
            return
        t0 = time.time()
        with self.mem.stage(f"eval_{stage}"):
            self.rows[stage] = summary_row(evaluate_dev(self.make_engine(m), self.setup.dev,
                                                        self.run_dir / "eval" / stage, self.cfg))
        self.timings[f"eval_{stage}"] = time.time() - t0
        self.log(f"      dev EM {STAGE_NAMES[stage]}: {self.rows[stage]['em']}")

    def warmup(self, model: Any) -> Any:
        """The cached protocol warm-up; returns the policy reloaded from the warmed-up folder (or ``model``)."""
        if not self.cfg.warmup.enabled:
            self.log("[3/5] protocol warm-up disabled")
            return model
        from hindsearch.models import cache_dir, load_policy
        from hindsearch.train.warmup import ensure_warmup

        self.log("[3/5] protocol warm-up (cached)")
        t0 = time.time()
        with self.mem.stage("warmup"):
            wdir = ensure_warmup(self.cfg, model, self.tok, self.setup.retriever, self.setup.train,
                                 cache_dir() / "warmup")
            self.timings["warmup"] = time.time() - t0
            del model  # the SFT'd copy in memory: the policy is reloaded from the saved folder
            gc.collect()
            model, self.tok = load_policy(replace(self.cfg.model, name=str(wdir), gguf_file=None))
        self.log(f"      warmed-up checkpoint: {wdir}")
        self.dev_eval("warmup", model)
        return model

    def rl(self, model: Any, ckpt: Path | None, done: int) -> Any:
        """``train.steps`` steps of the method (or the finished run's weights); returns the trained policy."""
        cfg = self.cfg
        self.log(f"[4/5] {cfg.method} for {cfg.train.steps} steps "
                 f"({cfg.train.questions_per_step} questions x {cfg.rollout.num_generations} rollouts per step)")
        t0 = time.time()
        with self.mem.stage("rl"):
            if ckpt is not None and done >= cfg.train.steps:  # training already finished: reuse its weights
                from hindsearch.models import load_policy

                final = self.run_dir / "final"
                src = final if final.is_dir() else ckpt
                model, self.tok = load_policy(replace(cfg.model, name=str(src), gguf_file=None))
                self.log(f"      all {cfg.train.steps} steps already done; using {src}")
            elif cfg.train.steps > 0:
                model = self._train(model, ckpt)
        self.timings["rl"] = time.time() - t0
        return model

    def _train(self, model: Any, ckpt: Path | None) -> Any:
        from hindsearch.fsutil import atomic_checkpoints
        from hindsearch.memory import release_memory_callback
        from hindsearch.train.aux_loss import NonFiniteLoss

        cfg, run_dir, setup = self.cfg, self.run_dir, self.setup
        model.train()
        trainer = build_trainer(cfg, model, self.tok, self.make_engine(model), setup.retriever, setup.train, run_dir)
        atomic_checkpoints(trainer)  # checkpoint-N appears only when complete (staging folder + rename)
        trainer.add_callback(release_memory_callback())
        if cfg.train.eval_steps > 0 and not self.distributed:
            trainer.add_callback(dev_curve_callback(cfg, trainer, self.make_engine, setup.dev, run_dir))
        try:
            trainer.train(resume_from_checkpoint=str(ckpt) if ckpt else None)
        except NonFiniteLoss as e:
            trainer._save_checkpoint(trainer.model, trial=None)
            raise RuntimeError(f"{e}; the last good weights are saved in {run_dir / 'checkpoints'} "
                               f"(lower train.lr or check the data)") from e
        trainer.save_model(str(run_dir / "final"))
        model = trainer.accelerator.unwrap_model(trainer.model)
        del trainer  # its optimizer state (2x the trainable weights) is not needed by the last evaluation
        gc.collect()
        return model

    def finish(self, t_start: float) -> dict[str, Any]:
        """Write ``summary.json``, print the EM and memory tables; returns the summary."""
        from hindsearch.memory import format_memory_table

        cfg, run_dir, log = self.cfg, self.run_dir, self.log
        self.timings["total"] = time.time() - t_start
        summary = {"run_dir": str(run_dir), "method": cfg.method, "steps": cfg.train.steps, "dev": self.rows,
                   "timings_s": self.timings, "memory": self.mem.summary(),
                   "paths": {k: str(v) for k, v in self.setup.paths.items() if v is not None}}
        (run_dir / "summary.json").write_text(json.dumps(summary, indent=1))
        log("\n" + format_table(self.rows))
        log("\n" + format_memory_table(summary["memory"]))
        log(f"\noutputs: {run_dir}/ (config.toml, metrics.jsonl, samples.jsonl, checkpoints/, final/, eval/, "
            f"summary.json); total {self.timings['total'] / 60:.1f} min")
        return summary
