"""Bad values (issue 23, classes E and F): one bad value never aborts the report, and the loaders and the
config refuse what they would otherwise accept without a word, naming the file, line or key.

E: a run folder holding a mathtext metric name, ±1e308, NaN log-probs, integers of hundreds of digits,
wrong types, lone surrogates or non-UTF-8 bytes still gets its page: labels drawn as plain text, such
numbers shown as such and left out of the plots, bad lines skipped and counted with their line number.
"""

from __future__ import annotations

import base64
import io
import json
import re
from html.parser import HTMLParser
from pathlib import Path

import pytest

from hindsearch.cli import main
from hindsearch.study.report import render, write_report
from conftest import one_line_error  # noqa: E402  (the shared CLI-error check)

pytestmark = pytest.mark.timeout(300)

SAMPLE = {"step": 1, "question": "Who?", "reward": 0.0, "golden_answers": ["x"], "answer": "y"}


def run_folder(path: Path, metrics: bytes | None = None, samples: bytes | None = None,
               files: dict[str, bytes] | None = None) -> Path:
    """A run folder with the given raw file contents (a default one-row metrics.jsonl)."""
    path.mkdir(parents=True, exist_ok=True)
    (path / "metrics.jsonl").write_bytes(metrics if metrics is not None else b'{"step": 1, "loss": 0.5}\n')
    if samples is not None:
        (path / "samples.jsonl").write_bytes(samples)
    for name, data in (files or {}).items():
        (path / name).write_bytes(data)
    return path


def jl(*rows) -> bytes:
    return "".join(json.dumps(r) + "\n" for r in rows).encode()


class Page(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.text: list[str] = []
        self.imgs: list[str] = []
        self.titles: list[str] = []

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        if tag == "img":
            self.imgs.append(a.get("src") or "")
        if a.get("title"):
            self.titles.append(a["title"])

    def handle_data(self, data):
        self.text.append(data)


def page_of(run: Path) -> tuple[str, Page]:
    """The page ``hindsearch report`` writes for ``run`` (through the CLI: exit 0, the file written)."""
    assert main(["report", str(run)]) == 0
    html = (run / "report.html").read_bytes().decode("utf-8")  # strict: the page is valid UTF-8
    p = Page()
    p.feed(html)
    return " ".join(" ".join(p.text).split()), p


def plot_pixels(src: str):
    """The pixels of an inlined PNG (matplotlib reads it back)."""
    import matplotlib.image

    return matplotlib.image.imread(io.BytesIO(base64.b64decode(src.split(",", 1)[1])), format="png")


# --------------------------------------------------------------------------- E: the report
def test_mathtext_metric_names_are_drawn_as_plain_text(tmp_path):
    """matplotlib reads ``$...$`` in a legend label as mathtext: an unbalanced one raised and no page was written."""
    run = run_folder(tmp_path / "run", jl({"step": 1, "loss/$x^$": 0.5, "loss/$\\frac{a}{$": 1.0},
                                          {"step": 2, "loss/$x^$": 0.4, "loss/$\\frac{a}{$": 0.9}))
    text, page = page_of(run)
    assert len(page.imgs) == 1 and "Loss parts" in text  # the loss panel is drawn
    from hindsearch.study.report.plots import plain

    assert plain("loss/$x^$") == "loss/$x^$" and plain("a\x00b") == "a\\x00b"


def test_huge_and_non_finite_metrics_are_shown_and_not_plotted(tmp_path):
    """±1e308 broke matplotlib's axis arithmetic; NaN/Infinity and a 400-digit integer (no float holds it)
    broke the float conversion. They are listed as such under the plot, and the finite values are plotted."""
    big = "1" + "0" * 399
    rows = (b'{"step": 1, "loss": 1e308, "rollout/reward_mean": 0.5}\n'
            b'{"step": 2, "loss": -1e308, "rollout/reward_mean": NaN}\n'
            b'{"step": 3, "loss": 0.25, "rollout/reward_mean": Infinity}\n'
            + f'{{"step": 4, "loss": {big}, "rollout/reward_mean": 0.75, "time/step": {big}}}\n'.encode())
    text, page = page_of(run_folder(tmp_path / "run", rows))
    assert len(page.imgs) == 2  # reward and loss: each drawn from its finite values
    assert "loss = 1e+308 (step 1)" in text and "loss = -1e+308 (step 2)" in text
    assert "rollout/reward_mean = NaN (step 2)" in text and "rollout/reward_mean = inf (step 3)" in text
    assert "(400-digit integer, out of range) (step 4)" in text
    # the summary table shows the first and last values as logged, the median over the finite ones
    assert re.search(r"rollout/reward_mean 0\.5 0\.75 0\.75", text), text
    assert re.search(r"time/step 1000000000000… \(400-digit integer, out of range\)", text), text


def test_a_5000_digit_integer_and_a_deep_line_are_skipped_or_shown(tmp_path):
    """Python refuses to parse an integer past 4,300 digits and a value nested 100k deep: the first is shown
    as out of range, the second is a skipped line counted with its number; the other rows stay."""
    rows = (b'{"step": 1, "loss": ' + b"9" * 5000 + b"}\n"
            + b'{"step": 2, "x": ' + b"[" * 100_000 + b"]" * 100_000 + b"}\n"
            + b'{"step": 3, "loss": 0.5}\n')
    text, page = page_of(run_folder(tmp_path / "run", rows))
    assert "(5000-digit integer, out of range) (step 1)" in text
    assert "Unreadable lines: 1 skipped" in text and "metrics.jsonl:2: invalid JSON: nested too deep to read" in text
    assert "2 logged steps" in text and len(page.imgs) == 1


def test_nan_teacher_log_probs_are_shown_uncoloured(tmp_path):
    """``round(NaN)`` raised while colouring the tokens; a NaN or infinite log-prob is now an uncoloured token
    whose tooltip says NaN, and the other tokens keep their colours."""
    samples = (b'{"step": 1, "question": "Q", "reward": 0.0, "golden_answers": ["a"], "hind": {"critique": "c",'
               b' "distill_tokens": ["t1", "t2", "t3", "t4"], "lT": [NaN, 1.0, Infinity, ' + b"1" * 400 + b"]}}\n")
    html_text, page = page_of(run_folder(tmp_path / "run", samples=samples))
    html = (tmp_path / "run" / "report.html").read_text()
    assert page.titles[-4:] == ["NaN", "+1.000", "inf", "1111111111111… (400-digit integer, out of range)"]
    assert html.count('class="tok nf"') == 3 and 'class="tok g4"' in html
    from hindsearch.study.report import token_spans

    assert 'class="tok nf" title="NaN"' in token_spans(["a"], [float("nan")])


def test_wrong_types_show_as_they_were_logged(tmp_path):
    """``doc_titles = 5`` (iterating an int) and other fields of the wrong type raised; they show as logged."""
    sample = {**SAMPLE, "reward": "1", "golden_answers": "just one", "step": [1],
              "turns": [{"action": "search", "content": {"q": 1}, "doc_titles": 5, "error": 7}, 3, "x"],
              "hind": {"critique": 12, "distill_tokens": "abc", "lT": [1.0]}, "igsd": 5}
    text, _ = page_of(run_folder(tmp_path / "run", samples=jl(sample, {**SAMPLE, "igsd": {"igsd_pairs": [
        {"gate": "open", "ig_S": [1, 2], "delta": 1e308, "q_S": None}]}})))
    assert "retrieved: 5" in text and "error: 7" in text and "{'q': 1}" in text and "gold: just one" in text
    assert "HindSearch critique 12" in text and "2 rollouts shown" in text
    assert "IGSD verified pairs" in text and "1e+308" in text  # the IGSD delta shown as such


def test_lone_surrogates_in_a_question_and_a_key(tmp_path):
    """A JSON ``\\ud800`` made the page unencodable (UnicodeEncodeError) and a metric key with one made
    FreeType refuse the legend; both show as the escape ``\\ud800``."""
    metrics = b'{"step": 1, "loss/\\ud800": 0.5}\n{"step": 2, "loss/\\ud800": 0.4}\n'
    samples = b'{"step": 1, "question": "Who \\ud800 is?", "reward": 0, "\\udfff": 1, "hind": {"critique": "\\udc80"}}\n'
    text, page = page_of(run_folder(tmp_path / "run", metrics, samples))
    assert "Who \\ud800 is?" in text and "\\udc80" in text and len(page.imgs) == 1


def test_non_utf8_bytes_skip_the_line_and_name_it(tmp_path):
    """A non-UTF-8 byte in samples.jsonl or metrics.jsonl aborted the page (UnicodeDecodeError); the line
    is skipped and named with its number, and config.toml is shown with U+FFFD in the byte's place."""
    run = run_folder(tmp_path / "run", b'{"step": 1, "loss": 0.5}\n\xff\xfe\n{"step": 2, "loss": 0.4}\n',
                     b'{"step": 1, "question": "caf\xe9", "reward": 0}\n' + jl({**SAMPLE, "question": "kept"}),
                     files={"config.toml": b'method = "grpo"\nout = "r\xff"\n'})
    text, _ = page_of(run)
    assert "Unreadable lines: 3 skipped" in text
    assert "metrics.jsonl:2: not UTF-8 (byte 0xff at column 1)" in text
    assert "samples.jsonl:1: not UTF-8 (byte 0xe9" in text
    assert "config.toml:2: not UTF-8 (byte 0xff)" in text and 'out = "r\ufffd"' in text
    assert "2 logged steps" in text and "kept" in text


def test_bad_summary_dev_curve_and_results_never_abort(tmp_path):
    """summary.json and dev_curve.jsonl were read by results.dev_curve without a guard (a string step, a
    list, NaN, non-UTF-8 all raised); results.json numbers of the wrong range broke the table's format."""
    run = run_folder(tmp_path / "run", files={
        "summary.json": b'{"dev": {"base": {"em": NaN}, "rl": {"em": 0.5}}, "steps": 1e400}',
        "dev_curve.jsonl": b'{"step": "x", "em": 0.5}\n[1]\n{"step": 2, "em": 0.25}\n\xff\n',
        "results.json": b'{"benchmarks": {"nq": {"em": 1e308, "n": ' + b"7" * 400 + b', "searches": NaN}}}'})
    text, page = page_of(run)
    assert "dev_curve.jsonl:2: not a JSON object" in text and "dev_curve.jsonl:4: not UTF-8" in text
    assert "dev EM (greedy) = NaN (step 0)" in text and "dev EM (greedy) = 0.5 (step inf)" in text
    assert re.search(r"nq 1e\+308 - - 7777777777777… \(400-digit integer, out of range\) NaN -", text), text
    assert len(page.imgs) >= 2  # loss, and the dev EM point at step 2


def test_unreadable_files_in_the_folder_are_named(tmp_path):
    run = run_folder(tmp_path / "run")
    (run / "samples.jsonl").mkdir()
    (run / "config.toml").mkdir()
    (run / "probe.json").write_bytes(b'{"student": {"rerun": {"em": NaN}}}')
    text, _ = page_of(run)
    assert "samples.jsonl: a folder, not a regular file; not read" in text
    assert "config.toml: a folder, not a regular file; not read" in text
    assert "probe.json unreadable" in text


def test_compare_folder_with_bad_values(tmp_path):
    """A comparison whose results.json carry NaN, 1e308 or a list of benchmarks: the table keeps what is
    finite and names what it left out; method names with mathtext are drawn verbatim."""
    cmp = tmp_path / "cmp"
    cmp.mkdir()
    (cmp / "compare.json").write_text(json.dumps({"methods": ["grpo", "$x^$"], "seeds": [0, 1, float("nan")]}))
    for m, s, res in (("grpo", 0, b'{"method": "grpo", "seed": 0, "benchmarks": {"world": {"em": 0.5}}}'),
                      ("grpo", 1, b'{"method": "grpo", "seed": 1, "benchmarks": {"world": {"em": NaN}}, "step_s": 1e999}'),
                      ("$x^$", 0, b'{"method": "$x^$", "seed": 0, "benchmarks": {"world": {"em": 1e308, "em_1hop": 0.25}}}'),
                      ("$x^$", 1, b'{"method": "$x^$", "seed": "a", "benchmarks": [1]}')):
        run_folder(cmp / f"{m}-s{s}", files={"results.json": res})
    assert main(["report", str(cmp)]) == 0
    text = " ".join(re.sub(r"<[^>]+>", " ", (cmp / "report.html").read_text()).split())
    assert "grpo-s1/results.json: world.em = NaN left out" in text
    assert "$x^$-s0/results.json: world.em = 1e+308 left out" in text
    assert "benchmarks is a list, not an object" in text and "step_s = inf left out" in text
    assert 'alt="EM per method' in (cmp / "report.html").read_text()  # the bars, "$x^$" among them
    assert re.search(r"grpo 2 50\.0", text), text


BAD_RUNS = {
    "mathtext key": (jl({"step": 1, "loss/$\\frac{$": 1.0, "loss/$$$": 2.0}), None, {}),
    "1e308 step": (b'{"step": 1e308, "loss": 1.0}\n{"step": -1e308, "loss": 2.0}\n', None, {}),
    "400-digit step": (f'{{"step": {"9" * 400}, "loss": 1.0}}\n'.encode(), None, {}),
    "1e308 time split": (jl({"step": 1, "time/a": 1e308, "time/b": 1e308}), None, {}),
    "NaN lT_minus_neutral": (None, b'{"reward": 0, "hind": {"distill_tokens": ["a"], "lT_minus_neutral": [NaN]}}\n', {}),
    "400-digit reward": (None, f'{{"reward": {"1" * 400}}}\n'.encode(), {}),
    "NaN reward": (None, b'{"reward": NaN}\n', {}),
    "doc_titles dict": (None, jl({"turns": [{"action": "search", "doc_titles": {"a": 1}}]}), {}),
    "igsd list": (None, jl({"igsd": [1, 2]}), {}),
    "igsd NaN gate": (None, b'{"igsd": {"igsd_pairs": [{"gate": NaN, "ig_S": Infinity}]}}\n', {}),
    "nested 900 deep": (None, b'{"question": ' + b"[" * 900 + b"]" * 900 + b"}\n", {}),
    "surrogate key in samples": (None, b'{"\\ud800": 1, "step": "\\udfff"}\n', {}),
    "summary a list": (None, None, {"summary.json": b"[1]"}),
    "summary dev a list": (None, None, {"summary.json": b'{"dev": [1], "steps": "x"}'}),
    "summary not UTF-8": (None, None, {"summary.json": b'{"steps": "\xff"}'}),
    "dev_curve not UTF-8": (None, None, {"dev_curve.jsonl": b'{"step": 1, "em": 0.5}\xff\n'}),
    "probe wrong types": (None, None, {"probe.json": b'{"student": 5, "hints": []}'}),
    "results bench a number": (None, None, {"results.json": b'{"benchmarks": {"nq": 5}}'}),
    "results NaN": (None, None, {"results.json": b'{"benchmarks": {"nq": {"em": NaN, "em_1hop": Infinity}}}'}),
    "control characters": (jl({"step": 1, "loss/\x00\x1b[31m": 1.0}), jl({"question": "a\x00b\x1b[2J"}), {}),
    "NaN and inf steps": (b'{"step": NaN, "loss": 1.0}\n{"step": Infinity, "loss": 2.0}\n', None, {}),
    "string and null steps": (jl({"step": "abc", "loss": 1.0}, {"step": None, "loss": 2.0}, {"step": {"a": 1}, "loss": 3}), None, {}),
    "400-digit time split": (f'{{"step": 1, "time/gen": {"9" * 400}, "time/step": {"9" * 400}}}\n'.encode(), None, {}),
    "100k-character key": (jl({"step": 1, "loss/" + "x" * 100_000: 1.0}), None, {}),
    "2,000 loss keys": (jl({"step": 1, **{f"loss/k{i}": float(i) for i in range(2000)}}), None, {}),
    "metrics not objects": (b'[1]\n"x"\nnull\n{"step": 1, "loss": 1}\n', None, {}),
    "deep metrics line": (b'{"x": ' + b"[" * 100_000 + b"]" * 100_000 + b"}\n", None, {}),
    "5000-digit metric": (b'{"step": 1, "loss": ' + b"9" * 5000 + b"}\n", None, {}),
    "samples of odd types": (None, jl({"step": [1], "question": {"a": 1}, "reward": "0.5", "hops": None, "answer": None}), {}),
    "turns of odd types": (None, jl({"turns": [5, "x", {"action": None, "content": {"x": [1]}, "doc_titles": [None, 10 ** 40]}]}), {}),
    "hind extras of odd types": (None, jl({"hind": {"critique": 10 ** 40, "judge_kind": {"a": 1}, "redactions": [1e308]}}), {}),
    "igsd huge floats": (None, b'{"igsd": {"igsd_pairs": [{"gate": NaN, "ig_S": Infinity, "delta": 1e308, "ig_T": '
                         + b"1" * 400 + b"}]}}\n", {}),
    "1e308 log-prob": (None, jl({"hind": {"distill_tokens": ["a"], "lT": [1e308]}}), {}),
    "distill_tokens a string": (None, jl({"hind": {"distill_tokens": "abc", "lT": [1.0, 2.0, 3.0]}}), {}),
    "golden_answers a string": (None, jl({"golden_answers": "abc", "turns": [{"doc_titles": {"a": 1}}]}), {}),
    "deep question": (None, b'{"question": ' + b"[" * 100_000 + b"]" * 100_000 + b"}\n", {}),
    "samples not UTF-8": (None, b'{"question": "q\xff\xfe"}\n{"question": "ok"}\n', {}),
    "metrics not UTF-8": (b'{"step": 1, "loss": 0.5}\n\xff\xfe\n', None, {}),
    "config not UTF-8": (None, None, {"config.toml": b'method = "grpo\xff"\n'}),
    "summary not JSON": (None, None, {"summary.json": b'{"dev": '}),
    "summary NaN and huge": (None, None, {"summary.json": b'{"dev": {"base": {"em": NaN}, "rl": {"em": 1e308}}, "steps": 1e400}'}),
    "summary wrong types": (None, None, {"summary.json": b'{"dev": {"base": {"em": "x"}, "rl": [1]}, "steps": "abc"}'}),
    "dev_curve odd rows": (None, None, {"dev_curve.jsonl": b'{"step": "x", "em": 0.5}\n{bad\n{"step": 1e308, "em": 0.1}\n[1]\n'
                                                          b'{"step": ' + b"1" * 40 + b', "em": "y"}\n'}),
    "results huge": (None, None, {"results.json": b'{"benchmarks": {"nq": {"em": 1e308, "n": ' + b"1" * 400 + b', "searches": NaN}}}'}),
    "results a list": (None, None, {"results.json": b"[1, 2]"}),
    "probe NaN": (None, None, {"probe.json": b'{"student": {"rerun": {"em": NaN, "evidence_recall": 1e308, "searches": "x"}}}'}),
    "probe not UTF-8": (None, None, {"probe.json": b'{"student": "\xff"}'}),
}


@pytest.mark.parametrize("name", sorted(BAD_RUNS))
def test_every_bad_value_still_writes_the_page(name, tmp_path):
    """More cases of the same classes, one bad value each (most of them aborted the report before this
    change; a few were already survived and stay covered): the page is written and is valid UTF-8."""
    metrics, samples, files = BAD_RUNS[name]
    run = run_folder(tmp_path / "run", metrics, samples, files)
    out = write_report(run)
    out.read_bytes().decode("utf-8")
    assert "<h2>" in render(run)


# --------------------------------------------------------------------------- F: validation and messages


def write_lines(path: Path, *lines: bytes | str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"".join((ln.encode() if isinstance(ln, str) else ln) + b"\n" for ln in lines))
    return path


def test_duplicate_passage_ids_are_refused_naming_file_and_line(tmp_path, capsys):
    """Evidence recall is keyed by passage id: a second passage under one id was indexed without a word."""
    from hindsearch.data.corpus import CorpusError, CorpusStats, read_corpus

    p = write_lines(tmp_path / "c.jsonl", '{"id": "1", "contents": "a"}', '{"id": "2", "contents": "b"}',
                    '{"id": 1, "contents": "c"}')  # the int 1 is the id "1"
    with pytest.raises(CorpusError, match=r"c\.jsonl:3: bad corpus line: duplicate passage id '1'"):
        read_corpus(p)
    q = write_lines(tmp_path / "d.jsonl", '{"id": "doc-a", "contents": "a"}', '{"contents": "b"}',
                    '{"id": "doc-a", "contents": "c"}', '{"id": "2", "contents": "the default id of line 2"}')
    with pytest.raises(CorpusError, match=r"d\.jsonl:3: .*duplicate passage id 'doc-a' \(line 1 has it\)"):
        read_corpus(q)
    stats = CorpusStats()
    assert [x.id for x in read_corpus(q, skip_bad=True, stats=stats)] == ["doc-a", "2"]
    assert stats.skipped == 2 and "d.jsonl:4" in stats.errors[1]
    j = tmp_path / "e.json"
    j.write_text(json.dumps([{"id": "007", "text": "a"}, {"id": "7", "text": "b"}, {"id": "007", "text": "c"}]))
    with pytest.raises(CorpusError, match=r"e\.json:3: bad corpus item: duplicate passage id '007' \(item 1 has it\)"):
        read_corpus(j)
    assert main(["index", "--corpus", str(p), "--out", str(tmp_path / "idx")]) == 1
    one_line_error(capsys, "c.jsonl:3", "duplicate passage id")
    assert not (tmp_path / "idx").exists()


def test_seen_ids_bitmap_and_dict_agree():
    from hindsearch.data.corpus import SeenIds

    seen = SeenIds()
    assert [seen.add(i, n) for n, i in enumerate(["0", "5", "05", "x", "268435456", "99999999999"], 1)] == [None] * 6
    assert seen.add("5", 7) == 0 and seen.add("05", 8) == 3 and seen.add("x", 9) == 4 and seen.add("0", 10) == 0
    assert seen.add("268435455", 11) is None and len(seen.bits) <= (1 << 25)


@pytest.mark.parametrize("gold,reason", [
    ('{"a": 1, "b": 2}', "golden_answers is an object"),
    ("NaN", "is not a string or a finite number"),
    ("[\"x\", Infinity]", "is not a string or a finite number"),
    ("-Infinity", "is not a string or a finite number"),
])
def test_golden_answers_object_or_non_finite_is_refused(tmp_path, gold, reason):
    """An object's keys became the golds, and NaN/Infinity became the gold strings "nan" and "inf"."""
    from hindsearch.data.qa import QAError, load_qa

    p = write_lines(tmp_path / "qa.jsonl", '{"question": "q1", "golden_answers": ["a"]}',
                    f'{{"question": "q2", "golden_answers": {gold}}}')
    with pytest.raises(QAError, match=rf"qa\.jsonl: line 2: bad QA row: .*{re.escape(reason)}"):
        load_qa(p)
    assert [r.question for r in load_qa(p, skip_bad=True)] == ["q1"]


def test_max_turns_zero_and_negative_world_entities_are_refused_before_config_toml(tmp_path, monkeypatch, capsys):
    from hindsearch.config import Config, ConfigError

    with pytest.raises(ConfigError, match=r"rollout\.max_turns must be >= 1, got 0"):
        Config.load(None, ["rollout.max_turns=0"])
    with pytest.raises(ConfigError, match=r"data\.world_entities must be >= 40, got -10"):
        Config.load(None, ["data.world_entities=-10"])
    assert Config.load(None, ["data.world_entities=40", "rollout.max_turns=1"]).data.world_entities == 40
    monkeypatch.chdir(tmp_path)
    assert main(["train", "--out", "run", "--set", "data.world_entities=-10"]) == 1
    one_line_error(capsys, "data.world_entities must be >= 40, got -10")
    assert not (tmp_path / "run" / "config.toml").exists()
    (tmp_path / "c.toml").write_text("[rollout]\nmax_turns = 0\n")
    assert main(["train", "--out", "run2", "--config", "c.toml"]) == 1
    one_line_error(capsys, "rollout.max_turns must be >= 1, got 0")
    assert not (tmp_path / "run2" / "config.toml").exists()


DEEP = b'{"question": "deep", "golden_answers": ' + b"[" * 100_000 + b"]" * 100_000 + b"}"
LONG_ID = b'{"id": ' + b"7" * 5000 + b', "question": "long id", "golden_answers": ["a"]}'


def test_skip_bad_skips_deep_rows_and_5000_digit_ids(tmp_path):
    """Both were raised by the JSON parser outside the per-row handler (RecursionError, and the ValueError of
    Python's 4,300-digit limit), so --skip-bad did not skip them and the error named no file."""
    from hindsearch.data.corpus import CorpusError, read_corpus
    from hindsearch.data.qa import QAError, QAStats, load_qa

    p = write_lines(tmp_path / "qa.jsonl", '{"question": "q1", "golden_answers": ["a"]}', DEEP, LONG_ID,
                    '{"question": "q4", "golden_answers": ["b"]}')
    with pytest.raises(QAError, match=r"qa\.jsonl: line 2: bad QA row: invalid JSON: nested too deep"):
        load_qa(p)
    stats = QAStats()
    assert [r.question for r in load_qa(p, skip_bad=True, stats=stats)] == ["q1", "q4"]
    assert stats.skipped == 2 and "line 3: bad QA row: invalid JSON: Exceeds the limit" in stats.errors[1]
    c = write_lines(tmp_path / "c.jsonl", '{"id": "1", "contents": "a"}', b'{"id": ' + b"7" * 5000 + b', "contents": "b"}',
                    b'{"id": "3", "contents": ' + b"[" * 100_000 + b"]" * 100_000 + b"}", '{"id": "4", "contents": "d"}')
    with pytest.raises(CorpusError, match=r"c\.jsonl:2: bad corpus line: invalid JSON: Exceeds the limit"):
        read_corpus(c)
    assert [x.id for x in read_corpus(c, skip_bad=True)] == ["1", "4"]
    j = tmp_path / "qa.json"
    j.write_bytes(b"[" + DEEP + b"]")
    with pytest.raises(QAError, match=r"qa\.json: invalid JSON: nested too deep"):
        load_qa(j)


def test_odd_row_shapes_are_that_rows_error(tmp_path):
    """A row whose fields have shapes no loader expects raised TypeError/AttributeError out of the per-row
    handler; each is now a bad row naming its line, skipped with skip_bad."""
    from hindsearch.data.qa import QAError, load_qa

    p = write_lines(tmp_path / "qa.jsonl", '{"question": "q1", "golden_answers": ["a"]}',
                    '{"question": "q2", "answers_objects": [5]}', '{"question": "q3", "answer": "x", "supporting_facts": 5}',
                    '{"question": "q4", "golden_answers": ["b"]}')
    with pytest.raises(QAError, match=r"qa\.jsonl: line 2: bad QA row: AttributeError"):
        load_qa(p)
    assert [r.question for r in load_qa(p, skip_bad=True)] == ["q1", "q4"]


def test_unreadable_files_name_the_file(tmp_path):
    """Non-UTF-8 QA and TOML files, fake and truncated parquet files: the error named no file."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from hindsearch.config import Config, ConfigError
    from hindsearch.data.qa import QAError, load_qa

    p = write_lines(tmp_path / "qa.jsonl", '{"question": "q1", "golden_answers": ["a"]}',
                    b'{"question": "caf\xe9", "golden_answers": ["b"]}')
    with pytest.raises(QAError, match=r"qa\.jsonl: line 2: bad QA row: not UTF-8 \(byte 0xe9 at column 18\)"):
        load_qa(p)
    assert len(load_qa(p, skip_bad=True)) == 1
    j = tmp_path / "qa.json"
    j.write_bytes(b'[{"question": "q", "answer": "\xff"}]')
    with pytest.raises(QAError, match=r"qa\.json: line 1: not UTF-8 \(byte 0xff"):
        load_qa(j)
    t = tmp_path / "c.toml"
    t.write_bytes(b'method = "grpo"\nout = "\xff"\n')
    with pytest.raises(ConfigError, match=r"c\.toml:2: not UTF-8 \(byte 0xff\)"):
        Config.load(t)
    (tmp_path / "fake.parquet").write_text('{"question": "not parquet"}')
    with pytest.raises(QAError, match=r"fake\.parquet: not a readable parquet file"):
        load_qa(tmp_path / "fake.parquet")
    good = tmp_path / "good.parquet"
    pq.write_table(pa.table({"question": ["q"] * 50, "golden_answers": [["a"]] * 50}), good)
    (tmp_path / "cut.parquet").write_bytes(good.read_bytes()[: good.stat().st_size // 2])
    with pytest.raises(QAError, match=r"cut\.parquet: not a readable parquet file"):
        load_qa(tmp_path / "cut.parquet")


@pytest.mark.parametrize("rows", [
    [b'{"benchmark": "dev", "qid": "1", "answer": "x"}'],  # another tool's row with the two keys
    [b"5", b'{"benchmark": "dev", "qid": "2"}'],
    [b'{"benchmark": "dev", "qid": "1", "turns": 5}'],
    [b'{"step": 1, "completion": "\xff"}'],
    [b'{"benchmark": "dev", "qid": ' + b"1" * 5000 + b"}", b"{}"],
], ids=["missing fields", "a number", "turns an int", "not UTF-8", "5000-digit qid"])
def test_someone_elses_trajectories_jsonl_names_the_file(tmp_path, rows):
    from hindsearch.eval import read_done

    p = write_lines(tmp_path / "out" / "trajectories.jsonl", *rows)
    with pytest.raises(ValueError, match=r"out/trajectories\.jsonl(:\d+)?: (not |invalid JSON: )"):
        read_done(p)


def test_eval_has_skip_bad_and_the_qa_error_names_it(tmp_path, capsys):
    """The QA error told users to pass --skip-bad to eval, which had no such flag."""
    from hindsearch.cli.eval import load_datasets
    from hindsearch.data.qa import QAError, load_qa

    p = write_lines(tmp_path / "qa.jsonl", '{"question": "q1", "golden_answers": ["a"]}', "{broken",
                    '{"question": "q3", "golden_answers": ["c"]}')
    with pytest.raises(QAError) as e:
        load_qa(p)
    assert "hindsearch eval --skip-bad" in str(e.value)
    with pytest.raises(SystemExit):
        main(["eval", "--help"])
    assert "--skip-bad" in capsys.readouterr().out
    assert [r.question for r in load_datasets([("d", str(p))], None, skip_bad=True)["d"]] == ["q1", "q3"]
    err = capsys.readouterr().err
    assert "qa.jsonl: skipped 1 bad QA row (--skip-bad), kept 2" in err and "line 2: bad QA row: invalid JSON" in err
    with pytest.raises(QAError, match="line 2"):
        load_datasets([("d", str(p))], None)


def test_thousands_of_keys_draw_the_first_and_say_so(tmp_path):
    """A folder logging 2,000 ``loss/*`` keys took a minute of legend layout per page; the panel draws 12."""
    text, page = page_of(run_folder(tmp_path / "run", jl({"step": 1, **{f"loss/k{i:04d}": 1.0 for i in range(2000)}})))
    assert "12 of 2000 series drawn" in text and len(page.imgs) == 1


GOOD_RESULT = {"method": "grpo", "seed": 0, "benchmarks": {"world": {"em": 0.5, "em_1hop": 0.6, "em_2hop": 0.4, "n": 10}}}

BAD_COMPARES = {
    "compare.json wrong types": {"compare.json": b'{"methods": [1, null, "grpo"], "seeds": ["a", Infinity, 1e308, 0]}'},
    "compare.json not UTF-8": {"compare.json": b'{"methods": ["\xff"]}'},
    "compare.json deep": {"compare.json": b'{"methods": ' + b"[" * 100_000 + b"]" * 100_000 + b"}"},
    "results deep": {"grpo-s0/results.json": b'{"benchmarks": ' + b"[" * 100_000 + b"]" * 100_000 + b"}"},
    "results seed a string": {"grpo-s0/results.json": b'{"method": "grpo", "seed": "zero", "benchmarks": {"world": {"em": 0.5}}}'},
    "results step_s NaN": {"grpo-s0/results.json": b'{"method": "grpo", "seed": 0, "step_s": NaN, "benchmarks": {}}'},
    "results bench keys odd": {"grpo-s0/results.json": b'{"method": "grpo", "seed": 0, "benchmarks": {"$x^$": {"em": 0.5}, "\\ud800": {"em": 1}}}'},
    "curves.png a folder": {"curves.png/x": b""},
    "curves.png not a PNG": {"curves.png": b"\xff\xfe not a png"},
    "test trajectories torn": {"grpo-s0/done.json": b"{}", "hindsearch-s0/done.json": b"{}",
                               "grpo-s0/eval/test/trajectories.jsonl": b'{"qid": 1, "em": NaN}\n{"qid"',
                               "hindsearch-s0/eval/test/trajectories.jsonl": b"\xff\n"},
}


@pytest.mark.parametrize("name", sorted(BAD_COMPARES))
def test_every_bad_compare_folder_still_writes_the_page(name, tmp_path):
    cmp = tmp_path / "cmp"
    for m in ("grpo", "hindsearch"):
        run_folder(cmp / f"{m}-s0", files={"results.json": json.dumps({**GOOD_RESULT, "method": m}).encode()})
    (cmp / "compare.json").write_text(json.dumps({"methods": ["grpo", "hindsearch"], "seeds": [0]}))
    for rel, data in BAD_COMPARES[name].items():
        (cmp / rel).parent.mkdir(parents=True, exist_ok=True)
        (cmp / rel).write_bytes(data)
    assert main(["report", str(cmp)]) == 0
    html = (cmp / "report.html").read_bytes().decode("utf-8")
    assert "Comparison results" in html and html.count('<section class="run"') == 2
