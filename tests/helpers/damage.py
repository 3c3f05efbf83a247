"""The kinds of non-file that can stand in a checkpoint file's place, and a guard that fails a
test (instead of hanging it) when reading blocks."""

import os
import socket
import threading
from pathlib import Path

import pytest


def _fifo(path: Path) -> None:
    os.mkfifo(path)


def _socket(path: Path) -> None:
    # Unix socket paths are limited to ~100 bytes: bind by a name relative to its directory.
    cwd = os.getcwd()
    os.chdir(path.parent)
    try:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.bind(path.name)
        sock.close()  # the socket file stays
    finally:
        os.chdir(cwd)


KINDS = {
    "fifo": _fifo,
    "socket": _socket,
    "device": lambda path: path.symlink_to("/dev/zero"),  # reads never end
    "directory": lambda path: path.mkdir(),
    "dangling link": lambda path: path.symlink_to(path.parent / "nowhere"),
}


def _unblock(path: Path) -> None:
    """If a reader is stuck on the pipe at `path`, give it an end of file."""
    try:
        fd = os.open(path, os.O_WRONLY | os.O_NONBLOCK)
        os.close(fd)
    except OSError:
        pass


def _within(seconds, fn, fifo=None):
    """fn() in a thread; fails (after freeing a reader stuck on `fifo`) if it blocks."""
    out = {}

    def target():
        try:
            out["value"] = fn()
        except BaseException as err:  # re-raised in the test's thread
            out["error"] = err

    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    thread.join(seconds)
    if thread.is_alive():
        while thread.is_alive() and fifo is not None:
            _unblock(fifo)
            thread.join(0.5)
        pytest.fail(f"blocked for more than {seconds} s")
    if "error" in out:
        raise out["error"]
    return out.get("value")
