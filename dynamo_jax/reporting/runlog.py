"""The workdir's log file (`run.log`): library detail goes there, the console keeps the project's
one-line messages.

orbax and tensorstore log (through absl) errors with long tracebacks, some from background
threads, when a damaged checkpoint is read; the project then says what happened in one line. While
`library_detail_to(path)` is active, those records (and the "Exception ignored in <coroutine>"
reports of the reads orbax abandons, and uncaught exceptions of threads) are appended to `path` and
dropped from every other handler (the console), and `append` writes the project's own full detail (the exception
chain behind a one-line message) to the same file. Only the primary process writes the file.
"""

from __future__ import annotations

import contextlib
import gc
import logging
import sys
import threading
import time
import traceback
from collections.abc import Iterator
from pathlib import Path

from dynamo_jax.sharding import multihost

# Loggers and source trees whose records are detail (absl routes orbax's through the 'absl'
# logger, so the source path is what tells them apart).
_LIBRARY_PARTS = ("/orbax/", "/tensorstore/")
_LIBRARY_LOGGERS = ("asyncio", "orbax", "tensorstore")
_FORMAT = "%(asctime)s %(levelname)s %(name)s %(filename)s:%(lineno)d] %(message)s"


def _from_library(record: logging.LogRecord) -> bool:
    path = record.pathname.replace("\\", "/")
    return record.name.split(".")[0] in _LIBRARY_LOGGERS or any(p in path for p in _LIBRARY_PARTS)


class _DropLibraries(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return not _from_library(record)


class _OnlyLibraries(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return _from_library(record)


def append(path: Path | None, text: str, err: BaseException | None = None) -> None:
    """Append `text` (and `err`'s traceback chain) to the log file `path` (primary process)."""
    if path is None or not multihost.is_primary():
        return
    stamp = time.strftime("%Y-%m-%d %H:%M:%S")
    body = f"{stamp} {text}\n"
    if err is not None:
        body += "".join(traceback.format_exception(err))
    try:
        with open(path, "a") as f:
            f.write(body)
    except OSError:
        pass  # the log is a courtesy; the console line already said what happened


@contextlib.contextmanager
def library_detail_to(path: Path | None, *, collect: bool = False) -> Iterator[None]:
    """Within the block, library log records (and uncaught exceptions of background threads)
    go to `path` only; with `path` None, nothing changes.

    A block that raises ends with a full garbage collection, so that what its failed reads left
    is collected while the hook is ours; `collect` asks for one anyway, for a block that may
    abandon reads without raising (orbax reading a damaged step that the caller skips). Not
    after every block: a full collection takes ~70 ms in a trainer's process, and a save's
    blocks doing one each were 1.5 s of the README's 13-second tiny run."""
    if path is None:
        yield
        return
    root = logging.getLogger()
    drop = _DropLibraries()
    consoles = list(root.handlers)
    for handler in consoles:
        handler.addFilter(drop)
    to_file = None
    if multihost.is_primary():
        to_file = logging.FileHandler(path, delay=True)  # no file until something is logged
        to_file.setFormatter(logging.Formatter(_FORMAT))
        to_file.addFilter(_OnlyLibraries())
        root.addHandler(to_file)
    previous_hook = threading.excepthook

    def thread_hook(args: threading.ExceptHookArgs) -> None:
        if args.exc_value is not None:
            append(path, f"exception in thread {args.thread}", args.exc_value)

    # orbax abandons its reading coroutines when a read fails; Python reports each as
    # "Exception ignored in: <coroutine ...>" with a long traceback when it is collected.
    previous_unraisable = sys.unraisablehook

    def unraisable_hook(u) -> None:
        what = f"exception ignored in {u.object!r}" if u.object is not None else "exception ignored"
        append(path, what, u.exc_value)

    threading.excepthook = thread_hook
    sys.unraisablehook = unraisable_hook
    try:
        yield
    except BaseException:
        collect = True
        raise
    finally:
        if collect:
            gc.collect()  # collect what the failed reads left while the hook is ours
        sys.unraisablehook = previous_unraisable
        threading.excepthook = previous_hook
        for handler in consoles:
            handler.removeFilter(drop)
        if to_file is not None:
            root.removeHandler(to_file)
            to_file.close()
