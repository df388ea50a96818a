"""Protocol warm-up of the default model: dev EM and validity before and after SFT on scripted demos.

Builds (cached) the fictional world and its BM25 index, evaluates the policy greedily on a small
dev subset (half one-hop, half two-hop), runs the warm-up (scripted demonstrations over the
train split -> SFT with the loss on gen_mask tokens, through transformers' Trainer), evaluates again
and prints a table: EM (overall / by hop count), validity rate (a well-formed search or answer),
searches per question, answered rate, and the time and peak resident memory of each stage. Also prints the scripted searcher's own
EM per hop (the ceiling the demonstrations teach) and the SFT loss curve.

    python benchmarks/bench_warmup.py --config configs/tiny-cpu.toml --dev 16 \
        --set warmup.num_demos=32 --set warmup.epochs=1 --set warmup.batch_size=4 --set warmup.lr=2e-4
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch


def read_split(path: Path) -> list:
    """A world split (one ``QARecord.to_dict()`` per line)."""
    from hindsearch.records import QARecord

    return [QARecord.from_dict(json.loads(line)) for line in path.read_text().splitlines() if line.strip()]


def pick_dev(records: list, n: int) -> list:
    """``n`` dev records, alternating one-hop and two-hop where possible."""
    one = [r for r in records if r.hops == 1]
    two = [r for r in records if r.hops == 2]
    out = [r for pair in zip(one, two) for r in pair][:n]
    return out if len(out) == n else records[:n]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--config", default="configs/tiny-cpu.toml", help="preset (rollout, retrieval, warm-up settings)")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="config override, e.g. warmup.lr=2e-4")
    ap.add_argument("--dev", type=int, default=16, help="dev questions evaluated before and after")
    ap.add_argument("--train-layers", type=int, default=None, help="train only the top N layers (default: all)")
    ap.add_argument("--entities", type=int, default=None, help="world size (default: generator default)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--skip-base", action="store_true", help="do not evaluate the base model")
    ap.add_argument("--work", default=".hindsearch/bench_warmup", help="world/index cache and outputs")
    ap.add_argument("--no-malloc-tune", action="store_true", help="leave glibc's allocator at its defaults")
    args = ap.parse_args()
    from hindsearch.memory import StageMemory, tune_malloc

    if not args.no_malloc_tune:
        tune_malloc()
    torch.set_num_threads(args.threads)
    mem = StageMemory()

    from hindsearch.agent.engine import RolloutEngine
    from hindsearch.config import Config
    from hindsearch.data.world import ensure_world
    from hindsearch.eval import evaluate
    from hindsearch.models import load_policy
    from hindsearch.retrieval.factory import ensure_index, load_retriever
    from hindsearch.train.warmup import build_demos, sft

    work = Path(args.work)
    cfg = Config.load(args.config if Path(args.config).exists() else None, ["model.device='cpu'", *args.set])
    times: dict[str, float] = {}
    t = time.time()
    world = Path(ensure_world(work / f"world-{args.entities or 'default'}", seed=0, n_entities=args.entities))
    index = ensure_index(world / "corpus.jsonl", world / "index-bm25", kind="bm25", show_progress=False)
    retriever = load_retriever(cfg.retrieval, index)
    train, dev = read_split(world / "train.jsonl"), pick_dev(read_split(world / "dev.jsonl"), args.dev)
    times["world+index"] = time.time() - t
    t = time.time()
    with mem.stage("load model"):
        model, tok = load_policy(cfg.model)
    times["load model"] = time.time() - t
    engine = RolloutEngine(model, tok, retriever, cfg.rollout, topk=cfg.retrieval.topk)
    rows = []

    def run_eval(name: str) -> None:
        t0 = time.time()
        out = work / "eval" / f"{name}-{time.strftime('%Y%m%d-%H%M%S')}"
        with mem.stage(f"eval {name}"):
            res = evaluate(engine, {"dev": dev}, out_dir=out, batch_size=min(16, len(dev)), progress=False)["overall"]
        for line in (out / "trajectories.jsonl").read_text().splitlines()[:3]:
            d = json.loads(line)
            print(f"  [{name}] gold {d['golden_answers']} answer {d['answer']!r} queries {d['queries']}", flush=True)
        times[f"eval {name}"] = time.time() - t0
        rows.append((name, res))
        print(f"[{name}] EM {res['em']:.3f} by hops {res.get('em_by_hops')} validity {res['validity_rate']:.2f} "
              f"searches/q {res['searches_per_question']:.2f} ({times[f'eval {name}']:.0f}s)", flush=True)

    if not args.skip_base:
        run_eval("base")
    t = time.time()
    demos, info = build_demos(cfg, tok, retriever, train)
    times["demos"] = time.time() - t
    with mem.stage("sft"):
        curve = sft(model, tok, demos, cfg.warmup.epochs, cfg.warmup.lr, cfg.warmup.batch_size,
                    train_layers=args.train_layers, progress=False, micro_batch_size=cfg.warmup.micro_batch_size)
    times["sft"] = curve["seconds"]
    print(f"[sft] {curve['steps']} steps in {curve['seconds']:.0f}s, loss {curve['loss'][0]:.3f} -> {curve['loss'][-1]:.3f}",
          flush=True)
    run_eval("warm-up")

    w, ro = cfg.warmup, cfg.rollout
    print(f"\nmodel {cfg.model.name}, {args.config} {' '.join(args.set)}, world {world.name}, dev {len(dev)} questions, "
          f"greedy; threads {args.threads}; topk {cfg.retrieval.topk}, max_turns {ro.max_turns}, "
          f"max_new_tokens_per_turn {ro.max_new_tokens_per_turn}, max_total_tokens {ro.max_total_tokens}")
    print(f"warm-up: {info['num_demos']} demos (p_bridge {w.p_bridge}, p_feedback {w.p_feedback}, truncated "
          f"{info['truncated']}, mean {info['mean_tokens']:.0f} tokens, {info['mean_gen_tokens']:.0f} generated), "
          f"epochs {w.epochs}, lr {w.lr}, batch {w.batch_size} (micro {w.micro_batch_size or w.batch_size}), train_layers {args.train_layers or 'all'}, "
          f"{curve['steps']} steps")
    c = info["scripted_ceiling"]
    print(f"scripted ceiling on its demos: EM {c['em']:.3f} by hops {json.dumps({k: round(v, 3) for k, v in c['em_by_hops'].items()})}, "
          f"searches/q {c['searches_per_question']:.2f}")
    lc = curve["loss"]
    print("SFT loss: " + " ".join(f"{x:.2f}" for x in lc[:: max(1, len(lc) // 12)]) + f" (last {lc[-1]:.2f})")
    print(f"\n| {'stage':8} | {'EM':>5} | {'EM 1-hop':>8} | {'EM 2-hop':>8} | {'valid':>5} | {'answered':>8} | {'search/q':>8} | stop reasons")
    print("|" + "---|" * 8)
    for name, r in rows:
        bh = r.get("em_by_hops", {})
        print(f"| {name:8} | {r['em']:5.3f} | {bh.get('1', 0):8.3f} | {bh.get('2', 0):8.3f} | {r['validity_rate']:5.2f} | "
              f"{r['answered_rate']:8.2f} | {r['searches_per_question']:8.2f} | {r['stop_reasons']}")
    print("\n| stage | seconds | peak RSS MiB |\n|---|---|---|")
    for k, v in times.items():
        peak = mem.stages.get(k, {}).get("peak_rss_mb")
        print(f"| {k} | {v:.1f} | {'-' if peak is None else f'{peak:.0f}'} |")
    print(f"process peak RSS (VmHWM): {mem.summary()['peak_rss_mb']:.0f} MiB")


if __name__ == "__main__":
    main()
