"""Dataset readers: every shared math row loads; ids are stable and unique; bad rows are named."""

import collections
import json
import logging
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from dynamo_jax.data.readers import DataError, load_files, load_rows, read_rows
from dynamo_jax.data.rows import content_id

MATH = Path(__file__).resolve().parents[1] / "data" / "math"


@pytest.fixture(scope="module")
def shared():
    out = {}
    for name in ("train.parquet", "valid.parquet", "test.jsonl"):
        rows, report = read_rows(MATH / name)
        out[name] = (rows, report)
    return out


def test_all_shared_rows_load(shared):
    sizes = {name: len(rows) for name, (rows, _) in shared.items()}
    assert sizes == {"train.parquet": 10_240, "valid.parquet": 512, "test.jsonl": 1_288}
    for rows, report in shared.values():
        assert report.skipped == 0
        assert [r.index for r in rows] == list(range(len(rows)))
        assert len({r.prompt_id for r in rows}) == len(rows)
        assert all(0 <= r.prompt_id < 2**63 for r in rows)
    assert shared["train.parquet"][1].empty_gold == 6  # present but empty ground truths


def test_shared_row_contents(shared):
    test_rows = shared["test.jsonl"][0]
    assert collections.Counter(r.source for r in test_rows) == {
        "aime": 30,
        "amc": 83,
        "math": 500,
        "olympiad_bench": 675,
    }
    assert "025" in {r.gold for r in test_rows}  # leading zeros survive (strings, not ints)
    assert all(r.rank is None and r.messages[0]["role"] == "user" for r in test_rows)
    train = shared["train.parquet"][0]
    assert train[0].gold == "843" and train[0].source == "math"
    assert all(r.rank is not None and 0.0 <= r.rank <= 1.0 for r in train)


def test_repeated_prompts_get_distinct_ids(shared):
    train = shared["train.parquet"][0]
    by_prompt = collections.defaultdict(list)
    for row in train:
        by_prompt[(row.source, row.messages[0]["content"])].append(row)
    repeated = [rows for rows in by_prompt.values() if len(rows) > 1]
    assert len(repeated) == 133
    for rows in repeated:
        first = rows[0]
        assert first.prompt_id == content_id(first.source, first.messages, first.gold, 0)
        assert len({r.prompt_id for r in rows}) == len(rows)
    # 15 repeated prompts have different answers: their ids must not depend on file order.
    assert sum(len({r.gold for r in rows}) > 1 for rows in repeated) == 15


def test_ids_survive_reshuffling(tmp_path, shared):
    rows = shared["valid.parquet"][0]
    table = pq.read_table(MATH / "valid.parquet")
    shuffled = table.take(list(reversed(range(table.num_rows))))
    pq.write_table(shuffled, tmp_path / "shuffled.parquet")
    reloaded = load_rows(tmp_path / "shuffled.parquet")

    def keyed(rs):  # exact repeats are interchangeable, so compare as a multiset
        return sorted((r.source, r.messages[0]["content"], r.gold, r.prompt_id) for r in rs)

    assert keyed(reloaded) == keyed(rows)
    assert [r.index for r in reloaded] == list(range(len(rows)))  # indices are positions


def test_same_problem_same_id_across_formats(tmp_path, shared):
    row = shared["valid.parquet"][0][0]
    line = {"prompt": row.messages[0]["content"], "answer": row.gold, "source": row.source}
    path = tmp_path / "one.jsonl"
    path.write_text(json.dumps(line) + "\n")
    assert load_rows(path)[0].prompt_id == row.prompt_id


def test_several_files_make_one_dataset_with_unique_ids():
    rows, reports = load_files([MATH / "valid.parquet", MATH / "test.jsonl"])
    assert len(rows) == 512 + 1_288 and [r.index for r in rows] == list(range(len(rows)))
    assert len({r.prompt_id for r in rows}) == len(rows)
    assert [r.loaded for r in reports] == [512, 1_288]


def _jsonl(tmp_path, records, name="data.jsonl"):
    path = tmp_path / name
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in records))
    return path


GOOD = {"prompt": "1+1?", "answer": "2", "source": "toy"}


@pytest.mark.parametrize(
    "bad, field",
    [
        ({"prompt": "1+1?", "source": "toy"}, "answer"),  # missing answer
        ({"prompt": "1+1?", "answer": None, "source": "toy"}, "answer"),
        ({"prompt": "1+1?", "answer": 2, "source": "toy"}, "answer"),  # wrong type
        ({"prompt": 123, "answer": "2", "source": "toy"}, "prompt"),  # non-string prompt
        ({"prompt": [], "answer": "2", "source": "toy"}, "prompt"),  # empty messages
        ({"prompt": "   ", "answer": "2", "source": "toy"}, "prompt"),
        ({"prompt": [{"role": "user"}], "answer": "2"}, "prompt[0].content"),
        ({"prompt": [{"role": "robot", "content": "x"}], "answer": "2"}, "prompt[0].role"),
        ({"prompt": [{"role": "assistant", "content": "x"}], "answer": "2"}, "prompt"),
        ({"prompt": ["x"], "answer": "2"}, "prompt[0]"),
        ({"prompt": "1+1?", "answer": "2", "source": 7}, "source"),
        ({"prompt": "1+1?", "answer": "2", "rank": "high"}, "rank"),
        ({"prompt": "1+1?", "answer": "2", "rank": 1.5}, "rank"),
        ({"prompt": "1+1?", "answer": "2", "id": -3}, "id"),
        ("[1, 2]", "<line>"),
        ("{not json", "<line>"),
    ],
)
def test_malformed_jsonl_row_names_file_line_and_field(tmp_path, bad, field):
    path = _jsonl(tmp_path, [GOOD, GOOD | {"prompt": "2+2?"}, bad])
    with pytest.raises(DataError) as info:
        load_rows(path)
    message = str(info.value)
    assert str(path) in message and "line 3" in message and f"field '{field}'" in message


def test_skip_mode_counts_and_logs(tmp_path, caplog):
    records = [GOOD, {"prompt": 1, "answer": "2"}, "", GOOD | {"prompt": "3?"}, {"answer": "x"}]
    path = _jsonl(tmp_path, records)
    with caplog.at_level(logging.WARNING, logger="dynamo_jax.data.readers"):
        rows, report = read_rows(path, on_bad_row="skip")
    assert [r.messages[0]["content"] for r in rows] == ["1+1?", "3?"]
    assert [r.index for r in rows] == [0, 1]
    assert (report.loaded, report.skipped) == (2, 2)
    assert "line 2" in caplog.text and "line 5" in caplog.text and "skipped 2" in caplog.text


def test_source_defaults_to_file_stem_and_explicit_ids(tmp_path):
    path = _jsonl(
        tmp_path, [GOOD | {"id": 17}, {"prompt": "x", "answer": "1", "id": "p-9"}], "aime24.jsonl"
    )
    rows = load_rows(path)
    assert rows[0].prompt_id == 17 and rows[1].source == "aime24"
    assert rows[1].prompt_id != 0 and rows[1].prompt_id == load_rows(path)[1].prompt_id


def test_duplicate_explicit_ids_are_an_error(tmp_path):
    path = _jsonl(tmp_path, [GOOD | {"id": 5}, GOOD | {"prompt": "other", "id": 5}])
    with pytest.raises(
        DataError, match=r"line 2: field 'id': duplicate prompt id 5 \(first at .*line 1\)"
    ):
        load_rows(path)


def _parquet(tmp_path, records, schema=None):
    path = tmp_path / "data.parquet"
    pq.write_table(pa.Table.from_pylist(records, schema=schema), path)
    return path


def _verl(content="q", gold="1", source="math", rank=0.5):
    return {
        "data_source": source,
        "prompt": [{"role": "user", "content": content}],
        "reward_model": {"ground_truth": gold, "style": "rule"},
        "rank": rank,
    }


@pytest.mark.parametrize(
    "bad, field",
    [
        (_verl(gold=None), "reward_model.ground_truth"),
        (_verl() | {"reward_model": None}, "reward_model"),
        (_verl() | {"prompt": []}, "prompt"),
        (_verl() | {"prompt": None}, "prompt"),
        (_verl(source=None), "data_source"),
        (_verl(rank=2.0), "rank"),
    ],
)
def test_malformed_parquet_row_names_file_row_and_field(tmp_path, bad, field):
    path = _parquet(tmp_path, [_verl("a"), _verl("b"), bad])
    with pytest.raises(DataError) as info:
        load_rows(path)
    message = str(info.value)
    assert str(path) in message and "row 2" in message and f"field '{field}'" in message


def test_parquet_missing_column_and_unknown_extension(tmp_path):
    path = _parquet(tmp_path, [{"data_source": "x", "prompt": [{"role": "user", "content": "q"}]}])
    with pytest.raises(DataError, match=r"missing column\(s\) \['reward_model'\]"):
        load_rows(path)
    with pytest.raises(DataError, match="cannot tell the format"):
        load_rows(_jsonl(tmp_path, [GOOD], "data.txt"))
    with pytest.raises(DataError, match="no such file"):
        load_rows(tmp_path / "absent.jsonl")
