"""BackgroundEngine: process-local work on one worker thread in call order, collective work on
the caller's thread, and no error of a queued push lost."""

import threading

import pytest

from dynamo_jax.rollout.background import BackgroundCapable, BackgroundEngine
from dynamo_jax.rollout.protocol import Completion, Request, SamplingParams

MAIN = threading.main_thread().name


class Recorder:
    """Logs (call, thread name, version) of every call; `fail_load` makes loads raise."""

    def __init__(self):
        self.weight_version = 0
        self.log = []
        self.fail_load = False
        self.closed = False

    def _note(self, what):
        self.log.append((what, threading.current_thread().name, self.weight_version))

    def generate_local(self, requests, sampling):
        self._note("generate_local")
        return [
            Completion(r.prompt_id, 0, (1,), (0.0,), "stop", self.weight_version) for r in requests
        ]

    def finish_generate(self, requests, local):
        self._note("finish_generate")
        return local

    def export_weights(self, params, version):
        self._note("export")
        return version

    def load_weights(self, version):
        self._note("load")
        if self.fail_load:
            raise OSError("no space left in /dev/shm")
        self.weight_version = version

    def close(self):
        self.closed = True


REQUESTS = [Request(5, (1, 2), 1)]
SAMPLING = SamplingParams(max_new_tokens=2)


def test_calls_split_between_the_worker_and_the_caller_in_order():
    engine = Recorder()
    assert isinstance(engine, BackgroundCapable)
    background = BackgroundEngine(engine)
    first = background.submit(REQUESTS, SAMPLING)
    background.update_weights(None, 1)
    second = background.submit(REQUESTS, SAMPLING)
    assert background.weight_version == 1  # what every later generate runs with
    assert [c.weight_version for c in second.result()] == [1]
    assert [c.weight_version for c in first.result()] == [0]
    worker = [entry for entry in engine.log if entry[1] != MAIN]
    caller = [entry for entry in engine.log if entry[1] == MAIN]
    assert [w[0] for w in worker] == ["generate_local", "load", "generate_local"]
    assert [c[0] for c in caller] == ["export", "finish_generate", "finish_generate"]
    assert len({w[1] for w in worker}) == 1  # one worker thread
    first.result()  # finish_generate runs once per batch (it may be a collective)
    assert sum(c[0] == "finish_generate" for c in engine.log) == 2
    background.close()
    assert engine.closed
    with pytest.raises(RuntimeError, match="closed"):
        background.submit(REQUESTS, SAMPLING)


def test_a_failed_push_is_raised_not_lost():
    engine = Recorder()
    background = BackgroundEngine(engine)
    engine.fail_load = True
    background.update_weights(None, 1)
    pending = background.submit(REQUESTS, SAMPLING)
    with pytest.raises(OSError, match="/dev/shm"):
        pending.result()
    background.close()


def test_engines_without_the_split_are_refused():
    class Plain:
        weight_version = 0

        def generate(self, requests, sampling):
            return []

    with pytest.raises(TypeError, match="Plain cannot generate in the background"):
        BackgroundEngine(Plain())
