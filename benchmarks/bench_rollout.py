"""Rollout throughput of the default model (SmolLM2-135M) on CPU, and a small greedy evaluation.

Measures, in one run:

1. the engine at batch 1 (questions one at a time) and batch B (all together): trajectories/min
   and generated tokens/s (sampled, temperature 1);
2. the limit the model sets: plain batched ``model.generate`` of the same number of tokens per
   row (B rows, no tool calls, min = max new tokens), and the engine's overhead over it, split
   into prefill (prompts, then only each turn's new tokens: the cross-turn KV cache), decode,
   KV saving, retrieval, injection and the rest (parsing, masks, bookkeeping); for comparison
   the old engine that re-reads every context at every turn (``--skip-nokv`` to leave it out).
   All variants run interleaved in each repeat and the overheads are per-repeat ratios;
3. greedy ``evaluate`` on the first N questions of each world split (and each mini benchmark
   found under ``--mini DIR``), with the EM table.

    python benchmarks/bench_rollout.py [--batch 16] [--eval-per-split 8] [--threads 2]

Numbers are medians over ``--repeats`` runs. CPU is shared: keep the defaults small.
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
    ap.add_argument("--skip-nokv", action="store_true", help="no comparison run of the old re-prefill engine")
    ap.add_argument("--skip-throughput", action="store_true", help="only run the evaluation part")
    ap.add_argument("--skip-world-eval", action="store_true", help="no world-split evaluation (e.g. mini only)")
    ap.add_argument("--world", default=".hindsearch/world")
    ap.add_argument("--out", default=".hindsearch/bench/rollout-eval")
    args = ap.parse_args()
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
    from hindsearch.agent.hf_backend import HFBackend, left_pad

    class NoKVBackend(HFBackend):
        supports_kv_store = False  # the old engine: every turn re-reads its whole context

    def run_engine(records: list, batch: int, kv: bool = True) -> dict:
        eng = RolloutEngine(model, tok, retriever, cfg, topk=3, backend=(HFBackend if kv else NoKVBackend)(model, tok))
        t = time.perf_counter()
        trajs = []
        for i in range(0, len(records), batch):
            trajs += eng.rollout(records[i : i + batch], seed=i)
        wall = time.perf_counter() - t
        gen = sum(sum(x.gen_mask) for x in trajs)
        print(f"  engine batch {batch}{'' if kv else ' no-kv'}: {len(trajs)} trajectories, {gen} tokens, {wall:.1f}s", flush=True)
        return {"wall": wall, "n": len(trajs), "gen": gen, "trajs": trajs, **eng.backend.stats, **eng.stats}

    eng = RolloutEngine(model, tok, retriever, cfg)
    ids, mask = left_pad([eng.prompt_ids(q.question) for q in qs], tok.pad_token_id, torch.device("cpu"))

    def run_plain(per_row: int, r: int) -> dict:
        """Plain batched generate: same rows, ``per_row`` tokens each (the engine run's mean), no tools."""
        torch.manual_seed(r)
        t = time.perf_counter()
        with torch.no_grad():
            model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=per_row, min_new_tokens=per_row,
                           do_sample=True, temperature=1.0, top_p=1.0, top_k=0, pad_token_id=tok.pad_token_id)
        wall = time.perf_counter() - t
        print(f"  plain generate: {len(qs)} x {per_row} tokens, {wall:.1f}s", flush=True)
        return {"wall": wall, "n": len(qs), "gen": per_row * len(qs)}

    # interleaved (the CPU is shared: each repeat measures every variant back to back, ratios per repeat)
    single, batched, nokv, plain, plain_nokv = [], [], [], [], []
    for r in range(args.repeats):
        if args.single > 0:
            single.append(run_engine(qs[: args.single], 1))
        batched.append(run_engine(qs, args.batch))
        plain.append(run_plain(max(1, round(batched[-1]["gen"] / len(qs))), r))
        if not args.skip_nokv:
            nokv.append(run_engine(qs, args.batch, kv=False))
            plain_nokv.append(run_plain(max(1, round(nokv[-1]["gen"] / len(qs))), r))

    def med(runs: list, key: str) -> float:
        return statistics.median(r[key] for r in runs)

    def tps(run: dict) -> float:
        return run["gen"] / run["wall"]

    def line(name: str, runs: list) -> str:
        w, n, g = med(runs, "wall"), med(runs, "n"), med(runs, "gen")
        return f"| {name} | {n:.0f} | {g:.0f} | {w:.1f} | {60 * n / w:.1f} | {g / w:.1f} |"

    print(f"\n## Rollout throughput ({args.model}, CPU, {torch.get_num_threads()} threads, max_turns={args.max_turns}, "
          f"max_new_tokens_per_turn={args.max_new}, sampled T=1, median of {args.repeats}, interleaved)\n")
    print("| run | trajectories | generated tokens | wall s | trajectories/min | gen tokens/s |")
    print("|---|---|---|---|---|---|")
    if single:
        print(line("engine, batch 1", single))
    print(line(f"engine, batch {args.batch} (cross-turn KV cache)", batched))
    print(line(f"plain generate, batch {args.batch}, same tok/row, no tools", plain))
    if nokv:
        print(line(f"engine, batch {args.batch}, re-prefill every turn (old)", nokv))
        print(line(f"plain generate for the old run's tok/row", plain_nokv))
    if single:
        print(f"\nbatching gain (engine tokens/s, batch {args.batch} / batch 1): {med(batched, 'gen') / med(batched, 'wall') / (med(single, 'gen') / med(single, 'wall')):.2f}x")
    over = [100 * (tps(p) / tps(b) - 1) for b, p in zip(batched, plain)]
    print(f"engine overhead vs plain generate (time per generated token, per-repeat ratios {', '.join(f'{o:.1f}%' for o in over)}): "
          f"median {statistics.median(over):.1f}%")
    if nokv:
        over = [100 * (tps(p) / tps(b) - 1) for b, p in zip(nokv, plain_nokv)]
        print(f"old engine (re-prefill) overhead, same runs: median {statistics.median(over):.1f}% "
              f"({', '.join(f'{o:.1f}%' for o in over)})")

    b = sorted(batched, key=lambda x: x["wall"])[len(batched) // 2]
    other = b["wall"] - b["prefill_s"] - b["decode_s"] - b["kv_save_s"] - b["retrieve_s"] - b["inject_s"]
    turns = sum(len(x.turns) for x in b["trajs"])
    ctx = sum(len(x.prompt_ids) + len(x.completion_ids) for x in b["trajs"])
    print(f"\n## Where the batch-{args.batch} engine time goes (median run: {turns} model turns, "
          f"{b['prefill_tokens']} prefill tokens for {ctx} context tokens, {b['decode_steps']} decode steps)\n")
    print("| part | seconds | share |")
    print("|---|---|---|")
    for k, v in (("prefill (prompts, then only the new tokens of each turn)", b["prefill_s"]),
                 ("decode (cached steps, incl. stop-string checks)", b["decode_s"]),
                 ("KV save (copy finished rows' caches)", b["kv_save_s"]),
                 ("retrieval (BM25, batched)", b["retrieve_s"]), ("injection (tokenize observations)", b["inject_s"]),
                 ("other (parse, masks, bookkeeping)", other)):
        print(f"| {k} | {v:.2f} | {100 * v / b['wall']:.1f}% |")
    stops = {}
    for x in b["trajs"]:
        stops[x.stop_reason] = stops.get(x.stop_reason, 0) + 1
    print(f"\nstop reasons (batch run): {stops}; searches/trajectory "
          f"{sum(x.num_searches for x in b['trajs']) / len(b['trajs']):.2f}")


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
