"""The configuration's sections: one dataclass per concern, one docstring per field (TOML tables of
a preset)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from hindsearch.config.fields import FEEDBACK_KINDS, bounded, choice


@dataclass
class LoRAConfig:
    """``[model.lora]``: train a LoRA adapter (``peft``) in RL instead of the whole policy.

    Off while ``r = 0``. With ``r > 0`` TRL wraps the policy with ``peft.LoraConfig(r, lora_alpha =
    alpha, lora_dropout = dropout, target_modules)``; only the adapter is trained, the KL reference
    is the base with the adapter disabled, the frozen teacher and judge are copies of the initial
    policy (no adapter), and checkpoints and ``final/`` hold the adapter
    (``adapter_model.safetensors``) with its ``adapter_config.json``. The protocol warm-up, which
    runs before RL, still trains the model itself. Needs ``pip install peft`` (extra ``lora``).
    """

    r: int = bounded(0, ge=0)
    """LoRA rank; 0 = no LoRA (the whole policy is trained)."""
    alpha: int = bounded(16, gt=0)
    """LoRA scaling numerator (``lora_alpha``); the update is scaled by ``alpha / r``."""
    dropout: float = bounded(0.0, ge=0.0, lt=1.0)
    """Dropout on the adapter's input (``lora_dropout``), in [0, 1)."""
    target_modules: list[str] = field(default_factory=lambda: ["all-linear"])
    """Module names to adapt (e.g. ``["q_proj", "v_proj"]``); ``["all-linear"]`` = every linear
    layer but the output head (peft's ``"all-linear"``)."""


@dataclass
class ModelConfig:
    name: str = "smollm2-135m"
    """Policy model: a short alias (``smollm2-135m``, ``tiny-random``), an HF hub id or a local path
    (e.g. a micro model built by ``recipes/micro/build.py``)."""
    gguf_file: str | None = None
    """GGUF file name inside ``name`` (for GGUF checkpoints); set automatically for the
    ``smollm2-135m`` alias."""
    dtype: str = choice("float32", ("float32", "bfloat16", "float16"))
    """Weights dtype: ``float32``, ``bfloat16`` or ``float16`` (CPU wants float32)."""
    device: str = choice("auto", ("auto", "cpu", "cuda"))
    """``auto`` (cuda when available), ``cpu`` or ``cuda``."""
    attn_implementation: str | None = None
    """Passed to ``from_pretrained`` (e.g. ``flash_attention_2`` on GPU); None = library default."""
    hub_kernels: bool = False
    """Let transformers swap layers for Hugging Face Hub kernels
    (``from_pretrained(use_kernels=...)``). Off by default: transformers >= 5.2x turns them on when
    the ``kernels`` package is installed, fetches them from the Hub at the first ``train()`` on a
    GPU (an offline machine fails there) and changes the numerics."""
    lora: LoRAConfig = field(default_factory=LoRAConfig)
    """``[model.lora]``: LoRA adapter training in RL (off by default, see ``LoRAConfig``)."""


@dataclass
class DataConfig:
    world_dir: str = ".hindsearch/world"
    """Folder of the fictional world (built on first use when missing): corpus.jsonl,
    train/dev/test.jsonl."""
    world_seed: int = 0
    """Seed of the fictional-world generator."""
    world_entities: int | None = bounded(None, ge=40)
    """Number of entities of the generated world (None = generator default, ~2,000 passages; at
    least 40)."""
    world_test_questions: int | None = bounded(None, gt=0)
    """Size of the world's test split (None = the generator default, 200). A larger test split is a
    different world (its train split differs too); the mechanism preset uses 600 for tighter
    intervals."""
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
    kind: str = "bm25"
    """``bm25`` (in-process bm25s), ``dense`` (encoder + FAISS), ``remote`` (HTTP ``/retrieve``
    server) or a kind a plugin registers (``hindsearch.retrieval.base.register_retriever`` /
    ``register_index_kind``)."""
    index_dir: str | None = None
    """Index folder (``hindsearch index``); None = the world's index, built on first use."""
    url: str | None = None
    """Base URL of a Search-R1-compatible retrieval server when ``kind = remote``."""
    topk: int = bounded(3, gt=0)
    """Passages per search (Search-R1: 3)."""
    encoder: str = "minilm"
    """Dense encoder: ``minilm`` (offline all-MiniLM-L6-v2), ``e5-base-v2`` or any HF encoder
    path/id."""
    timeout_s: float = bounded(30.0, gt=0)
    """Remote retriever: per-request timeout."""
    retries: int = bounded(3, ge=0)
    """Retries of a failed retrieval, with exponential backoff, before the failure is recorded in
    the trajectory. The one retry setting: the remote client retries, the rollout engine does not
    add its own."""


@dataclass
class RolloutConfig:
    backend: str = choice("hf", ("hf", "vllm"))
    """Generation backend: ``hf`` (transformers generate, CPU/GPU) or ``vllm`` (GPU)."""
    vllm_mode: str = choice("colocate", ("colocate", "server"))
    """With ``backend = vllm`` in training: ``colocate`` (a vLLM engine inside each training
    process, on its GPU) or ``server`` (a separate ``trl vllm-serve`` process on its own GPUs; see
    the README)."""
    vllm_server_host: str = "127.0.0.1"
    """``vllm_mode = server``: host of the ``trl vllm-serve`` server."""
    vllm_server_port: int = bounded(8001, gt=0)
    """``vllm_mode = server``: port of the ``trl vllm-serve`` server (8001: the paper presets'
    retrieval server already listens on 8000)."""
    vllm_server_timeout: float = bounded(240.0, gt=0.0)
    """``vllm_mode = server``: seconds to wait for the server to come up before training fails."""
    vllm_is_cap: float = bounded(2.0, ge=1.0)
    """Truncated importance sampling for vLLM rollouts: each generated token's loss is weighted by
    ``min(pi_train / pi_vllm, cap)`` (TRL's ``token_truncate`` mode,
    ``vllm_importance_sampling_clip_max``); must be >= 1. The log-prob mismatch and the ratio
    statistics are logged as ``vllm/*`` in metrics.jsonl."""
    max_turns: int = bounded(4, ge=1)
    """Maximum number of searches (at least 1: the agent searches); after that one last turn must
    answer."""
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
    sampler: str = choice("multinomial", ("multinomial", "inverse_cdf"))
    """How the HF backend draws a sampled id: ``multinomial`` (``torch.multinomial``, one random
    number per vocabulary entry; every seeded result so far) or ``inverse_cdf`` (one random number
    per row: the same distribution, a different random stream, several times less CPU at a real
    vocabulary). vLLM samples its own way."""
    num_generations: int = bounded(4, gt=0)
    """Rollouts per question (GRPO group size G; paper: 5)."""


@dataclass
class WarmupConfig:
    enabled: bool = True
    """Run the protocol warm-up (SFT on demonstration rollouts) before RL; cached by config hash."""
    demos: str | None = None
    """Demonstration trajectories (JSONL in our rollout format); None = scripted searcher over the
    train split."""
    num_demos: int = bounded(400, ge=0)
    """Scripted demonstrations to build."""
    epochs: int = bounded(2, ge=0)
    """SFT epochs over the demonstrations."""
    lr: float = bounded(5e-5, gt=0.0)
    """SFT learning rate."""
    batch_size: int = bounded(8, gt=0)
    """SFT batch size."""
    p_bridge: float = bounded(0.5, ge=0.0, le=1.0)
    """Scripted searcher: probability of searching the bridge entity on a two-hop question (else it
    guesses after one search)."""
    train_layers: int | None = bounded(None, gt=0)
    """Train only the top N decoder layers during warm-up (None = the whole model)."""
    micro_batch_size: int | None = bounded(None, gt=0)
    """Demonstrations per forward/backward during warm-up (gradient accumulation fills
    ``batch_size``; the same gradient as one pass, with the activations of fewer rows alive). None =
    the whole batch at once."""
    gradient_checkpointing: bool = False
    """Activation checkpointing during warm-up SFT (as ``train.gradient_checkpointing``; the same
    weights, less memory, more compute). Not part of the warm-up's cache key."""
    checkpoint_every_n_layers: int = bounded(1, gt=0)
    """With ``gradient_checkpointing``: checkpoint every N-th decoder layer only (1 = all of
    them)."""
    p_feedback: float = bounded(0.0, ge=0.0, le=1.0)
    """Fraction of demonstrations whose prompt carries a critique that the demonstration follows
    (teaches reading hindsight)."""
    feedback_kinds: list[str] = choice(["critique"], FEEDBACK_KINDS)
    """Kinds of hindsight line a feedback demo carries, drawn uniformly
    (``hindsearch.train.scripted``): ``critique`` (a generic line), ``oracle_gold`` /
    ``oracle_nogold`` (exactly the oracle judge's text about the scripted searcher's own failed
    attempt, followed: it changes the first and the bridge query) and ``answer_line`` (IGSD's ``(The
    correct answer is: ...)``; the demo follows the chain) and ``answer_query`` (the same line, and
    the first query names the answer: the retriever decides whether that helps)."""


@dataclass
class TrainConfig:
    steps: int = bounded(8, ge=0, le=10**9)
    """Optimizer steps of RL."""
    questions_per_step: int = bounded(4, gt=0)
    """Distinct questions per step (each gets ``rollout.num_generations`` rollouts)."""
    lr: float = bounded(1e-6, gt=0.0)
    """Learning rate (paper: 1e-6)."""
    kl_coef: float = bounded(0.001, ge=0.0)
    """KL coefficient to the reference policy (TRL's ``beta``; paper: 0.001; 0 disables the
    reference model)."""
    epsilon: float = bounded(0.2, gt=0.0)
    """PPO clipping range."""
    loss_type: str = choice("grpo", ("grpo", "dr_grpo", "dapo", "bnpo"))
    """TRL loss aggregation: ``grpo``, ``dr_grpo``, ``dapo``, ``bnpo``."""
    reward_funcs: list[str] = field(default_factory=lambda: ["em"])
    """TRL reward functions summed (weight 1 each) into the rollout's reward: registered names
    (``em``: exact match of the final answer, ``f1``: its token F1, ``format``: a well-formed final
    answer; ``hindsearch.train.reward_funcs``) or a plugin's. Each is logged by TRL as
    ``rewards/<function>/mean``."""
    format_reward: float = bounded(0.0, ge=0.0)
    """Weight of a small format term (well-formed final answer) added to ``reward_funcs``; 0 =
    none."""
    seed: int = 0
    """Random seed (data order, sampling)."""
    threads: int | None = bounded(None, gt=0)
    """Torch CPU threads of the run (``torch.set_num_threads``; ``hindsearch train --threads N``);
    None = chosen for the machine when the run starts (``models.default_threads``: 1 on 2 cores or
    fewer or a busy machine, where OpenMP threads spin-wait for a descheduled partner; torch's
    default on an idle one), printed and recorded in summary.json. The count also changes float
    reductions, so two counts give slightly different weights (a resume may change it)."""
    save_steps: int = bounded(4, gt=0)
    """Checkpoint every N steps (and at the end)."""
    gradient_checkpointing: bool = False
    """Trade compute for memory in the policy forward (activation checkpointing: the checkpointed
    decoder layers keep only their inputs and are recomputed in the backward)."""
    checkpoint_every_n_layers: int = bounded(1, gt=0)
    """With ``gradient_checkpointing``: checkpoint every N-th decoder layer only (1 = all of them).
    Each checkpointed layer gives back its activations for one more forward of that layer in the
    backward, so N = 2 saves about half the activation memory of N = 1 for about half its extra
    compute."""
    samples_per_step: int = bounded(4, ge=0)
    """Rollouts written to samples.jsonl per step."""
    eval_limit: int = bounded(50, ge=0)
    """Dev questions evaluated before and after RL."""
    eval_steps: int = bounded(0, ge=0)
    """Also evaluate those dev questions (greedy) every N RL steps into ``dev_curve.jsonl``; 0 =
    only before and after."""
    micro_batch_size: int | None = bounded(None, gt=0)
    """Rollouts per forward/backward on each process (gradient accumulation fills the step); None =
    all at once."""
    keep_steps: list[int] = field(default_factory=list)
    """Optimizer steps at which the policy's weights (model and tokenizer, no optimizer state) are
    also saved into ``RUN/steps/step-N/``, kept whatever ``save_total_limit`` deletes: what a
    sample-efficiency curve evaluates (``compare --eval-at``)."""
    grpo_scale: float = bounded(1.0, ge=0.0)
    """Factor on GRPO's loss (1 = the method as defined; 0 = the hindsight terms alone, the
    distillation-only check of the mechanism: rollouts, rewards and metrics as usual, but no
    policy-gradient update)."""
    grad_share_steps: int = bounded(10, ge=0)
    """Every N optimizer steps (from the first), log each hindsight term's share of the update
    (``<term>/grad_share``: the norm of ``d(lambda L_term)/dh`` against ``d L_GRPO/dh`` at the last
    hidden state ``h``); 1 = every step, 0 = never. Each measurement costs two extra backward passes
    through the LM head (on micro, whose head is most of the model, about one extra update)."""
    trl: dict[str, Any] = field(default_factory=dict)
    """``[train.trl]``: raw TRL ``GRPOConfig`` fields passed through, e.g. ``report_to =
    ["tensorboard"]``, ``lr_scheduler_type = "cosine"``, ``warmup_ratio``, ``weight_decay``,
    ``max_grad_norm``, ``save_total_limit``, ``push_to_hub`` / ``hub_model_id``. They replace our
    defaults (``report_to = "none"``, constant LR, ``save_total_limit = 2``, ...), but a field that
    one of our keys sets (``learning_rate`` from ``train.lr``, ``max_steps`` from ``train.steps``,
    ...; see ``train.grpo_config.OWNED_GRPO_FIELDS``) keeps our key's value, with a warning. An
    unknown field name is a config error."""


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
