"""`SplitEngine`: a step's requests split across every local engine of every process, each a
contiguous, sample-balanced slice; every process gets the whole batch back in request order, and
a weight push is exported once per process and loaded by each of its engines.

First simulated processes (threads; the all-gather is a barrier) over fake engines, against one
fake engine answering every request; then two real processes (jax.distributed on 127.0.0.1, one
CPU device each, parameters sharded across them), each with its own vLLM sidecar, against the
embedded JAX engine on the same weights before and after a weight push.
(tests/test_rollout_sidecar_fleet.py runs two real sidecars in one process.)
"""

import json
import os
import socket
import subprocess
import sys
import threading
from pathlib import Path

import numpy as np
import pytest
from hf_fixtures import make_tiny_hf_checkpoint
from process_split_worker import NEW, REQUESTS, changed_params
from processes import communicate_all

from dynamo_jax.errors import SidecarError
from dynamo_jax.rollout.process_split import SplitEngine, request_slice
from dynamo_jax.rollout.protocol import Completion, Request, SamplingParams
from dynamo_jax.sharding import multihost

ROOT = Path(__file__).resolve().parents[1]
VLLM_PYTHON = os.environ.get("DYNAMO_VLLM_PYTHON", str(ROOT / ".venv-vllm" / "bin" / "python"))


@pytest.mark.parametrize("count", [1, 2, 3, 5, 8])
def test_request_slices_cover_every_request_once_balanced(count):
    rng = np.random.default_rng(count)
    for _ in range(20):
        ns = rng.integers(0, 17, size=int(rng.integers(1, 12)))
        requests = [Request(i, (1,), int(n)) for i, n in enumerate(ns)]
        slices = [request_slice(requests, p, count) for p in range(count)]
        assert slices[0].start == 0 and slices[-1].stop == len(requests)
        for a, b in zip(slices, slices[1:]):
            assert a.stop == b.start  # contiguous, in process order, nothing twice
        total, largest = ns.sum(), ns.max()
        for s in slices:  # each within one request of an equal share of the samples
            assert abs(ns[s].sum() - total / count) <= largest
    requests = [Request(i, (1,), n) for i, n in enumerate([3, 1, 0, 2, 2])]
    assert [request_slice(requests, p, 2) for p in range(2)] == [slice(0, 2), slice(2, 5)]


class FakeEngine:
    """Deterministic completions keyed by (prompt_id, sample_index), some of length 0; records
    what it was asked and which pushes it loaded."""

    def __init__(self):
        self.weight_version, self.seen, self.loaded = 0, [], []

    def generate(self, requests, sampling):
        self.seen.append([r.prompt_id for r in requests])
        out = []
        for r in requests:
            for i in range(r.n):
                length = (r.prompt_id % 1000 + 3 * i) % 5
                out.append(
                    Completion(
                        r.prompt_id,
                        i,
                        np.arange(length, dtype=np.int32) + r.prompt_id % 1000 + i,
                        -0.5 * np.arange(length, dtype=np.float32) - i,
                        ("stop", "length")[i % 2],
                        self.weight_version,
                    )  # fmt: skip
                )
        return out

    def update_weights(self, params, version):
        self.weight_version = version

    def load_push(self, push):
        self.loaded.append(push)
        self.weight_version = push.version
        return 0.0, 0.0

    def close(self):
        pass


class FakePush:
    def __init__(self, version):
        self.version, self.removed = version, False
        self.export_s, self.nbytes = 0.0, 0

    def remove(self):
        self.removed = True


def _simulated_processes(monkeypatch, procs, body):
    """body(pid) on `procs` threads standing in for processes; the all-gather is a barrier."""
    local, barrier, slots = threading.local(), threading.Barrier(procs), {}

    def allgather(x):  # every simulated process deposits its array, then all read the stack
        call = local.calls = getattr(local, "calls", -1) + 1
        slots.setdefault(call, [None] * procs)[local.pid] = np.asarray(x)
        barrier.wait(timeout=30)
        return np.stack(slots[call])

    monkeypatch.setattr(multihost, "allgather_host", allgather)
    results, errors = [None] * procs, []

    def run(pid):
        local.pid = pid
        try:
            results[pid] = body(pid)
        except BaseException as e:  # re-raised below, not lost in the thread
            errors.append(e)
            barrier.abort()

    threads = [threading.Thread(target=run, args=(p,)) for p in range(procs)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    if errors:
        raise errors[0]
    return results


def _assert_same(got, want):
    assert len(got) == len(want)
    for a, b in zip(got, want, strict=True):
        assert (a.prompt_id, a.sample_index, a.finish_reason, a.weight_version) == (
            b.prompt_id, b.sample_index, b.finish_reason, b.weight_version,
        )  # fmt: skip
        np.testing.assert_array_equal(a.token_ids, b.token_ids)
        np.testing.assert_array_equal(a.logprobs, b.logprobs)


# Uneven counts (as DRA allocates them), n = 0 in the middle and at the end, ids too big for
# int32. 19 samples; first samples at 0, 4, 4, 5, 12, 14, 16, 19, so over 6 engines request r
# goes to min(start * 6 // 19, 5) = 0, 1, 1, 1, 3, 4, 5, 5 (engine 2 gets nothing).
COUNTS = [4, 0, 1, 7, 2, 2, 3, 0]
SPLIT_REQUESTS = [Request(10**12 + i, (1, 2), n) for i, n in enumerate(COUNTS)]
SHARDS = [[0], [1, 2, 3], [], [4], [5], [6, 7]]


def test_three_sidecars_on_each_of_two_processes_return_what_one_engine_returns(monkeypatch):
    """3 local engines x 2 simulated processes: every process gets exactly the one engine's
    completions (order, ids, per-prompt counts, zero-length samples, n = 0 requests); each
    engine saw only its slice; each process exported once per push, every engine loaded it."""
    procs, per_host = 2, 3
    one = FakeEngine()
    one.update_weights(None, 5)
    sampling = SamplingParams(max_new_tokens=4)
    want = one.generate(SPLIT_REQUESTS, sampling)
    assert any(len(c.token_ids) == 0 for c in want)  # zero-length completions are in the batch
    exports = [[] for _ in range(procs)]

    def body(pid):
        def export(params, version):
            exports[pid].append(FakePush(version))
            return exports[pid][-1]

        engine = SplitEngine(
            [FakeEngine() for _ in range(per_host)], export, process_index=pid, process_count=procs
        )
        engine.update_weights(None, 5)
        got = engine.generate(SPLIT_REQUESTS, sampling)
        samples = list(engine.last_samples)
        engine.update_weights(None, 6)
        empty = engine.generate([Request(7, (1,), 0)], sampling)
        return engine, got, samples, empty

    results = _simulated_processes(monkeypatch, procs, body)
    ids = [r.prompt_id for r in SPLIT_REQUESTS]
    for pid, (engine, got, samples, empty) in enumerate(results):
        _assert_same(got, want)
        assert empty == []
        shards = SHARDS[pid * per_host : (pid + 1) * per_host]
        # Each engine was called with its own requests only, and not at all when it had none.
        assert [f.seen for f in engine.local] == [
            [[ids[i] for i in s]] if s else [] for s in shards
        ]
        assert samples == [sum(COUNTS[i] for i in s) for s in shards]
        # One export per process per push; every local engine loaded that same push.
        assert [p.version for p in exports[pid]] == [5, 6]
        assert all(f.loaded == exports[pid] for f in engine.local)
        assert exports[pid][0].removed and not exports[pid][1].removed  # the superseded one
        assert engine.weight_version == 6
        engine.close()
        assert exports[pid][1].removed
    assert [r[2] for r in results] == [[4, 8, 0], [2, 2, 3]]


def test_one_process_needs_no_gather(monkeypatch):
    def no_gather(x):
        raise AssertionError("a single process must not all-gather")

    monkeypatch.setattr(multihost, "allgather_host", no_gather)
    fakes = [FakeEngine() for _ in range(3)]
    engine = SplitEngine(fakes, process_index=0, process_count=1)
    engine.update_weights(None, 2)  # no export: each engine is given the parameters
    one = FakeEngine()
    one.update_weights(None, 2)
    sampling = SamplingParams(max_new_tokens=4)
    _assert_same(engine.generate(SPLIT_REQUESTS, sampling), one.generate(SPLIT_REQUESTS, sampling))
    # 3 engines: owners min(start * 3 // 19, 2) = 0, 0, 0, 0, 1, 2, 2, 2.
    ids = [r.prompt_id for r in SPLIT_REQUESTS]
    assert [f.seen for f in fakes] == [[ids[:4]], [ids[4:5]], [ids[5:]]]
    assert engine.last_samples == [12, 2, 5] and engine.last_local_samples == 19
    with pytest.raises(ValueError, match="must not go back"):
        engine.update_weights(None, 1)


def test_a_refused_push_is_removed_and_the_error_kept():
    class Refuses(FakeEngine):
        def load_push(self, push):
            raise SidecarError("sidecar 1: refused")

    pushes = []

    def export(params, version):
        pushes.append(FakePush(version))
        return pushes[-1]

    engine = SplitEngine([FakeEngine(), FakeEngine()], export, process_index=0, process_count=1)
    engine.update_weights(None, 1)
    engine.local[1] = Refuses()
    with pytest.raises(SidecarError, match="sidecar 1"):
        engine.update_weights(None, 2)
    assert [p.removed for p in pushes] == [False, True]
    assert engine.weight_version == 1


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.vllm
@pytest.mark.skipif(
    not Path(VLLM_PYTHON).is_file(),
    reason=f"no vLLM venv at {VLLM_PYTHON}: run `bash scripts/make_vllm_venv.sh .venv-vllm`",
)
def test_two_processes_with_their_own_vllm_sidecars(tmp_path):
    """Greedy output on every process equals the embedded engine's on the same weights, before
    and after a push of changed (sharded) parameters; sampled output is the same on both
    processes; each sidecar drew only its own slice."""
    from dynamo_jax.models import hf_io
    from dynamo_jax.rollout.jax_engine import JaxEngine, JaxEngineConfig

    shape = dict(hidden=64, heads=2, kv_heads=1, intermediate=128, vocab=256, seed=5)
    ckpt = make_tiny_hf_checkpoint(tmp_path, "qwen2", tie=False, **shape)
    port = _free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("JAX_")}
    env.update(JAX_PLATFORMS="cpu", XLA_FLAGS="--xla_force_host_platform_device_count=1")
    worker = [sys.executable, str(ROOT / "tests" / "process_split_worker.py"), str(ckpt)]
    procs = [
        subprocess.Popen(
            [*worker, VLLM_PYTHON, str(tmp_path / "work"), str(tmp_path / f"out{pid}.json")],
            env={
                **env,
                "JAX_COORDINATOR_ADDRESS": f"127.0.0.1:{port}",
                "JAX_NUM_PROCESSES": "2",
                "JAX_PROCESS_ID": str(pid),
            },  # fmt: skip
            cwd=ROOT,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for pid in range(2)
    ]
    communicate_all(procs, ("process 0", "process 1"), timeout=900)
    out = [json.loads((tmp_path / f"out{pid}.json").read_text()) for pid in range(2)]

    cfg, params = hf_io.load_hf_checkpoint(ckpt)
    embedded = JaxEngine(cfg, params, JaxEngineConfig(min_batch=4, max_batch=16))
    greedy = SamplingParams(max_new_tokens=NEW, temperature=0.0)
    expect = lambda: [
        [c.prompt_id, c.sample_index, c.token_ids.tolist()]
        for c in embedded.generate(REQUESTS, greedy)
    ]
    before = expect()
    embedded.update_weights(changed_params(params), 1)
    after = expect()
    embedded.close()
    assert before != after
    mine = [sum(r.n for r in REQUESTS[request_slice(REQUESTS, p, 2)]) for p in range(2)]
    assert mine == [4, 4]
    for pid, got in enumerate(out):
        assert got["before"] == before and got["before_versions"] == [0]
        assert got["after"] == after and got["after_versions"] == [1]
        assert got["before_local"] == got["after_local"] == mine[pid]
        assert got["sampled"] == out[0]["sampled"]
        assert got["sampled_logprobs"] == out[0]["sampled_logprobs"]
        assert got["exports"] == 1
    counts = [sum(1 for c in out[0]["sampled"] if c[0] == r.prompt_id) for r in REQUESTS]
    assert counts == [r.n for r in REQUESTS]
    assert out[0]["sidecar_pid"] != out[1]["sidecar_pid"]
