"""EM/F1 normalisation (SQuAD rules) and record round trips."""

import pytest

from hindsearch.records import Passage, QARecord, Trajectory, Turn, make_contents
from hindsearch.answers import answer_in_text, exact_match, f1_score, normalize_answer


@pytest.mark.parametrize(
    ("raw", "norm"),
    [
        ("The Eiffel Tower!", "eiffel tower"),
        ("  a   Tale of  Two Cities ", "tale of two cities"),
        ("An apple, the pear.", "apple pear"),
        ("Theatre", "theatre"),  # 'the' only as a whole word
        ("U.S.A.", "usa"),
        ("", ""),
    ],
)
def test_normalize(raw, norm):
    assert normalize_answer(raw) == norm


def test_exact_match_any_gold_and_empty():
    assert exact_match("the Beatles", ["Beatles", "Fab Four"]) == 1.0
    assert exact_match("Fab four.", ["Beatles", "Fab Four"]) == 1.0
    assert exact_match("Beatle", ["Beatles"]) == 0.0
    assert exact_match("", ["the"]) == 0.0  # empty answers never score
    assert exact_match(None, ["x"]) == 0.0
    assert exact_match("Paris", "paris") == 1.0


def test_f1():
    assert f1_score("new york city", ["New York"]) == pytest.approx(0.8)
    assert f1_score("yes", ["no"]) == 0.0
    assert f1_score("yes", ["Yes"]) == 1.0
    assert f1_score("completely wrong", ["Paris"]) == 0.0
    assert f1_score(None, ["Paris"]) == 0.0


def test_answer_in_text_whole_words():
    assert answer_in_text(["Ulm"], "Einstein was born in Ulm, Germany.")
    assert not answer_in_text(["Ulm"], "Ulmus is a tree genus.")


def test_passage_title_text():
    p = Passage("1", make_contents("Foo Bar", "Some text\nmore"))
    assert p.title == '"Foo Bar"' and p.bare_title == "Foo Bar" and p.text == "Some text\nmore"
    assert p.to_search_r1() == {"id": "1", "contents": '"Foo Bar"\nSome text\nmore'}


def test_trajectory_round_trip():
    t = Trajectory(
        qid="q1", question="Q?", golden_answers=["a"], prompt_ids=[1, 2], completion_ids=[3, 4, 5],
        gen_mask=[1, 1, 0], query_mask=[0, 1, 0], logprobs=[-0.1, -0.2, 0.0],
        turns=[Turn(action="search", content="q", gen_span=(0, 2), query_span=(1, 2), inject_span=(2, 3))],
    )
    d = t.to_dict()
    assert d["queries"] == ["q"] and d["num_searches"] == 1
    back = Trajectory.from_dict(d)
    assert back == t
    r = QARecord.from_dict({"id": "x", "question": "q", "golden_answers": ["a"], "unknown": 1})
    assert r.golden_answers == ["a"]


def test_em_reward_reads_only_the_text_the_model_wrote():
    """The TRL reward function computes EM from the model's own text and the gold answers: an ``<answer>`` in
    an injected block (Search-R1's invalid-action notice names the tags) is not the model's answer, and a
    model answer after it is; the result equals ``exact_match`` of the last model-written answer."""
    from hindsearch.agent.protocol import INVALID_NOTICE
    from hindsearch.train.reward_funcs import em_reward

    def traj(parts: list[tuple[str, bool]]) -> Trajectory:
        """Characters as token ids; ``(text, generated)`` parts; one turn per generated part."""
        t = Trajectory(qid="q", question="?", golden_answers=["Paris"], prompt_ids=[])
        for text, gen in parts:
            a = len(t.completion_ids)
            t.completion_ids += [ord(c) for c in text]
            if gen:
                t.turns.append(Turn(action="answer", gen_span=(a, len(t.completion_ids))))
        return t

    decode = lambda ids: "".join(map(chr, ids))  # noqa: E731
    wrong_then_notice = traj([("I think so", True), (INVALID_NOTICE.replace("and </answer>", "Paris </answer>"), False)])
    notice_then_right = traj([("no tag", True), (INVALID_NOTICE, False), ("<answer> paris </answer>", True)])
    right_then_wrong = traj([("<answer> Paris </answer>", True), ("<answer> Rome </answer>", True)])
    trajs = [wrong_then_notice, notice_then_right, right_then_wrong]
    texts = [t.model_text(decode) for t in trajs]
    assert texts[1] == "no tag<answer> paris </answer>"
    golds = [t.golden_answers for t in trajs]
    assert em_reward(["full text"] * 3, golden_answers=golds, model_text=texts) == [0.0, 1.0, 0.0]
    with pytest.raises(ValueError, match="2 model texts"):
        em_reward(["a"] * 3, golden_answers=golds, model_text=texts[:2])
