"""Configuration: one dataclass per concern, one docstring per field, TOML presets.

A preset is a TOML file whose tables are the concerns (``[model]``, ``[data]``,
``[retrieval]``, ``[rollout]``, ``[warmup]``, ``[train]``, ``[hindsearch]``, ``[igsd]``,
``[eval]``) plus top-level ``method`` and ``out``. ``--set section.key=value`` overrides
a single field (values parsed as TOML, falling back to a plain string).

Every value is validated by ``Config.validate`` *before* any model is loaded; an error
names the key and the allowed values. Allowed values and numeric bounds are declared once, in
the field's metadata (``choice(...)``, ``bounded(...)``): ``validate`` walks every field and
checks them, and code that dispatches on a name reads the same tuple with ``choices_of``.
Cross-field rules (a remote retriever needs a URL, ...) are the only hand-written checks.

Renamed keys stay readable with a deprecation message (``RENAMED``): ``train.beta`` is now
``train.kl_coef`` and ``igsd.beta`` is ``igsd.gate_sharpness`` (the two shared one name).
"""

from __future__ import annotations

import math
import sys
import tomllib
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

METHODS = ("grpo", "hindsearch", "igsd", "hindsearch+igsd")
TEACHERS = ("frozen", "live", "ema")
FEEDBACK_KINDS = ("critique", "oracle_gold", "oracle_nogold", "answer_line")
AGGREGATIONS = ("token-mean", "seq-mean-token-mean", "seq-mean-token-sum", "sum")

RENAMED: dict[tuple[str, str], str] = {("train", "beta"): "kl_coef", ("igsd", "beta"): "gate_sharpness"}
"""Old ``(section, key)`` -> new key: read with a deprecation message, written under the new name."""


def choice(default: Any, choices: tuple[str, ...]) -> Any:
    """A field whose value (or, for a list, every element) must be one of ``choices``."""
    if isinstance(default, list):
        return field(default_factory=lambda: list(default), metadata={"choices": choices})
    return field(default=default, metadata={"choices": choices})


def bounded(default: Any, *, ge: float | None = None, gt: float | None = None, le: float | None = None,
            lt: float | None = None) -> Any:
    """A numeric field with bounds (None values are not checked: they mean "unset")."""
    return field(default=default, metadata={"bounds": {"ge": ge, "gt": gt, "le": le, "lt": lt}})


def choices_of(cls: type, name: str) -> tuple[str, ...]:
    """The allowed values declared on ``cls.name`` (what validation checks and code dispatches on)."""
    for f in fields(cls):
        if f.name == name:
            return tuple(f.metadata["choices"])
    raise KeyError(f"{cls.__name__} has no field {name!r}")


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

    r: int = bounded(0, ge=0)
    """LoRA rank; 0 = no LoRA (the whole policy is trained)."""
    alpha: int = bounded(16, gt=0)
    """LoRA scaling numerator (``lora_alpha``); the update is scaled by ``alpha / r``."""
    dropout: float = bounded(0.0, ge=0.0, lt=1.0)
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
    dtype: str = choice("float32", ("float32", "bfloat16", "float16"))
    """Weights dtype: ``float32``, ``bfloat16`` or ``float16`` (CPU wants float32)."""
    device: str = choice("auto", ("auto", "cpu", "cuda"))
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
    world_test_questions: int | None = bounded(None, gt=0)
    """Size of the world's test split (None = the generator default, 200). A larger test split is a
    different world (its train split differs too); the mechanism preset uses 600 for tighter intervals."""
    train: str | None = None
    """Training questions (any supported QA format); None = the world's train split."""
    dev: str | None = None
    """Dev questions for in-training evaluation; None = the world's dev split."""
    test: str | None = None
    """Test questions; None = the world's test split."""
    max_train_questions: int | None = bounded(None, gt=0)
    """Use only the first N training questions (None = all)."""


@dataclass
class RetrievalConfig:
    kind: str = choice("bm25", ("bm25", "dense", "remote"))
    """``bm25`` (in-process bm25s), ``dense`` (encoder + FAISS) or ``remote`` (HTTP ``/retrieve`` server)."""
    index_dir: str | None = None
    """Index folder (``hindsearch index``); None = the world's index, built on first use."""
    url: str | None = None
    """Base URL of a Search-R1-compatible retrieval server when ``kind = remote``."""
    topk: int = bounded(3, gt=0)
    """Passages per search (Search-R1: 3)."""
    encoder: str = "minilm"
    """Dense encoder: ``minilm`` (offline all-MiniLM-L6-v2), ``e5-base-v2`` or any HF encoder path/id."""
    timeout_s: float = bounded(30.0, gt=0)
    """Remote retriever: per-request timeout."""
    retries: int = bounded(3, ge=0)
    """Retries of a failed retrieval, with exponential backoff, before the failure is recorded in the
    trajectory. The one retry setting: the remote client retries, the rollout engine does not add its own."""


@dataclass
class RolloutConfig:
    backend: str = choice("hf", ("hf", "vllm"))
    """Generation backend: ``hf`` (transformers generate, CPU/GPU) or ``vllm`` (GPU)."""
    vllm_mode: str = choice("colocate", ("colocate", "server"))
    """With ``backend = vllm`` in training: ``colocate`` (a vLLM engine inside each training process, on its
    GPU) or ``server`` (a separate ``trl vllm-serve`` process on its own GPUs; see the README)."""
    vllm_server_host: str = "127.0.0.1"
    """``vllm_mode = server``: host of the ``trl vllm-serve`` server."""
    vllm_server_port: int = bounded(8001, gt=0)
    """``vllm_mode = server``: port of the ``trl vllm-serve`` server (8001: the paper presets' retrieval
    server already listens on 8000)."""
    vllm_server_timeout: float = bounded(240.0, gt=0.0)
    """``vllm_mode = server``: seconds to wait for the server to come up before training fails."""
    vllm_is_cap: float = bounded(2.0, ge=1.0)
    """Truncated importance sampling for vLLM rollouts: each generated token's loss is weighted by
    ``min(pi_train / pi_vllm, cap)`` (TRL's ``token_truncate`` mode, ``vllm_importance_sampling_clip_max``);
    must be >= 1. The log-prob mismatch and the ratio statistics are logged as ``vllm/*`` in metrics.jsonl."""
    max_turns: int = bounded(4, ge=0)
    """Maximum number of searches; after that one last turn must answer."""
    max_new_tokens_per_turn: int = bounded(128, gt=0)
    """Token budget of one model turn."""
    max_total_tokens: int = bounded(1024, gt=0)
    """Context budget: prompt + completion (generated and injected). A turn's budget is cut so the
    total never exceeds it; an information block that does not fit is truncated to the room left
    and the trajectory ends with stop_reason ``length``."""
    temperature: float = bounded(1.0, ge=0.0)
    """Sampling temperature for training rollouts (0 = greedy)."""
    top_p: float = bounded(1.0, gt=0.0, le=1.0)
    """Nucleus sampling for training rollouts."""
    num_generations: int = bounded(4, gt=0)
    """Rollouts per question (GRPO group size G; paper: 5)."""


@dataclass
class WarmupConfig:
    enabled: bool = True
    """Run the protocol warm-up (SFT on demonstration rollouts) before RL; cached by config hash."""
    demos: str | None = None
    """Demonstration trajectories (JSONL in our rollout format); None = scripted searcher over the train split."""
    num_demos: int = bounded(400, ge=0)
    """Scripted demonstrations to build."""
    epochs: int = bounded(2, ge=0)
    """SFT epochs over the demonstrations."""
    lr: float = bounded(5e-5, gt=0.0)
    """SFT learning rate."""
    batch_size: int = bounded(8, gt=0)
    """SFT batch size."""
    p_bridge: float = bounded(0.5, ge=0.0, le=1.0)
    """Scripted searcher: probability of searching the bridge entity on a two-hop question (else it guesses after one search)."""
    train_layers: int | None = bounded(None, gt=0)
    """Train only the top N decoder layers during warm-up (None = the whole model)."""
    micro_batch_size: int | None = bounded(None, gt=0)
    """Demonstrations per forward/backward during warm-up (gradient accumulation fills ``batch_size``; the same
    gradient as one pass, with the activations of fewer rows alive). None = the whole batch at once."""
    p_feedback: float = bounded(0.0, ge=0.0, le=1.0)
    """Fraction of demonstrations whose prompt carries a critique that the demonstration follows (teaches reading hindsight)."""
    feedback_kinds: list[str] = choice(["critique"], FEEDBACK_KINDS)
    """Kinds of hindsight line a feedback demo carries, drawn uniformly (``hindsearch.train.scripted``):
    ``critique`` (a generic line), ``oracle_gold`` / ``oracle_nogold`` (exactly the oracle judge's text about
    the scripted searcher's own failed attempt, followed: it changes the first and the bridge query) and
    ``answer_line`` (IGSD's ``(The correct answer is: ...)``)."""


@dataclass
class TrainConfig:
    steps: int = bounded(8, ge=0)
    """Optimizer steps of RL."""
    questions_per_step: int = bounded(4, gt=0)
    """Distinct questions per step (each gets ``rollout.num_generations`` rollouts)."""
    lr: float = bounded(1e-6, gt=0.0)
    """Learning rate (paper: 1e-6)."""
    kl_coef: float = bounded(0.001, ge=0.0)
    """KL coefficient to the reference policy (TRL's ``beta``; paper: 0.001; 0 disables the reference
    model). Was ``train.beta``, still read with a deprecation message."""
    epsilon: float = bounded(0.2, gt=0.0)
    """PPO clipping range."""
    loss_type: str = choice("grpo", ("grpo", "dr_grpo", "dapo", "bnpo"))
    """TRL loss aggregation: ``grpo``, ``dr_grpo``, ``dapo``, ``bnpo``."""
    format_reward: float = bounded(0.0, ge=0.0)
    """Weight of a small format term (well-formed final answer); 0 = reward is EM only."""
    seed: int = 0
    """Random seed (data order, sampling)."""
    save_steps: int = bounded(4, gt=0)
    """Checkpoint every N steps (and at the end)."""
    gradient_checkpointing: bool = False
    """Trade compute for memory in the policy forward."""
    samples_per_step: int = bounded(4, ge=0)
    """Rollouts written to samples.jsonl per step."""
    eval_limit: int = bounded(50, ge=0)
    """Dev questions evaluated before and after RL."""
    eval_steps: int = bounded(0, ge=0)
    """Also evaluate those dev questions (greedy) every N RL steps into ``dev_curve.jsonl``; 0 = only before and after."""
    micro_batch_size: int | None = bounded(None, gt=0)
    """Rollouts per forward/backward on each process (gradient accumulation fills the step); None = all at once."""
    grad_share_steps: int = bounded(10, ge=0)
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
    lam: float = bounded(0.01, ge=0.0)
    """Weight lambda of L_hind in L = L_GRPO + lambda * L_hind."""
    judge_kind: str = choice("lm", ("lm", "oracle"))
    """``lm`` (frozen LM judge, the paper's setting) or ``oracle`` (fictional world only: critique from recorded evidence)."""
    judge_model: str | None = None
    """Judge weights: None = the initial policy checkpoint; else an HF id or path."""
    judge_sees_gold: bool = True
    """The judge prompt contains the gold answers (False = the paper's no-gold ablation)."""
    critique_max_tokens: int = bounded(64, gt=0)
    """Greedy critique length cap."""
    judge_max_prompt_tokens: int = bounded(768, gt=0)
    """Judge prompt budget; longer prompts drop retrieved snippets first, then the oldest turns."""
    redact_gold_in_critique: bool = True
    """Replace gold-answer strings in critiques with a placeholder."""
    teacher: str = choice("frozen", TEACHERS)
    """Teacher weights: ``frozen`` (initial policy), ``live`` (current policy, no grad) or ``ema``."""
    ema_decay: float = bounded(0.99, ge=0.0, le=1.0)
    """EMA decay when ``teacher = ema``."""
    divergence: str = choice("clamped_sampled", ("clamped_sampled", "signed", "reverse_kl", "jsd"))
    """``clamped_sampled`` (DESIGN's reading of the paper), ``signed`` (unclamped ``lT - lS`` as a per-token
    advantage), ``reverse_kl`` or ``jsd`` (teacher top-k ids plus one tail bucket for the remaining mass)."""
    topk: int = bounded(50, gt=0)
    """Vocabulary top-k for ``reverse_kl`` / ``jsd``."""
    signed_clip: float = bounded(1.0, gt=0.0)
    """``signed``: the per-token advantage ``lT - lS`` is clipped to ``[-signed_clip, signed_clip]``."""
    distill_on: str = choice("query", ("query", "action"))
    """Tokens distilled on failed rollouts: ``query`` (the query text inside ``<search>``) or ``action``
    (the query tokens plus, in every turn after an information block, the turn's first token and the
    tokens of its ``<search>``/``<answer>`` opening tag: where the search-again-or-answer choice is made)."""
    aggregation: str = choice("token-mean", AGGREGATIONS)
    """How ``L_hind`` is reduced over the distilled tokens (``hindsearch.hindsight.losses.AGG_MODES`` reads
    this tuple)."""
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
    lam: float = bounded(0.1, ge=0.0)
    """Weight lambda of L_igsd in L = L_GRPO + lambda * L_igsd."""
    max_positions_per_rollout: int = bounded(8, gt=0)
    """Query-token positions verified per failed rollout."""
    positions: str = choice("disagree", ("disagree", "all", "random"))
    """``disagree`` (teacher top token != student token), ``all`` or ``random``."""
    max_query_tokens: int = bounded(24, gt=0)
    """Cap of a matched query completion (cut and still executed when ``</search>`` never comes)."""
    n_controls: int = bounded(2, ge=0)
    """Shared counterfactual control sets per pair."""
    control: str = choice("random", ("random", "empty"))
    """``random`` corpus passages or ``empty`` information block."""
    gate: str = choice("positive_sigmoid", ("positive_sigmoid", "sigmoid", "hard", "none"))
    """``positive_sigmoid`` (paper), ``sigmoid``, ``hard`` or ``none`` (ungated pair distillation);
    ``hindsearch.hindsight.losses.GATES`` reads this tuple."""
    gate_sharpness: float = bounded(5.0, gt=0.0)
    """Gate sharpness (the paper's beta in sigmoid(beta * (delta - margin))). Was ``igsd.beta``, still read
    with a deprecation message."""
    margin: float = 0.0
    """Gate margin on the paired gain delta."""
    aggregation: str = choice("token-mean", AGGREGATIONS)
    """How ``L_igsd`` is reduced over the verified positions (``token-mean``: gated KL summed over positions
    divided by their number, the paper's form)."""
    max_answer_tokens: int = bounded(16, gt=0)
    """Answer tokens scored by the utility u(D); longer answers are cut (and counted)."""
    teacher: str = choice("frozen", TEACHERS)
    """Teacher weights for proposals and the pair distribution: ``frozen``, ``live`` or ``ema``."""


@dataclass
class EvalConfig:
    limit: int | None = bounded(None, gt=0)
    """Questions per benchmark (None = all)."""
    greedy: bool = True
    """Greedy decoding (the papers' evaluation); False samples with the rollout temperature."""
    batch_size: int = bounded(16, gt=0)
    """Trajectories generated together."""
    seed: int = 0
    """Seed for sampling when not greedy."""


@dataclass
class Config:
    method: str = choice("grpo", METHODS)
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
        """Check every declared choice and bound (field metadata), then the cross-field rules."""
        _check_declared(self, "")
        if self.retrieval.kind == "remote" and not self.retrieval.url:
            raise ConfigError("retrieval.url is required when retrieval.kind = 'remote'")
        if not self.warmup.feedback_kinds:
            raise ConfigError(f"warmup.feedback_kinds must be a non-empty list of {', '.join(FEEDBACK_KINDS)}")
        if self.rollout.num_generations < 2 and self.train.steps > 0:
            raise ConfigError("rollout.num_generations must be >= 2 for GRPO (group-relative advantages)")
        for fld in ("question", "searches", "prediction"):
            if "{" + fld + "}" not in self.hindsearch.judge_template:
                raise ConfigError(f"hindsearch.judge_template must contain {{{fld}}}")
        self._validate_lora()
        self._validate_trl()
        return self

    def _validate_lora(self) -> None:
        lo = self.model.lora
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
    new = RENAMED.get((prefix.rstrip("."), key))
    if new is not None:
        print(f"{source}: {prefix}{key} is deprecated, read as {prefix}{new} (rename it; the old key will be "
              f"removed)", file=sys.stderr)
        key = new
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


_BOUND_TEXT = {"ge": ">=", "gt": ">", "le": "<=", "lt": "<"}
_BOUND_OK = {"ge": lambda v, b: v >= b, "gt": lambda v, b: v > b, "le": lambda v, b: v <= b, "lt": lambda v, b: v < b}


def _check_declared(obj: Any, prefix: str) -> None:
    """Walk ``obj``'s fields (recursing into sub-configs) and check each declared choice and bound."""
    for f in fields(obj):
        value, key = getattr(obj, f.name), prefix + f.name
        if hasattr(value, "__dataclass_fields__"):
            _check_declared(value, key + ".")
        elif "choices" in f.metadata:
            allowed = f.metadata["choices"]
            bad = [v for v in (value if isinstance(value, list) else [value]) if v not in allowed]
            if bad:
                raise ConfigError(f"{key} = {value!r} is not allowed; choose {'each from' if isinstance(value, list) else 'one of'} "
                                  f"{', '.join(allowed)}")
        elif "bounds" in f.metadata and value is not None:
            for op, bound in f.metadata["bounds"].items():
                if bound is not None and not _BOUND_OK[op](value, bound):
                    rule = " and ".join(f"{_BOUND_TEXT[o]} {b}" for o, b in f.metadata["bounds"].items() if b is not None)
                    raise ConfigError(f"{key} must be {rule}, got {value}")
