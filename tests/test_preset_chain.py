"""Issue 41, item 12: presets. A ``base`` chain too deep (1,500 presets) or round is one line naming the files, not a
RecursionError; ``out`` with a NUL byte names ``out``; ``train --out 'runs/{method}'`` is substituted as a preset's
``out`` is."""

from __future__ import annotations

from pathlib import Path

import pytest

from conftest import one_line_error
from hindsearch.cli import main
from hindsearch.config import Config, ConfigError


def chain(folder: Path, n: int, last_base: str | None = None) -> Path:
    """``p0.toml`` -> ``p1.toml`` -> ... -> ``p{n-1}.toml`` (whose base is ``last_base``, if any)."""
    for i in range(n):
        base = f"p{i + 1}.toml" if i < n - 1 else last_base
        (folder / f"p{i}.toml").write_text((f'base = "{base}"\n' if base else "") + f"[train]\nsteps = {i + 1}\n")
    return folder / "p0.toml"


def test_a_base_chain_1500_deep_is_one_line(tmp_path, capsys):
    top = chain(tmp_path, 1500)
    with pytest.raises(ConfigError, match=r"p0.toml: its base chain is longer than 64 presets"):
        Config.load(top)
    assert main(["train", "--config", str(top), "--out", str(tmp_path / "run")]) == 1
    one_line_error(capsys, "hindsearch train: error:", "base chain is longer than 64 presets", "p0.toml")
    assert not (tmp_path / "run").exists()
    # a chain within the limit still resolves, the preset nearest the top winning
    (tmp_path / "ok").mkdir()
    assert Config.load(chain(tmp_path / "ok", 64)).train.steps == 1
    # and a cycle within it is still named as one
    (tmp_path / "round").mkdir()
    with pytest.raises(ConfigError, match=r"p39.toml: base = 'p0.toml' makes a cycle \(.*p0.toml -> .* -> .*p0.toml\)"):
        Config.load(chain(tmp_path / "round", 40, last_base="p0.toml"))


def test_out_with_a_nul_byte_names_out(tmp_path, capsys):
    preset = tmp_path / "nul.toml"
    preset.write_text('out = "runs/a\\u0000b"\n')
    with pytest.raises(ConfigError, match=r"out = 'runs/a\\x00b': holds a NUL byte"):
        Config.load(preset)
    assert main(["train", "--config", str(preset)]) == 1
    one_line_error(capsys, "hindsearch train: error: out = ", "NUL byte")
    with pytest.raises(ConfigError, match="out = .*NUL byte"):
        Config.load(None, ['out="x\\u0000"'])


def test_out_on_the_command_line_is_substituted_like_a_presets(tmp_path, monkeypatch):
    import hindsearch.train.run

    seen = []
    monkeypatch.setattr(hindsearch.train.run, "run_train", lambda cfg, **kw: seen.append(cfg.out))  # stop before work
    preset = tmp_path / "p.toml"
    preset.write_text('method = "grpo"\nout = "runs/p-{method}"\n')
    assert main(["train", "--config", str(preset), "--method", "igsd"]) == 0
    assert main(["train", "--config", str(preset), "--method", "igsd", "--out", str(tmp_path / "runs/{method}")]) == 0
    assert seen == ["runs/p-igsd", str(tmp_path / "runs/igsd")]
