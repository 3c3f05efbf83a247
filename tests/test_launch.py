"""launch.py's handling of bad input: one or two plain lines, exit status 2, nothing created.
(Exit status 1 of a run that stops early: test_loop_train.py, which shares its compilation cache.)"""

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from absl import flags
from helpers.scripts import launch
from ml_collections import config_flags

from configs import base, tiny
from dynamo_jax import cli
from dynamo_jax.errors import CheckpointError, ConfigError, DataError

ROOT = Path(__file__).resolve().parents[1]
TINY = str(ROOT / "configs" / "tiny.py")


def _flag_values(argv):
    """launch.py's flags on a fresh FlagValues (config_flags finds the `--config.*` overrides
    in sys.argv unless given the command line)."""
    fv = flags.FlagValues()
    config_flags.DEFINE_config_file(
        "config", None, "config", flag_values=fv, lock_config=True, sys_argv=list(argv)
    )
    flags.DEFINE_string("workdir", None, "workdir", flag_values=fv)
    return fv


def _parse_error(*args):
    argv = ["launch.py", *args]
    with pytest.raises(Exception) as err:
        _flag_values(argv)(argv)
    return cli.flag_error_message(err.value, argv)


# ----------------------------------------------------------------------------- messages


def test_misspelt_override_is_one_line_with_the_hint():
    assert _parse_error(f"--config={TINY}", "--config.train.stpes=3") == (
        "--config.train.stpes: the config has no field 'stpes'. "
        'Did you mean "steps" instead of "stpes"?'
    )
    assert _parse_error(f"--config={TINY}", "--config.trian.steps=3") == (
        "--config.trian.steps: the config has no field 'trian'. "
        'Did you mean "train" instead of "trian"?'
    )
    assert _parse_error(f"--config={TINY}", "--config.train.zzzz=3") == (
        "--config.train.zzzz: the config has no field 'zzzz'"
    )


def test_other_flag_errors_are_one_line():
    assert _parse_error(f"--config={TINY}", "--config.train.steps=abc") == (
        "--config.train.steps=abc: invalid literal for int() with base 10: 'abc'"
    )
    # An error inside the config file's get_config: its message, not absl's traceback text.
    assert _parse_error(f"--config={TINY}:method=foo") == (
        f"--config={TINY}:method=foo: configs/tiny.py: method must be one of "
        f"{base.METHODS}, got 'foo'"
    )
    assert _parse_error("--config_file=x") == (
        "Unknown command line flag 'config_file'. Did you mean: config ?"
    )


def test_parse_flags_exits_2_with_one_line_and_debug_keeps_the_traceback(capsys):
    argv = ["launch.py", f"--config={TINY}", "--config.train.stpes=3"]
    with pytest.raises(SystemExit) as exit_:
        cli.parse_flags(argv, _flag_values(argv))
    assert exit_.value.code == 2
    assert capsys.readouterr().err.splitlines() == [
        "error: --config.train.stpes: the config has no field 'stpes'. "
        'Did you mean "steps" instead of "stpes"?'
    ]
    with pytest.raises(AttributeError):
        cli.parse_flags([*argv, "--debug"], _flag_values(argv))


def test_a_config_file_that_does_not_exist_or_does_not_load(tmp_path):
    argv = ["launch.py", f"--config={tmp_path / 'nope.py'}"]
    fv = _flag_values(argv)
    fv(argv)
    with pytest.raises(ConfigError, match=r"^--config: no such file: .*nope\.py$"):
        cli.load_config(fv["config"])
    # A config file that fails to import: at parse time (a syntax error) ...
    broken = tmp_path / "broken.py"
    broken.write_text("def get_config(:\n")
    assert _parse_error(f"--config={broken}") == (
        f"--config={broken}: SyntaxError: invalid syntax (broken.py, line 1)"
    )
    # ... or deferred by config_flags to the first use of the value (an OSError).
    broken.write_text("open('/nonexistent/data.txt')\n")
    argv = ["launch.py", f"--config={broken}"]
    fv = _flag_values(argv)
    fv(argv)
    with pytest.raises(
        ConfigError, match=r"^--config=.*broken\.py: \[Errno 2\] No such file .*data\.txt'$"
    ):
        cli.load_config(fv["config"])
    argv = ["launch.py", f"--config={TINY}"]
    fv = _flag_values(argv)
    fv(argv)
    assert cli.load_config(fv["config"]).train.steps == 100


def test_user_error_lines_are_at_most_two():
    assert cli.user_error_lines(DataError("a.jsonl:3: field 'prompt' is empty")) == [
        "error: a.jsonl:3: field 'prompt' is empty"
    ]
    assert cli.user_error_lines(CheckpointError("W: does not fit\nRerun with ...")) == [
        "error: W: does not fit",
        "  Rerun with ...",
    ]
    assert cli.user_error_lines(ConfigError("one\ntwo\nthree\nfour")) == [
        "error: one",
        "  ... (3 more lines: --debug)",
    ]


def test_known_errors_exit_2_and_debug_reraises(capsys):
    with pytest.raises(SystemExit) as exit_, cli.known_errors(debug=False):
        raise ConfigError("config.train (TrainConfig): train.seed must be ...")
    assert exit_.value.code == 2
    assert capsys.readouterr().err == "error: config.train (TrainConfig): train.seed must be ...\n"
    with pytest.raises(ConfigError), cli.known_errors(debug=True):
        raise ConfigError("x")
    with pytest.raises(KeyError), cli.known_errors(debug=False):  # a bug keeps its traceback
        raise KeyError("x")


# ----------------------------------------------------------------------------- launch.py


def test_launch_misspelt_override_prints_one_line(tmp_path):
    workdir = tmp_path / "w"
    proc = launch(f"--config={TINY}", f"--workdir={workdir}", "--config.train.stpes=3")
    assert proc.returncode == 2
    assert proc.stderr.splitlines() == [
        "error: --config.train.stpes: the config has no field 'stpes'. "
        'Did you mean "steps" instead of "stpes"?'
    ]
    assert not workdir.exists()


def test_launch_invalid_config_prints_one_line_and_creates_nothing(tmp_path):
    workdir = tmp_path / "w"
    proc = launch(f"--config={TINY}", f"--workdir={workdir}", "--config.train.seed=-1")
    assert proc.returncode == 2
    assert proc.stderr.splitlines() == [
        "error: config.train (TrainConfig): train.seed must be an int in [0, 2**32), got -1"
    ]
    assert not workdir.exists()


@pytest.mark.parametrize(
    "overrides, message",
    [
        (("train.pack_len=8",), "train.pack_len (8) must be >= the run's max_seq_len"),
        (("train.max_tokens_per_micro_batch=8",), "must hold at least one row"),
        (("rollout.max_new_tokens=5000",), "exceeds the model's context"),
        (("train.old_logp_source=engine", "rollout.top_p=0.9"), "needs rollout.top_p = 1"),
    ],
)
def test_cross_section_config_errors_are_user_errors(overrides, message):
    """Checks that span sections are ConfigErrors too (launch.py prints one line, exit 2)."""
    from dynamo_jax.config import from_config_dict

    config = tiny.get_config()
    for override in overrides:
        path, value = override.split("=")
        section, field = path.split(".")
        current = config[section][field]
        config[section][field] = type(current)(value) if current is not None else value
    with pytest.raises(ConfigError, match=re.escape(message)):
        from_config_dict(config)


def test_task_and_workdir_errors_are_user_errors(tmp_path):
    """A model vocabulary smaller than the tokenizer's, too few usable prompts and a workdir that
    is a file were tracebacks; now one line each."""
    from dynamo_jax import tasks, workdir
    from dynamo_jax.config import from_config_dict

    config = tiny.get_config()
    config.model.vocab_size = 16
    with pytest.raises(ConfigError, match=r"model.vocab_size \(16\) is smaller"):
        tasks.build_task(from_config_dict(config))
    config = tiny.get_config()
    config.train.prompts_per_step = 64  # the synthetic max task has 25 problems
    config.train.mini_batch_size = 64
    with pytest.raises(DataError, match="25 usable prompts, fewer than train.prompts_per_step"):
        tasks.build_task(from_config_dict(config))
    file = tmp_path / "w"
    file.write_text("")
    with pytest.raises(ConfigError, match="exists and is not a directory"):
        workdir.prepare(file, from_config_dict(tiny.get_config()), start_over=False)


# ----------------------------------------------------------------------------- compilation cache

# launch.py's own entry with `main` swapped for a probe: by the time `main` runs, parsing the
# flags has loaded the config file (and with it JAX); the probe compiles one program.
CACHE_PROBE = """
import json, sys
import launch

def probe(argv):
    jax_before_main = "jax" in sys.modules
    import jax
    jax.jit(lambda x: x * 2.0 + 1.0)(jax.numpy.arange(3.0)).block_until_ready()
    print(json.dumps({
        "jax_before_main": jax_before_main,
        "dir": jax.config.jax_compilation_cache_dir,
        "min_compile_s": jax.config.jax_persistent_cache_min_compile_time_secs,
    }))

launch.main = probe
sys.argv = ["launch.py", "--config", "configs/tiny.py", "--workdir", "unused"]
launch.run()
"""


def test_a_users_run_writes_its_programs_to_the_default_cache(tmp_path):
    """No cache variable set (a user's shell): the run's programs go to <cache>/jax, every one,
    although JAX was imported (by the config file) before `main` (it once was not: JAX had read
    the unset variables at its import, and every run compiled everything)."""
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in (cli.COMPILATION_CACHE_ENV, cli.MIN_COMPILE_TIME_ENV)
    }
    env["DYNAMO_JAX_CACHE"] = str(tmp_path / "cache")
    proc = subprocess.run(
        [sys.executable, "-c", CACHE_PROBE], cwd=ROOT, env=env, capture_output=True, text=True,
        timeout=300,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    seen = json.loads(proc.stdout.strip().splitlines()[-1])
    assert seen == {
        "jax_before_main": True,
        "dir": str(tmp_path / "cache" / "jax"),
        "min_compile_s": 0.0,
    }
    # the probe's program compiled in well under jax's default 1 s threshold, and is kept
    assert [n for n in os.listdir(tmp_path / "cache" / "jax") if n.startswith("jit__lambda")]
