"""How launch.py reports bad input: one or two plain lines and an exit status, no traceback.

Known errors are `dynamo_jax.errors.UserError` (ConfigError, DataError, CheckpointError,
SidecarError) and what absl/ml_collections raise while parsing the command line (an unknown
flag, a misspelt `--config.section.field` override, a value of the wrong type, a config file
that does not load). Anything else is a bug and keeps its traceback; `--debug` keeps it for the
known errors too.

Exit statuses of `python launch.py`: the one table in dynamo_jax/errors.py (`ExitCode`).
"""

from __future__ import annotations

import contextlib
import os
import re
import sys
from collections.abc import Iterator, Mapping, MutableMapping, Sequence
from pathlib import Path
from typing import Any

from dynamo_jax.errors import ConfigError, ExitCode, UserError

EXIT_BAD_INPUT = ExitCode.REFUSED
DEBUG_FLAG = "--debug"
COMPILATION_CACHE_ENV = "JAX_COMPILATION_CACHE_DIR"
MIN_COMPILE_TIME_ENV = "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS"
_FLAG_PREFIX = re.compile(r"^flag (\S+): ")


def _chain(err: BaseException) -> list[BaseException]:
    """`err` and the exceptions it was raised from, outermost first."""
    out: list[BaseException] = []
    while err is not None and err not in out:
        out.append(err)
        err = err.__cause__ or err.__context__
    return out


def _first_line(text: str) -> str:
    return text.strip().splitlines()[0] if text.strip() else ""


def _override_flag(argv: Sequence[str], key: str) -> str:
    """The `--config.a.b` override of `argv` with `key` as one of its parts, else '--config'."""
    for arg in argv:
        name = arg.split("=", 1)[0]
        if name.startswith("--config.") and key in name.split(".")[1:]:
            return name
    return "--config"


def _renamed_key_message(argv: Sequence[str], key: str) -> str | None:
    """One line naming the new key when `key` (a field the config lacks) is a renamed one."""
    from dynamo_jax.config import RENAMED, renamed_message

    flag = _override_flag(argv, key)
    if flag != "--config":  # an override: its section is in the flag's name
        return renamed_message(flag.removeprefix("--config."), flag)
    # Set inside a config file: name every section the old field was renamed in.
    olds = [old for old in RENAMED if old.split(".", 1)[1] == key]
    return renamed_message(olds[0]) if len(olds) == 1 else None


def flag_error_message(err: BaseException, argv: Sequence[str]) -> str:
    """One line for an error raised while parsing the command line `argv`."""
    from absl import flags

    chain = _chain(err)
    # A misspelt config field: ml_collections raises KeyError("'stpes'\nDid you mean ...")
    # (wrapped in an AttributeError for a field, bare for a section).
    for e in chain:
        text = e.args[0] if e.args and isinstance(e.args[0], str) else ""
        if isinstance(e, KeyError) and text:
            key, _, hint = text.partition("\n")
            key = key.strip("'\"")
            renamed = _renamed_key_message(argv, key)
            if renamed:
                return renamed
            message = f"{_override_flag(argv, key)}: the config has no field {key!r}"
            return f"{message}. {hint.strip()}" if hint.strip() else message
    root = chain[-1]
    head = _first_line(str(err))
    match = _FLAG_PREFIX.match(head)
    if match and "Traceback (most recent call last)" in str(err):
        # An exception inside the config file (its get_config): absl's message holds its
        # formatted traceback; the innermost exception says what is wrong.
        return f"{match.group(1)}: {_first_line(str(root))}"
    if match:
        return head[len("flag ") :]
    if isinstance(err, flags.Error):
        return head
    # A config file that is not there: config_flags only says "Failed loading config file".
    path = _config_path(argv)
    if path is not None and not Path(path.split(":", 1)[0]).is_file():
        return f"--config: no such file: {path.split(':', 1)[0]}"
    # Anything else raised while the config file was imported (a syntax error, ...).
    config_arg = next((a for a in argv if re.match(r"^--?config(=|$)", a)), "--config")
    return f"{config_arg}: {type(root).__name__}: {_first_line(str(root))}"


def _config_path(argv: Sequence[str]) -> str | None:
    """The value of `--config=X` or `--config X` in `argv`, if any."""
    for i, arg in enumerate(argv):
        match = re.match(r"^--?config(=(.*))?$", arg)
        if match and match.group(1):
            return match.group(2)
        if match and i + 1 < len(argv):
            return argv[i + 1]
    return None


def parse_flags(argv: list[str], flag_values: Any = None) -> list[str]:
    """absl's flag parsing (`app.run(main, flags_parser=parse_flags)`), printing a bad flag or
    config override as one line and exiting with status 2 (a traceback with `--debug`)."""
    from absl import flags

    try:
        return (flag_values or flags.FLAGS)(argv)
    except Exception as err:
        if DEBUG_FLAG in argv:
            raise
        _fail(flag_error_message(err, argv))


def load_config(flag: Any) -> Any:
    """The ConfigDict of a `config_flags.DEFINE_config_file` flag (the absl Flag object);
    `ConfigError` naming the file if it did not load (config_flags defers that error to the
    first use of the value)."""
    from ml_collections import config_flags

    filename = config_flags.get_config_filename(flag)
    path = filename.split(":", 1)[0]
    if not Path(path).is_file():
        raise ConfigError(f"--config: no such file: {path}")
    try:
        config = flag.value
        config.keys()  # a config that failed to load raises its deferred error here
    except OSError as err:
        # config_flags' message ends with the underlying error ("[Errno 2] No such file ...").
        lines = [line.strip() for line in str(_chain(err)[-1]).splitlines() if line.strip()]
        raise ConfigError(f"--config={filename}: {lines[-1] if lines else err}") from err
    return config


def user_error_lines(err: UserError, limit: int = 2) -> list[str]:
    """`err`'s message as at most `limit` lines, the first prefixed with 'error: '."""
    lines = [line for line in str(err).strip().splitlines() if line.strip()] or [type(err).__name__]
    if len(lines) > limit:
        lines = [*lines[: limit - 1], f"... ({len(lines) - limit + 1} more lines: {DEBUG_FLAG})"]
    return [f"error: {lines[0]}", *(f"  {line.strip()}" for line in lines[1:])]


def _fail(message: str) -> None:
    print(f"error: {message}", file=sys.stderr, flush=True)
    sys.exit(int(EXIT_BAD_INPUT))


@contextlib.contextmanager
def known_errors(debug: bool) -> Iterator[None]:
    """Turn a `UserError` into its plain lines on stderr and its exit status (REFUSED unless it
    says otherwise; re-raised with `debug`), and a second Ctrl-C/SIGTERM (KeyboardInterrupt)
    into one line and ABORTED."""
    try:
        yield
    except UserError as err:
        if debug:
            raise
        print("\n".join(user_error_lines(err)), file=sys.stderr, flush=True)
        sys.exit(int(getattr(err, "exit_code", EXIT_BAD_INPUT)))
    except KeyboardInterrupt:
        if debug:
            raise
        print(
            "error: interrupted twice: stopped at once; the step in flight was not "
            "checkpointed (rerun the same command to resume from the newest checkpoint)",
            file=sys.stderr,
            flush=True,
        )
        sys.exit(int(ExitCode.ABORTED))


def compilation_cache_dir(environ: Mapping[str, str]) -> str | None:
    """JAX's persistent compilation cache of runs and tests: $JAX_COMPILATION_CACHE_DIR when set
    (set but empty: no cache), else `<cache>/jax` with models/fetch.py's `<cache>`
    ($DYNAMO_JAX_CACHE, else ~/.cache/dynamo_jax). Outside any checkout, so a fresh clone loads
    what another one compiled: JAX keys an entry on the program without its source locations
    (jax_compilation_cache_include_metadata_in_key stays off), never on the checkout's path."""
    if COMPILATION_CACHE_ENV in environ:
        return environ[COMPILATION_CACHE_ENV] or None
    from dynamo_jax.models.fetch import cache_dir

    return str(cache_dir() / "jax")


def use_compilation_cache(environ: MutableMapping[str, str] = os.environ) -> str | None:
    """Turns JAX's persistent compilation cache on at `compilation_cache_dir`, through the
    environment (for this process and the ones it starts: the dry run's planner, sidecars),
    so call it before JAX is imported. Every program is written, however fast it compiled
    ($JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS unless set): jax's default of 1 s leaves out
    programs that load in a tenth of their compile time (benchmarks/compile_time.py). Returns
    the directory (None: no cache). JAX reads the variables once, when it is imported: where it
    already is (this process's `os.environ`), its config is set as well, which holds until its
    first compilation."""
    path = compilation_cache_dir(environ)
    if path is not None:
        environ[COMPILATION_CACHE_ENV] = path
        environ.setdefault(MIN_COMPILE_TIME_ENV, "0")
        jax = sys.modules.get("jax")
        if jax is not None and environ is os.environ:
            jax.config.update("jax_compilation_cache_dir", path)
            jax.config.update(
                "jax_persistent_cache_min_compile_time_secs", float(environ[MIN_COMPILE_TIME_ENV])
            )
    return path
