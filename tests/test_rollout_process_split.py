"""`ProcessSplitEngine`: each process's own engine samples a contiguous, sample-balanced slice of
the requests, and every process gets the whole batch back in request order.

First simulated processes (threads; the all-gather is a barrier) over a fake engine, against the
same fake engine answering every request in one process; then two real processes
(jax.distributed on 127.0.0.1, one CPU device each, parameters sharded across them), each with
its own vLLM sidecar, against the embedded JAX engine on the same weights before and after a
weight push.
"""

import json
import os
import socket
import subprocess
import sys
import threading
from pathlib import Path

import jax
import numpy as np
import pytest
from hf_fixtures import make_tiny_hf_checkpoint
from process_split_worker import NEW, REQUESTS, changed_params
from processes import communicate_all

from dynamo_jax.rollout.process_split import ProcessSplitEngine, request_slice
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
    """Deterministic completions keyed by (prompt_id, sample_index), some of length 0."""

    def __init__(self):
        self.weight_version, self.seen = 0, []

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

    def close(self):
        pass


def test_simulated_processes_each_sample_their_slice_and_get_everything(monkeypatch):
    procs = 3
    requests = [Request(10**12 + i, (1, 2), n) for i, n in enumerate([4, 0, 1, 7, 2, 2, 3])]
    want = FakeEngine()
    want.update_weights(None, 5)
    want = want.generate(requests, SamplingParams(max_new_tokens=4))
    local, barrier, slots = threading.local(), threading.Barrier(procs), {}

    def allgather(x):  # every simulated process deposits its array, then all read the stack
        call = local.calls = getattr(local, "calls", -1) + 1
        slots.setdefault(call, [None] * procs)[local.pid] = np.asarray(x)
        barrier.wait()
        return np.stack(slots[call])

    monkeypatch.setattr(jax, "process_count", lambda: procs)
    monkeypatch.setattr(jax, "process_index", lambda: local.pid)
    monkeypatch.setattr(multihost, "allgather_host", allgather)
    engines = [ProcessSplitEngine(FakeEngine()) for _ in range(procs)]
    results = [None] * procs

    def one_process(pid):
        local.pid = pid
        engines[pid].update_weights(None, 5)
        results[pid] = engines[pid].generate(requests, SamplingParams(max_new_tokens=4))

    threads = [threading.Thread(target=one_process, args=(p,)) for p in range(procs)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=30)
    # 19 samples, first samples at 0, 4, 4, 5, 12, 14, 16: shares [0, 6.3) [6.3, 12.7) [12.7, 19)
    seen = [e.local.seen for e in engines]
    assert seen == [
        [[r.prompt_id for r in requests[s]]] for s in (slice(0, 4), slice(4, 5), slice(5, 7))
    ]
    assert [e.last_local_samples for e in engines] == [12, 2, 5]
    for got in results:
        assert len(got) == len(want)
        for a, b in zip(got, want, strict=True):
            assert (a.prompt_id, a.sample_index, a.finish_reason) == (
                b.prompt_id, b.sample_index, b.finish_reason,
            )  # fmt: skip
            assert a.weight_version == b.weight_version == 5
            np.testing.assert_array_equal(a.token_ids, b.token_ids)
            np.testing.assert_array_equal(a.logprobs, b.logprobs)


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
    counts = [sum(1 for c in out[0]["sampled"] if c[0] == r.prompt_id) for r in REQUESTS]
    assert counts == [r.n for r in REQUESTS]
    assert out[0]["sidecar_pid"] != out[1]["sidecar_pid"]
