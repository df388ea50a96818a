"""Protocol warm-up: scripted demonstrations (real BM25 retrieval), exact masks, SFT, cache."""

from __future__ import annotations

import json
import random

import pytest
import torch

from hindsearch.agent import protocol
from hindsearch.config import Config
from hindsearch.records import Passage, QARecord, Trajectory, make_contents
from hindsearch.answers import exact_match
from hindsearch.train.scripted import ScriptedSearcher, find_in_docs, scripted_ceiling
from hindsearch.train.demos import load_demos, tokenize_demo
from hindsearch.train.warmup import collate, ensure_warmup, sft, sft_loss

SYL = ["va", "ro", "kes", "tel", "dun", "mer", "zel", "os", "trik", "bal", "lor", "quen", "dri", "sa", "mon", "fe"]


def _name(rng: random.Random, n: int) -> str:
    return "".join(rng.choice(SYL) for _ in range(n)).capitalize()


def small_world(seed: int = 0) -> tuple[list[Passage], list[QARecord]]:
    """A hand-made fictional world: people born in cities, cities located in countries."""
    rng = random.Random(seed)
    countries = sorted({_name(rng, 3) for _ in range(4)})
    cities = {c: rng.choice(countries) for c in sorted({_name(rng, 2) + "ton" for _ in range(8)})}
    people = {f"{_name(rng, 2)} {_name(rng, 3)}": rng.choice(sorted(cities)) for _ in range(12)}
    passages = [Passage(f"c{i}", make_contents(c, f"{c} is a country. Its people farm and trade.")) for i, c in enumerate(countries)]
    passages += [Passage(f"t{i}", make_contents(t, f"{t} is a city located in {k}. It has a river and a market."))
                 for i, (t, k) in enumerate(cities.items())]
    passages += [Passage(f"p{i}", make_contents(p, f"{p} is a painter. {p.split()[1]} was born in {t} and painted ships."))
                 for i, (p, t) in enumerate(people.items())]
    recs = []
    for i, (p, t) in enumerate(people.items()):
        recs.append(QARecord(f"q1-{i}", f"Where was {p} born?", [t], "world", 1, [p], {"relation": "born_in"}))
        recs.append(QARecord(f"q2-{i}", f"In which country is the city where {p} was born?", [cities[t]], "world", 2,
                             [p, t], {"relation": "born_in/located_in", "bridge": t,
                                      "hop_questions": [f"Where was {p} born?", f"In which country is {t}?"]}))
    recs.append(QARecord("q-missing", "Who founded Nowhereville?", ["Zzyzx Qwerty"], "world", 1, [], {}))
    return passages, recs


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    from hindsearch.retrieval.factory import build_index, load_index

    passages, recs = small_world()
    d = tmp_path_factory.mktemp("idx") / "bm25"
    build_index(passages, d, kind="bm25", show_progress=False)
    return passages, recs, load_index(d)


def check_demo(t: Trajectory, retriever, k: int = 3) -> None:
    """A demonstration is well-formed protocol text whose blocks are exactly what the retriever returns."""
    segs = t.extra["segments"]
    assert "".join(s for s, _ in segs) == t.completion_text
    gens = [s for s, g in segs if g]
    injected = [s for s, g in segs if not g]
    for s in gens:
        assert protocol.parse_action(s)[0] is not None, s
        # a turn ends exactly at its (first) stop string
        assert min(s.find(x) + len(x) for x in protocol.STOP_STRINGS if x in s) == len(s), s
    assert protocol.parse_action(gens[-1]) == ("answer", t.answer)
    assert protocol.extract_answer(t.completion_text) == t.answer
    assert len(injected) == t.num_searches == len(gens) - 1 >= 1
    for q, block in zip(t.queries, injected):
        assert block == protocol.information_block(retriever.retrieve([q], k)[0])
    assert t.em == exact_match(t.answer, t.golden_answers)


def test_demos_well_formed_and_blocks_are_real_retrieval(world):
    _, recs, retriever = world
    for t in ScriptedSearcher(retriever, topk=3, p_bridge=0.5, seed=1).demos(recs):
        check_demo(t, retriever)


@pytest.fixture(scope="module")
def gen_world(tmp_path_factory):
    from hindsearch.data.world import generate_world
    from hindsearch.retrieval.factory import build_index, load_index

    w = generate_world(0, n_entities=300)
    d = tmp_path_factory.mktemp("gw") / "bm25"
    build_index(w.passages, d, kind="bm25", show_progress=False)
    return w, load_index(d)


def test_scripted_ceiling_on_generated_world_leaves_two_hop_headroom(gen_world):
    w, retriever = gen_world
    train = w.splits["train"][:120]
    for t in ScriptedSearcher(retriever, topk=2, p_bridge=0.5, p_feedback=0.2).demos(train[:40]):
        check_demo(t, retriever, k=2)
    c0, c5, c1 = (scripted_ceiling(train, retriever, p_bridge=p) for p in (0.0, 0.5, 1.0))
    assert c5["n_by_hops"]["1"] + c5["n_by_hops"]["2"] == len(train)
    assert c5["em_by_hops"]["1"] >= 0.8
    assert c0["em_by_hops"]["2"] < c5["em_by_hops"]["2"] < c1["em_by_hops"]["2"]
    assert c5["em_by_hops"]["2"] < c5["em_by_hops"]["1"]
    assert c0["searches_per_question"] == 1.0 < c5["searches_per_question"]


def test_answers_only_from_retrieved_text(world):
    passages, recs, retriever = world
    demos = ScriptedSearcher(retriever, topk=3, p_bridge=1.0).demos(recs)
    for t in demos:
        read = [Passage(i, make_contents(ti, sn)) for turn in t.turns for i, ti, sn in
                zip(turn.doc_ids, turn.doc_titles, turn.doc_snippets)]
        seen = "".join(s for s, g in t.extra["segments"] if not g)
        if any(turn.doc_ids for turn in t.turns):
            assert t.answer.lower() in seen.lower(), (t.question, t.answer)
        else:
            assert t.answer == "unknown"
        if t.em:
            assert find_in_docs(t.golden_answers, read) is not None
    missing = next(t for t in demos if t.qid == "q-missing")
    assert missing.em == 0.0 and "Zzyzx" not in missing.completion_text


def test_p_bridge_controls_two_hop_headroom(world):
    _, recs, retriever = world
    two = [r for r in recs if r.hops == 2]
    full = ScriptedSearcher(retriever, p_bridge=1.0).demos(two)
    none = ScriptedSearcher(retriever, p_bridge=0.0).demos(two)
    assert all(t.num_searches >= 2 for t in full) and all(t.num_searches == 1 for t in none)
    assert all(r.metadata["bridge"] in t.queries[-1] for r, t in zip(two, full))
    c1, c0 = scripted_ceiling(recs, retriever, p_bridge=1.0), scripted_ceiling(recs, retriever, p_bridge=0.0)
    assert set(c1["em_by_hops"]) == {"1", "2"} and c1["n_by_hops"]["2"] == len(two)
    assert c1["em_by_hops"]["2"] > c0["em_by_hops"]["2"]
    assert c0["em_by_hops"]["1"] > c0["em_by_hops"]["2"]
    one_max = ScriptedSearcher(retriever, p_bridge=1.0, max_turns=1).demos(two)
    assert all(t.num_searches == 1 for t in one_max)


def test_feedback_demos_carry_and_follow_critique(world, tok):
    _, recs, retriever = world
    two = [r for r in recs if r.hops == 2][:4]
    demos = ScriptedSearcher(retriever, p_bridge=0.0, p_feedback=1.0).demos(two)
    for r, t in zip(two, demos):
        assert t.extra["hint"].startswith("Feedback on a previous attempt:") and r.metadata["bridge"] in t.extra["hint"]
        assert t.num_searches >= 2
        ids = tokenize_demo(tok, t).prompt_ids
        assert tok.decode(ids) == protocol.make_prompt(tok, t.question, t.extra["hint"])


def test_tokenisation_masks_exact_and_match_rollout_engine(world, tok):
    from hindsearch.agent.engine import RolloutEngine
    from hindsearch.config import RolloutConfig

    _, recs, retriever = world
    engine = RolloutEngine(None, tok, retriever, RolloutConfig(), topk=3)
    for t in ScriptedSearcher(retriever, p_bridge=1.0).demos(recs[:6]):
        d = tokenize_demo(tok, t)
        assert d.prompt_ids == engine.prompt_ids(t.question)
        n = len(d.completion_ids)
        assert len(d.gen_mask) == len(d.query_mask) == len(d.logprobs) == n
        assert tok.decode(d.completion_ids) == t.completion_text
        for turn, (text, gen) in zip(d.turns, [(s, g) for s, g in t.extra["segments"] if g]):
            a, b = turn.gen_span
            assert tok.decode(d.completion_ids[a:b]) == text and all(d.gen_mask[a:b])
            a, b = turn.inject_span
            if turn.action == "search":
                block = protocol.information_block(retriever.retrieve([turn.content], 3)[0])
                assert d.completion_ids[a:b] == engine.encode_text(block)
                assert tok.decode(d.completion_ids[a:b]) == block and not any(d.gen_mask[a:b])
                q = [i for i, m in zip(d.completion_ids, d.query_mask) if m]
                assert turn.content in tok.decode(d.completion_ids[slice(*turn.query_span)])
                assert sum(d.query_mask[slice(*turn.query_span)]) == turn.query_span[1] - turn.query_span[0]
                assert q
        # every gen_mask=0 run decodes to exactly one injected block
        runs, cur = [], []
        for i, m in zip(d.completion_ids, d.gen_mask):
            if m == 0:
                cur.append(i)
            elif cur:
                runs.append(cur)
                cur = []
        runs += [cur] if cur else []
        assert [tok.decode(r) for r in runs] == [s for s, g in t.extra["segments"] if not g]


def test_truncation_to_budget(world, tok):
    _, recs, retriever = world
    t = ScriptedSearcher(retriever, p_bridge=1.0).demo(recs[1])
    full = tokenize_demo(tok, t)
    budget = len(full.prompt_ids) + 20
    cut = tokenize_demo(tok, t, max_total_tokens=budget)
    assert cut.stop_reason == "length" and len(cut.prompt_ids) + len(cut.completion_ids) == budget
    assert cut.completion_ids == full.completion_ids[:20] and cut.gen_mask == full.gen_mask[:20]


def test_labels_only_on_generated_tokens(world, tok):
    _, recs, retriever = world
    demos = [tokenize_demo(tok, t) for t in ScriptedSearcher(retriever, p_bridge=1.0).demos(recs[:4])]
    ids, att, lab = collate(demos, tok.pad_token_id)
    for b, d in enumerate(demos):
        p, n = len(d.prompt_ids), len(d.prompt_ids) + len(d.completion_ids)
        assert (lab[b, :p] == -100).all() and (lab[b, n:] == -100).all() and (att[b, n:] == 0).all()
        gm = torch.tensor(d.gen_mask, dtype=torch.bool)
        assert torch.equal(lab[b, p:n][gm], torch.tensor(d.completion_ids)[gm])
        assert (lab[b, p:n][~gm] == -100).all() and (~gm).any()


def test_sft_loss_equals_hf_masked_loss_and_ignores_injected_tokens(world, tok, model):
    _, recs, retriever = world
    demos = [tokenize_demo(tok, t) for t in ScriptedSearcher(retriever, p_bridge=1.0).demos(recs[:3])]
    ids, att, lab = collate(demos, tok.pad_token_id)
    with torch.no_grad():
        ours = sft_loss(model, ids, att, lab)
        ref = model(input_ids=ids, attention_mask=att, labels=lab).loss
    assert torch.allclose(ours, ref, atol=1e-5)
    # masking matters: with injected tokens as targets too, the loss differs
    full = ids.clone()
    full[att == 0] = -100
    for b_, d in enumerate(demos):
        full[b_, : len(d.prompt_ids)] = -100
    with torch.no_grad():
        assert (full != -100).sum() > (lab != -100).sum()
        assert not torch.allclose(sft_loss(model, ids, att, full), ours)


def test_few_sft_steps_lower_the_loss(world, tok):
    from hindsearch.models import tiny_random_model

    _, recs, retriever = world
    model = tiny_random_model(tok, seed=0)
    demos = [tokenize_demo(tok, t) for t in ScriptedSearcher(retriever, p_bridge=1.0).demos(recs[:4])]
    ids, att, lab = collate(demos, tok.pad_token_id)
    with torch.no_grad():
        before = float(sft_loss(model, ids, att, lab))
    out = sft(model, tok, demos, epochs=6, lr=3e-3, batch_size=2, progress=False)
    with torch.no_grad():
        after = float(sft_loss(model, ids, att, lab))
    assert out["steps"] == 12 and len(out["loss"]) == 12 and out["tokens_trained"] > 0
    assert after < before - 1.0, (before, after)
    assert not model.training


def test_micro_batches_give_the_same_training_and_trainer_metrics(world, tok, tmp_path):
    """warmup.micro_batch_size splits each batch into forward/backward passes whose gradients add up to the
    batch's token mean: the weights after training match one pass per batch (float summation order only), and
    the Trainer writes one metrics row per step with the step's loss."""
    import copy

    from hindsearch.models import tiny_random_model

    _, recs, retriever = world
    demos = [tokenize_demo(tok, t) for t in ScriptedSearcher(retriever, p_bridge=1.0).demos(recs[:6])]
    whole, split = tiny_random_model(tok, seed=0), tiny_random_model(tok, seed=0)
    untouched = copy.deepcopy(whole)
    a = sft(whole, tok, demos, epochs=2, lr=3e-3, batch_size=3, progress=False)
    b = sft(split, tok, demos, epochs=2, lr=3e-3, batch_size=3, progress=False, micro_batch_size=1,
            metrics_path=tmp_path / "metrics.jsonl")
    assert a["steps"] == b["steps"] == 4 and a["tokens_trained"] == b["tokens_trained"]
    assert a["loss"] == pytest.approx(b["loss"], rel=1e-5)
    moved = max(float((p - q).abs().max()) for p, q in zip(whole.parameters(), untouched.parameters()))
    diff = max(float((p - q).abs().max()) for p, q in zip(whole.parameters(), split.parameters()))
    assert moved > 1e-3 and diff < 1e-3 * moved, (moved, diff)  # Adam rescales tiny gradient differences
    rows = [json.loads(x) for x in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2, 3, 4] and [r["loss"] for r in rows] == b["loss"]
    assert all(r["lr"] > 0 and r["grad_norm"] > 0 for r in rows)


def test_checkpointed_warmup_trains_the_same_weights_and_keeps_the_cache_key(world, tok, tmp_path):
    """warmup.gradient_checkpointing recomputes every N-th layer in the backward: the same weights as without it,
    the layers are checkpointed only while SFT runs, and the warm-up cache key does not change (same weights)."""
    from hindsearch.models import tiny_random_model
    from hindsearch.train.warmup import warmup_key

    _, recs, retriever = world
    demos = [tokenize_demo(tok, t) for t in ScriptedSearcher(retriever, p_bridge=1.0).demos(recs[:4])]
    plain, ckpt = (tiny_random_model(tok, seed=0, num_hidden_layers=4) for _ in range(2))
    seen: list[list[bool]] = []
    hook = ckpt.model.layers[0].register_forward_hook(
        lambda *_: seen.append([bool(getattr(x, "gradient_checkpointing", False)) for x in ckpt.model.layers]))
    a = sft(plain, tok, demos, epochs=1, lr=3e-3, batch_size=2, progress=False, micro_batch_size=1)
    b = sft(ckpt, tok, demos, epochs=1, lr=3e-3, batch_size=2, progress=False, micro_batch_size=1,
            checkpoint_every=2)
    hook.remove()
    assert seen and all(s == [True, False, True, False] for s in seen), seen[:2]
    assert not any(getattr(x, "gradient_checkpointing", False) for x in ckpt.model.layers)  # off again after SFT
    assert a["loss"] == pytest.approx(b["loss"], rel=1e-6)
    for (n, p), q in zip(plain.named_parameters(), ckpt.parameters()):
        assert torch.allclose(p, q, atol=1e-6), n
    base = ["model.name='tiny-random'", "warmup.num_demos=4"]
    on = base + ["warmup.gradient_checkpointing=true", "warmup.checkpoint_every_n_layers=2"]
    assert warmup_key(Config.load(None, base), recs) == warmup_key(Config.load(None, on), recs)
    assert warmup_key(Config.load(None, base), recs) != warmup_key(Config.load(None, base + ["warmup.lr=1e-3"]), recs)


def test_load_demos_roundtrip_and_errors(world, tok, tmp_path):
    _, recs, retriever = world
    texts = ScriptedSearcher(retriever, p_bridge=1.0).demos(recs[:4])
    f = tmp_path / "traj.jsonl"
    rows = []
    for t in texts:
        d = t.to_dict()
        d["extra"] = {}  # a rollout file has no segments: they are re-derived from the text
        rows.append(json.dumps(d))
    bad = json.loads(rows[0])
    bad["completion_text"] = "<think> no answer here </think>"
    f.write_text("\n".join(rows + [json.dumps(bad)]) + "\n")
    loaded, skipped = load_demos(f)
    assert skipped == 1 and len(loaded) == 4
    for t, l in zip(texts, loaded):
        assert protocol.segments_from_text(l.completion_text) == [tuple(s) for s in t.extra["segments"]]
        a, b = tokenize_demo(tok, t), tokenize_demo(tok, l)
        assert a.completion_ids == b.completion_ids and a.gen_mask == b.gen_mask
    f.write_text(rows[0] + "\n{not json\n")
    with pytest.raises(ValueError, match=r"traj\.jsonl:2"):
        load_demos(f)
    notice = "<think> hmm </think> oops" + protocol.INVALID_NOTICE + "<answer> x </answer>"
    assert protocol.segments_from_text(notice) == [("<think> hmm </think> oops", True), (protocol.INVALID_NOTICE, False),
                                          ("<answer> x </answer>", True)]


def test_ensure_warmup_is_cached(world, tok, tmp_path):
    from hindsearch.models import tiny_random_model

    _, recs, retriever = world
    cfg = Config.load(None, ["model.name='tiny-random'", "warmup.num_demos=6", "warmup.epochs=1",
                             "warmup.batch_size=3", "warmup.lr=1e-3", "warmup.p_feedback=0.5"])
    model = tiny_random_model(tok, seed=0)
    w0 = model.lm_head.weight.detach().clone()
    path = ensure_warmup(cfg, model, tok, retriever, recs, tmp_path, progress=False)
    info = json.loads((path / "warmup.json").read_text())
    assert info["num_demos"] == 6 and info["sft"]["steps"] == 2 and len(info["sft"]["loss"]) == 2
    assert set(info["scripted_ceiling"]["em_by_hops"]) <= {"1", "2"}
    assert (path / "config.json").exists() and (path / "tokenizer_config.json").exists()
    assert not torch.equal(w0, model.lm_head.weight)
    mtime = (path / "warmup.json").stat().st_mtime_ns
    # second call: cache hit, nothing is trained (the model is not even touched)
    assert ensure_warmup(cfg, None, tok, retriever, recs, tmp_path) == path
    assert (path / "warmup.json").stat().st_mtime_ns == mtime
    cfg.warmup.lr = 2e-3
    assert ensure_warmup(cfg, tiny_random_model(tok), tok, retriever, recs, tmp_path, progress=False) != path
    from transformers import AutoModelForCausalLM

    re = AutoModelForCausalLM.from_pretrained(path)
    assert torch.allclose(re.lm_head.weight, model.lm_head.weight)


def test_sft_cli_scripted_then_from_a_trajectories_file(tmp_path):
    import argparse

    from hindsearch.cli.train import register

    parser = argparse.ArgumentParser()
    register(parser.add_subparsers())
    common = ["--set", "model.name='tiny-random'", "--set", "warmup.epochs=1", "--set", "warmup.batch_size=2",
              "--set", "warmup.lr=1e-3"]
    args = parser.parse_args(["sft", *common, "--set", f"data.world_dir='{tmp_path / 'world'}'",
                              "--set", "data.world_entities=300", "--set", "warmup.num_demos=4",
                              "--out", str(tmp_path / "a")])
    assert args.func(args) == 0
    info = json.loads((tmp_path / "a" / "warmup.json").read_text())
    assert info["source"] == "scripted" and info["num_demos"] == 4 and info["sft"]["steps"] == 2
    assert (tmp_path / "a" / "config.json").exists()
    args = parser.parse_args(["sft", *common, "--demos", str(tmp_path / "a" / "demos.jsonl"), "--out", str(tmp_path / "b")])
    assert args.func(args) == 0
    info_b = json.loads((tmp_path / "b" / "warmup.json").read_text())
    assert info_b["num_demos"] == 4 and info_b["demo_em"]["em"] == info["scripted_ceiling"]["em"]
    args = parser.parse_args(["sft", *common, "--demos", str(tmp_path / "missing.jsonl"), "--out", str(tmp_path / "c")])
    with pytest.raises(FileNotFoundError, match="missing.jsonl"):
        args.func(args)


def test_warmup_key_changes_when_a_local_model_folder_is_rebuilt(tmp_path):
    """The same model path with other weights (a rebuilt micro model) must not hit the old warm-up."""
    import os

    from hindsearch.config import Config
    from hindsearch.train.warmup import warmup_key

    d = tmp_path / "model"
    d.mkdir()
    w = d / "model.safetensors"
    w.write_bytes(b"a" * 8)
    os.utime(w, ns=(1_000_000_000, 1_000_000_000))
    cfg = Config.load(None, [f'model.name="{d.as_posix()}"'])
    k1 = warmup_key(cfg, [])
    assert warmup_key(cfg, []) == k1  # unchanged folder: cache hit
    w.write_bytes(b"b" * 8)  # same size, rewritten later
    os.utime(w, ns=(2_000_000_000, 2_000_000_000))
    k2 = warmup_key(cfg, [])
    assert k2 != k1
    w.write_bytes(b"b" * 9)
    os.utime(w, ns=(2_000_000_000, 2_000_000_000))
    assert warmup_key(cfg, []) not in (k1, k2)
