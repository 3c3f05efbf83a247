"""Dataset readers: every shared math row loads; ids are stable and unique; bad rows are named."""

import collections
import dataclasses
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


def _jsonl_bytes(tmp_path, lines: list[bytes], name="data.jsonl"):
    path = tmp_path / name
    path.write_bytes(b"".join(line + b"\n" for line in lines))
    return path


GOOD_LINE = json.dumps(GOOD).encode()
DEEP = 100_000

# (id, raw line 2, field named in the error, words in the error)
UNREADABLE_LINES = [
    ("latin-1", '{"prompt": "caf\xe9?", "answer": "2"}'.encode("latin-1"), "<line>", "not UTF-8"),
    ("nul-and-ff", b'{"prompt": "\xff\x00", "answer": "2"}', "<line>", "not UTF-8"),
    ("surrogate-prompt", b'{"prompt": "\\ud800", "answer": "2"}', "prompt", "lone surrogate"),
    ("surrogate-answer", b'{"prompt": "q", "answer": "\\udfff"}', "answer", "lone surrogate"),
    ("surrogate-source", b'{"prompt": "q", "answer": "2", "source": "\\ud800"}', "source", "lone"),
    (
        "surrogate-message",
        b'{"prompt": [{"role": "user", "content": "x\\ud83d"}], "answer": "2"}',
        "prompt[0].content",
        "lone surrogate",
    ),
    ("surrogate-id", b'{"prompt": "q", "answer": "2", "id": "\\ud800"}', "id", "not valid Unicode"),
    ("deep-array", b"[" * DEEP + b"]" * DEEP, "<line>", "nested too deeply"),
    (
        "deep-object",
        b'{"prompt": ' + b'{"a": ' * DEEP + b"1" + b"}" * DEEP + b"}",
        "<line>",
        "deep",
    ),
    ("huge-int", b'{"prompt": "q", "answer": ' + b"9" * 5000 + b"}", "<line>", "invalid JSON"),
]


@pytest.mark.parametrize(
    "raw, field, words", [c[1:] for c in UNREADABLE_LINES], ids=[c[0] for c in UNREADABLE_LINES]
)
def test_undecodable_jsonl_line_is_an_error_or_a_counted_skip(tmp_path, caplog, raw, field, words):
    # Non-UTF-8 bytes, `"\ud800"` (valid JSON, invalid Unicode) and 100k-deep nesting used to
    # crash both modes with a bare UnicodeDecodeError / UnicodeEncodeError / RecursionError.
    path = _jsonl_bytes(tmp_path, [GOOD_LINE, raw, json.dumps(GOOD | {"prompt": "3?"}).encode()])
    with pytest.raises(DataError) as info:
        load_rows(path)
    message = str(info.value)
    assert message.startswith(f"{path}: line 2: field '{field}': ") and words in message, message
    with caplog.at_level(logging.WARNING, logger="dynamo_jax.data.readers"):
        rows, report = read_rows(path, on_bad_row="skip")
    assert [r.messages[0]["content"] for r in rows] == ["1+1?", "3?"]
    assert (report.loaded, report.skipped) == (2, 1)
    assert f"{path}: line 2: field '{field}'" in caplog.text and "skipped 1" in caplog.text


def test_utf8_byte_order_mark_is_accepted(tmp_path):
    path = _jsonl_bytes(tmp_path, [b"\xef\xbb\xbf" + GOOD_LINE, GOOD_LINE.replace(b"1+1", b"2+2")])
    rows = load_rows(path)
    assert [r.messages[0]["content"] for r in rows] == ["1+1?", "2+2?"]
    # The mark is not part of the data: same id as the file without it.
    plain = _jsonl_bytes(tmp_path, [GOOD_LINE], "plain.jsonl")
    assert rows[0].prompt_id == load_rows(plain)[0].prompt_id
    # Only at the start of the file; elsewhere it is a bad line.
    path = _jsonl_bytes(tmp_path, [GOOD_LINE, b"\xef\xbb\xbf" + GOOD_LINE], "late.jsonl")
    with pytest.raises(DataError, match=r"line 2: field '<line>': invalid JSON"):
        load_rows(path)


def _write(path: Path, data: bytes) -> Path:
    path.write_bytes(data)
    return path


def _unreadable_files(tmp_path) -> dict[str, tuple[Path, str]]:
    good = _parquet(tmp_path, [_verl("a"), _verl("b")]).read_bytes()
    empty_table = pa.Table.from_pylist([_verl()]).slice(0, 0)
    pq.write_table(empty_table, tmp_path / "zero_rows.parquet")
    (tmp_path / "dir.jsonl").mkdir()
    return {
        "text-as-parquet": (
            _write(tmp_path / "text.parquet", b"hello\n"),
            "not a readable parquet",
        ),
        "jsonl-as-parquet": (_write(tmp_path / "j.parquet", GOOD_LINE), "not a readable parquet"),
        "truncated-parquet": (_write(tmp_path / "cut.parquet", good[:-50]), "not a readable"),
        "empty-parquet": (_write(tmp_path / "empty.parquet", b""), "the file is empty"),
        "empty-jsonl": (_write(tmp_path / "empty.jsonl", b""), "the file is empty"),
        "blank-jsonl": (_write(tmp_path / "blank.jsonl", b"\n  \n\n"), "no rows"),
        "zero-row-parquet": (tmp_path / "zero_rows.parquet", "no rows"),
        "directory": (tmp_path / "dir.jsonl", "not a file"),
    }


@pytest.mark.parametrize("on_bad_row", ["error", "skip"])
def test_unreadable_or_empty_file_is_an_error_naming_it(tmp_path, on_bad_row):
    # A non-parquet file raised pyarrow's ArrowInvalid; an empty JSONL file loaded as 0 rows.
    for name, (path, words) in _unreadable_files(tmp_path).items():
        with pytest.raises(DataError) as info:
            read_rows(path, on_bad_row=on_bad_row)
        message = str(info.value)
        assert message.startswith(f"{path}: ") and words in message, (name, message)


def test_file_whose_every_row_is_bad_is_an_error_in_skip_mode(tmp_path):
    path = _jsonl(tmp_path, [{"prompt": 1, "answer": "2"}, "{oops"])
    with pytest.raises(DataError) as info:
        read_rows(path, on_bad_row="skip")
    assert str(info.value) == (
        f"{path}: no usable rows (2 bad row(s) skipped; first: line 1: field 'prompt': "
        "must be a string or a list of messages, got int)"
    )


@pytest.mark.parametrize("content", ["", "  \n"])
@pytest.mark.parametrize("role", ["user", "system"])
def test_message_with_empty_content_names_file_row_and_field(tmp_path, content, role):
    messages = [{"role": role, "content": content}, {"role": "user", "content": "1+1?"}]
    jsonl = _jsonl(tmp_path, [GOOD, {"prompt": messages, "answer": "2"}])
    with pytest.raises(DataError, match=rf"^{jsonl}: line 2: field 'prompt\[0\].content': empty$"):
        load_rows(jsonl)
    parquet = _parquet(tmp_path, [_verl("a"), _verl("b") | {"prompt": messages}])
    with pytest.raises(DataError, match=rf"^{parquet}: row 1: field 'prompt\[0\].content': empty$"):
        load_rows(parquet)


def test_rows_remember_where_they_were_read(tmp_path):
    path = _jsonl(tmp_path, [GOOD, "", GOOD | {"prompt": "3?"}])
    assert [r.origin for r in load_rows(path)] == [f"{path} line 1", f"{path} line 3"]
    parquet = _parquet(tmp_path, [_verl("a"), _verl("b")])
    rows = load_rows(parquet)
    assert [r.origin for r in rows] == [f"{parquet} row 0", f"{parquet} row 1"]
    assert rows[0] == dataclasses.replace(rows[0], origin="elsewhere")  # not part of identity


def test_data_error_is_the_project_wide_user_error():
    from dynamo_jax import errors

    assert DataError is errors.DataError and issubclass(DataError, ValueError)


def test_invalid_json_line_names_its_column(tmp_path):
    # Columns count within the line, without its newline: `{"prompt": "q"` ends at column 14.
    path = _jsonl_bytes(tmp_path, [GOOD_LINE, b'{"prompt": "q"', b'{"prompt": "q'])
    with pytest.raises(DataError) as info:
        load_rows(path)
    assert str(info.value) == (
        f"{path}: line 2: field '<line>': invalid JSON (Expecting ',' delimiter: column 15)"
    )
    rows, report = read_rows(path, on_bad_row="skip")
    assert report.skip_reasons[1] == (
        f"{path}: line 3: field '<line>': invalid JSON (Unterminated string starting at: column 12)"
    )


# --- Paths that are not regular files, duplicated keys, over-long lines (issue: never block) --


def _special_paths(tmp_path):
    import os
    import socket

    fifo = tmp_path / "fifo.jsonl"
    os.mkfifo(fifo)
    directory = tmp_path / "folder.jsonl"
    directory.mkdir()
    sock_path = tmp_path / "s.jsonl"
    sock = socket.socket(socket.AF_UNIX)
    sock.bind(str(sock_path))
    special = {
        "fifo": (fifo, "is a named pipe (FIFO), not a file"),
        "directory": (directory, "is a directory, not a file"),
        "socket": (sock_path, "is a socket, not a file"),
        "dev-zero": (Path("/dev/zero"), "is a character device, not a file"),
        "missing": (tmp_path / "nope.jsonl", "no such file"),
    }
    link = tmp_path / "link.jsonl"
    link.symlink_to(fifo)
    special["symlink-to-fifo"] = (link, "is a named pipe (FIFO), not a file")
    return special, sock


@pytest.mark.parametrize("fmt", ["auto", "jsonl", "parquet"])
def test_special_files_are_named_and_never_opened(tmp_path, fmt):
    # A FIFO without a writer blocks open() forever and /dev/zero streams forever: both are
    # refused from os.stat. If anything opened them this test would hang (pytest has no
    # timeout here), which is the failure it guards against.
    special, sock = _special_paths(tmp_path)
    try:
        for name, (path, words) in special.items():
            with pytest.raises(DataError) as info:
                read_rows(path, fmt=fmt)
            message = str(info.value)
            assert message == f"{path}: {words}", (name, message)
            assert "\n" not in message
    finally:
        sock.close()


def test_fifo_in_a_file_list_is_refused_before_rows_of_later_files(tmp_path):
    import os

    good = _jsonl(tmp_path, [GOOD])
    fifo = tmp_path / "pipe.jsonl"
    os.mkfifo(fifo)
    with pytest.raises(DataError, match="pipe.jsonl: is a named pipe"):
        load_files([good, fifo])


DUPLICATES = [
    ("top-level", b'{"prompt": "1+1?", "answer": "2", "answer": "3"}', "answer"),
    ("prompt", b'{"prompt": "a", "prompt": "b", "answer": "2"}', "prompt"),
    ("same-value", b'{"prompt": "1+1?", "answer": "2", "answer": "2"}', "answer"),
    ("source", b'{"prompt": "q", "answer": "2", "source": "a", "source": "b"}', "source"),
    (
        "inside-message",
        b'{"prompt": [{"role": "user", "content": "x", "role": "system"}], "answer": "1"}',
        "role",
    ),
    ("unused-key", b'{"prompt": "q", "answer": "2", "note": 1, "note": 2}', "note"),
    ("escaped-same-key", b'{"prompt": "q", "answer": "2", "answ\\u0065r": "3"}', "answer"),
]


@pytest.mark.parametrize("raw, key", [c[1:] for c in DUPLICATES], ids=[c[0] for c in DUPLICATES])
def test_duplicated_key_is_refused_naming_file_line_and_key(tmp_path, caplog, raw, key):
    path = _jsonl_bytes(tmp_path, [GOOD_LINE, raw, GOOD_LINE.replace(b"1+1", b"3+3")])
    with pytest.raises(DataError) as info:
        load_rows(path)
    assert str(info.value) == (
        f"{path}: line 2: field '{key}': duplicated key in one object (which value is meant?)"
    )
    rows, report = read_rows(path, on_bad_row="skip")
    assert [r.messages[0]["content"] for r in rows] == ["1+1?", "3+3?"]
    assert report.skipped == 1


def test_distinct_keys_in_nested_objects_are_fine(tmp_path):
    messages = [{"role": "system", "content": "s"}, {"role": "user", "content": "u"}]
    path = _jsonl(tmp_path, [{"prompt": messages, "answer": "1", "meta": {"answer": "x"}}])
    assert load_rows(path)[0].messages[1]["content"] == "u"


def test_over_long_line_is_refused_before_parsing(tmp_path):
    # 50 MB of one JSON string: parsing it would take tens of seconds and its memory; the
    # reader sees the line is over the bound after max_line_bytes bytes and skips the rest.
    big = b'{"prompt": "' + b"7" * 50_000_000 + b'", "answer": "1"}'
    path = _jsonl_bytes(tmp_path, [GOOD_LINE, big, GOOD_LINE.replace(b"1+1", b"5+5")])
    with pytest.raises(DataError) as info:
        load_rows(path)
    assert str(info.value) == (
        f"{path}: line 2: field '<line>': {len(big) + 1} bytes, longer than "
        f"max_line_bytes={1 << 20} (not parsed)"
    )
    rows, report = read_rows(path, on_bad_row="skip")
    assert [r.messages[0]["content"] for r in rows] == ["1+1?", "5+5?"]
    assert [r.origin.rsplit(" ", 1)[1] for r in rows] == ["1", "3"]  # line numbers kept


def test_line_limit_is_configurable_and_exact(tmp_path):
    line = GOOD_LINE + b"\n"
    path = _jsonl_bytes(tmp_path, [GOOD_LINE, GOOD_LINE.replace(b"1+1", b"2+2") + b"   "])
    assert len(load_rows(path, max_line_bytes=len(line) + 3)) == 2
    with pytest.raises(DataError, match=r"line 2: .* longer than max_line_bytes"):
        load_rows(path, max_line_bytes=len(line) + 2)
    # Last line without a newline, over the bound.
    tail = _jsonl_bytes(tmp_path, [GOOD_LINE], "tail.jsonl")
    tail.write_bytes(line + b'{"prompt": "' + b"x" * 500 + b'", "answer": "1"}')
    with pytest.raises(DataError, match=r"line 2: field '<line>': 52\d bytes"):
        load_rows(tail, max_line_bytes=200)


def test_max_line_bytes_is_a_validated_data_setting():
    from dynamo_jax.data.config import MAX_LINE_BYTES, DataConfig

    assert DataConfig().max_line_bytes == MAX_LINE_BYTES == 1 << 20
    with pytest.raises(ValueError, match="DataConfig.max_line_bytes"):
        DataConfig(max_line_bytes=0)
