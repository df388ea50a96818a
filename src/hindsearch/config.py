"""Configuration: one dataclass per concern, one docstring per field, TOML presets.

A preset is a TOML file whose tables are the concerns (``[model]``, ``[data]``,
``[retrieval]``, ``[rollout]``, ``[warmup]``, ``[train]``, ``[hindsearch]``, ``[igsd]``,
``[eval]``) plus top-level ``method`` and ``out``. ``--set section.key=value`` overrides
a single field (values parsed as TOML, falling back to a plain string).

Every value is validated by ``Config.validate`` *before* any model is loaded; an error
names the key and the allowed values.
"""

from __future__ import annotations

import math
import tomllib
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

METHODS = ("grpo", "hindsearch", "igsd", "hindsearch+igsd")


class ConfigError(ValueError):
    """A bad configuration value; the message names the key and what is allowed."""


@dataclass
class LoRAConfig:
    """``[model.lora]``: train a LoRA adapter (``peft``) in RL instead of the whole policy.

    Off while ``r = 0``. With ``r > 0`` TRL wraps the policy with ``peft.LoraConfig(r, lora_alpha =
    alpha, lora_dropout = dropout, target_modules)``; only the adapter is trained, the KL reference is
    the base with the adapter disabled, the frozen teacher and judge are copies of the initial policy
    (no adapter), and checkpoints and ``final/`` hold the adapter (``adapter_model.safetensors``) with
    its ``adapter_config.json``. The protocol warm-up, which runs before RL, still trains the model itself.
    Needs ``pip install peft`` (extra ``lora``).
    """

    r: int = 0
    """LoRA rank; 0 = no LoRA (the whole policy is trained)."""
    alpha: int = 16
    """LoRA scaling numerator (``lora_alpha``); the update is scaled by ``alpha / r``."""
    dropout: float = 0.0
    """Dropout on the adapter's input (``lora_dropout``), in [0, 1)."""
    target_modules: list[str] = field(default_factory=lambda: ["all-linear"])
    """Module names to adapt (e.g. ``["q_proj", "v_proj"]``); ``["all-linear"]`` = every linear layer
    but the output head (peft's ``"all-linear"``)."""


@dataclass
class ModelConfig:
    name: str = "smollm2-135m"
    """Policy model: a short alias (``smollm2-135m``, ``tiny-random``, ``micro``), an HF hub id or a local path."""
    gguf_file: str | None = None
    """GGUF file name inside ``name`` (for GGUF checkpoints); set automatically for the ``smollm2-135m`` alias."""
    dtype: str = "float32"
    """Weights dtype: ``float32``, ``bfloat16`` or ``float16`` (CPU wants float32)."""
    device: str = "auto"
    """``auto`` (cuda when available), ``cpu`` or ``cuda``."""
    attn_implementation: str | None = None
    """Passed to ``from_pretrained`` (e.g. ``flash_attention_2`` on GPU); None = library default."""
    lora: LoRAConfig = field(default_factory=LoRAConfig)
    """``[model.lora]``: LoRA adapter training in RL (off by default, see ``LoRAConfig``)."""


@dataclass
class DataConfig:
    world_dir: str = ".hindsearch/world"
    """Folder of the fictional world (built on first use when missing): corpus.jsonl, train/dev/test.jsonl."""
    world_seed: int = 0
    """Seed of the fictional-world generator."""
    world_entities: int | None = None
    """Number of entities of the generated world (None = generator default, ~2,000 passages)."""
    world_test_questions: int | None = None
    """Size of the world's test split (None = the generator default, 200). A larger test split is a
    different world (its train split differs too); the mechanism preset uses 600 for tighter intervals."""
    train: str | None = None
    """Training questions (any supported QA format); None = the world's train split."""
    dev: str | None = None
    """Dev questions for in-training evaluation; None = the world's dev split."""
    test: str | None = None
    """Test questions; None = the world's test split."""
    max_train_questions: int | None = None
    """Use only the first N training questions (None = all)."""


@dataclass
class RetrievalConfig:
    kind: str = "bm25"
    """``bm25`` (in-process bm25s), ``dense`` (encoder + FAISS) or ``remote`` (HTTP ``/retrieve`` server)."""
    index_dir: str | None = None
    """Index folder (``hindsearch index``); None = the world's index, built on first use."""
    url: str | None = None
    """Base URL of a Search-R1-compatible retrieval server when ``kind = remote``."""
    topk: int = 3
    """Passages per search (Search-R1: 3)."""
    encoder: str = "minilm"
    """Dense encoder: ``minilm`` (offline all-MiniLM-L6-v2), ``e5-base-v2`` or any HF encoder path/id."""
    timeout_s: float = 30.0
    """Remote retriever: per-request timeout."""
    retries: int = 3
    """Remote retriever: retries with exponential backoff before a failure is recorded."""


@dataclass
class RolloutConfig:
    backend: str = "hf"
    """Generation backend: ``hf`` (transformers generate, CPU/GPU) or ``vllm`` (GPU)."""
    vllm_mode: str = "colocate"
    """With ``backend = vllm`` in training: ``colocate`` (a vLLM engine inside each training process, on its
    GPU) or ``server`` (a separate ``trl vllm-serve`` process on its own GPUs; see the README)."""
    vllm_server_host: str = "127.0.0.1"
    """``vllm_mode = server``: host of the ``trl vllm-serve`` server."""
    vllm_server_port: int = 8001
    """``vllm_mode = server``: port of the ``trl vllm-serve`` server (8001: the paper presets' retrieval
    server already listens on 8000)."""
    vllm_server_timeout: float = 240.0
    """``vllm_mode = server``: seconds to wait for the server to come up before training fails."""
    vllm_is_cap: float = 2.0
    """Truncated importance sampling for vLLM rollouts: each generated token's loss is weighted by
    ``min(pi_train / pi_vllm, cap)`` (TRL's ``token_truncate`` mode, ``vllm_importance_sampling_clip_max``);
    must be >= 1. The log-prob mismatch and the ratio statistics are logged as ``vllm/*`` in metrics.jsonl."""
    max_turns: int = 4
    """Maximum number of searches; after that one last turn must answer."""
    max_new_tokens_per_turn: int = 128
    """Token budget of one model turn."""
    max_total_tokens: int = 1024
    """Context budget: prompt + completion (generated and injected). A turn's budget is cut so the
    total never exceeds it; an information block that does not fit is truncated to the room left
    and the trajectory ends with stop_reason ``length``."""
    temperature: float = 1.0
    """Sampling temperature for training rollouts (0 = greedy)."""
    top_p: float = 1.0
    """Nucleus sampling for training rollouts."""
    num_generations: int = 4
    """Rollouts per question (GRPO group size G; paper: 5)."""


@dataclass
class WarmupConfig:
    enabled: bool = True
    """Run the protocol warm-up (SFT on demonstration rollouts) before RL; cached by config hash."""
    demos: str | None = None
    """Demonstration trajectories (JSONL in our rollout format); None = scripted searcher over the train split."""
    num_demos: int = 400
    """Scripted demonstrations to build."""
    epochs: int = 2
    """SFT epochs over the demonstrations."""
    lr: float = 5e-5
    """SFT learning rate."""
    batch_size: int = 8
    """SFT batch size."""
    p_bridge: float = 0.5
    """Scripted searcher: probability of searching the bridge entity on a two-hop question (else it guesses after one search)."""
    train_layers: int | None = None
    """Train only the top N decoder layers during warm-up (None = the whole model)."""
    micro_batch_size: int | None = None
    """Demonstrations per forward/backward during warm-up (gradient accumulation fills ``batch_size``; the same
    gradient as one pass, with the activations of fewer rows alive). None = the whole batch at once."""
    p_feedback: float = 0.0
    """Fraction of demonstrations whose prompt carries a critique that the demonstration follows (teaches reading hindsight)."""
    feedback_kinds: list[str] = field(default_factory=lambda: ["critique"])
    """Kinds of hindsight line a feedback demo carries, drawn uniformly (``hindsearch.train.scripted``):
    ``critique`` (a generic line), ``oracle_gold`` / ``oracle_nogold`` (exactly the oracle judge's text about
    the scripted searcher's own failed attempt, followed: it changes the first and the bridge query) and
    ``answer_line`` (IGSD's ``(The correct answer is: ...)``)."""


@dataclass
class TrainConfig:
    steps: int = 8
    """Optimizer steps of RL."""
    questions_per_step: int = 4
    """Distinct questions per step (each gets ``rollout.num_generations`` rollouts)."""
    lr: float = 1e-6
    """Learning rate (paper: 1e-6)."""
    beta: float = 0.001
    """KL coefficient to the reference policy (paper: 0.001; 0 disables the reference model)."""
    epsilon: float = 0.2
    """PPO clipping range."""
    loss_type: str = "grpo"
    """TRL loss aggregation: ``grpo``, ``dr_grpo``, ``dapo``, ``bnpo``."""
    format_reward: float = 0.0
    """Weight of a small format term (well-formed final answer); 0 = reward is EM only."""
    seed: int = 0
    """Random seed (data order, sampling)."""
    save_steps: int = 4
    """Checkpoint every N steps (and at the end)."""
    gradient_checkpointing: bool = False
    """Trade compute for memory in the policy forward."""
    samples_per_step: int = 4
    """Rollouts written to samples.jsonl per step."""
    eval_limit: int = 50
    """Dev questions evaluated before and after RL."""
    eval_steps: int = 0
    """Also evaluate those dev questions (greedy) every N RL steps into ``dev_curve.jsonl``; 0 = only before and after."""
    micro_batch_size: int | None = None
    """Rollouts per forward/backward on each process (gradient accumulation fills the step); None = all at once."""
    grad_share_steps: int = 10
    """Every N optimizer steps (from the first), log each hindsight term's share of the update
    (``<term>/grad_share``: the norm of ``d(lambda L_term)/dh`` against ``d L_GRPO/dh`` at the last hidden state
    ``h``); 1 = every step, 0 = never. Each measurement costs two extra backward passes through the LM head
    (on micro, whose head is most of the model, about one extra update)."""
    trl: dict[str, Any] = field(default_factory=dict)
    """``[train.trl]``: raw TRL ``GRPOConfig`` fields passed through, e.g. ``report_to = ["tensorboard"]``,
    ``lr_scheduler_type = "cosine"``, ``warmup_ratio``, ``weight_decay``, ``max_grad_norm``,
    ``save_total_limit``, ``push_to_hub`` / ``hub_model_id``. They replace our defaults (``report_to =
    "none"``, constant LR, ``save_total_limit = 2``, ...), but a field that one of our keys sets
    (``learning_rate`` from ``train.lr``, ``max_steps`` from ``train.steps``, ...; see
    ``train.run.OWNED_GRPO_FIELDS``) keeps our key's value, with a warning. An unknown field name is a
    config error."""


@dataclass
class HindSearchConfig:
    lam: float = 0.01
    """Weight lambda of L_hind in L = L_GRPO + lambda * L_hind."""
    judge_kind: str = "lm"
    """``lm`` (frozen LM judge, the paper's setting) or ``oracle`` (fictional world only: critique from recorded evidence)."""
    judge_model: str | None = None
    """Judge weights: None = the initial policy checkpoint; else an HF id or path."""
    judge_sees_gold: bool = True
    """The judge prompt contains the gold answers (False = the paper's no-gold ablation)."""
    critique_max_tokens: int = 64
    """Greedy critique length cap."""
    judge_max_prompt_tokens: int = 768
    """Judge prompt budget; longer prompts drop retrieved snippets first, then the oldest turns."""
    redact_gold_in_critique: bool = True
    """Replace gold-answer strings in critiques with a placeholder."""
    teacher: str = "frozen"
    """Teacher weights: ``frozen`` (initial policy), ``live`` (current policy, no grad) or ``ema``."""
    ema_decay: float = 0.99
    """EMA decay when ``teacher = ema``."""
    divergence: str = "clamped_sampled"
    """``clamped_sampled`` (DESIGN's reading of the paper), ``signed`` (unclamped ``lT - lS`` as a per-token
    advantage), ``reverse_kl`` or ``jsd`` (teacher top-k ids plus one tail bucket for the remaining mass)."""
    topk: int = 50
    """Vocabulary top-k for ``reverse_kl`` / ``jsd``."""
    signed_clip: float = 1.0
    """``signed``: the per-token advantage ``lT - lS`` is clipped to ``[-signed_clip, signed_clip]``."""
    distill_on: str = "query"
    """Tokens distilled on failed rollouts: ``query`` (the query text inside ``<search>``) or ``action``
    (the query tokens plus, in every turn after an information block, the turn's first token and the
    tokens of its ``<search>``/``<answer>`` opening tag: where the search-again-or-answer choice is made)."""
    aggregation: str = "token-mean"
    """How ``L_hind`` is reduced over the distilled tokens (``hindsearch.hindsight.losses.AGG_MODES``)."""
    neutral_control: bool = False
    """Also score the student's tokens under a neutral-feedback teacher ("Feedback on a previous attempt:
    none.") and log ``critique_minus_neutral``: what the critique itself changes, net of the prompt shift.
    One more teacher forward per failed rollout; on in the micro presets."""
    judge_template: str = (
        "You are reviewing a failed attempt by a search assistant.\n"
        "Question: {question}\n"
        "{gold_line}"
        "Searches and what they returned:\n{searches}\n"
        "Predicted answer: {prediction}\n"
        "In 1-2 sentences, say what the searches should have looked for. Do not state the answer.\n"
        "Critique:"
    )
    """Judge prompt template; fields: question, gold_line, searches, prediction."""


@dataclass
class IGSDConfig:
    lam: float = 0.1
    """Weight lambda of L_igsd in L = L_GRPO + lambda * L_igsd."""
    max_positions_per_rollout: int = 8
    """Query-token positions verified per failed rollout."""
    positions: str = "disagree"
    """``disagree`` (teacher top token != student token), ``all`` or ``random``."""
    max_query_tokens: int = 24
    """Cap of a matched query completion (cut and still executed when ``</search>`` never comes)."""
    n_controls: int = 2
    """Shared counterfactual control sets per pair."""
    control: str = "random"
    """``random`` corpus passages or ``empty`` information block."""
    gate: str = "positive_sigmoid"
    """``positive_sigmoid`` (paper), ``sigmoid``, ``hard`` or ``none`` (ungated pair distillation)."""
    beta: float = 5.0
    """Gate sharpness."""
    margin: float = 0.0
    """Gate margin on the paired gain delta."""
    max_answer_tokens: int = 16
    """Answer tokens scored by the utility u(D); longer answers are cut (and counted)."""
    teacher: str = "frozen"
    """Teacher weights for proposals and the pair distribution: ``frozen``, ``live`` or ``ema``."""


@dataclass
class EvalConfig:
    limit: int | None = None
    """Questions per benchmark (None = all)."""
    greedy: bool = True
    """Greedy decoding (the papers' evaluation); False samples with the rollout temperature."""
    batch_size: int = 16
    """Trajectories generated together."""
    seed: int = 0
    """Seed for sampling when not greedy."""


@dataclass
class Config:
    method: str = "grpo"
    """``grpo``, ``hindsearch``, ``igsd`` or ``hindsearch+igsd``."""
    out: str = "runs/default"
    """Run folder: config.toml, metrics.jsonl, samples.jsonl, checkpoints/."""
    model: ModelConfig = field(default_factory=ModelConfig)
    data: DataConfig = field(default_factory=DataConfig)
    retrieval: RetrievalConfig = field(default_factory=RetrievalConfig)
    rollout: RolloutConfig = field(default_factory=RolloutConfig)
    warmup: WarmupConfig = field(default_factory=WarmupConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    hindsearch: HindSearchConfig = field(default_factory=HindSearchConfig)
    igsd: IGSDConfig = field(default_factory=IGSDConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)

    # ------------------------------------------------------------------ io
    def to_dict(self) -> dict[str, Any]:
        return _drop_none(asdict(self))

    def to_toml(self) -> str:
        import tomli_w

        return tomli_w.dumps(self.to_dict())

    def save(self, path: str | Path) -> None:
        Path(path).write_text(self.to_toml())

    @classmethod
    def from_dict(cls, d: dict[str, Any], source: str = "<dict>") -> "Config":
        cfg = cls()
        for key, value in d.items():
            _assign(cfg, key, value, source)
        return cfg

    @classmethod
    def load(cls, path: str | Path | None = None, overrides: list[str] | None = None) -> "Config":
        """Load a TOML preset (None = defaults), apply ``section.key=value`` overrides, validate."""
        d: dict[str, Any] = {}
        src = "<defaults>"
        if path is not None:
            p = Path(path)
            if not p.exists():
                raise ConfigError(f"config file not found: {p}")
            try:
                d = tomllib.loads(p.read_text())
            except tomllib.TOMLDecodeError as e:
                raise ConfigError(f"{p}: invalid TOML: {e}") from e
            src = str(p)
        cfg = cls.from_dict(d, src)
        for ov in overrides or []:
            cfg.set(ov)
        cfg.validate()
        return cfg

    def set(self, override: str) -> None:
        """Apply one ``section.key=value`` (or ``method=...``) override."""
        if "=" not in override:
            raise ConfigError(f"--set expects key=value, got {override!r}")
        key, raw = override.split("=", 1)
        try:
            value = tomllib.loads(f"v = {raw}")["v"]
        except tomllib.TOMLDecodeError:
            value = raw
        parts = key.strip().split(".")
        if len(parts) == 1:
            _assign(self, parts[0], value, "--set")
        elif len(parts) == 2:
            _assign(self, parts[0], {parts[1]: value}, "--set")
        elif len(parts) == 3:  # a key of a sub-table: model.lora.r=8, train.trl.weight_decay=0.1
            _assign(self, parts[0], {parts[1]: {parts[2]: value}}, "--set")
        else:
            raise ConfigError(f"--set key must be 'section.field', 'section.table.field' or a top-level field, "
                              f"got {key!r}")

    # ------------------------------------------------------------ validate
    def validate(self) -> "Config":
        _choice("method", self.method, METHODS)
        _choice("model.dtype", self.model.dtype, ("float32", "bfloat16", "float16"))
        _choice("model.device", self.model.device, ("auto", "cpu", "cuda"))
        _choice("retrieval.kind", self.retrieval.kind, ("bm25", "dense", "remote"))
        if self.retrieval.kind == "remote" and not self.retrieval.url:
            raise ConfigError("retrieval.url is required when retrieval.kind = 'remote'")
        if self.data.world_test_questions is not None:
            _positive("data.world_test_questions", self.data.world_test_questions)
        _positive("retrieval.topk", self.retrieval.topk)
        _positive("retrieval.retries", self.retrieval.retries, allow_zero=True)
        _choice("rollout.backend", self.rollout.backend, ("hf", "vllm"))
        _choice("rollout.vllm_mode", self.rollout.vllm_mode, ("colocate", "server"))
        _positive("rollout.vllm_server_port", self.rollout.vllm_server_port)
        if not self.rollout.vllm_server_timeout > 0:
            raise ConfigError(f"rollout.vllm_server_timeout must be > 0, got {self.rollout.vllm_server_timeout}")
        if not self.rollout.vllm_is_cap >= 1:
            raise ConfigError(f"rollout.vllm_is_cap must be >= 1, got {self.rollout.vllm_is_cap}")
        _positive("rollout.max_turns", self.rollout.max_turns, allow_zero=True)
        _positive("rollout.max_new_tokens_per_turn", self.rollout.max_new_tokens_per_turn)
        _positive("rollout.max_total_tokens", self.rollout.max_total_tokens)
        _positive("rollout.num_generations", self.rollout.num_generations)
        if self.rollout.temperature < 0:
            raise ConfigError(f"rollout.temperature must be >= 0, got {self.rollout.temperature}")
        if not 0 < self.rollout.top_p <= 1:
            raise ConfigError(f"rollout.top_p must be in (0, 1], got {self.rollout.top_p}")
        _positive("warmup.num_demos", self.warmup.num_demos, allow_zero=True)
        bad = [k for k in self.warmup.feedback_kinds if k not in ("critique", "oracle_gold", "oracle_nogold", "answer_line")]
        if bad or not self.warmup.feedback_kinds:
            raise ConfigError(f"warmup.feedback_kinds must be a non-empty list of critique, oracle_gold, oracle_nogold, "
                              f"answer_line; got {self.warmup.feedback_kinds}")
        _positive("warmup.epochs", self.warmup.epochs, allow_zero=True)
        if self.warmup.micro_batch_size is not None:
            _positive("warmup.micro_batch_size", self.warmup.micro_batch_size)
        _prob("warmup.p_bridge", self.warmup.p_bridge)
        _prob("warmup.p_feedback", self.warmup.p_feedback)
        _positive("train.steps", self.train.steps, allow_zero=True)
        _positive("train.questions_per_step", self.train.questions_per_step)
        _positive("train.save_steps", self.train.save_steps)
        _positive("train.grad_share_steps", self.train.grad_share_steps, allow_zero=True)
        if self.train.micro_batch_size is not None:
            _positive("train.micro_batch_size", self.train.micro_batch_size)
        if self.train.lr <= 0:
            raise ConfigError(f"train.lr must be > 0, got {self.train.lr}")
        if self.train.beta < 0:
            raise ConfigError(f"train.beta must be >= 0, got {self.train.beta}")
        _choice("train.loss_type", self.train.loss_type, ("grpo", "dr_grpo", "dapo", "bnpo"))
        if self.rollout.num_generations < 2 and self.train.steps > 0:
            raise ConfigError("rollout.num_generations must be >= 2 for GRPO (group-relative advantages)")
        h = self.hindsearch
        _choice("hindsearch.judge_kind", h.judge_kind, ("lm", "oracle"))
        _choice("hindsearch.teacher", h.teacher, ("frozen", "live", "ema"))
        _choice("hindsearch.divergence", h.divergence, ("clamped_sampled", "signed", "reverse_kl", "jsd"))
        _choice("hindsearch.distill_on", h.distill_on, ("query", "action"))
        _choice("hindsearch.aggregation", h.aggregation, ("token-mean", "seq-mean-token-mean", "seq-mean-token-sum", "sum"))
        if not (h.signed_clip > 0):
            raise ConfigError(f"hindsearch.signed_clip must be > 0, got {h.signed_clip}")
        _positive("hindsearch.critique_max_tokens", h.critique_max_tokens)
        _positive("hindsearch.topk", h.topk)
        if h.lam < 0:
            raise ConfigError(f"hindsearch.lam must be >= 0, got {h.lam}")
        for fld in ("question", "searches", "prediction"):
            if "{" + fld + "}" not in h.judge_template:
                raise ConfigError(f"hindsearch.judge_template must contain {{{fld}}}")
        g = self.igsd
        _choice("igsd.positions", g.positions, ("disagree", "all", "random"))
        _choice("igsd.control", g.control, ("random", "empty"))
        _choice("igsd.gate", g.gate, ("positive_sigmoid", "sigmoid", "hard", "none"))
        _choice("igsd.teacher", g.teacher, ("frozen", "live", "ema"))
        _positive("igsd.max_positions_per_rollout", g.max_positions_per_rollout)
        _positive("igsd.max_query_tokens", g.max_query_tokens)
        _positive("igsd.n_controls", g.n_controls, allow_zero=True)
        _positive("igsd.max_answer_tokens", g.max_answer_tokens)
        if g.lam < 0:
            raise ConfigError(f"igsd.lam must be >= 0, got {g.lam}")
        _positive("eval.batch_size", self.eval.batch_size)
        self._validate_lora()
        self._validate_trl()
        return self

    def _validate_lora(self) -> None:
        lo = self.model.lora
        _positive("model.lora.r", lo.r, allow_zero=True)
        _positive("model.lora.alpha", lo.alpha)
        if not 0.0 <= lo.dropout < 1.0:
            raise ConfigError(f"model.lora.dropout must be in [0, 1), got {lo.dropout}")
        if not lo.target_modules or not all(isinstance(m, str) and m for m in lo.target_modules):
            raise ConfigError(f"model.lora.target_modules must be a non-empty list of module names, "
                              f"got {lo.target_modules!r}")
        if lo.r == 0:
            return
        for key, teacher in (("hindsearch.teacher", self.hindsearch.teacher), ("igsd.teacher", self.igsd.teacher)):
            if teacher == "ema":
                raise ConfigError(f"{key} = 'ema' is not supported with model.lora (the EMA copy averages the "
                                  f"whole policy); use 'frozen' or 'live', or set model.lora.r = 0")
        try:
            import peft  # noqa: F401
        except ImportError as e:
            raise ConfigError("model.lora.r > 0 needs the peft package: pip install peft "
                              "(or pip install -e \".[lora]\")") from e

    def _validate_trl(self) -> None:
        if not self.train.trl:
            return
        from dataclasses import fields as dc_fields

        from trl import GRPOConfig

        known = {f.name for f in dc_fields(GRPOConfig)}
        for k in self.train.trl:
            if k not in known:
                import difflib

                close = difflib.get_close_matches(k, sorted(known), n=3)
                hint = f"; did you mean {', '.join(close)}?" if close else ""
                raise ConfigError(f"train.trl.{k} is not a field of TRL's GRPOConfig (trl==1.16.0){hint}")
        report_to = self.train.trl.get("report_to", "none")
        for target in [report_to] if isinstance(report_to, str) else list(report_to):
            if target in ("none", "all"):
                continue
            from transformers.integrations import get_available_reporting_integrations

            if target not in get_available_reporting_integrations():
                need = {"tensorboard": "tensorboard (or tensorboardX)"}.get(target, target)
                raise ConfigError(f"train.trl.report_to = {report_to!r}: {target!r} needs the {need} package "
                                  f"installed (pip install {target if target != 'tensorboard' else 'tensorboardX'})")


def _drop_none(d: Any) -> Any:
    if isinstance(d, dict):
        return {k: _drop_none(v) for k, v in d.items() if v is not None}
    return d


def _assign(obj: Any, key: str, value: Any, source: str, prefix: str = "") -> None:
    names = {f.name: f for f in fields(obj)}
    if key not in names:
        if not prefix:
            raise ConfigError(f"{source}: unknown key {key!r} in [{type(obj).__name__}]; allowed: {sorted(names)}")
        raise ConfigError(f"{source}: unknown key {prefix}{key}; allowed: {sorted(names)}")
    current = getattr(obj, key)
    if hasattr(current, "__dataclass_fields__"):
        if not isinstance(value, dict):
            raise ConfigError(f"{source}: [{prefix}{key}] must be a table, got {value!r}")
        for k, v in value.items():
            _assign(current, k, v, source, f"{prefix}{key}.")
        return
    if isinstance(current, dict) and isinstance(value, dict):
        value = {**current, **value}  # a raw table (train.trl): --set adds one key, keeps the others
    if current is None and value is not None:  # no current value to compare with: check the annotation
        value = _check_annotation(prefix + key, names[key].type, value, source)
    setattr(obj, key, _coerce(prefix + key, current, value, source))


_SIMPLE_TYPES = {"int": (int,), "float": (int, float), "str": (str,), "bool": (bool,), "list": (list,), "dict": (dict,)}


def _check_annotation(key: str, annotation: Any, value: Any, source: str) -> Any:
    """A value for a field whose default is None, checked against its annotation (``int | None`` ...)."""
    parts = [a.strip().split("[")[0] for a in str(annotation).split("|")]
    named = [a for a in parts if a != "None"]
    if not named or any(a not in _SIMPLE_TYPES for a in named):
        return value  # an annotation this check does not read: left to validate()
    ok = any(isinstance(value, t) for a in named for t in _SIMPLE_TYPES[a])
    if isinstance(value, bool) and "bool" not in named:
        ok = False
    if not ok:
        raise ConfigError(f"{source}: {key} must be {' or '.join(named)}, got {value!r}")
    return float(value) if named == ["float"] else value


def _coerce(key: str, current: Any, value: Any, source: str) -> Any:
    if isinstance(value, float) and not math.isfinite(value):  # nan/inf pass every < and > check
        raise ConfigError(f"{source}: {key} must be a finite number, got {value!r}")
    if current is None or value is None:
        return value
    if isinstance(current, bool):
        if not isinstance(value, bool):
            raise ConfigError(f"{source}: {key} must be true or false, got {value!r}")
        return value
    if isinstance(current, float) and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if type(current) is not type(value):
        raise ConfigError(f"{source}: {key} must be {type(current).__name__}, got {value!r}")
    return value


def _choice(key: str, value: Any, allowed: tuple[str, ...]) -> None:
    if value not in allowed:
        raise ConfigError(f"{key} = {value!r} is not allowed; choose one of {', '.join(allowed)}")


def _positive(key: str, value: int, allow_zero: bool = False) -> None:
    if value < 0 or (value == 0 and not allow_zero):
        raise ConfigError(f"{key} must be {'>= 0' if allow_zero else '> 0'}, got {value}")


def _prob(key: str, value: float) -> None:
    if not 0.0 <= value <= 1.0:
        raise ConfigError(f"{key} must be in [0, 1], got {value}")
