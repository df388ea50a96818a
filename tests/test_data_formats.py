"""HotpotQA-style ``{title: [sentences]}`` corpora, and the hop count of HotpotQA / 2Wiki question types.

The real-file tests read ``../shared/data`` relative to the repository root: skipped when it is
absent, except under ``CI=true``, where a missing folder fails (CI must always run them).
"""

import json

import pytest

from hindsearch.data.corpus import CorpusError, CorpusStats, read_corpus
from hindsearch.data.qa import TYPE_HOPS, load_qa, row_to_record

from shared_data import shared  # noqa: E402 - tests dir on sys.path


# ---------------------------------------------------------------- {title: [sentences]} corpora
def test_title_to_sentences_corpus(tmp_path):
    path = tmp_path / "corpus.json"
    path.write_text(json.dumps({
        "Demon Dice": ["Demon Dice is a dice game.", " It was created by Lester Smith."],
        "Plain": "One string of text. ",
        "Numbers": [1, 2],
    }))
    with pytest.raises(CorpusError, match=r"corpus.json:3: bad corpus item: title 'Numbers': expected a list of "
                                          r"sentences \(strings\) or a string, got list"):
        read_corpus(path)
    stats = CorpusStats()
    ps = read_corpus(path, skip_bad=True, stats=stats)
    assert [p.id for p in ps] == ["1", "2"] and (stats.rows, stats.skipped) == (2, 1)
    assert ps[0].contents == '"Demon Dice"\nDemon Dice is a dice game. It was created by Lester Smith.'
    assert ps[0].bare_title == "Demon Dice"
    assert ps[1].contents == '"Plain"\nOne string of text.'


def test_title_corpus_with_wrong_values_names_the_format(tmp_path):
    path = tmp_path / "qa.json"
    path.write_text(json.dumps({"data": [{"question": "q", "answer": "a"}]}))
    with pytest.raises(CorpusError, match=r"title 'data': expected a list of sentences \(strings\) or a string, "
                                          r"got list \(a .json corpus object maps titles to sentences\)"):
        read_corpus(path)
    path.write_text(json.dumps({"title": "T", "text": "one row, not in a list"}))
    with pytest.raises(CorpusError, match="looks like a single row"):
        read_corpus(path)
    path.write_text("42")
    with pytest.raises(CorpusError, match="list of objects or an object mapping titles to sentences, got int"):
        read_corpus(path)


def test_real_hotpotqa_train_corpus_loads_and_serves_its_questions(tmp_path):
    corpus = read_corpus(shared("hipporag/hotpotqa_train_corpus.json"))
    assert len(corpus) == 994 and len({p.id for p in corpus}) == 994
    first = corpus[0]
    assert first.bare_title == "Demon Dice"
    assert first.contents.startswith('"Demon Dice"\nDemon Dice, originally published as Chaos Progenitus, is a '
                                     "collectible dice game")
    assert "Tim Brown. In it, each player" in first.contents  # sentences joined with their own leading space
    # every supporting title of the 100 HotpotQA training questions shipped with it is a passage title
    titles = {p.bare_title for p in corpus}
    questions = load_qa(shared("hipporag/hotpotqa_train.json"))
    evidence = [t for q in questions for t in q.evidence]
    assert len(evidence) == 200 and all(t in titles for t in evidence)
    # and it indexes and retrieves as a corpus
    from hindsearch.retrieval.factory import build_index, load_index

    build_index(corpus, tmp_path / "idx", kind="bm25", show_progress=False)
    hit = load_index(tmp_path / "idx").retrieve(["collectible dice game Chaos Progenitus"], k=1)[0][0]
    assert hit.id == first.id


# ---------------------------------------------------------------- hop counts by question type
def _row(qtype, titles, **extra):
    return {"_id": "x", "type": qtype, "question": "q?", "answer": "a",
            "supporting_facts": [[t, 0] for t in titles], **extra}


@pytest.mark.parametrize("qtype,titles", [
    ("comparison", ["Film A", "Film B"]),
    ("bridge_comparison", ["Film A", "Film B", "Director A", "Director B"]),
    ("inference", ["Person", "Mother"]),
    ("compositional", ["Film", "Director"]),
    ("bridge", ["Band", "Drummer"]),
])
def test_question_type_sets_the_hops_not_the_title_count(qtype, titles):
    rec = row_to_record(_row(qtype, titles), "d")
    assert rec.hops == TYPE_HOPS[qtype] == 2
    assert rec.evidence == titles and rec.metadata["type"] == qtype


def test_hop_precedence():
    assert row_to_record(_row("bridge_comparison", ["A", "B", "C", "D"], hops=3), "d").hops == 3  # explicit wins
    flashrag = {"id": "t1", "question": "q?", "golden_answers": ["a"], "metadata": {"type": "bridge_comparison"}}
    assert row_to_record(flashrag, "d").hops == 2  # FlashRAG keeps the type in metadata
    assert row_to_record(_row("unknown", ["A", "B", "C"]), "d").hops == 3  # unknown type: title count
    assert row_to_record({"question": "q?", "answer": "a"}, "d").hops is None


def test_real_2wiki_types():
    recs = load_qa(shared("migres/wikihop.json"))
    by_type: dict[str, set] = {}
    for r in recs:
        by_type.setdefault(r.metadata["type"], set()).add((r.hops, len(r.evidence)))
    assert by_type == {"comparison": {(2, 2)}, "compositional": {(2, 2)}, "inference": {(2, 2)},
                       "bridge_comparison": {(2, 4)}}
