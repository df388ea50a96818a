"""glibc malloc settings against each other on training and decode: CPU time and peak RSS per fresh process.

Each run is one child process under ``/usr/bin/time -v`` (user + system CPU seconds, maximum resident set size),
with ``HINDSEARCH_MALLOC_TUNE=0`` and one subset of ``hindsearch.memory.MALLOC_SETTINGS`` applied by ``mallopt``
before torch loads:

- ``all``: every setting (arena max 2, trim threshold 32 MiB, mmap threshold 1 MiB);
- ``no-mmap``: arena max and trim threshold only (glibc's dynamic mmap threshold);
- ``none``: glibc's defaults.

Workloads (random weights, one torch thread): ``train`` = ``--train-steps`` AdamW steps of a SmolLM2-vocabulary
(49,152) Llama on a batch of 8 x 256 tokens; ``decode`` = ``--decode-steps`` sampled decode steps of
``core.decode`` at batch 16. Variants run interleaved in every repeat (the CPU is shared); medians and per-repeat
ratios against ``all``.

    python benchmarks/bench_malloc.py --repeats 5
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import subprocess
import sys

VARIANTS = {"all": ("MALLOC_ARENA_MAX", "MALLOC_TRIM_THRESHOLD_", "MALLOC_MMAP_THRESHOLD_"),
            "no-mmap": ("MALLOC_ARENA_MAX", "MALLOC_TRIM_THRESHOLD_"), "none": ()}

CHILD = r"""
import ctypes, sys
from hindsearch.memory import MALLOC_SETTINGS
names = set(sys.argv[3].split(",")) - {""}
mallopt = ctypes.CDLL("libc.so.6").mallopt
for param, (env, value) in MALLOC_SETTINGS.items():
    if env in names:
        assert mallopt(param, value) == 1
import torch
from transformers import LlamaConfig, LlamaForCausalLM
torch.manual_seed(0)
torch.set_num_threads(1)
cfg = LlamaConfig(vocab_size=49152, hidden_size=256, intermediate_size=768, num_hidden_layers=4,
                  num_attention_heads=4, num_key_value_heads=2, pad_token_id=0)
model = LlamaForCausalLM(cfg)
work, steps = sys.argv[1], int(sys.argv[2])
if work == "train":
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    x = torch.randint(0, 49152, (8, 256))
    for _ in range(steps):
        model(input_ids=x, labels=x).loss.backward()
        opt.step()
        opt.zero_grad()
else:
    from hindsearch.core.decode import decode
    from hindsearch.core.sampling import SamplingParams, Stop
    model.eval()
    ctx = torch.randint(1, 49152, (16, 64)).tolist()
    with torch.no_grad():
        decode(model, ctx, Stop(None, set()), SamplingParams(temperature=1.0), [steps] * 16,
               generator=torch.Generator().manual_seed(0), pad=0)
"""


def run(work: str, steps: int, variant: str) -> dict[str, float]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("MALLOC_")}
    env.update(HINDSEARCH_MALLOC_TUNE="0", OMP_NUM_THREADS="1")
    p = subprocess.run(["/usr/bin/time", "-v", sys.executable, "-c", CHILD, work, str(steps),
                        ",".join(VARIANTS[variant])], capture_output=True, text=True, env=env)
    if p.returncode != 0:
        raise RuntimeError(p.stderr[-2000:])

    def field(name: str) -> float:
        return float(re.search(rf"{re.escape(name)}: ([0-9.]+)", p.stderr).group(1))

    return {"user": field("User time (seconds)"), "sys": field("System time (seconds)"),
            "rss_mb": field("Maximum resident set size (kbytes)") / 1024}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--train-steps", type=int, default=3)
    ap.add_argument("--decode-steps", type=int, default=50)
    ap.add_argument("--variants", default="all,no-mmap,none")
    a = ap.parse_args()
    variants = a.variants.split(",")
    res: dict[tuple[str, str], list[dict[str, float]]] = {}
    for r in range(a.repeats):
        for work, steps in (("train", a.train_steps), ("decode", a.decode_steps)):
            order = variants if r % 2 == 0 else variants[::-1]  # alternate which goes first
            for v in order:
                m = run(work, steps, v)
                res.setdefault((work, v), []).append(m)
                print(f"repeat {r} {work} {v}: user {m['user']:.2f} s, sys {m['sys']:.2f} s, "
                      f"max RSS {m['rss_mb']:.0f} MiB", flush=True)
    print(f"\n| workload | malloc settings | CPU s (user + sys), median | user | sys | CPU vs all, median of "
          f"per-repeat ratios | max RSS MiB, median |")
    print("|---|---|---|---|---|---|---|")
    for work in ("train", "decode"):
        base = [m["user"] + m["sys"] for m in res[(work, "all")]] if "all" in variants else None
        for v in variants:
            ms = res[(work, v)]
            cpu = [m["user"] + m["sys"] for m in ms]
            ratio = f"{statistics.median(c / b for c, b in zip(cpu, base)):.3f}" if base else "-"
            print(f"| {work} | {v} | {statistics.median(cpu):.2f} | {statistics.median(m['user'] for m in ms):.2f} | "
                  f"{statistics.median(m['sys'] for m in ms):.2f} | {ratio} | "
                  f"{statistics.median(m['rss_mb'] for m in ms):.0f} |")


if __name__ == "__main__":
    main()
