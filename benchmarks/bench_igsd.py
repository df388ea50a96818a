"""IGSD prepare cost: the plain path (full-sequence forwards) vs the prefix-cached path, one run.

A fixed batch of failed two-search rollouts over the seeded world (real BM25 retrieval, real
information blocks) goes through ``run_igsd`` twice per repeat: ``prefix_cache=False`` (every matched
completion decoded from its whole context, every utility a full forward of
prompt + completion prefix + information block + answer) and ``prefix_cache=True`` (each rollout's
shared prefix computed once, suffixes scored against its KV cache). Prints the time split
(medians), the ratio and the largest difference in u / IG / delta / gate between the two paths.

    python benchmarks/bench_igsd.py [--model tiny-random|smollm2-135m] [--rollouts 4] [--positions 4]

CPU is shared: keep the defaults small.
"""

from __future__ import annotations

import argparse
import random
import statistics
import time
from pathlib import Path

import torch

PARTS = ("time_proposal", "time_completion", "time_retrieval", "time_scoring")


def make_rollouts(tok, retriever, records, topk: int) -> list:
    """Failed rollouts: think, search (the question), information, think, search (answer words), information, wrong answer."""
    from hindsearch.agent import protocol
    from hindsearch.records import Trajectory, Turn

    out = []
    for r in records:
        q2 = " ".join(r.golden_answers[0].split()[:2]) + " location"
        segs = [("<think> I need to look this up. </think>\n<search>", 0, 1), (f" {r.question}", 1, 1), (" </search>", 0, 1),
                (protocol.information_block(retriever.retrieve([r.question], topk)[0]), 0, 0),
                ("<think> Not there yet. </think>\n<search>", 0, 1), (f" {q2}", 1, 1), (" </search>", 0, 1),
                (protocol.information_block(retriever.retrieve([q2], topk)[0]), 0, 0), ("<answer> unknown </answer>", 0, 1)]
        ids, qm, gm = [], [], []
        for text, q, g in segs:
            t = tok(text, add_special_tokens=False)["input_ids"]
            ids, qm, gm = ids + t, qm + [q] * len(t), gm + [g] * len(t)
        turns = []
        s = 0
        while 1 in qm[s:]:  # one Turn per run of query tokens
            a = qm.index(1, s)
            e = a + next((k for k, x in enumerate(qm[a:]) if not x), len(qm) - a)
            turns.append(Turn("search", tok.decode(ids[a:e]).strip(), (0, e), (a, e)))
            s = e
        out.append(Trajectory(qid=r.id, question=r.question, golden_answers=r.golden_answers,
                              prompt_ids=protocol.encode_prompt(tok, r.question, None), completion_ids=ids, gen_mask=gm,
                              query_mask=qm, logprobs=[0.0] * len(ids), reward=0.0, answer="unknown", turns=turns))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="tiny-random", help="tiny-random (default) or smollm2-135m")
    ap.add_argument("--rollouts", type=int, default=4, help="failed rollouts in the batch")
    ap.add_argument("--positions", type=int, default=4, help="max_positions_per_rollout")
    ap.add_argument("--max-query-tokens", type=int, default=24)
    ap.add_argument("--topk", type=int, default=3)
    ap.add_argument("--repeats", type=int, default=1)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--world", default=".hindsearch/world")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)

    import json

    from hindsearch.config import ModelConfig
    from hindsearch.hindsight.methods.igsd import IGSDConfig
    from hindsearch.data.world import ensure_world
    from hindsearch.agent.hf_backend import HFBackend
    from hindsearch.hindsight.contract import AuxContext
    from hindsearch.hindsight.igsd import run_igsd
    from hindsearch.models import load_policy, load_tokenizer, tiny_random_model
    from hindsearch.records import QARecord
    from hindsearch.retrieval.factory import ensure_index, load_index

    world = Path(ensure_world(args.world, seed=0))
    retriever = load_index(ensure_index(world / "corpus.jsonl", world / "index-bm25", kind="bm25", show_progress=False))
    recs = [QARecord.from_dict(json.loads(x)) for x in (world / "dev.jsonl").read_text().splitlines() if x.strip()]
    if args.model == "tiny-random":
        tok = load_tokenizer("tiny-random")
        model = tiny_random_model(tok, seed=0)
    else:
        model, tok = load_policy(ModelConfig(name=args.model, device="cpu"))
    trajs = make_rollouts(tok, retriever, recs[: args.rollouts], args.topk)
    T = max(len(t.completion_ids) for t in trajs)
    cfg = IGSDConfig(max_positions_per_rollout=args.positions, max_query_tokens=args.max_query_tokens)
    print(f"{args.model}, CPU {torch.get_num_threads()} threads: {len(trajs)} failed rollouts, prompt+completion "
          f"{statistics.median(len(t.prompt_ids) + len(t.completion_ids) for t in trajs):.0f} tokens (median), "
          f"{args.positions} positions each, max_query_tokens {args.max_query_tokens}, topk {args.topk}")

    runs: dict[bool, list[dict]] = {False: [], True: []}
    recs_of: dict[bool, list] = {}
    for r in range(args.repeats):
        for pc in (False, True):
            t0 = time.perf_counter()
            ctx = AuxContext(policy=model, frozen=model, tokenizer=tok, retriever=retriever,
                             complete=HFBackend(model, tok), topk=args.topk)
            _, m, samples = run_igsd(trajs, T, ctx, cfg, rng=random.Random(r), prefix_cache=pc)
            m["total"] = time.perf_counter() - t0
            print(f"repeat {r} {'prefix-cached' if pc else 'plain'}: " + ", ".join(f"{k.replace('time_', '')} {m[k]:.2f}s"
                  for k in (*PARTS, "total")), flush=True)
            runs[pc].append(m)
            recs_of[pc] = [p for s in samples for p in s.get("igsd_pairs", [])]

    def med(pc: bool, key: str) -> float:
        return statistics.median(m[key] for m in runs[pc])

    print(f"\n## IGSD prepare, plain vs prefix-cached (median of {args.repeats})\n")
    print("| part | plain s | prefix-cached s | speed-up |")
    print("|---|---|---|---|")
    for key in (*PARTS, "total"):
        a, b = med(False, key), med(True, key)
        print(f"| {key.replace('time_', '')} | {a:.2f} | {b:.2f} | {a / max(b, 1e-9):.2f}x |")
    m = runs[True][0]
    print(f"\npositions verified {m['positions_verified']:.0f}, completions {m['completions']:.0f}, utility evals "
          f"{m['utility_evals']:.0f}, retrieval calls {m['retrieval_calls']:.0f}, cache hit rate {m['cache_hit_rate']:.2f}")
    a, b = recs_of[False], recs_of[True]
    same_q = sum((x["q_T"], x["q_S"]) == (y["q_T"], y["q_S"]) for x, y in zip(a, b))
    print(f"same matched queries in both paths: {same_q}/{len(a)}")
    for key in ("u_T", "u_S", "ig_T", "ig_S", "delta", "gate"):
        d = max((abs(x[key] - y[key]) for x, y in zip(a, b) if (x["q_T"], x["q_S"]) == (y["q_T"], y["q_S"])), default=0.0)
        print(f"max |{key} plain - cached| = {d:.2e}")


if __name__ == "__main__":
    main()
