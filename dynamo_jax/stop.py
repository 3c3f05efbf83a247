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
        """Handle both signals (main thread only); returns the handlers to put back."""
        if not _main_thread():
            return {}
        return {signum: signal.signal(signum, self) for signum in self.SIGNALS}


def _main_thread() -> bool:
    return threading.current_thread() is threading.main_thread()
