"""The micro model (``recipes/micro/build.py``): BPE trained on the world, protocol tags as single tokens, cached
build keyed by the world files' contents, loadable by path; a model name never builds it."""

from __future__ import annotations

import json
import os

import pytest
import torch

from hindsearch.agent import protocol
from hindsearch.config import Config, DataConfig, ModelConfig
from hindsearch.data.world import generate_world, write_world
from hindsearch.models import load_policy
from recipes.micro.build import PROTOCOL_TAGS, MicroSpec, copy_rows, ensure_micro, main, world_texts

SPEC = MicroSpec(vocab_size=800, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                 pretrain_steps=0)


@pytest.fixture(scope="module")
def world_dir(tmp_path_factory):
    d = tmp_path_factory.mktemp("world")
    write_world(generate_world(seed=0, n_entities=60), d)
    return d


@pytest.fixture(scope="module")
def micro(world_dir, tmp_path_factory):
    return ensure_micro(world_dir, tmp_path_factory.mktemp("m") / "micro", seed=0, spec=SPEC)


def test_micro_loads_and_encodes_protocol(micro, world_dir):
    model, tok = load_policy(ModelConfig(name=str(micro), device="cpu"))
    meta = json.loads((micro / "micro.json").read_text())
    assert len(tok) == meta["vocab"] <= SPEC.vocab_size + len(PROTOCOL_TAGS)
    assert model.config.num_hidden_layers == 2 and model.config.vocab_size == len(tok)
    assert tok.pad_token == "<|pad|>" and tok.eos_token == "<|im_end|>" and tok.padding_side == "left"
    for tag in PROTOCOL_TAGS:
        assert len(tok(tag, add_special_tokens=False).input_ids) == 1, tag
    prompt = protocol.make_prompt(tok, "Where was Zoë Ångström born")
    assert prompt.startswith("<|im_start|>user\n") and prompt.endswith("<|im_start|>assistant\n")
    ids = tok(prompt, add_special_tokens=False).input_ids
    assert tok.decode(ids) == prompt  # byte-level: any text round-trips
    # the instruction was in the BPE corpus, so it costs far fewer tokens than characters / 2
    assert len(ids) < len(prompt) / 3
    passage = next(world_texts(world_dir))
    assert tok.decode(tok(passage, add_special_tokens=False).input_ids) == passage
    with torch.no_grad():
        out = model(input_ids=torch.tensor([ids]))
    assert out.logits.shape == (1, len(ids), len(tok))


def test_micro_is_cached_and_rebuilt_on_change(micro, world_dir):
    stamp = (micro / "model.safetensors").stat().st_mtime_ns
    assert ensure_micro(world_dir, micro, seed=0, spec=SPEC) == micro
    assert (micro / "model.safetensors").stat().st_mtime_ns == stamp
    other = ensure_micro(world_dir, micro.with_name("micro2"), seed=1, spec=SPEC)
    a = load_policy(ModelConfig(name=str(micro), device="cpu"))[0]
    b = load_policy(ModelConfig(name=str(other), device="cpu"))[0]
    assert not torch.equal(a.model.layers[0].mlp.up_proj.weight, b.model.layers[0].mlp.up_proj.weight)


def test_bad_world_files_are_named(tmp_path):
    with pytest.raises(FileNotFoundError, match="corpus.jsonl"):
        ensure_micro(tmp_path, tmp_path / "m", spec=SPEC)
    (tmp_path / "corpus.jsonl").write_text(json.dumps({"id": "1", "contents": '"A"\nA is a city.'}) + "\n")
    (tmp_path / "train.jsonl").write_text('{"question": "Where?", "golden_answers": ["A"]}\n{"oops": 1}\n')
    with pytest.raises(ValueError, match=r"train.jsonl:2"):
        list(world_texts(tmp_path))


def test_a_copied_world_reuses_the_build(micro, world_dir, tmp_path):
    """The cache key hashes the world files' contents: a copy with new times (no ``cp -a``) is the same world, an
    edited file is another."""
    import shutil

    copy = tmp_path / "copy"
    copy.mkdir()
    for f in world_dir.iterdir():
        if f.is_file():
            shutil.copyfile(f, copy / f.name)  # contents only: new modification times
            os.utime(copy / f.name, (1, 1))
    stamp = (micro / "model.safetensors").stat().st_mtime_ns
    assert ensure_micro(copy, micro, seed=0, spec=SPEC) == micro
    assert (micro / "model.safetensors").stat().st_mtime_ns == stamp
    key = json.loads((micro / "micro.json").read_text())["key"]
    with (copy / "train.jsonl").open("a") as f:
        f.write(json.dumps({"question": "Who is new?", "golden_answers": ["Nobody"]}) + "\n")
    rebuilt = ensure_micro(copy, tmp_path / "other", seed=0, spec=SPEC)
    assert json.loads((rebuilt / "micro.json").read_text())["key"] != key


def test_build_command_prints_its_folder_and_a_name_never_builds(world_dir, tmp_path, monkeypatch, capsys):
    """``python recipes/micro/build.py --world DIR --out DIR`` builds and prints the folder; the model is then named
    by that path. Loading the name ``micro`` is an error naming it: resolving a name never trains anything."""
    import recipes.micro.build as build

    monkeypatch.setattr(build, "MicroSpec", lambda: SPEC)
    assert main(["--world", str(world_dir), "--out", str(tmp_path / "m"), "--seed", "0"]) == 0
    assert capsys.readouterr().out.strip() == str(tmp_path / "m")
    model, _ = load_policy(ModelConfig(name=str(tmp_path / "m"), device="cpu"))
    assert model.config.hidden_size == SPEC.hidden_size
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "notes.txt").write_text("not a model")
    with pytest.raises(Exception, match="not a micro model folder"):
        main(["--world", str(world_dir), "--out", str(tmp_path / "mine")])
    cfg = Config.load(None, ['model.name="micro"', 'model.device="cpu"'])
    with pytest.raises(FileNotFoundError, match="'micro'"):
        load_policy(cfg.model)
    assert cfg.model.name == "micro" and DataConfig().world_dir == ".hindsearch/world"



def test_copy_rows_supervise_only_the_repeat():
    pool = torch.arange(10, 50)
    ids, labels = copy_rows(pool, 3, 11, torch.Generator().manual_seed(0))
    assert ids.shape == labels.shape == (3, 10)
    assert torch.equal(ids[:, :5], ids[:, 5:]) and bool(((ids >= 10) & (ids < 50)).all())
    assert bool((labels[:, :5] == -100).all()) and torch.equal(labels[:, 5:], ids[:, 5:])


def test_pretraining_teaches_copying_and_lowers_the_lm_loss(world_dir, tmp_path):
    from dataclasses import replace

    # measured: 300 steps take this 2-layer model from chance (<1%) to >99% copy accuracy; 120 steps do not
    spec = replace(SPEC, pretrain_steps=300, pretrain_seq_len=32, pretrain_batch_size=16, pretrain_lr=3e-3)
    out = ensure_micro(world_dir, tmp_path / "pre", spec=spec)
    meta = json.loads((out / "micro.json").read_text())
    losses = meta["pretrain_loss"]
    assert len(losses) == 50 and sum(losses[-5:]) / 5 < losses[0] - 1.0
    assert meta["copy_acc_before"] < 0.1 and meta["copy_acc_after"] > 0.9


def test_tokenizer_and_pretraining_never_read_dev_or_test(world_dir):
    texts = list(world_texts(world_dir))
    dev = [json.loads(line) for line in (world_dir / "dev.jsonl").read_text().splitlines() if line.strip()]
    test = [json.loads(line) for line in (world_dir / "test.jsonl").read_text().splitlines() if line.strip()]
    joined = "\n".join(texts)
    assert all(r["question"] not in joined for r in dev + test)
    assert len(list(world_texts(world_dir, splits=("train", "dev", "test")))) == len(texts) + len(dev) + len(test)


def test_bad_copy_fraction_is_named(world_dir, tmp_path):
    from dataclasses import replace

    with pytest.raises(ValueError, match="pretrain_copy_frac"):
        ensure_micro(world_dir, tmp_path / "bad", spec=replace(SPEC, pretrain_steps=1, pretrain_copy_frac=1.5))
