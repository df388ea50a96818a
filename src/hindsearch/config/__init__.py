"""Configuration as plain data: one dataclass per concern, one docstring per field, TOML presets.

A preset's tables are the concerns (``[model]``, ``[data]``, ``[retrieval]``, ``[rollout]``,
``[warmup]``, ``[train]``, ``[eval]``), one table per method with options, and the top-level
``method``, ``out``, ``plugins`` and ``base`` (a preset to lay this one over); ``--set
section.key=value`` overrides one field. ``Config.load`` checks every type, bound and fixed choice
and imports nothing but the plugins; the names that registries hold and the method tables are
checked where those registries live, when a run is assembled. An error names the key and what is
allowed.
"""

from __future__ import annotations

import tomllib
from dataclasses import asdict, dataclass, field
from dataclasses import fields as dc_fields
from pathlib import Path
from typing import Any

from hindsearch.config.fields import (FEEDBACK_KINDS, ConfigError, _assign, _check_declared,
                                      _drop_none, bounded, choice, choices_of, url_problem)
from hindsearch.config.registry import PluginError, load_plugins
from hindsearch.config.sections import (DataConfig, EvalConfig, LoRAConfig, ModelConfig,
                                        RetrievalConfig, RolloutConfig, TrainConfig, WarmupConfig)

__all__ = [
    "FEEDBACK_KINDS", "Config", "ConfigError", "DataConfig",
    "EvalConfig", "LoRAConfig", "ModelConfig", "RetrievalConfig", "RolloutConfig", "TrainConfig",
    "WarmupConfig", "bounded", "choice", "choices_of",
]


def read_toml(p: Path) -> dict[str, Any]:
    """A TOML file as a dict; a file that cannot be read, is not UTF-8 or is not TOML raises
    ``ConfigError`` naming it (and the line of a byte that is not UTF-8). A byte-order mark at its
    start is read past."""
    try:
        raw = p.read_bytes()
    except OSError as e:
        raise ConfigError(f"{p}: cannot read it ({e.strerror or type(e).__name__})") from None
    try:
        # a BOM, as Windows editors write one, is not part of the TOML
        text = raw.decode("utf-8-sig")
    except UnicodeDecodeError as e:
        line = raw.count(b"\n", 0, e.start) + 1
        raise ConfigError(f"{p}:{line}: not UTF-8 (byte 0x{raw[e.start]:02x}); a config is UTF-8 "
                          "TOML") from None
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        raise ConfigError(f"{p}: invalid TOML: {e}") from e
    except RecursionError:
        raise ConfigError(f"{p}: invalid TOML: nested too deep to read") from None


BASE_KEY = "base"
"""Top-level key of a preset naming the preset it lays itself over."""


def _overlay(base: dict[str, Any], top: dict[str, Any]) -> dict[str, Any]:
    """``top`` laid over ``base``: tables merged key by key (recursively), any other value
    replaced."""
    out = dict(base)
    for k, v in top.items():
        out[k] = _overlay(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out


DEFAULT_PRESET = "tiny-cpu"
"""The preset ``hindsearch train`` and ``hindsearch eval`` run without ``--config``."""


def preset_dirs() -> list[Path]:
    """Where shipped presets are looked up: ``./configs`` then the checkout's ``configs/``."""
    here = Path(__file__).resolve()
    return [Path.cwd() / "configs", here.parents[3] / "configs", here.parents[1] / "configs"]


def find_config(name: str | Path | None) -> Path:
    """A config path from a file path or a preset name (``tiny-cpu`` or ``tiny-cpu.toml``; None: the
    default preset)."""
    name = str(name or DEFAULT_PRESET)
    p = Path(name)
    if p.exists():
        return p
    stem = p.name if p.suffix == ".toml" else p.name + ".toml"
    for d in preset_dirs():
        if (d / stem).exists():
            return d / stem
    known = sorted({q.stem for d in preset_dirs() if d.is_dir() for q in d.glob("*.toml")})
    raise FileNotFoundError(f"config {name!r} not found (not a file, not a preset); "
                            f"presets: {', '.join(known) or 'none'}")


MAX_BASE_DEPTH = 64
"""The most presets a ``base`` chain may hold (the preset itself included)."""


def read_preset(p: Path) -> dict[str, Any]:
    """A preset's TOML as a dict, its ``base`` chain resolved: the base (relative to ``p``'s folder)
    read first, then ``p`` laid over it (``_overlay``). A missing base, a cycle or a chain of more
    than ``MAX_BASE_DEPTH`` presets raises ``ConfigError`` naming the files."""
    chain: list[tuple[Path, dict[str, Any]]] = []
    seen: list[Path] = []
    while True:
        d = read_toml(p)
        chain.append((p, d))
        seen.append(p.resolve())
        if BASE_KEY not in d:
            break
        name = d.pop(BASE_KEY)
        if not isinstance(name, str) or not name:
            raise ConfigError(f"{p}: base must be the file name of another preset, got {name!r}")
        base = p.parent / name
        if base.resolve() in seen:
            shown = seen if len(seen) <= 6 else [*seen[:3], "...", *seen[-2:]]
            cycle = " -> ".join(map(str, [*shown, base.resolve()]))
            raise ConfigError(f"{p}: base = {name!r} makes a cycle ({cycle})")
        if not base.is_file():
            raise ConfigError(f"{p}: base = {name!r}: {base} not found (a path relative to the "
                              "preset's folder)")
        if len(chain) >= MAX_BASE_DEPTH:
            raise ConfigError(f"{chain[0][0]}: its base chain is longer than {MAX_BASE_DEPTH} "
                              f"presets ({chain[0][0]} -> ... -> {p} -> {base}); shorten it")
        p = base
    out: dict[str, Any] = {}
    for _, d in reversed(chain):  # the deepest base first, each preset laid over the ones below it
        out = _overlay(out, d)
    return out


@dataclass(eq=False)
class Config:
    method: str = "grpo"
    """A registered method (``grpo``, ``hindsearch``, ``igsd``, a plugin's) or registered methods
    composed with ``+`` (``hindsearch+igsd``: both terms)."""
    out: str = "runs/default"
    """Run folder: config.toml, metrics.jsonl, samples.jsonl, checkpoints/. In a preset,
    ``{method}`` in it becomes the method (``runs/qwen2.5-3b-instruct-{method}``)."""
    plugins: list[str] = field(default_factory=list)
    """Modules (``package.module``) or Python files (``path/to/file.py``) imported before the rest
    of the config is read: their methods, retriever kinds and reward functions register themselves
    (``hindsearch.config.registry``). Written into the run's config.toml, so ``compare`` and
    ``report`` import them too."""
    model: ModelConfig = field(default_factory=ModelConfig)
    data: DataConfig = field(default_factory=DataConfig)
    retrieval: RetrievalConfig = field(default_factory=RetrievalConfig)
    rollout: RolloutConfig = field(default_factory=RolloutConfig)
    warmup: WarmupConfig = field(default_factory=WarmupConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)

    def __post_init__(self) -> None:
        self.sections: dict[str, Any] = {}
        """A method's options by its name, parsed by its registered dataclass
        (``resolve_methods``)."""
        self.tables: dict[str, list[tuple[str, Any]]] = {}
        """Top-level tables not parsed yet, by name: ``(source, value)`` in the order they were
        set."""

    @classmethod
    def field_names(cls) -> list[str]:
        return [f.name for f in dc_fields(cls)]

    def __getattr__(self, name: str) -> Any:
        sections = self.__dict__.get("sections")
        if sections is not None and name in sections:
            return sections[name]
        if name in self.__dict__.get("tables", {}):
            raise AttributeError(f"[{name}] is parsed when the run is assembled: call "
                                 f"hindsearch.hindsight.registry.resolve_methods(cfg) first")
        raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Config) and self.to_dict() == other.to_dict()

    def use_plugins(self, specs: list[str], source: str) -> None:
        """Set ``plugins`` and import them (``load_plugins``). A ``.py`` file is recorded by its
        absolute path (a run's config.toml is read from other folders)."""
        _assign(self, "plugins", specs, source)
        if not all(isinstance(p, str) and p for p in self.plugins):
            raise ConfigError(f"{source}: plugins must be a list of module names or .py files, got "
                              f"{self.plugins!r}")
        self.plugins = [str(Path(p).expanduser().resolve()) if p.endswith(".py") else p
                        for p in self.plugins]
        try:
            load_plugins(self.plugins)
        except (ImportError, OSError, PluginError) as e:
            raise ConfigError(f"{source}: plugins = {self.plugins!r}: {e}") from e

    # ------------------------------------------------------------------ io
    def to_dict(self) -> dict[str, Any]:
        """The config as nested dicts, the method tables before ``eval`` (an empty ``plugins`` is
        left out)."""
        d: dict[str, Any] = {}
        for key, value in asdict(self).items():
            if key == "eval":
                d.update({name: asdict(sec) for name, sec in self.sections.items()})
                for name, layers in self.tables.items():
                    d[name] = {}
                    for _, v in layers:
                        both = isinstance(v, dict) and isinstance(d[name], dict)
                        d[name] = _overlay(d[name], v) if both else v
            if key != "plugins" or value:
                d[key] = value
        return _drop_none(d)

    def to_toml(self) -> str:
        import tomli_w

        return tomli_w.dumps(self.to_dict())

    def save(self, path: str | Path) -> None:
        Path(path).write_text(self.to_toml())

    @classmethod
    def from_dict(cls, d: dict[str, Any], source: str = "<dict>") -> "Config":
        cfg = cls()
        if "plugins" in d:  # first: a plugin's sections are read like built-in ones
            cfg.use_plugins(d["plugins"], source)
        for key, value in d.items():
            if key != "plugins":
                _assign(cfg, key, value, source)
        return cfg

    @classmethod
    def load(cls, path: str | Path | None = None, overrides: list[str] | None = None, *,
             out: str | None = None) -> "Config":
        """Load a TOML file or a shipped preset by name (``"tiny-cpu"``, as ``--config`` takes it;
        None = the built-in defaults; its ``base`` chain resolved: ``read_preset``), apply
        ``section.key=value`` overrides, fill ``{method}`` in ``out``, replace ``out`` by ``out``
        when given (a command's ``--out``, ``{method}`` filled the same way), validate."""
        d: dict[str, Any] = {}
        src = "<defaults>"
        if path is not None:
            p = Path(path)
            if not p.exists() and len(p.parts) == 1:  # a bare name: a shipped preset
                try:
                    p = find_config(p)
                except FileNotFoundError as e:
                    raise ConfigError(str(e)) from None
            if not p.exists():
                raise ConfigError(f"config file not found: {p}")
            d = read_preset(p)
            src = str(p)
        cfg = cls.from_dict(d, src)
        for ov in overrides or []:
            cfg.set(ov)
        cfg.use_out(cfg.out)
        if out is not None:
            cfg.use_out(out)
        cfg.validate()
        return cfg

    def use_out(self, out: str) -> None:
        """Set the run folder as a preset's ``out`` is set (``--out`` too): ``{method}`` becomes the
        method, and a name no folder can have is refused naming ``out``."""
        self.out = str(out).replace("{method}", self.method)
        self._check_out()

    def _check_out(self) -> None:
        if "\0" in self.out:
            raise ConfigError(f"out = {self.out!r}: holds a NUL byte (\\x00), which no folder name "
                              "may hold")

    def set(self, override: str) -> None:
        """Apply one ``section.key=value`` (or ``method=...``) override."""
        if "=" not in override:
            raise ConfigError(f"--set expects key=value, got {override!r}")
        key, raw = override.split("=", 1)
        try:
            value = tomllib.loads(f"v = {raw}")["v"]
        except tomllib.TOMLDecodeError:
            value = raw
        except RecursionError:
            raise ConfigError(f"--set {key.strip()}: the value is nested too deep "
                              "to read") from None
        parts = key.strip().split(".")
        if parts == ["plugins"]:
            self.use_plugins(value, "--set")
        elif len(parts) == 1:
            _assign(self, parts[0], value, "--set")
        elif len(parts) == 2:
            _assign(self, parts[0], {parts[1]: value}, "--set")
        elif len(parts) == 3:  # a key of a sub-table: model.lora.r=8, train.trl.weight_decay=0.1
            _assign(self, parts[0], {parts[1]: {parts[2]: value}}, "--set")
        else:
            raise ConfigError("--set key must be 'section.field', 'section.table.field' or a "
                              f"top-level field, got {key!r}")

    # ------------------------------------------------------------ validate
    def validate(self) -> "Config":
        """Check every declared choice and bound (field metadata, the parsed method sections' too),
        then the cross-field rules."""
        _check_declared(self, "")
        self._check_out()
        for name, sec in self.sections.items():
            _check_declared(sec, name + ".")
        if not self.out.strip():
            raise ConfigError(f"out = {self.out!r}: no run folder given (it would write into the "
                              f"current folder); set out in the config or pass --out")
        if self.retrieval.kind == "remote" and not self.retrieval.url:
            raise ConfigError("retrieval.url is required when retrieval.kind = 'remote'")
        if self.retrieval.url is not None and (why := url_problem(self.retrieval.url)) is not None:
            raise ConfigError(f"retrieval.url = {self.retrieval.url!r} {why}")
        if not self.warmup.feedback_kinds:
            raise ConfigError("warmup.feedback_kinds must be a non-empty list of "
                              f"{', '.join(FEEDBACK_KINDS)}")
        if self.rollout.num_generations < 2 and self.train.steps > 0:
            raise ConfigError("rollout.num_generations must be >= 2 for GRPO (group-relative "
                              "advantages)")
        for sec in self.sections.values():
            if hasattr(sec, "check"):  # the cross-field rules of a method's own options
                sec.check()
        self._validate_lora()
        self._validate_trl()
        return self

    def _validate_lora(self) -> None:
        lo = self.model.lora
        if not lo.target_modules or not all(isinstance(m, str) and m for m in lo.target_modules):
            raise ConfigError("model.lora.target_modules must be a non-empty list of module "
                              f"names, got {lo.target_modules!r}")
        if lo.r == 0:
            return
        for name, sec in self.sections.items():
            if getattr(sec, "teacher", None) == "ema":
                raise ConfigError(f"{name}.teacher = 'ema' is not supported with model.lora (the "
                                  "EMA copy averages the whole policy); use 'frozen' or 'live', "
                                  "or set model.lora.r = 0")
        try:
            import peft  # noqa: F401  # optional: lora
        except ImportError as e:
            raise ConfigError("model.lora.r > 0 needs the peft package: pip install peft "
                              "(or pip install -e \".[lora]\")") from e

    def _validate_trl(self) -> None:
        if not self.train.trl:
            return
        from trl import GRPOConfig

        known = {f.name for f in dc_fields(GRPOConfig)}
        for k in self.train.trl:
            if k in REDIRECTING_TRL_FIELDS:
                raise ConfigError(f"train.trl.{k} = {self.train.trl[k]!r}: "
                                  f"{REDIRECTING_TRL_FIELDS[k]}; remove it")
            if k not in known:
                import difflib

                close = difflib.get_close_matches(k, sorted(known), n=3)
                hint = f"; did you mean {', '.join(close)}?" if close else ""
                raise ConfigError(f"train.trl.{k} is not a field of TRL's GRPOConfig "
                                  f"(trl==1.16.0){hint}")
        report_to = self.train.trl.get("report_to", "none")
        for target in [report_to] if isinstance(report_to, str) else list(report_to):
            if target in ("none", "all"):
                continue
            from transformers.integrations import get_available_reporting_integrations

            if target not in get_available_reporting_integrations():
                need = {"tensorboard": "tensorboard (or tensorboardX)"}.get(target, target)
                raise ConfigError(f"train.trl.report_to = {report_to!r}: {target!r} needs the "
                                  f"{need} package installed (pip install "
                                  f"{target if target != 'tensorboard' else 'tensorboardX'})")


REDIRECTING_TRL_FIELDS = {"output_dir": "a run writes its checkpoints into its own folder (out), "
                                        "set out instead"}
"""Raw TRL fields that would send a run's outputs away from its folder: refused in
``[train.trl]``."""


def flat_keys(d: Any, prefix: str = "") -> dict[str, Any]:
    """A nested config dict as ``{"section.key": value}`` (sub-sections joined with dots): what a
    config comparison (an edited ``config.toml`` on resume, an eval folder's record) walks key by
    key."""
    if not isinstance(d, dict):
        return {prefix: d}
    out: dict[str, Any] = {}
    for k, v in d.items():
        out.update(flat_keys(v, f"{prefix}{k}.") if isinstance(v, dict) else {f"{prefix}{k}": v})
    return out
