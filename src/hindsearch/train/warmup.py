"""Protocol warm-up (cold start): supervised fine-tuning on demonstration rollouts.

The loss is the token-mean cross-entropy on the demonstration's generated tokens only; prompt and
injected tokens carry label -100, as GRPO masks them. ``tokenize_demo`` tokenises as the rollout
engine does (each segment on its own), so ``gen_mask`` is exact. Demos come from ``train.scripted``
or any rollout JSONL. ``ensure_warmup`` runs the stage once and caches the model, tokenizer and
``warmup.json`` under ``cache_dir/warmup-<hash>``; ``cmd_sft`` runs ``hindsearch sft``. The
objective and the cache key: docs/methods.md, "The scripted searcher and the warm-up".
"""

from __future__ import annotations

import hashlib
import json
import random
import shutil
import time
from collections.abc import Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

import torch

from hindsearch.records import QARecord, Trajectory
from hindsearch.train.demos import load_demos, tokenize_demo

CACHE_VERSION = 1


# ---------------------------------------------------------------- SFT
def collate(batch: Sequence[Trajectory],
            pad_id: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Right-padded ``(input_ids [B, L], attention_mask [B, L], labels [B, L])``. Right, not
    ``core.model.left_pad``'s left: a training batch is never continued, and ``sft_step`` cuts a
    micro-batch to its own longest row by columns.

    ``labels[b, i] = input_ids[b, i]`` where the token is a generated completion token
    (gen_mask 1), else -100 (prompt, injected blocks, padding). Labels are *not* shifted.
    """
    L = max(len(t.prompt_ids) + len(t.completion_ids) for t in batch)
    ids = torch.full((len(batch), L), pad_id, dtype=torch.long)
    att = torch.zeros((len(batch), L), dtype=torch.long)
    lab = torch.full((len(batch), L), -100, dtype=torch.long)
    for b, t in enumerate(batch):
        seq = t.prompt_ids + t.completion_ids
        n, p = len(seq), len(t.prompt_ids)
        ids[b, :n] = torch.tensor(seq)
        att[b, :n] = 1
        comp = torch.tensor(t.completion_ids, dtype=torch.long)
        gm = torch.tensor(t.gen_mask, dtype=torch.bool)
        lab[b, p:n] = torch.where(gm, comp, torch.full_like(comp, -100))
    return ids, att, lab


def sft_loss(model: Any, input_ids: torch.Tensor, attention_mask: torch.Tensor,
             labels: torch.Tensor, num_items: int | torch.Tensor | None = None) -> torch.Tensor:
    """Next-token cross-entropy over labelled positions (labels != -100): the token mean, or with
    ``num_items`` the token sum divided by ``num_items`` (a micro-batch's share of a larger batch's
    mean).

    Shapes: ``input_ids``, ``attention_mask``, ``labels`` [B, L]. The LM head is applied only at
    the positions that predict a labelled token (cheaper than full [B, L, V] logits).
    """
    tgt = labels[:, 1:]
    sel = tgt != -100
    if num_items is None and not bool(sel.any()):
        raise ValueError("SFT batch has no gen_mask tokens to train on")
    decoder = model.get_decoder() if hasattr(model, "get_decoder") else None
    head = model.get_output_embeddings()
    if decoder is not None and head is not None:
        # [B, L, H]
        hidden = decoder(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state
        logits = head(hidden[:, :-1][sel])  # [N, V]
    else:
        logits = model(input_ids=input_ids, attention_mask=attention_mask).logits[:, :-1][sel]
    if num_items is None:
        return torch.nn.functional.cross_entropy(logits.float(), tgt[sel])
    return torch.nn.functional.cross_entropy(logits.float(), tgt[sel], reduction="sum") / num_items


def sft_step(model: Any, batch: dict[str, torch.Tensor], backward: Any,
             micro_batch_size: int | None) -> torch.Tensor:
    """Forward and backward of one SFT batch in micro-batches of ``micro_batch_size`` rows (None:
    all at once).

    Each micro-batch contributes its token sum divided by the whole batch's labelled-token count, so
    the accumulated gradient is the gradient of the batch's token mean (``sft_loss``), with the
    activations of one micro-batch alive at a time. Rows are right-padded: a micro-batch is cut to
    its own longest row. Returns the batch's token-mean loss (detached).
    """
    ids, att, lab = batch["input_ids"], batch["attention_mask"], batch["labels"]
    n = (lab[:, 1:] != -100).sum()
    if int(n) == 0:
        raise ValueError("SFT batch has no gen_mask tokens to train on")
    step = micro_batch_size or ids.size(0)
    total = torch.zeros((), device=ids.device)
    for s in range(0, ids.size(0), step):
        width = int(att[s : s + step].sum(1).max())
        part_lab = lab[s : s + step, :width]
        if not bool((part_lab[:, 1:] != -100).any()):
            continue
        part = sft_loss(model, ids[s : s + step, :width], att[s : s + step, :width],
                        part_lab, num_items=n)
        backward(part)
        total += part.detach()
    return total


def _batches(n: int, batch_size: int, lengths: Sequence[int],
             rng: random.Random) -> list[list[int]]:
    """Shuffled batches; within windows of 4 batches, indices sorted by length (less padding)."""
    idx = list(range(n))
    rng.shuffle(idx)
    out = []
    win = batch_size * 4
    for w in range(0, n, win):
        chunk = sorted(idx[w : w + win], key=lambda i: lengths[i])
        out += [chunk[i : i + batch_size] for i in range(0, len(chunk), batch_size)]
    rng.shuffle(out)
    return out


def trainable_top_layers(model: Any, n: int | None) -> list[torch.nn.Parameter]:
    """Parameters to train: all (``n`` None) or only the top ``n`` decoder layers and the final
    norm.

    With ``n`` set, everything else gets ``requires_grad=False`` (the frozen lower layers then
    build no autograd graph: a cheaper step on CPU). Call ``model.requires_grad_(True)`` to undo.
    """
    if n is None:
        return [p for p in model.parameters() if p.requires_grad]
    layers = getattr(model.get_decoder(), "layers", None)
    if layers is None or not 0 < n <= len(layers):
        raise ValueError(f"train_layers = {n}: the model has "
                         f"{len(layers) if layers is not None else '?'} decoder layers")
    model.requires_grad_(False)
    for mod in [*layers[len(layers) - n :], getattr(model.get_decoder(), "norm", None)]:
        if mod is not None:
            mod.requires_grad_(True)
    return [p for p in model.parameters() if p.requires_grad]


def sft(model: Any, tokenizer: Any, demos: Sequence[Trajectory], epochs: int, lr: float,
        batch_size: int, seed: int = 0, warmup_frac: float = 0.1, max_grad_norm: float = 1.0,
        progress: bool = True, train_layers: int | None = None, micro_batch_size: int | None = None,
        metrics_path: str | Path | None = None, checkpoint_every: int = 0) -> dict[str, Any]:
    """Train ``model`` in place on tokenised demonstrations with transformers' ``Trainer``
    (``hindsearch.train.steps``): AdamW (no weight decay), linear warm-up over ``warmup_frac`` of
    the steps then cosine decay, gradient norm clipped to ``max_grad_norm``, the loss of
    ``sft_loss`` over each planned batch.

    ``train_layers``: train only the top N decoder layers (None = the whole model).
    ``micro_batch_size``: demos per forward/backward (None = the whole batch; the gradient is the
    same). ``metrics_path``: one JSONL row per step. ``checkpoint_every``: activation checkpointing
    of every N-th decoder layer (0 = off; the same weights). Returns ``{"loss": [per-step loss],
    "steps", "tokens_trained", "seconds"}``.
    """
    from functools import partial

    from hindsearch.train.steps import activation_checkpointing, run_steps, warmup_cosine

    if not demos:
        raise ValueError("warm-up has no demonstrations to train on")
    pad_id = (tokenizer.pad_token_id if tokenizer.pad_token_id is not None
              else tokenizer.eos_token_id)
    rng = random.Random(seed)
    lengths = [len(t.prompt_ids) + len(t.completion_ids) for t in demos]
    plan = [b for _ in range(epochs) for b in _batches(len(demos), batch_size, lengths, rng)]
    total = len(plan)
    params = trainable_top_layers(model, train_layers)
    opt = torch.optim.AdamW(params, lr=lr, weight_decay=0.0)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, partial(warmup_cosine,
                                                           n_warm=max(1, int(warmup_frac * total)),
                                                           total=total))

    def make_batch(i: int) -> dict[str, torch.Tensor]:
        ids, att, lab = collate([demos[j] for j in plan[i]], pad_id)
        return {"input_ids": ids, "attention_mask": att, "labels": lab}

    try:
        with activation_checkpointing(model, checkpoint_every):
            out = run_steps(model, total, make_batch,
                            partial(sft_step, micro_batch_size=micro_batch_size), opt,
                            sched, max_grad_norm=max_grad_norm, seed=seed, desc="warm-up SFT",
                            progress=progress, metrics_path=metrics_path)
    finally:
        if train_layers is not None:
            model.requires_grad_(True)
    out["tokens_trained"] = sum(sum(demos[i].gen_mask) for b in plan for i in b)
    return out


# ---------------------------------------------------------------- the stage
def select_records(records: Sequence[QARecord], n: int, seed: int) -> list[QARecord]:
    """``n`` records drawn without replacement (seeded); all of them when ``n >= len``."""
    idx = list(range(len(records)))
    random.Random(seed).shuffle(idx)
    return [records[i] for i in sorted(idx[: min(n, len(records))])]


def build_demos(cfg: Any, tokenizer: Any, retriever: Any, train_records: Sequence[QARecord],
                demos_path: str | Path | None = None) -> tuple[list[Trajectory], dict[str, Any]]:
    """Tokenised demonstrations + info (scripted ceiling per hop, counts) for the warm-up config."""
    from hindsearch.train.scripted import ScriptedSearcher, ceiling_from_demos

    w = cfg.warmup
    path = demos_path or w.demos
    info: dict[str, Any] = {}
    if path:
        texts, skipped = load_demos(path)
        texts = texts[: w.num_demos] if w.num_demos else texts
        info.update(source=str(path), skipped_without_answer=skipped)
    else:
        searcher = ScriptedSearcher(retriever, topk=cfg.retrieval.topk, p_bridge=w.p_bridge,
                                    p_feedback=w.p_feedback, max_turns=cfg.rollout.max_turns,
                                    seed=cfg.train.seed, feedback_kinds=w.feedback_kinds)
        texts = searcher.demos(select_records(train_records, w.num_demos, cfg.train.seed))
        info.update(source="scripted", p_bridge=w.p_bridge, p_feedback=w.p_feedback)
    info["scripted_ceiling" if not path else "demo_em"] = ceiling_from_demos(texts)
    demos = [tokenize_demo(tokenizer, t, cfg.rollout.max_total_tokens) for t in texts]
    info.update(num_demos=len(demos), truncated=sum(t.stop_reason == "length" for t in demos),
                with_feedback=sum(bool(t.extra.get("hint")) for t in demos),
                feedback_by_kind={k: sum(t.extra.get("hint_kind") == k and bool(t.extra.get("hint"))
                                         for t in demos)
                                  for k in w.feedback_kinds},
                answer_query_found=sum(t.extra.get("answer_query_found") is True for t in demos),
                mean_tokens=sum(len(t.prompt_ids) + len(t.completion_ids) for t in demos) / max(
                    1, len(demos)),
                mean_gen_tokens=sum(sum(t.gen_mask) for t in demos) / max(1, len(demos)))
    return demos, info


def run_warmup(cfg: Any, model: Any, tokenizer: Any, retriever: Any,
               train_records: Sequence[QARecord], out_dir: str | Path,
               demos_path: str | Path | None = None, progress: bool = True) -> dict[str, Any]:
    """Build demonstrations, SFT ``model`` in place, save model + tokenizer + ``warmup.json`` to
    ``out_dir``."""
    w = cfg.warmup
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    t0 = time.time()
    demos, info = build_demos(cfg, tokenizer, retriever, train_records, demos_path)
    info["demo_seconds"] = time.time() - t0
    with (out / "demos.jsonl").open("w") as f:
        for t in demos:
            f.write(json.dumps(t.to_dict()) + "\n")
    curve = sft(model, tokenizer, demos, epochs=w.epochs, lr=w.lr, batch_size=w.batch_size,
                seed=cfg.train.seed, progress=progress, train_layers=w.train_layers,
                micro_batch_size=w.micro_batch_size, metrics_path=out / "metrics.jsonl",
                checkpoint_every=w.checkpoint_every_n_layers if w.gradient_checkpointing else 0)
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    info.update(model=cfg.model.name, warmup=asdict(w), sft=curve, seconds=time.time() - t0,
                threads=torch.get_num_threads())  # the weights depend on it (models.torch_threads)
    (out / "warmup.json").write_text(json.dumps(info, indent=1))
    return info


def model_fingerprint(name: str) -> str | None:
    """Identity of a local model folder's contents (None for a hub id or alias): the same path
    rebuilt with other weights (e.g. the ``micro`` model after a spec change) must not reuse a
    warm-up of the old weights.

    A hash of the names, sizes and modification times (ns) of the folder's files.
    """
    d = Path(name)
    if not d.is_dir():
        return None
    st = [(f.name, f.stat().st_size, f.stat().st_mtime_ns) for f in sorted(d.iterdir())
          if f.is_file()]
    return hashlib.sha256(json.dumps(st).encode()).hexdigest()[:16]


# warm-up fields that change memory and time but not the trained weights: not part of the cache key
MEMORY_ONLY = ("gradient_checkpointing", "checkpoint_every_n_layers")


def warmup_key(cfg: Any, train_records: Sequence[QARecord],
               demos_path: str | Path | None = None) -> str:
    """Cache key: hash of (model, warm-up config, rollout budget, retrieval, seed, data)."""
    h = hashlib.sha256()
    path = demos_path or cfg.warmup.demos
    parts = {
        "version": CACHE_VERSION,
        "model": [cfg.model.name, cfg.model.gguf_file, cfg.model.dtype,
                  model_fingerprint(cfg.model.name)],
        "warmup": {k: v for k, v in asdict(cfg.warmup).items() if k not in MEMORY_ONLY},
        "rollout": [cfg.rollout.max_turns, cfg.rollout.max_total_tokens],
        "retrieval": [cfg.retrieval.kind, cfg.retrieval.index_dir, cfg.retrieval.url,
                      cfg.retrieval.topk, cfg.retrieval.encoder],
        "seed": cfg.train.seed,
    }
    h.update(json.dumps(parts, sort_keys=True).encode())
    if path:
        h.update(Path(path).read_bytes())
    else:
        for r in train_records:
            h.update(json.dumps([r.id, r.question, r.golden_answers, r.hops, r.metadata],
                                sort_keys=True).encode())
    return h.hexdigest()[:16]


def warmup_dir(cfg: Any, train_records: Sequence[QARecord], cache_dir: str | Path) -> Path:
    """The cached warm-up folder of this config and data (``cache_dir/warmup-<key>``); it is
    complete, and ``ensure_warmup`` trains nothing, when its ``warmup.json`` exists."""
    return Path(cache_dir) / f"warmup-{warmup_key(cfg, train_records)}"


def ensure_warmup(cfg: Any, model: Any, tokenizer: Any, retriever: Any,
                  train_records: Sequence[QARecord], cache_dir: str | Path,
                  progress: bool = True) -> Path:
    """The warmed-up checkpoint folder, built once per (model, warm-up config, data).

    On a cache miss ``model`` is trained in place and saved; on a hit nothing is trained and
    the cached folder is returned (load the policy from it). Written atomically: a folder is
    only used when its ``warmup.json`` exists.
    """
    final = warmup_dir(cfg, train_records, cache_dir)
    if (final / "warmup.json").exists():
        return final
    tmp = final.with_name(final.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    run_warmup(cfg, model, tokenizer, retriever, train_records, tmp, progress=progress)
    shutil.rmtree(final, ignore_errors=True)
    tmp.rename(final)
    return final


# ---------------------------------------------------------------- CLI
def cmd_sft(args: Any) -> int:
    """``hindsearch sft`` (the parser lives in ``hindsearch.cli.train`` so the CLI starts without
    torch)."""
    from hindsearch.config import Config

    from hindsearch.hindsight.registry import resolve_methods

    cfg = resolve_methods(Config.load(args.config, args.set))
    demos = args.demos or cfg.warmup.demos
    if demos and not Path(demos).exists():
        raise FileNotFoundError(f"demonstrations file not found: {demos}")
    if demos:
        records, retriever = [], None
    else:
        from hindsearch.inputs import prepare

        setup = prepare(cfg)  # data, index and retriever, as every command resolves them
        records, retriever = setup.train, setup.retriever
    from hindsearch.models import load_policy

    model, tokenizer = load_policy(cfg.model)
    info = run_warmup(cfg, model, tokenizer, retriever, records, args.out, demos_path=args.demos)
    c = info.get("scripted_ceiling") or info.get("demo_em") or {}
    print(f"warm-up: {info['num_demos']} demos, demo EM {c.get('em', 0):.3f} by hops "
          f"{c.get('em_by_hops')}, final loss {(info['sft']['loss'] or [float('nan')])[-1]:.3f}, "
          f"{info['seconds']:.0f}s -> {args.out}")
    return 0
