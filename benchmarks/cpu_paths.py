"""Which CPU code paths change trained weights bit for bit: torch's vectorised kernels and MKL's matrix products.

A compare's shared start (micro pretraining + warm-up, one thread) came out as one model on an Intel AVX512
machine and as another on AMD AVX2 ones, and forcing torch's AVX2 kernels on the Intel machine gave a third: the
kernel set that ``init.json`` records is not the only path that counts. This script trains
a small Llama (2 layers, hidden 128, vocabulary 1,024; 20 AdamW steps on fixed random tokens, one thread) in a
fresh process per setting of the environment variables that choose those paths, and prints each setting's
kernel set, weight digest and final loss. Two settings with one digest take the same path on this CPU.

    python benchmarks/cpu_paths.py
    python benchmarks/cpu_paths.py --settings "" "ATEN_CPU_CAPABILITY=avx2 MKL_CBWR=AVX2,STRICT"
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys

TRAIN = r"""
import hashlib, torch
from transformers import LlamaConfig, LlamaForCausalLM
torch.manual_seed(0)
torch.set_num_threads(1)
cfg = LlamaConfig(vocab_size=1024, hidden_size=128, intermediate_size=256, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=4)
model = LlamaForCausalLM(cfg)
opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
x = torch.randint(0, 1024, (8, 64))
for _ in range(STEPS):
    loss = model(input_ids=x, labels=x).loss
    loss.backward()
    opt.step()
    opt.zero_grad()
digest = hashlib.sha256(b"".join(p.detach().numpy().tobytes() for p in model.parameters())).hexdigest()
print(torch.backends.cpu.get_cpu_capability(), digest[:16], repr(float(loss)))
"""

DEFAULT_SETTINGS = ("", "ATEN_CPU_CAPABILITY=avx2", "MKL_CBWR=AVX2", "ATEN_CPU_CAPABILITY=avx2 MKL_CBWR=AVX2",
                    "ATEN_CPU_CAPABILITY=avx2 MKL_CBWR=COMPATIBLE", "ATEN_CPU_CAPABILITY=default")


def run(setting: str, steps: int) -> tuple[str, str, str]:
    """``(kernel set, digest, final loss)`` of one fresh process under ``setting`` (``VAR=value`` words)."""
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    for word in setting.split():
        if "=" not in word:
            raise SystemExit(f"--settings: {word!r} is not VAR=value")
        k, v = word.split("=", 1)
        env[k] = v
    out = subprocess.run([sys.executable, "-c", TRAIN.replace("STEPS", str(steps))], env=env, capture_output=True,
                         text=True, timeout=600)
    if out.returncode != 0:
        raise SystemExit(f"setting {setting!r} failed:\n{out.stderr[-2000:]}")
    kernels, digest, loss = out.stdout.strip().splitlines()[-1].split()
    return kernels, digest, loss


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--settings", nargs="+", default=list(DEFAULT_SETTINGS),
                    help='environment settings to compare, each "VAR=value VAR=value" ("" is the machine default)')
    ap.add_argument("--steps", type=int, default=20)
    a = ap.parse_args(argv)
    rows = [(s or "(machine default)", *run(s, a.steps)) for s in a.settings]
    base = rows[0][2]
    print(f"{a.steps} AdamW steps of a 2-layer Llama, one thread per process\n")
    print("| setting | torch kernels | weights sha256 | final loss | same weights as the first |")
    print("|---|---|---|---|---|")
    for setting, kernels, digest, loss in rows:
        print(f"| {setting} | {kernels} | {digest}... | {loss} | {'yes' if digest == base else 'no'} |")


if __name__ == "__main__":
    main()
