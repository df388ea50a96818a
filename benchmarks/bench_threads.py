"""Torch threads on a shared CPU: one training step of the default model's size with 1 thread, N, and the default.

``hindsearch train --threads N`` sets the count; without it a run takes ``models.default_threads`` (1 on 2 cores
or fewer or on a busy machine, the free cores when some are taken, else torch's). This benchmark times what the
choice costs where the user waits: forward + backward + an AdamW step of a model with SmolLM2-135M's shape
(random weights, the same compute; 30 layers, hidden 576), on ``--rows`` rows of ``--tokens`` tokens, alternating
the arms (1, N, default, 1, N, default, ...) so that all see the same machine load; the default is chosen again
before each of its steps, from the load average then. Prints the median wall and process CPU seconds per step of
each arm, and their ratios, with the load average and the default's counts.

    OMP_NUM_THREADS=1 python benchmarks/bench_threads.py --threads 2 --rounds 3
"""

from __future__ import annotations

import argparse
import os
import statistics
import time


def make_model(layers: int) -> tuple[object, object]:
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=49152, hidden_size=576, intermediate_size=1536, num_hidden_layers=layers,
                      num_attention_heads=9, num_key_value_heads=3, max_position_embeddings=2048, tie_word_embeddings=True)
    model = LlamaForCausalLM(cfg)
    return model, torch.optim.AdamW(model.parameters(), lr=1e-5)


def one_step(model, opt, ids) -> None:
    out = model(input_ids=ids, labels=ids)
    out.loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)


def main(argv: list[str] | None = None) -> int:
    import torch

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    ap.add_argument("--threads", type=int, default=2, help="the count compared with 1 (the default of a 2-core box)")
    ap.add_argument("--rounds", type=int, default=3, help="alternations of (1 thread, N threads), one step each")
    ap.add_argument("--rows", type=int, default=4, help="sequences per step")
    ap.add_argument("--tokens", type=int, default=256, help="tokens per sequence")
    ap.add_argument("--layers", type=int, default=30, help="decoder layers (SmolLM2-135M: 30)")
    args = ap.parse_args(argv)
    model, opt = make_model(args.layers)
    ids = torch.randint(0, 49152, (args.rows, args.tokens))
    torch.set_num_threads(1)
    one_step(model, opt, ids)  # warm: allocations, first-call overheads
    from hindsearch.models import default_threads, usable_cores

    torch_default = torch.get_num_threads()
    arms: list[int | str] = [1, args.threads, "default"]
    times: dict[int | str, list[tuple[float, float]]] = {a: [] for a in arms}
    chosen: list[str] = []
    loads: list[float] = []
    for _ in range(args.rounds):
        for arm in arms:
            n = arm
            if arm == "default":
                loads.append(os.getloadavg()[0])
                auto, why = default_threads(usable_cores(), loads[-1])
                n = min(auto or torch_default, torch_default)
                chosen.append(f"{n} ({why})")
            torch.set_num_threads(n)
            w0, c0 = time.perf_counter(), time.process_time()
            one_step(model, opt, ids)
            times[arm].append((time.perf_counter() - w0, time.process_time() - c0))
    load = os.getloadavg()
    print(f"one training step ({args.layers} layers, hidden 576, {args.rows} x {args.tokens} tokens), "
          f"{args.rounds} alternations; load average {load[0]:.2f} {load[1]:.2f} {load[2]:.2f} at the end "
          f"({min(loads):.2f}-{max(loads):.2f} during), {os.cpu_count()} cores")
    print("default chose: " + "; ".join(dict.fromkeys(chosen)))
    print("| threads | median wall s | median CPU s | wall vs 1 thread | CPU vs 1 thread |")
    print("|---|---|---|---|---|")
    base_w = statistics.median(w for w, _ in times[1])
    base_c = statistics.median(c for _, c in times[1])
    for n, ts in times.items():
        w, c = statistics.median(x for x, _ in ts), statistics.median(y for _, y in ts)
        print(f"| {n} | {w:.2f} | {c:.2f} | {w / base_w:.2f}x | {c / base_c:.2f}x |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
