"""QA loaders on the real slices in ../shared/data, plus hand-made bad files."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from hindsearch.data.qa import QAError, QAStats, load_hf, load_qa, paragraphs_of, read_rows
from hindsearch.data.world import generate_world, write_world

SHARED = Path(__file__).resolve().parents[1].parent / "shared" / "data"
needs_shared = pytest.mark.skipif(not SHARED.is_dir(), reason=f"real data slices not found at {SHARED}")

# (file, rows, first id, first gold answer, hops of the first row, first evidence)
REAL = [
    ("flashrag-toy/test.jsonl", 17, "test_0", "Wilhelm Conrad Röntgen", None, []),
    ("search-r1/test.parquet", 3610, "test_0", "Wilhelm Conrad Röntgen", None, []),
    ("ros-subsample/nq/test.jsonl", 1000, "test_3283", "Jesus Christ", None, []),
    ("ros-subsample/triviaqa/test.jsonl", 1000, "test_6233", "Mark Twain", None, []),
    ("ros-subsample/popqa/test.jsonl", 1000, "test_10207", "Ralph Rainger", None, []),
    ("ros-subsample/bamboogle/test.jsonl", 125, "test_0", "james madison", None, []),
    ("agentic-rag-qa/nq_test_questions_and_answers.json", 3610, None, "14 December 1972 UTC", None, []),
    ("agentic-rag-qa/hotpotqa_test_questions_and_answers.json", 7405, None, "yes", None, []),
    ("agentic-rag-qa/2wikimultihop_test_questions_and_answers.json", 12576, None, "Małgorzata Braunek", None, []),
    ("agentic-rag-qa/musique_test_questions_and_answers.json", 2417, None, "Miquette Giraudy", None, []),
    ("agentic-rag-qa/bamboogle_test_questions_and_answers.json", 125, None, "james madison", None, []),
    ("trustmargin-2wiki/dev.json", 1000, "0", "Małgorzata Braunek", None, []),
    ("ircot-hotpotqa/dev_subsampled.jsonl", 500, "5a8c7595554299585d9e36b6", "Chief of Protocol", 2,
     ["Shirley Temple", "Kiss and Tell (1945 film)"]),
    ("migres/hotpot.json", 200, "5a7f6fd75542992e7d278cfa", "Rush", 2, ["Nobody's Hero", "Neil Peart"]),
    ("migres/musique.json", 200, "2hop__574419_270105", "Stanley", 2,
     ["Mountrail County Courthouse", "Van Hook Township, Mountrail County, North Dakota"]),
    ("migres/wikihop.json", 200, "b088d3ca08e211ebbda4ac1f6bf848b6", "Free Guy", 2,  # bridge_comparison
     ["Forbidden Ground", "Free Guy", "Pál Gábor", "Shawn Levy"]),
    ("migres/odqa.json", 400, "-3403542892395107762", "A simple majority", None, []),
    ("hipporag/hotpotqa_train.json", 100, "5a77ec115542992a6e59dff7", "a spirit", 2, ["Alû", "Lilu (mythology)"]),
    ("hipporag/musique_train.json", 100, "2hop__150763_14904", "G. Stanley Hall", 2, None),
    ("ros-trajectories/bamboogle_2026_04_25_17_32_search_r1_base_seed1/intermediate_data.json", 125, "test_0",
     "james madison", None, []),
]


@needs_shared
@pytest.mark.parametrize("rel,rows,first_id,answer,hops,evidence", REAL, ids=[r[0] for r in REAL])
def test_real_slices(rel, rows, first_id, answer, hops, evidence):
    recs = load_qa(SHARED / rel, name="bench")
    assert len(recs) == rows
    r = recs[0]
    if first_id is not None:
        assert r.id == first_id
    assert r.golden_answers[0] == answer and r.hops == hops
    if evidence is not None:
        assert r.evidence == evidence
    assert all(x.question and x.golden_answers and all(isinstance(a, str) and a for a in x.golden_answers)
               for x in recs)
    assert len({x.id for x in recs}) == rows  # ids present and unique (defaults included)


@needs_shared
def test_format_specifics():
    pq_recs = load_qa(SHARED / "search-r1/test.parquet", limit=5)
    assert len(pq_recs) == 5 and pq_recs[0].data_source == "nq"  # numpy golden_answers -> list[str]
    assert isinstance(pq_recs[0].golden_answers, list)
    trivia = load_qa(SHARED / "ros-subsample/triviaqa/test.jsonl", limit=1)[0]
    assert trivia.golden_answers[:3] == ["Mark Twain", "Thomas Jefferson Snodgrass", "Sam Clemens"]
    popqa = load_qa(SHARED / "ros-subsample/popqa/test.jsonl", limit=1)[0]
    assert popqa.golden_answers == ["Ralph Rainger", "Ralph Reichenthal"] and popqa.metadata["prop"] == "composer"
    tm = load_qa(SHARED / "trustmargin-2wiki/dev.json")
    assert tm[1].golden_answers == ["Mask of Fu Manchu", "The Mask of Fu Manchu"]  # answer list
    assert tm[2].golden_answers == ["12 June 1516"]  # answer string
    odqa = load_qa(SHARED / "migres/odqa.json")
    assert odqa[1].golden_answers == ["President"] and odqa[1].data_source == "nq"  # short_answers row
    mus = load_qa(SHARED / "migres/musique.json", limit=1)[0]
    assert mus.metadata["question_decomposition"][0]["answer"] == "Mountrail County"
    wiki = load_qa(SHARED / "migres/wikihop.json", limit=1)[0]
    assert wiki.metadata["type"] == "bridge_comparison" and len(wiki.metadata["evidences"]) == 4
    hm = load_qa(SHARED / "hipporag/musique_train.json", limit=1)[0]
    assert hm.golden_answers[:2] == ["G. Stanley Hall", "Stanley Hall"]  # answer + answer_aliases


@needs_shared
def test_paragraphs_of_multi_hop_rows():
    _, _, hot = next(read_rows(SHARED / "migres/hotpot.json"))
    paras = paragraphs_of(hot)
    assert len(paras) == 10 and {p.title for p in paras if p.supporting} == {"Nobody's Hero", "Neil Peart"}
    jeff = next(p for p in paras if p.title == "Jeff Porcaro")
    assert jeff.text.startswith("Jeffrey Thomas Porcaro (April 1, 1954") and "  " not in jeff.text
    _, _, wk = next(read_rows(SHARED / "migres/wikihop.json"))
    assert all(" " in p.text and not p.text.startswith(" ") for p in paragraphs_of(wk))
    _, _, ir = next(read_rows(SHARED / "ircot-hotpotqa/dev_subsampled.jsonl"))
    assert sum(p.supporting for p in paragraphs_of(ir)) == 2
    _, _, mu = next(read_rows(SHARED / "migres/musique.json"))
    assert len(paragraphs_of(mu)) == 20 and sum(p.supporting for p in paragraphs_of(mu)) == 2
    assert paragraphs_of({"question": "q", "answer": "a"}) == []


def test_world_jsonl_round_trip(tmp_path):
    w = generate_world(0, 120)
    write_world(w, tmp_path)
    recs = load_qa(tmp_path / "dev.jsonl")
    assert [r.to_dict() for r in recs] == [r.to_dict() for r in w.splits["dev"]]
    assert {r.hops for r in recs} == {1, 2} and all(r.evidence for r in recs)


def _write(path: Path, lines: list[str]) -> Path:
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


@pytest.mark.parametrize("bad,reason", [
    ('{"question": "", "golden_answers": ["x"]}', "empty or missing question"),
    ('{"question": "q2"}', "missing or empty answers"),
    ('{"question": "q2", "golden_answers": []}', "missing or empty answers"),
    ('{"question": "q2", "answer": ""}', "missing or empty answers"),
    ('{"question": "q2", "golden_answers": [{"a": 1}]}', "not a string"),
    ('{"question": "q2", "golden_answers": ["x"]', "invalid JSON"),
    ('["q2", "x"]', "expected a JSON object"),
])
def test_bad_jsonl_row_names_file_and_line(tmp_path, bad, reason):
    path = _write(tmp_path / "qa.jsonl", ['{"question": "q1", "golden_answers": ["a"]}', bad,
                                          '{"question": "q3", "answer": ["b", "c"]}'])
    with pytest.raises(QAError) as e:
        load_qa(path)
    assert str(path) in str(e.value) and "line 2" in str(e.value) and reason in str(e.value)
    stats = QAStats()
    recs = load_qa(path, skip_bad=True, stats=stats)
    assert [r.question for r in recs] == ["q1", "q3"] and recs[1].golden_answers == ["b", "c"]
    assert stats.rows == 2 and stats.skipped == 1 and "line 2" in stats.errors[0]


def test_bad_json_list_item_and_parquet_row(tmp_path):
    path = tmp_path / "plain.json"
    path.write_text(json.dumps([{"question": "q1", "answer": "a"}, {"question": "q2", "answer": "b"},
                                {"question": "  ", "answer": "c"}]))
    with pytest.raises(QAError, match=r"plain\.json: item 3: bad QA row: empty or missing question"):
        load_qa(path)
    assert len(load_qa(path, skip_bad=True)) == 2 and len(load_qa(path, limit=1)) == 1
    (tmp_path / "one.json").write_text('{"question": "q", "answer": "a"}')  # one-row JSON Lines
    assert load_qa(tmp_path / "one.json")[0].golden_answers == ["a"]
    pq_path = tmp_path / "t.parquet"
    pq.write_table(pa.table({"question": ["q1", "q2"], "golden_answers": [["a"], []], "data_source": ["nq", "nq"]}),
                   pq_path)
    with pytest.raises(QAError, match=r"t\.parquet: row 2: bad QA row: missing or empty answers"):
        load_qa(pq_path)
    (tmp_path / "notlist.json").write_text('{"questions": ["q"]}')
    with pytest.raises(QAError, match="expected a JSON list"):
        load_qa(tmp_path / "notlist.json")
    (tmp_path / "broken.json").write_text('[{"question": "q",')
    with pytest.raises(QAError, match=r"broken\.json:1: invalid JSON"):
        load_qa(tmp_path / "broken.json")
    with pytest.raises(FileNotFoundError, match="missing.jsonl"):
        load_qa(tmp_path / "missing.jsonl")


@needs_shared
def test_load_hf_local_files_and_offline_hub(monkeypatch):
    import datasets.config
    import huggingface_hub.constants

    recs = load_hf("json", split="train", data_files=str(SHARED / "ros-subsample/bamboogle/test.jsonl"))
    assert len(recs) == 125 and recs[0].golden_answers == ["james madison"]
    monkeypatch.setattr(datasets.config, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    with pytest.raises(ConnectionError, match="RUC-NLPIR/FlashRAG_datasets"):
        load_hf("RUC-NLPIR/FlashRAG_datasets", split="test", name="nq")
