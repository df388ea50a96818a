"""Search-R1 protocol parsing and EM/F1 on hand-written transcripts and on real Search-R1 rollouts."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from hindsearch.agent import protocol
from hindsearch.agent.protocol import STOP_STRINGS, extract_answer, parse_action
from hindsearch.records import Passage, make_contents
from hindsearch.rewards import exact_match, f1_score, normalize_answer

ROS = Path(__file__).resolve().parents[1] / ".." / "shared" / "data" / "ros-trajectories"


@pytest.mark.parametrize(
    "turn, expected",
    [
        ("<think>need info</think>\n<search> capital of France </search>", ("search", "capital of France")),
        ("<search>\n multi\nline query \n</search>", ("search", "multi\nline query")),
        ("<answer> Paris </answer>", ("answer", "Paris")),
        # the first well-formed action wins, whatever its kind
        ("<search> a </search> then <answer> b </answer>", ("search", "a")),
        ("<answer> b </answer><search> a </search>", ("answer", "b")),
        # mismatched / unclosed / wrong-case tags are invalid
        ("<search> a </answer>", (None, "")),
        ("<search> never closed", (None, "")),
        ("I think. </search>", (None, "")),
        ("<SEARCH> a </SEARCH>", (None, "")),
        ("", (None, "")),
        # an unclosed tag before a well-formed one: the regex finds the well-formed one (non-greedy)
        ("<answer> x <search> q </search>", ("search", "q")),
        ("<search></search>", ("search", "")),
    ],
)
def test_parse_action(turn, expected):
    assert parse_action(turn) == expected


def test_extract_answer_last_and_completion_only():
    prompt = protocol.user_message("Who is X")  # holds the example <answer> Beijing </answer>
    assert "<answer> Beijing </answer>" in prompt
    assert extract_answer(prompt) == "Beijing"  # why the prompt must never be parsed
    completion = "<search> x </search>\n\n<information>Doc 1(Title: X) ...</information>\n\n<answer> first </answer> <answer> Last One </answer>"
    assert extract_answer(completion) == "Last One"
    assert extract_answer("<answer> unclosed") is None
    assert extract_answer("<answer>\n</answer>") == ""
    assert exact_match(extract_answer("<answer>\n</answer>"), [""]) == 0.0
    assert exact_match(None, ["x"]) == 0.0 and f1_score(None, ["x"]) == 0.0


@pytest.mark.parametrize(
    "pred, golds, em",
    [
        ("Paris", ["paris"], 1.0),
        ("  The  Eiffel   Tower. ", ["eiffel tower"], 1.0),
        ("an apple", ["Apple"], 1.0),
        ("A.B.C.", ["abc"], 1.0),
        ("Theodore", ["odore"], 0.0),  # articles only as whole words
        ("Paris, France", ["Paris"], 0.0),
        ("James Madison", ["john adams", "James  Madison!"], 1.0),
        ("", ["anything"], 0.0),
        ("yes", ["yes"], 1.0),
    ],
)
def test_exact_match_cases(pred, golds, em):
    assert exact_match(pred, golds) == em


def test_f1_and_normalize():
    assert normalize_answer("The  Quick, brown FOX!") == "quick brown fox"
    assert f1_score("Paris France", ["Paris"]) == pytest.approx(2 * 0.5 * 1 / 1.5)
    assert f1_score("no", ["yes"]) == 0.0 and f1_score("yes", ["yes"]) == 1.0


def test_information_block_and_notice_bytes():
    docs = [Passage("1", make_contents("Paris", "Paris is the capital.")), Passage("2", make_contents("Lyon", "Lyon is a city."))]
    block = protocol.information_block(docs)
    assert block == '\n\n<information>Doc 1(Title: "Paris") Paris is the capital.\nDoc 2(Title: "Lyon") Lyon is a city.</information>\n\n'
    assert protocol.information_block([]) == "\n\n<information></information>\n\n"
    assert protocol.INVALID_NOTICE.startswith("\nMy previous action is invalid.")


def cut_at_stop(text: str) -> tuple[str, str | None]:
    """Cut text right after the first ``</search>`` or ``</answer>``: ``(kept text, stop string or None)``."""
    best: tuple[int, str] | None = None
    for s in STOP_STRINGS:
        i = text.find(s)
        if i >= 0 and (best is None or i < best[0]):
            best = (i, s)
    if best is None:
        return text, None
    return text[: best[0] + len(best[1])], best[1]


def test_cut_at_stop():
    assert cut_at_stop("a <search> q </search> tail <answer>") == ("a <search> q </search>", "</search>")
    assert cut_at_stop("<answer> x </answer></search>") == ("<answer> x </answer>", "</answer>")
    assert cut_at_stop("no stop") == ("no stop", None)


def full_transcript_turns(text: str) -> list[tuple[str | None, str]]:
    """Split a whole Search-R1 rollout into model turns (text between observations) and parse each."""
    chunks, rest = [], text
    while rest:
        cut, stop = cut_at_stop(rest)
        chunks.append(cut)
        rest = rest[len(cut):]
        if stop is None:
            break
        for obs_end in ("</information>\n\n",):
            if rest.startswith("\n\n<information>") and obs_end in rest:
                rest = rest[rest.index(obs_end) + len(obs_end):]
    return [parse_action(c) for c in chunks if c.strip()]


def test_hand_written_transcript_turns():
    text = (
        "<think> I need the founding year. </think>\n<search> Citibank founded </search>\n\n"
        "<information>Doc 1(Title: Citibank) founded 1812 <answer> fake </answer></information>\n\n"
        "<think> 1812: Madison. </think>\n<answer> James Madison </answer>"
    )
    assert full_transcript_turns(text) == [("search", "Citibank founded"), ("answer", "James Madison")]
    assert extract_answer(text) == "James Madison"  # the last answer, not the one inside a doc


ROS_FILES = sorted(ROS.glob("*/intermediate_data.json"))


@pytest.mark.skipif(not ROS_FILES, reason="../shared/data/ros-trajectories not present")
def test_real_search_r1_rollouts_reproduce_pred_and_em():
    """375 real Search-R1 evaluation rollouts (Bamboogle, 3 runs): their pred and EM come back.

    FlashRAG writes ``pred = ""`` when no ``<answer>`` exists; we return None (both score 0).
    Their extraction runs on the response only here, so no prompt-coupling difference arises.
    """
    n = 0
    invalid_seen = 0
    for f in ROS_FILES:
        for row in json.loads(f.read_text()):
            out = row["output"]
            ours = extract_answer(out["final_response"])
            assert (ours if ours is not None else "") == out["pred"], (f.parent.name, row["id"])
            assert exact_match(ours, row["golden_answers"]) == out["metric_score"]["em"], (f.parent.name, row["id"])
            assert f1_score(ours, row["golden_answers"]) == pytest.approx(out["metric_score"]["f1"]), (f.parent.name, row["id"])
            invalid_seen += protocol.INVALID_NOTICE.strip() in out["final_response"]
            n += 1
    assert n == 375 and invalid_seen > 0
