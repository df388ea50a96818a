"""The micro model: a small Llama-style causal LM trained from scratch on the fictional world (a research rig).

Build it, then name its folder as ``model.name`` (the presets beside this file do)::

    python recipes/micro/build.py --config recipes/micro/micro.toml --out .hindsearch/micro
    python recipes/micro/build.py --world .hindsearch/world --out .hindsearch/micro   # an existing world folder

The command prints the folder it wrote (or found up to date). ``--config`` builds the preset's world
(``[data]``) when it is missing; ``--world`` takes a world folder as it is.

Small instruct models are slow on a CPU (one GRPO step of SmolLM2-135M costs minutes on 2 cores),
so a method comparison with them only gets a handful of steps. ``micro`` is built for that
comparison: a few-layer model (~2-3M parameters) whose steps take seconds.

``ensure_micro(world_dir, out_dir, seed)`` builds, once (cached by a hash of its inputs: the world files'
contents, the spec and the seed):
1. a byte-level BPE vocabulary (``MicroSpec.vocab_size`` at most, default 8,192; ``min_frequency`` 1,
   so every word of the world is one token and copying a name is copying one token) trained with
   ``tokenizers`` on the world's passages and questions plus the Search-R1 protocol strings (the
   instruction, the feedback/gold hindsight lines, the invalid notice and scripted-searcher
   phrases), so the long instruction costs few tokens. The protocol tags (``<search>``,
   ``</search>``, ``<answer>``, ``</answer>``, ``<information>``, ``</information>``, ``<think>``,
   ``</think>``) are single (non-special) added tokens; ``<|im_start|>``, ``<|im_end|>`` (eos) and
   ``<|pad|>`` are special tokens. Byte-level: any text round-trips, nothing maps to ``<unk>``;
2. a ``PreTrainedTokenizerFast`` around it with a ChatML-like chat template
   (``<|im_start|>user\\n{msg}<|im_end|>\\n<|im_start|>assistant\\n``), pad/eos set;
3. a ``LlamaForCausalLM`` (``MicroSpec``: 4 layers, hidden 192, 6 heads, tied embeddings), randomly
   initialised, then pretrained (``pretrain``; 800 steps by default) on a mix of packed world text
   (passages and *training* questions; dev and test are never read) and synthetic copy rows (random
   world tokens followed by their repeat, loss on the repeat). Saved with ``save_pretrained`` next to
   the tokenizer, with ``micro.json`` recording the copy accuracy before, during and after,

so ``load_policy(ModelConfig(name=str(path)))`` loads it like any local model. Teaching it the
protocol is the warm-up's job (``micro.toml`` here: long warm-up, feedback-conditioned demos).

**Why the copy rows** (measured on 2 CPU cores): copying is the skill the protocol needs (the query
repeats the question's entity, the answer repeats a name from the passages), and a model this size does
not pick it up from the protocol data. Without copy rows, three builds (3k BPE; the same after 300 steps
of plain-text pretraining; the 8k vocabulary with random init) followed the protocol after the 375-step
warm-up (validity 90-100%) but wrote memorised training entities into their queries: dev EM 0.0. With
half of each pretraining batch copy rows, copy accuracy goes 0.0 / 0.02 / 0.28 / 0.85 / 1.00 at steps
100 / 300 / 400 / 500 / 600 (an induction-head phase change; ~11 min for 800 steps), and after the same
warm-up the model repeats the question as its query in 90 of 100 dev questions and scores dev EM 16.0
(one-hop 31.3, two-hop 1.9). Rows packing several short ``x x`` episodes did not work (copy accuracy at
chance after 800 steps); one long episode per row does.

The torch thread count changes the weights (``--threads``, default 1: the count ``hindsearch compare`` builds its
start with).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from hindsearch.agent import protocol

if TYPE_CHECKING:
    import torch

PROTOCOL_TAGS = ("<search>", "</search>", "<answer>", "</answer>", "<information>", "</information>",
                 "<think>", "</think>")
BOS, EOS, PAD = "<|im_start|>", "<|im_end|>", "<|pad|>"
CHAT_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
MICRO_VERSION = 4

# Phrases the scripted searcher and the judges write; repeated in the tokenizer corpus so they merge.
_PHRASES = (
    "I need to look this up.", "I should find the first fact on its own.", "The passages point to",
    "Now I need to find out about", "The passages say the answer is", "I am not sure. My best guess is",
    "After the first search, search for", "and answer",
    "Search with the question and answer with the name written in the passages.",
    "Doc 1(Title: ", "Doc 2(Title: ", "Doc 3(Title: ",
)


@dataclass(frozen=True)
class MicroSpec:
    """Size of the micro model and its vocabulary (all fields enter the cache key)."""

    vocab_size: int = 8192
    hidden_size: int = 192
    intermediate_size: int = 512
    num_hidden_layers: int = 4
    num_attention_heads: int = 6
    max_position_embeddings: int = 2048
    pretrain_steps: int = 800
    """Pretraining steps before saving (0 = the random init): causal LM on the world's passages and
    training questions mixed with synthetic copy rows (``pretrain_copy_frac``)."""
    pretrain_seq_len: int = 256
    """Tokens per pretraining row (passages are packed; a copy row is a random half and its repeat)."""
    pretrain_batch_size: int = 16
    """Rows per pretraining step."""
    pretrain_lr: float = 1e-3
    """Peak AdamW learning rate of pretraining (linear warm-up over 10% of the steps, then cosine)."""
    pretrain_copy_frac: float = 0.5
    """Share of each pretraining batch that is synthetic copy rows (``copy_rows``: ``seq_len / 2`` random
    world tokens followed by the same tokens, loss on the repeat). This teaches copying (induction heads), which
    the protocol needs (the query repeats the question, the answer repeats a name in the passages)
    and which a few hundred steps of plain text or of demonstrations do not teach a model this size
    (measured with the default spec: copy accuracy 0.02 at step 300, 1.00 by step 600; 300 steps of
    passages alone and the 375-step warm-up alone left dev EM at 0)."""


def protocol_texts() -> list[str]:
    """The fixed protocol strings a micro tokenizer must encode compactly."""
    return [
        protocol.PROMPT_TEMPLATE.replace("{question}", ""),
        protocol.FEEDBACK_TEMPLATE.replace("{critique}", ""),
        protocol.GOLD_HINDSIGHT_TEMPLATE.replace("{answer}", ""),
        protocol.INVALID_NOTICE,
        *_PHRASES,
    ]


def world_texts(world_dir: str | Path, splits: tuple[str, ...] = ("train",)) -> Iterator[str]:
    """Passages (title + text) and the questions with answers of ``splits`` of a world folder.

    Only the training split by default: the tokenizer and the pretraining never see a dev or test
    question or answer. Reads ``corpus.jsonl`` (required) and whichever split files exist; a bad
    line raises ``ValueError`` naming the file and line.
    """
    world_dir = Path(world_dir)
    corpus = world_dir / "corpus.jsonl"
    if not corpus.exists():
        raise FileNotFoundError(f"{corpus} not found (build the world first: hindsearch world --out {world_dir})")
    from hindsearch.data.corpus import iter_corpus

    for p in iter_corpus(corpus):
        yield p.contents
    for split in splits:
        path = world_dir / f"{split}.jsonl"
        if not path.exists():
            continue
        with path.open() as f:
            for i, line in enumerate(f, 1):
                if not line.strip():
                    continue
                try:
                    row = json.loads(line)
                    yield f"{row['question']} {' '.join(row.get('golden_answers', []))}"
                except (json.JSONDecodeError, KeyError, TypeError) as e:
                    raise ValueError(f"{path}:{i}: bad question row ({e})") from e


def train_tokenizer(texts: list[str], vocab_size: int = 8192) -> Any:
    """Train a byte-level BPE on ``texts``; returns a transformers ``PreTrainedTokenizerFast``.

    The protocol strings are added ``8`` times so their words merge into few tokens.
    """
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size, min_frequency=1, special_tokens=[PAD, BOS, EOS],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False,
    )
    tok.train_from_iterator(texts + protocol_texts() * 8, trainer=trainer)
    tok.add_tokens([AddedToken(t, single_word=False, normalized=False, special=False) for t in PROTOCOL_TAGS])
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token=BOS, eos_token=EOS, pad_token=PAD)
    fast.chat_template = CHAT_TEMPLATE
    fast.padding_side = "left"
    return fast


def build_model(tokenizer: Any, spec: MicroSpec, seed: int = 0) -> Any:
    """A randomly initialised ``LlamaForCausalLM`` of size ``spec`` over ``tokenizer``'s vocabulary."""
    import torch
    from transformers import GenerationConfig, LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(
        vocab_size=len(tokenizer), hidden_size=spec.hidden_size, intermediate_size=spec.intermediate_size,
        num_hidden_layers=spec.num_hidden_layers, num_attention_heads=spec.num_attention_heads,
        num_key_value_heads=spec.num_attention_heads, max_position_embeddings=spec.max_position_embeddings,
        bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id, tie_word_embeddings=True,
    )
    torch.manual_seed(seed)
    model = LlamaForCausalLM(cfg)
    model.generation_config = GenerationConfig(
        bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id
    )
    return model


def pack(ids_list: list[list[int]], seq_len: int, eos_id: int) -> "torch.Tensor":
    """Concatenate token lists (eos between them) and cut into rows: ``[N, seq_len]`` (the tail is dropped)."""
    import torch

    flat = [t for ids in ids_list for t in ids + [eos_id]]
    n = len(flat) // seq_len
    if n == 0:
        raise ValueError(f"pretraining text too short: {len(flat)} tokens < seq_len {seq_len}")
    return torch.tensor(flat[: n * seq_len]).view(n, seq_len)


def copy_rows(pool: "torch.Tensor", n: int, seq_len: int, generator: "torch.Generator") -> tuple["torch.Tensor", "torch.Tensor"]:
    """Synthetic copy rows: ``seq_len // 2`` tokens drawn from ``pool`` ``[P]``, then the same tokens.

    Returns ``(input_ids [n, 2 * (seq_len // 2)], labels [n, 2 * (seq_len // 2)])``; labels are -100
    on the random first half, so the loss is on the repeat only (nothing there is predictable
    except by copying). Measured: rows packing several shorter ``x x`` episodes (8-64 tokens) left
    copy accuracy at chance after 800 steps; one long episode per row reached 1.0.
    """
    import torch

    half = seq_len // 2
    x = pool[torch.randint(0, len(pool), (n, half), generator=generator)]  # [n, half]
    ids = torch.cat([x, x], dim=1)
    labels = ids.clone()
    labels[:, :half] = -100
    return ids, labels


def copy_accuracy(model: Any, pool: "torch.Tensor", seq_len: int = 64, n: int = 16, seed: int = 1) -> float:
    """Greedy next-token accuracy of ``model`` on the repeats of ``n`` fresh copy rows (1.0 = copies)."""
    import torch

    ids, labels = copy_rows(pool, n, seq_len, torch.Generator().manual_seed(seed))
    with torch.no_grad():
        pred = model(input_ids=ids).logits[:, :-1].argmax(-1)  # [n, S-1]
    target, on = ids[:, 1:], labels[:, 1:] != -100
    return float((pred[on] == target[on]).float().mean())


def _pretrain_batches(data: torch.Tensor, pool: torch.Tensor, spec: MicroSpec, n_text: int, n_copy: int,
                      seed: int) -> list[dict[str, torch.Tensor]]:
    """Every step's batch, drawn up front from one generator seeded ``seed``: ``n_text`` packed rows of
    ``data`` (``"text"``) then ``n_copy`` copy rows over ``pool`` (``"copy_ids"``, ``"copy_labels"``), per step."""
    import torch

    g = torch.Generator().manual_seed(seed)
    batches: list[dict[str, torch.Tensor]] = []
    for _ in range(spec.pretrain_steps):  # the draws in the order the hand-written loop made them
        batch = {}
        if n_text:
            batch["text"] = data[torch.randint(0, len(data), (n_text,), generator=g)]  # [B_text, S]
        if n_copy:
            batch["copy_ids"], batch["copy_labels"] = copy_rows(pool, n_copy, spec.pretrain_seq_len, g)  # [B_copy, S']
        batches.append(batch)
    return batches


def _mixed_step(spec: MicroSpec, n_text: int, n_copy: int) -> Any:
    """The ``run_steps`` step function: the text and copy forwards' mean losses weighted by their share of
    the batch, one backward; a non-finite loss raises ``FloatingPointError`` naming the step."""
    import torch

    B = n_text + n_copy
    steps_done = [0]

    def step(model: Any, batch: dict[str, torch.Tensor], backward: Any) -> torch.Tensor:
        loss = torch.zeros((), device=next(model.parameters()).device)
        if n_text:
            loss = loss + model(input_ids=batch["text"], labels=batch["text"]).loss * (n_text / B)
        if n_copy:
            loss = loss + model(input_ids=batch["copy_ids"], labels=batch["copy_labels"]).loss * (n_copy / B)
        steps_done[0] += 1
        if not torch.isfinite(loss):
            raise FloatingPointError(f"micro pretraining loss is {float(loss)} at step {steps_done[0]}; "
                                     f"lower MicroSpec.pretrain_lr ({spec.pretrain_lr})")
        backward(loss)
        return loss.detach()

    return step


def _copy_curve(model: Any, pool: torch.Tensor, spec: MicroSpec, curve: list[list[float]]) -> Any:
    """A ``TrainerCallback`` appending ``[step, copy accuracy]`` to ``curve`` every ``pretrain_steps // 8``
    steps (at least every step) and at the last step."""
    from transformers import TrainerCallback

    every = max(1, spec.pretrain_steps // 8)

    class CopyCurve(TrainerCallback):
        def on_step_end(self, args, state, control, **kwargs):
            if state.global_step % every == 0 or state.global_step == spec.pretrain_steps:
                model.eval()
                curve.append([state.global_step, copy_accuracy(model, pool, spec.pretrain_seq_len)])
                model.train()

    return CopyCurve()


def pretrain(model: Any, tokenizer: Any, texts: list[str], spec: MicroSpec, seed: int = 0,
             progress: bool = True) -> dict[str, Any]:
    """Pretrain ``model`` in place with transformers' ``Trainer`` (``hindsearch.train.steps``): AdamW
    (weight decay 0.01 on every parameter), linear warm-up over 10% of the steps then cosine,
    gradient norm clipped to 1, ``spec.pretrain_steps`` steps.

    Each batch holds ``round(pretrain_copy_frac * batch)`` synthetic copy rows (``copy_rows`` over
    the tokens that occur in ``texts``) and packed rows of ``texts`` (causal LM, all tokens); the loss is
    the two forwards' means weighted by their share of the batch. The batches are drawn up front from one
    seeded generator. Returns ``{"loss": [per step], "copy_acc_before", "copy_acc_after",
    "copy_acc_curve": [[step, acc], ...]}``.
    """
    from functools import partial

    import torch

    from hindsearch.train.steps import run_steps, warmup_cosine

    if not 0.0 <= spec.pretrain_copy_frac <= 1.0:
        raise ValueError(f"MicroSpec.pretrain_copy_frac must be in [0, 1], got {spec.pretrain_copy_frac}")
    data = pack([tokenizer(t, add_special_tokens=False)["input_ids"] for t in texts], spec.pretrain_seq_len,
                tokenizer.eos_token_id)  # [N, S]
    pool = torch.unique(data)  # [P] token ids of the world's text
    B = spec.pretrain_batch_size
    n_copy = round(spec.pretrain_copy_frac * B)
    n_text = B - n_copy
    batches = _pretrain_batches(data, pool, spec, n_text, n_copy, seed)
    opt = torch.optim.AdamW(model.parameters(), lr=spec.pretrain_lr, weight_decay=0.01)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, partial(warmup_cosine, n_warm=max(1, spec.pretrain_steps // 10),
                                                           total=spec.pretrain_steps))
    acc_before = copy_accuracy(model, pool, spec.pretrain_seq_len)
    curve: list[list[float]] = []  # [step, copy accuracy]: every `every` steps and the last
    out = run_steps(model, spec.pretrain_steps, batches.__getitem__, _mixed_step(spec, n_text, n_copy), opt, sched,
                    max_grad_norm=1.0, seed=seed, desc="micro pretrain", progress=progress,
                    callbacks=[_copy_curve(model, pool, spec, curve)],
                    release_memory=False)  # a few-MB model: nothing to hand back
    return {"loss": out["loss"], "copy_acc_before": acc_before, "copy_acc_after": curve[-1][1], "copy_acc_curve": curve}


def _cache_key(world_dir: Path, spec: MicroSpec, seed: int) -> str:
    """The build's inputs: the spec, the seed and the *contents* of the world files (a copy of the world, with
    other times or another folder, is the same world: no 17-minute rebuild)."""
    from hindsearch.data.corpus import file_sha256

    h = hashlib.sha256()
    h.update(json.dumps({"spec": asdict(spec), "seed": seed, "v": MICRO_VERSION}, sort_keys=True).encode())
    for name in ("corpus.jsonl", "train.jsonl", "dev.jsonl", "test.jsonl"):
        p = world_dir / name
        if p.exists():
            h.update(f"{name}:{file_sha256(p)}".encode())
    return h.hexdigest()[:16]


def ensure_micro(world_dir: str | Path, out_dir: str | Path, seed: int = 0, spec: MicroSpec | None = None) -> Path:
    """Build (or reuse) the micro model for ``world_dir`` in ``out_dir``; returns ``out_dir``.

    Cached: when ``out_dir/micro.json`` holds the same key (world files, spec, seed) nothing is
    rebuilt. Written atomically (temporary folder, then rename).
    """
    spec = spec or MicroSpec()
    world_dir, out = Path(world_dir), Path(out_dir)
    key = _cache_key(world_dir, spec, seed)
    meta = out / "micro.json"
    if meta.exists() and (out / "config.json").exists():
        try:
            if json.loads(meta.read_text()).get("key") == key:
                return out
        except json.JSONDecodeError:
            pass
    texts = list(world_texts(world_dir))
    tok = train_tokenizer(texts, spec.vocab_size)
    model = build_model(tok, spec, seed)
    pre = pretrain(model, tok, texts, spec, seed) if spec.pretrain_steps > 0 else {"loss": []}
    losses = pre["loss"]
    tmp = out.with_name(out.name + f".tmp{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    model.save_pretrained(tmp)
    tok.save_pretrained(tmp)
    n_params = sum(p.numel() for p in model.parameters())
    (tmp / "micro.json").write_text(json.dumps(
        {"key": key, "seed": seed, "spec": asdict(spec), "vocab": len(tok), "params": n_params,
         "world_dir": str(world_dir), "pretrain_loss": losses[::max(1, len(losses) // 50)],
         "copy_acc_before": pre.get("copy_acc_before"), "copy_acc_after": pre.get("copy_acc_after"),
         "copy_acc_curve": pre.get("copy_acc_curve")}, indent=1))
    if out.exists():
        shutil.rmtree(out)
    tmp.rename(out)
    return out


def main(argv: list[str] | None = None) -> int:
    """``python recipes/micro/build.py (--world DIR | --config PRESET) --out DIR``: build (or find up to date) the
    micro model and print its folder."""
    from hindsearch.models import torch_threads

    p = argparse.ArgumentParser(prog="python recipes/micro/build.py",
                                description="Build the micro model (own BPE, copy-row pretraining) of a world.")
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--world", help="a world folder (hindsearch world --out DIR)")
    src.add_argument("--config", help="a preset whose [data] world is used, built when missing")
    p.add_argument("--out", required=True, help="model folder (rebuilt only when the world, spec or seed changed)")
    p.add_argument("--seed", type=int, default=0, help="initialisation and pretraining seed (default: 0)")
    p.add_argument("--threads", type=int, default=1,
                   help="torch threads; the weights depend on the count (default: 1, as compare builds its start)")
    args = p.parse_args(argv)
    from hindsearch.fsutil import check_replaceable

    out = check_replaceable(args.out, lambda f: (f / "micro.json").exists(), "micro model folder")
    if args.config:
        from hindsearch.config import Config
        from hindsearch.data.world import ensure_world_for

        world = ensure_world_for(Config.load(args.config).data)
    else:
        world = Path(args.world)
    with torch_threads(args.threads):
        folder = ensure_micro(world, out, args.seed)
    print(folder)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
