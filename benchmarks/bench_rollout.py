"""Rollout throughput of the default model (SmolLM2-135M) on CPU, and a small greedy evaluation.

Measures, in one run:

1. the engine at batch B with per-row turn scheduling (the default) and (``--single``) at batch 1:
   trajectories/min and generated tokens/s (sampled, temperature 1); unless ``--skip-nokv``, the decode loop's
   turn-synchronous schedule (what it does with a cache it cannot merge: every turn re-reads its context);
2. the per-row engine's time against its limit: the same model decoding exactly the same number of
   generated tokens per row with plain batched decoding (``core.decode``, no tools, a row leaves when
   done) plus one batched prefill of the injected ids; target <= 1.25x. The rest is split into prefill,
   decode, scheduling (sampling/stop checks/selection, merging), KV saving, retrieval and serving, and the
   share of padded attention positions. All variants run interleaved in each repeat, ratios per repeat;
3. greedy ``evaluate`` on the first N questions of each world split (and each mini benchmark
   found under ``--mini DIR``), with the EM table.

    python benchmarks/bench_rollout.py [--batch 16] [--repeats 3] [--single 0] [--skip-nokv] [--eval-per-split 8]

Numbers are medians over ``--repeats`` runs. CPU is shared: keep the defaults small.

``--host`` measures instead the decode loop's host work, on random Llamas with SmolLM2's 49,152-id vocabulary
(2 layers, and 36 layers for the forward's per-layer dispatch), hidden 64, one thread, at batch 8, 32 and 64
(``--host-batches``), ``--host-tokens`` new tokens from 16-token prompts, CPU time (``time.process_time``):

- our loop (``core.decode``) greedy against ``model.generate`` greedy on the same prompts: CPU ms per decode
  step of each, their ratio, and whether the greedy ids are identical;
- the host time per decode step outside the forward (CPU time minus the CPU time inside ``model.forward``: sampling,
  stop checks, bookkeeping, the prefill's share excluded with the forwards) of ``generate`` and of our loop, greedy
  and sampled with each ``SamplingParams.draw`` (``multinomial``, ``inverse_cdf``);
- ``sample_tokens`` alone on ``[batch, 49152]`` logits, multinomial against inverse CDF.

All variants run interleaved in each repeat; medians, and ratios per repeat.

    python benchmarks/bench_rollout.py --host --repeats 3
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import torch


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--single", type=int, default=4, help="questions rolled out one at a time for the batch-1 row")
    ap.add_argument("--max-new", type=int, default=64, help="max_new_tokens_per_turn")
    ap.add_argument("--max-turns", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=1)
    ap.add_argument("--eval-per-split", type=int, default=8)
    ap.add_argument("--mini", help="folder of mini benchmarks (corpus.jsonl + <name>.jsonl), optional")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--skip-nokv", action="store_true", help="no comparison run of the turn-synchronous re-prefill schedule")
    ap.add_argument("--skip-throughput", action="store_true", help="only run the evaluation part")
    ap.add_argument("--skip-world-eval", action="store_true", help="no world-split evaluation (e.g. mini only)")
    ap.add_argument("--world", default=".hindsearch/world")
    ap.add_argument("--out", default=".hindsearch/bench/rollout-eval")
    ap.add_argument("--host", action="store_true", help="only the host-work table (module docstring)")
    ap.add_argument("--host-batches", default="8,32,64")
    ap.add_argument("--host-tokens", type=int, default=32)
    args = ap.parse_args()
    if args.host:
        torch.set_num_threads(1)
        host_table(args)
        return
    torch.set_num_threads(args.threads)

    from hindsearch.config import ModelConfig, RolloutConfig
    from hindsearch.data.world import ensure_world
    from hindsearch.models import load_policy
    from hindsearch.records import QARecord
    from hindsearch.retrieval.factory import ensure_index, load_index

    t0 = time.perf_counter()
    world = Path(ensure_world(args.world, seed=0))
    retriever = load_index(ensure_index(world / "corpus.jsonl", world / "index-bm25", kind="bm25", show_progress=False))
    splits = {s: [QARecord.from_dict(json.loads(x)) for x in (world / f"{s}.jsonl").read_text().splitlines() if x.strip()]
              for s in ("train", "dev", "test")}
    model, tok = load_policy(ModelConfig(name=args.model, device="cpu"))
    print(f"setup (world, index, model) {time.perf_counter() - t0:.1f}s; torch threads {torch.get_num_threads()}")
    cfg = RolloutConfig(max_turns=args.max_turns, max_new_tokens_per_turn=args.max_new, max_total_tokens=2048,
                        temperature=1.0, top_p=1.0)
    qs = splits["dev"][: args.batch]

    if not args.skip_throughput:
        throughput(args, model, tok, retriever, cfg, qs)
    evaluation(args, model, tok, retriever, splits)


def throughput(args, model, tok, retriever, cfg, qs) -> None:
    from hindsearch.agent.engine import RolloutEngine
    from hindsearch.agent.hf_backend import HFBackend
    from hindsearch.core import decode as core_decode
    from hindsearch.core.model import forward, left_pad, pad_id, positions
    from hindsearch.core.sampling import SamplingParams, Stop

    def run_engine(records: list, batch: int, per_row: bool = True) -> dict:
        eng = RolloutEngine(model, tok, retriever, cfg, topk=3, backend=HFBackend(model, tok))
        real = core_decode.mergeable
        if not per_row:  # the loop's schedule for caches it cannot merge: every turn re-reads its whole context
            core_decode.mergeable = lambda cache: False
        t = time.perf_counter()
        trajs = []
        try:
            for i in range(0, len(records), batch):
                trajs += eng.rollout(records[i : i + batch], seed=i)
        finally:
            core_decode.mergeable = real
        wall = time.perf_counter() - t
        gen = sum(sum(x.gen_mask) for x in trajs)
        name = "per-row" if per_row else "turn-synchronous re-prefill"
        print(f"  engine batch {batch} {name}: {len(trajs)} trajectories, {gen} tokens, {wall:.1f}s", flush=True)
        return {"wall": wall, "n": len(trajs), "gen": gen, "trajs": trajs, **eng.backend.stats, **eng.stats}

    def run_limit(trajs: list, r: int) -> dict:
        """The limit: the same rows decoding exactly the engine run's generated tokens per row (plain batched
        ``core.decode``, no tools, rows leave when done), plus one batched prefill of each row's injected ids."""
        prompts = [list(x.prompt_ids) for x in trajs]
        counts = [sum(x.gen_mask) for x in trajs]
        injected = [[i for i, g in zip(x.completion_ids, x.gen_mask) if not g] for x in trajs]
        gen = torch.Generator().manual_seed(r)
        t = time.perf_counter()
        core_decode.decode(model, prompts, Stop(tok, set()), SamplingParams(temperature=1.0), counts, generator=gen)
        t_dec = time.perf_counter() - t
        rows = [x for x in injected if x]
        if rows:
            ids, mask = left_pad(rows, pad_id(tok, model))
            forward(model, 1, input_ids=ids, attention_mask=mask, position_ids=positions(mask))
        wall = time.perf_counter() - t
        print(f"  limit: decode {sum(counts)} tokens {t_dec:.1f}s + prefill {sum(map(len, rows))} injected "
              f"{wall - t_dec:.1f}s = {wall:.1f}s", flush=True)
        return {"wall": wall, "n": len(trajs), "gen": sum(counts)}

    # interleaved (the CPU is shared: each repeat measures every variant back to back, ratios per repeat)
    single, per_row, limit, nokv = [], [], [], []
    for r in range(args.repeats):
        if args.single > 0:
            single.append(run_engine(qs[: args.single], 1))
        per_row.append(run_engine(qs, args.batch))
        limit.append(run_limit(per_row[-1]["trajs"], r))
        if not args.skip_nokv:
            nokv.append(run_engine(qs, args.batch, per_row=False))

    def med(runs: list, key: str) -> float:
        return statistics.median(r[key] for r in runs)

    def line(name: str, runs: list) -> str:
        w, n, g = med(runs, "wall"), med(runs, "n"), med(runs, "gen")
        return f"| {name} | {n:.0f} | {g:.0f} | {w:.1f} | {60 * n / w:.1f} | {g / w:.1f} |"

    print(f"\n## Rollout throughput ({args.model}, CPU, {torch.get_num_threads()} threads, max_turns={args.max_turns}, "
          f"max_new_tokens_per_turn={args.max_new}, sampled T=1, median of {args.repeats}, interleaved)\n")
    print("| run | trajectories | generated tokens | wall s | trajectories/min | gen tokens/s |")
    print("|---|---|---|---|---|---|")
    if single:
        print(line("engine, batch 1", single))
    print(line(f"engine, batch {args.batch}, per-row turn scheduling", per_row))
    print(line("limit: plain batched decode of the same tokens per row + one prefill of the injected ids", limit))
    if nokv:
        print(line(f"engine, batch {args.batch}, turn-synchronous, re-prefill every turn", nokv))
    ratios = [e["wall"] / lim["wall"] for e, lim in zip(per_row, limit)]
    print(f"\nper-row engine time / its limit, per repeat: {', '.join(f'{x:.2f}x' for x in ratios)} "
          f"(median {statistics.median(ratios):.2f}x; target <= 1.25x)")

    k = sorted(range(len(per_row)), key=lambda i: per_row[i]["wall"])[len(per_row) // 2]
    b, lim = per_row[k], limit[k]
    parts = (("prefill (first turn, then each rejoining row's new ids on its cache)", b["prefill_s"]),
             ("decode forwards", b["decode_s"]),
             ("sampling, stop checks, batch selection (scheduling)", b["step_s"]),
             ("merging rejoining rows into the batch (scheduling)", b["merge_s"]),
             ("KV save of rows whose turn ended", b["kv_save_s"]),
             ("retrieval (BM25, batched per decode step)", b["retrieve_s"]),
             ("serving without retrieval (parse, masks, inject)", b["callback_s"] - b["retrieve_s"]))
    other = b["wall"] - sum(v for _, v in parts)
    turns = sum(len(x.turns) for x in b["trajs"])
    pad = b["decode_pad_positions"] / max(1, b["decode_positions"])
    print(f"\n## Where the per-row batch-{args.batch} engine time goes (median run: {b['wall']:.1f}s vs limit "
          f"{lim['wall']:.1f}s = {b['wall'] / lim['wall']:.2f}x; {turns} model turns, {b['prefill_tokens']} prefill "
          f"tokens, {b['decode_steps']} decode steps, {int(b['retrieve_calls'])} retrieve calls)\n")
    print("| part | seconds | share of engine time |")
    print("|---|---|---|")
    for name, v in (*parts, ("other (rollout setup, finishing trajectories)", other)):
        print(f"| {name} | {v:.2f} | {100 * v / b['wall']:.1f}% |")
    print(f"\npadding: {100 * pad:.1f}% of the attention positions of decode forwards are left padding")
    stops = {}
    for x in b["trajs"]:
        stops[x.stop_reason] = stops.get(x.stop_reason, 0) + 1
    print(f"stop reasons (per-row run): {stops}; searches/trajectory "
          f"{sum(x.num_searches for x in b['trajs']) / len(b['trajs']):.2f}")


def host_table(args) -> None:
    from transformers import LlamaConfig, LlamaForCausalLM

    from hindsearch.core.decode import decode
    from hindsearch.core.sampling import SamplingParams, Stop, sample_tokens

    vocab, n_new = 49152, args.host_tokens
    batches = [int(b) for b in args.host_batches.split(",")]

    def llama(layers: int):
        torch.manual_seed(0)
        cfg = LlamaConfig(vocab_size=vocab, hidden_size=64, intermediate_size=128, num_hidden_layers=layers,
                          num_attention_heads=4, num_key_value_heads=2, pad_token_id=0, bos_token_id=1, eos_token_id=2)
        m = LlamaForCausalLM(cfg).eval()
        m.generation_config.eos_token_id = None  # every row runs its whole budget, in both loops
        return m

    models = {"2 layers": llama(2), "36 layers": llama(36)}
    stop = Stop(None, set())
    greedy, multi, inv = SamplingParams(greedy=True), SamplingParams(1.0), SamplingParams(1.0, draw="inverse_cdf")

    def timed_forwards(model):
        """``model.forward`` wrapped to add up its CPU time (the rest of a run is host work outside the forward)."""
        real, acc = model.forward, {"cpu": 0.0}

        def forward(*a, **k):
            t = time.process_time()
            try:
                return real(*a, **k)
            finally:
                acc["cpu"] += time.process_time() - t

        model.forward = forward
        return acc

    def ours(model, ctx, sp):
        fwd = timed_forwards(model)
        t = time.process_time()
        try:
            outs = decode(model, ctx, stop, sp, [n_new] * len(ctx), generator=torch.Generator().manual_seed(0), pad=0)
        finally:
            cpu = time.process_time() - t
            del model.forward
        return {"cpu": cpu, "per_step": cpu / n_new, "host": (cpu - fwd["cpu"]) / n_new, "ids": [o.ids for o in outs]}

    def generate(model, ctx):
        ids = torch.tensor(ctx)
        fwd = timed_forwards(model)
        t = time.process_time()
        try:
            with torch.no_grad():
                out = model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), max_new_tokens=n_new,
                                     min_new_tokens=n_new, do_sample=False, pad_token_id=0)
        finally:
            cpu = time.process_time() - t
            del model.forward
        return {"cpu": cpu, "per_step": cpu / n_new, "host": (cpu - fwd["cpu"]) / n_new,
                "ids": out[:, ids.shape[1]:].tolist()}

    def draw(b, sp):
        logits = torch.randn(b, vocab, generator=torch.Generator().manual_seed(b))
        g = torch.Generator().manual_seed(0)
        t = time.process_time()
        for _ in range(10):
            sample_tokens(logits, sp, g)
        return (time.process_time() - t) / 10

    res: dict = {}
    for r in range(args.repeats):
        for name, model in models.items():
            for b in batches:
                ctx = torch.randint(3, vocab, (b, 16), generator=torch.Generator().manual_seed(b)).tolist()
                runs = {"ours greedy": ours(model, ctx, greedy), "generate greedy": generate(model, ctx),
                        "ours multinomial": ours(model, ctx, multi), "ours inverse_cdf": ours(model, ctx, inv)}
                if name == "2 layers":
                    runs["draw multinomial"], runs["draw inverse_cdf"] = draw(b, multi), draw(b, inv)
                for k, v in runs.items():
                    res.setdefault((name, b, k), []).append(v)
                print(f"repeat {r} {name} batch {b}: ours {runs['ours greedy']['per_step'] * 1e3:.2f} ms/step, "
                      f"generate {runs['generate greedy']['per_step'] * 1e3:.2f} ms/step", flush=True)

    med = statistics.median
    print(f"\n## Decode host work on CPU (1 thread, vocabulary {vocab}, hidden 64, {n_new} new tokens, CPU time, "
          f"median of {args.repeats} interleaved repeats)\n")
    print("| model | batch | ours greedy ms/step | generate ms/step | ours / generate (median of per-repeat ratios) "
          "| greedy ids identical | host ms/step outside the forward: generate greedy | ours greedy | ours multinomial "
          "| ours inverse_cdf |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for name in models:
        for b in batches:
            o, g = res[(name, b, "ours greedy")], res[(name, b, "generate greedy")]
            same = all(x["ids"] == y["ids"] for x, y in zip(o, g))
            ratio = med(x["cpu"] / y["cpu"] for x, y in zip(o, g))
            hosts = [med(x["host"] for x in res[(name, b, k)]) * 1e3
                     for k in ("generate greedy", "ours greedy", "ours multinomial", "ours inverse_cdf")]
            print(f"| {name} | {b} | {med(x['per_step'] for x in o) * 1e3:.2f} | {med(x['per_step'] for x in g) * 1e3:.2f} "
                  f"| {ratio:.2f} | {'yes' if same else 'NO'} | " + " | ".join(f"{h:.2f}" for h in hosts) + " |")
    print(f"\n## One draw of sample_tokens on [batch, {vocab}] logits (T = 1, CPU ms, median)\n")
    print("| batch | multinomial | inverse_cdf | multinomial / inverse_cdf (median of per-repeat ratios) |")
    print("|---|---|---|---|")
    for b in batches:
        m, i = res[("2 layers", b, "draw multinomial")], res[("2 layers", b, "draw inverse_cdf")]
        print(f"| {b} | {med(m) * 1e3:.2f} | {med(i) * 1e3:.2f} | {med(x / y for x, y in zip(m, i)):.2f} |")


def evaluation(args, model, tok, retriever, splits) -> None:
    from hindsearch.agent.engine import RolloutEngine
    from hindsearch.config import RolloutConfig
    from hindsearch.eval import evaluate
    from hindsearch.retrieval.factory import ensure_index, load_index

    ecfg = RolloutConfig(max_turns=args.max_turns, max_new_tokens_per_turn=args.max_new, max_total_tokens=2048)
    if args.eval_per_split > 0 and not args.skip_world_eval:
        data = {f"world-{s}": recs[: args.eval_per_split] for s, recs in splits.items()}
        t = time.perf_counter()
        res = evaluate(RolloutEngine(model, tok, retriever, ecfg, topk=3), data, out_dir=Path(args.out) / "world",
                       batch_size=args.batch, progress=False)
        print(f"\n## Greedy eval, {args.model}, {args.eval_per_split} questions per world split ({time.perf_counter() - t:.0f}s)\n")
        print(res["table"])
        o = res["overall"]
        print(f"\nvalidity {100 * o['validity_rate']:.1f}%, answered {100 * o['answered_rate']:.1f}%, stop reasons {o['stop_reasons']}")
    if args.eval_per_split > 0 and args.mini:
        from hindsearch.data.qa import load_qa

        md = Path(args.mini)
        t = time.perf_counter()
        mret = load_index(ensure_index(md / "corpus.jsonl", Path(args.out) / "mini-index-bm25", kind="bm25", show_progress=False))
        print(f"\nmini index ready ({time.perf_counter() - t:.0f}s)")
        mdata = {p.stem: load_qa(p, limit=args.eval_per_split) for p in sorted(md.glob("*.jsonl")) if p.stem != "corpus"}
        t = time.perf_counter()
        res = evaluate(RolloutEngine(model, tok, mret, ecfg, topk=3), mdata, out_dir=Path(args.out) / "mini",
                       batch_size=args.batch, progress=False)
        print(f"\n## Greedy eval on mini benchmarks, {args.eval_per_split} questions each ({time.perf_counter() - t:.0f}s)\n")
        print(res["table"])


if __name__ == "__main__":
    main()
