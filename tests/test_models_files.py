"""JSON files of a model directory: every way one can be unreadable is an error naming it."""

import pytest

from dynamo_jax.errors import ConfigError, DataError
from dynamo_jax.models.files import read_json_object


@pytest.mark.parametrize(
    "data, words",
    [
        (b'{"a": 1,}', "invalid JSON (Expecting property name enclosed in double quotes: line 1"),
        (b"", "invalid JSON (Expecting value: line 1 column 1)"),
        (b'{"a":\n  "b\n', "invalid JSON (Invalid control character at: line 2 column 5)"),
        (b'{"a": "\xff"}', "invalid JSON ('utf-8' codec can't decode byte 0xff"),
        (b"[" * 100_000, "invalid JSON (nested too deeply)"),
        (b"[1]", "must be a JSON object, got list"),
        (b'"text"', "must be a JSON object, got str"),
    ],
)
def test_bad_json_is_one_error_naming_the_file(tmp_path, data, words):
    file = tmp_path / "config.json"
    file.write_bytes(data)
    with pytest.raises(ConfigError) as info:
        read_json_object(file)
    assert str(info.value).startswith(f"{file}: {words}"), str(info.value)
    with pytest.raises(DataError):  # the caller picks the error type
        read_json_object(file, DataError)


def test_good_json_and_unreadable_path(tmp_path):
    file = tmp_path / "a.json"
    file.write_bytes(b'\xef\xbb\xbf{"x": [1, 2]}')  # json.loads(bytes) accepts a UTF-8 BOM
    assert read_json_object(file) == {"x": [1, 2]}
    with pytest.raises(ConfigError, match=rf"^{tmp_path}: cannot read \("):
        read_json_object(tmp_path)  # a directory
