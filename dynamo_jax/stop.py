"""SIGTERM and Ctrl-C during a run: the first is a request, the second stops at once.

`loop.train.run` installs a `StopRequest` for SIGINT and SIGTERM (what SLURM, Kubernetes and
`timeout` send) before it builds anything. The first signal sets `requested` and prints one line;
the loop finishes the step in flight, checkpoints and ends INTERRUPTED (exit status 3). A second
signal raises KeyboardInterrupt wherever the main thread is; launch.py prints one line for it and
exits ABORTED (5) (dynamo_jax/errors.py `ExitCode`).
"""

from __future__ import annotations

import io
import os
import signal
import sys
import threading

from dynamo_jax.sharding import multihost


class StopRequest:
    """SIGTERM or Ctrl-C (SIGINT), first: finish the step in flight, checkpoint, exit
    (INTERRUPTED). Second: stop at once (KeyboardInterrupt; launch.py exits ABORTED)."""

    SIGNALS = (signal.SIGINT, signal.SIGTERM)

    def __init__(self):
        self.requested = False
        self.aborted = False
        self.signal_name = ""
        self._previous_unraisablehook = sys.unraisablehook

    def __call__(self, signum, frame):
        if self.requested:
            # Kept as well as raised: a handler that runs inside a callback called from C (a
            # garbage-collection callback of JAX's, a finaliser) has its exception printed and
            # dropped, and the loop then sees the flag (`raise_if_aborted`).
            self.aborted = True
            raise KeyboardInterrupt
        self.requested = True
        self.signal_name = signal.Signals(signum).name
        if multihost.is_primary():
            message = (
                f"{self.signal_name}: finishing the step in flight, then checkpointing and "
                "exiting (send it again to stop at once)\n"
            )
            try:  # not print(): the handler may interrupt a print of the main thread
                os.write(sys.stdout.fileno(), message.encode())
            except (OSError, ValueError, AttributeError, io.UnsupportedOperation):
                sys.stdout.write(message)

    def raise_if_aborted(self) -> None:
        """KeyboardInterrupt where a second signal came and its own raise was swallowed."""
        if self.aborted:
            raise KeyboardInterrupt

    def install(self) -> dict:
        """Handle both signals (main thread only); returns the handlers to put back (`restore`).

        Also keeps CPython from printing a traceback for the second signal's KeyboardInterrupt
        where it was raised inside a callback called from C: CPython hands it to
        `sys.unraisablehook`, which prints "Exception ignored in ..." and a traceback, though the
        stop is already on its way (`raise_if_aborted`) and launch.py prints its one line."""
        if not _main_thread():
            return {}
        previous = {signum: signal.signal(signum, self) for signum in self.SIGNALS}
        self._previous_unraisablehook = sys.unraisablehook
        sys.unraisablehook = self._unraisablehook
        return previous

    def restore(self, previous: dict) -> None:
        """Put back what `install` replaced."""
        for signum, handler in previous.items():
            signal.signal(signum, handler)
        if previous and sys.unraisablehook == self._unraisablehook:
            sys.unraisablehook = self._previous_unraisablehook

    def _unraisablehook(self, unraisable) -> None:
        if self.aborted and issubclass(unraisable.exc_type, KeyboardInterrupt):
            return  # our own second signal, swallowed where it was raised: the flag carries it
        self._previous_unraisablehook(unraisable)


def _main_thread() -> bool:
    return threading.current_thread() is threading.main_thread()
