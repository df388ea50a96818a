"""Search-R1 protocol parsing and EM/F1 on hand-written transcripts and on real Search-R1 rollouts."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from hindsearch.agent import protocol
from hindsearch.agent.protocol import STOP_STRINGS, extract_answer, parse_action
from hindsearch.records import Passage, make_contents
from hindsearch.answers import exact_match, f1_score, normalize_answer

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


# ------------------------------------------------------------------ the query mask: one algorithm, rollouts and demos
class PieceTokenizer:
    """A tokenizer double with a chosen vocabulary: greedy longest match over byte pieces (every single byte is a
    piece, so any text encodes); ``decode`` joins the bytes, invalid UTF-8 as U+FFFD, as byte-level tokenizers do;
    offsets give each token the characters its bytes fall in, as a fast tokenizer's ``offset_mapping`` does."""

    chat_template = None

    def __init__(self, pieces: list[str]) -> None:
        self.pieces = [bytes([b]) for b in range(256)] + [p.encode() for p in pieces]

    def __call__(self, text: str, add_special_tokens: bool = False, return_offsets_mapping: bool = False) -> dict:
        data, ids, spans, i = text.encode(), [], [], 0
        char_of = [c for c, ch in enumerate(text) for _ in ch.encode()]
        while i < len(data):
            j = max((k for k, p in enumerate(self.pieces) if data.startswith(p, i)), key=lambda k: len(self.pieces[k]))
            ids.append(j)
            spans.append((char_of[i], char_of[i + len(self.pieces[j]) - 1] + 1))
            i += len(self.pieces[j])
        return {"input_ids": ids, "offset_mapping": spans} if return_offsets_mapping else {"input_ids": ids}

    def encode(self, text: str) -> list[int]:
        return self(text)["input_ids"]

    def decode(self, ids, skip_special_tokens: bool = False) -> str:
        return b"".join(self.pieces[i] for i in ids).decode("utf-8", errors="replace")


def offsets_query_mask(tokenizer, text: str) -> list[int]:
    """The warm-up demos' former query mask (``train/demos.py`` before issue 22), kept here as the reference: the
    tokens of ``text``'s own encoding whose ``offset_mapping`` overlaps the stripped query."""
    enc = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
    m = protocol.ACTION_RE.search(text)
    if m is None or m.group(1) != "search":
        return [0] * len(enc["input_ids"])
    raw = m.group(2)
    lo, hi = m.start(2) + (len(raw) - len(raw.lstrip())), m.start(2) + len(raw.rstrip())
    return [int(a < hi and b > lo and b > a) for a, b in enc["offset_mapping"]]


# pieces that straddle the tag boundary: '>' merged with the space or the word after it, the space merged with '</'
STRADDLE = PieceTokenizer(["<search", "> ", ">Par", ">.", "></", " </", "</", "search>", " Paris", "Paris", "is",
                           " capital", " of", "<think>", "</think>", "<answer>", "</answer>", "\n"])


def _demo_mask(tok, text: str) -> list[int]:
    """The demo case: a model-written segment's own encoding, through ``tokenize_demo``."""
    from hindsearch.records import Trajectory
    from hindsearch.train.demos import tokenize_demo

    t = Trajectory(qid="q", question="Where?", golden_answers=["x"], prompt_ids=[], completion_text=text,
                   extra={"segments": [[text, True]]})
    return tokenize_demo(tok, t).query_mask


def _rollout_mask(tok, ids: list[int]) -> list[int]:
    """The rollout case: the sampled ids of a turn, as ``RolloutEngine.end_turn`` masks them."""
    return protocol.query_token_mask(tok, ids, tok.decode(ids, skip_special_tokens=False))


@pytest.mark.parametrize(
    "text, query_tokens",
    [
        ("<search> Paris </search>", ["Paris"]),  # '> ' holds the tag's '>' and the space: no query character
        ("<think>x</think>\n<search> Paris</search>", ["Paris"]),
        ("<search capital</search>", []),  # no well-formed action
        ("<answer> Paris </answer><search> Paris </search>", []),  # the first action answers
        ("<search> Paris of</search>", ["Paris", " of"]),
        # '>' merged with the first query characters: the straddling token is a query token
        ("<search>Paris</search>", [">Par", "is"]),
        ("<search>. Paris</search>", [">.", " Paris"]),
        ("<search> capital </search>", list("capital")),  # ' </' holds the space after the query, not the query
        ("<search>  Paris  of  </search>", [" Paris", " ", " of"]),  # inner whitespace stays
        ("<search> a </search> <search> b </search>", ["a"]),  # the first search only
    ],
)
def test_query_mask_rollouts_and_demos_agree_with_the_former_algorithms(text, query_tokens):
    tok = STRADDLE
    ids = tok.encode(text)
    roll, demo = _rollout_mask(tok, ids), _demo_mask(tok, text)
    assert roll == demo == offsets_query_mask(tok, text)  # the one algorithm = the demos' former one here
    assert [tok.decode([i]) for i, q in zip(ids, roll) if q] == query_tokens


def test_query_mask_on_sampled_ids_that_are_not_the_tokenizers_own_encoding():
    """A model may sample any split of its text: the mask is read from the ids themselves."""
    tok = STRADDLE
    canonical = tok.encode("<search>Paris</search>")
    piece = {p: i for i, p in enumerate(tok.pieces)}
    sampled = [piece[p] for p in (b"<search", b">", b"P", b"a", b"r", b"is", b"</", b"search>")]
    assert tok.decode(sampled) == tok.decode(canonical) and sampled != canonical
    assert [tok.decode([i]) for i, q in zip(sampled, _rollout_mask(tok, sampled)) if q] == ["P", "a", "r", "is"]
    assert [tok.decode([i]) for i, q in zip(canonical, _rollout_mask(tok, canonical)) if q] == [">Par", "is"]


def test_query_mask_where_the_former_algorithms_disagreed():
    """The two cases where the rollouts' and the demos' former algorithms differed; the rollouts' answer is kept."""
    tok = STRADDLE
    # an empty query: '></' straddles the empty query's position; the offsets rule marked it, a query of no
    # characters has no token (the rollouts' rule, kept)
    text = "<search></search>"
    assert [tok.decode([i]) for i in tok.encode(text)] == ["<search", "></", "search>"]
    assert offsets_query_mask(tok, text) == [0, 1, 0]
    assert _rollout_mask(tok, tok.encode(text)) == _demo_mask(tok, text) == [0, 0, 0]
    # a character split over byte tokens: offsets give both bytes of 'é' the character; incremental decoding gives
    # the second byte an empty span (its prefix decodes to as many characters as the first's), so only the first
    # byte is a query token (the rollouts' rule, kept: sampled ids have no offsets)
    text = "<search>é</search>"
    ids = tok.encode(text)
    assert [tok.decode([i]) for i in ids] == ["<search", ">", "\ufffd", "\ufffd", "</", "search>"]
    assert offsets_query_mask(tok, text) == [0, 0, 1, 1, 0, 0]
    assert _rollout_mask(tok, ids) == _demo_mask(tok, text) == [0, 0, 1, 0, 0, 0]


def test_query_mask_on_a_real_tokenizer_with_straddling_tags(tok):
    """SmolLM2's BPE merges '>' with the character after it ('>.', '>>') and the empty query's '></'."""
    for text, query_tokens in [("<search>.Paris</search>", [">.", "Paris"]),
                               ("<search>>Paris</search>", [">>", "Paris"]),
                               ("<search> capital of France </search>", [" capital", " of", " France"]),
                               ("<search></search>", [])]:
        ids = tok(text, add_special_tokens=False)["input_ids"]
        roll, demo = _rollout_mask(tok, ids), _demo_mask(tok, text)
        assert roll == demo
        assert [tok.decode([i]) for i, q in zip(ids, roll) if q] == query_tokens, text
        if query_tokens:
            assert roll == offsets_query_mask(tok, text)


def test_query_completion_cut_and_text(tok):
    ids = tok(" Marlow birthplace </search> more", add_special_tokens=False)["input_ids"]
    kept, closed = protocol.cut_at_search_close(tok, ids)
    assert closed and tok.decode(kept).rstrip().endswith("</search>") and "more" not in tok.decode(kept)
    kept, closed = protocol.cut_at_search_close(tok, ids[:2])
    assert not closed and kept == ids[:2]
    # a '</search>' that starts in the lead (the proposed token) counts
    lead = tok("</", add_special_tokens=False)["input_ids"]
    rest = tok("search> x", add_special_tokens=False)["input_ids"]
    assert protocol.cut_at_search_close(tok, rest, lead)[1]
    query_ids = tok(" Edwin Marlow </search>", add_special_tokens=False)["input_ids"]
    assert protocol.query_text(tok, query_ids) == "Edwin Marlow"
    assert tok.decode(protocol.search_close_ids(tok)) == "</search>"


def test_any_tag_and_stop_strings():
    assert protocol.TAG_RE.search("the answer is <answer> x") and protocol.TAG_RE.search("</information>")
    assert not protocol.TAG_RE.search("search for the answer") and not protocol.TAG_RE.search("<Search>")
    assert all(cut_at_stop("x " + s + " y")[0] == "x " + s for s in protocol.STOP_STRINGS)
    assert protocol.ACTION_TAGS == ("<search>", "<answer>")
