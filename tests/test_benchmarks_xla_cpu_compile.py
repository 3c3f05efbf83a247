import numpy as np
import pytest

from benchmarks import xla_cpu_compile


def test_same_bits_tells_one_ulp_apart_and_takes_nan_as_equal():
    a = [np.array([1.0, np.nan], np.float32), np.float32(2.0)]
    b = [np.array([1.0, np.nan], np.float32), np.float32(2.0)]
    assert xla_cpu_compile.same_bits(a, b)
    b[0][0] = np.nextafter(np.float32(1.0), np.float32(2.0))
    assert not xla_cpu_compile.same_bits(a, b)
    assert not xla_cpu_compile.same_bits(a, a[:1])


def test_options_are_read_as_the_bool_or_int_xla_takes():
    assert xla_cpu_compile._options("a=true") == {"a": True}
    assert xla_cpu_compile._options("a=False") == {"a": False}
    assert xla_cpu_compile._options("a=-1") == {"a": -1}
    assert xla_cpu_compile._options("a=") == {"a": ""}


def test_an_option_without_a_value_is_refused_in_one_line():
    with pytest.raises(SystemExit, match="NAME=VALUE"):
        xla_cpu_compile.main(["xla_backend_optimization_level"])


@pytest.mark.slow
def test_an_option_that_only_changes_how_code_is_split_keeps_the_bits(capsys):
    rows = xla_cpu_compile.main(["xla_cpu_parallel_codegen_split_count=1"])
    assert [r["same"] for r in rows] == [True, True]
    assert all(r["compile_s"] > 0 and r["run_s"] > 0 for r in rows)
    assert "| xla_cpu_parallel_codegen_split_count=1 |" in capsys.readouterr().out
