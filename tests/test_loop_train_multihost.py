"""The training loop as two real processes (jax.distributed on 127.0.0.1, one CPU device each)
against one process with two devices: `python launch.py` on the tiny config, fsdp=2 so the
parameters and every batch span the processes.

Both runs must log the same per-step metrics (rewards, allocation, loss statistics: exactly),
write one set of metrics and one checkpoint (process 0 writes the host payload, each process its
own array shards), and end with bit-identical parameters and optimizer state.
"""

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import jax
import numpy as np
import pytest
from processes import communicate_all

from configs import tiny
from dynamo_jax.checkpoint import CheckpointConfig, Checkpointer, abstract_like
from dynamo_jax.config import from_config_dict
from dynamo_jax.reporting.metrics import read_metrics
from dynamo_jax.step.optimizer import make_optimizer

ROOT = Path(__file__).resolve().parents[1]
STEPS = 3
# Wall-clock figures differ between runs; everything else must not.
TIMING_PREFIXES = ("time/", "perf/tokens_per_s")
OVERRIDES = (
    f"--config.train.steps={STEPS}",
    "--config.mesh.shape=(1,2,1)",  # fsdp=2: with two processes each holds half of every matrix
    "--config.eval.every_steps=3",  # the last step evaluates: the engine runs collectively there
    "--config.logging.progress_bar=False",
    "--config.logging.tensorboard=False",
    "--config.logging.plots_at_end=False",
)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _launch(workdir: Path, devices: int, process: tuple[int, int, int] | None, *extra: str):
    """`launch.py` in a child with `devices` CPU devices; `process` = (count, id, port)."""
    env = {
        k: v for k, v in os.environ.items() if not k.startswith(("JAX_COORDINATOR", "JAX_NUM_P"))
    }
    env.pop("JAX_PROCESS_ID", None)
    env.update(JAX_PLATFORMS="cpu", XLA_FLAGS=f"--xla_force_host_platform_device_count={devices}")
    if process is not None:
        count, pid, port = process
        env.update(
            JAX_COORDINATOR_ADDRESS=f"127.0.0.1:{port}",
            JAX_NUM_PROCESSES=str(count),
            JAX_PROCESS_ID=str(pid),
        )
    cmd = [sys.executable, "launch.py", "--config", "configs/tiny.py", "--workdir", str(workdir)]
    return subprocess.Popen(
        [*cmd, *OVERRIDES, *extra],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """(multi-process workdir, single-process workdir), run side by side."""
    root = tmp_path_factory.mktemp("train_multihost")
    multi, single = root / "multi", root / "single"
    port = _free_port()
    procs = [
        _launch(multi, 1, (2, 0, port)),
        _launch(multi, 1, (2, 1, port)),
        _launch(single, 2, None),
    ]
    communicate_all(procs, ("process 0", "process 1", "single"), timeout=900)
    return multi, single


def _config():
    config = tiny.get_config()
    config.train.steps = STEPS
    config.mesh.shape = (1, 2, 1)
    return from_config_dict(config)


def _restore(workdir: Path, step: int = STEPS, all_steps: tuple | None = (STEPS,)):
    """Checkpoint `step` on one device (`all_steps`: the steps the workdir must hold)."""
    from dynamo_jax.step.state import abstract_train_state

    cfg = _config()
    optimizer = make_optimizer(cfg.optim, cfg.total_updates)
    device = jax.sharding.SingleDeviceSharding(jax.devices()[0])
    place = lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=device)
    state = jax.tree.map(place, abstract_train_state(cfg.model, optimizer))
    abstract = {
        "params": state.params,
        "opt_state": state.opt_state,
        "progress": {"step": state.step, "rng": abstract_like(jax.random.key(cfg.train.seed))},
    }
    ckpt = Checkpointer(workdir / "checkpoints", CheckpointConfig(), read_only=True)
    try:
        if all_steps is not None:
            assert ckpt.all_steps() == list(all_steps)
        restored = ckpt.restore(step, abstract)
    finally:
        ckpt.close()
    return restored


def _deterministic(records):
    return [{k: v for k, v in r.items() if not k.startswith(TIMING_PREFIXES)} for r in records]


@pytest.mark.slow  # the module's two-process runs (its `runs` fixture) dominate its time
def test_same_metrics_every_step(runs):
    multi, single = runs
    got, want = read_metrics(multi), read_metrics(single)
    # One line per step: only process 0 writes metrics (a second writer would double them).
    assert [r["step"] for r in got] == [r["step"] for r in want] == list(range(1, STEPS + 1))
    assert _deterministic(got) == _deterministic(want)
    # The comparison covers what the processes had to agree on, not just bookkeeping.
    for key in ("reward/mean", "alloc/n_hist", "loss/loss", "loss/grad_norm", "entropy/mean"):
        assert key in got[0], key
    assert "eval/pass@1" in got[-1]
    assert got[-1]["train/applied_updates"] == STEPS * _config().updates_per_step


@pytest.mark.slow  # shares the two-process `runs` fixture
def test_checkpoint_written_once_and_restores_the_same_state(runs):
    multi, single = runs
    assert json.loads((multi / "config.json").read_text()) == json.loads(
        (single / "config.json").read_text()
    )
    state_dir = multi / "checkpoints" / str(STEPS) / "params"
    # Each process wrote its own shards of the arrays; the host payload came from process 0 only.
    assert sorted(p.name for p in state_dir.glob("ocdbt.process_*")) == [
        "ocdbt.process_0",
        "ocdbt.process_1",
    ]
    assert not list((multi / "checkpoints" / str(STEPS) / "host").glob("ocdbt.process_1"))
    got, want = _restore(multi), _restore(single)
    assert got.meta == want.meta
    jax.tree.map(np.testing.assert_array_equal, got.host, want.host)
    flat_got = jax.tree_util.tree_leaves_with_path(got.device)
    flat_want = jax.tree.leaves(want.device)
    assert len(flat_got) == len(flat_want)
    # Bit-identical, not just close: with two participants every cross-process sum (gradient
    # reduce-scatter, statistics) is a + b in either order, and each process computes the rows
    # its device would compute in the single process.
    for (path, a), b in zip(flat_got, flat_want):
        if jax.dtypes.issubdtype(a.dtype, jax.dtypes.prng_key):
            a, b = jax.random.key_data(a), jax.random.key_data(b)
        np.testing.assert_array_equal(
            np.asarray(a), np.asarray(b), err_msg=jax.tree_util.keystr(path)
        )
    # Trained state was compared, not an untouched tree: every update was applied.
    assert int(got.device["progress"]["step"]) == STEPS * _config().updates_per_step


VLLM_PYTHON = os.environ.get("DYNAMO_VLLM_PYTHON", str(ROOT / ".venv-vllm" / "bin" / "python"))


@pytest.mark.vllm
@pytest.mark.skipif(
    not Path(VLLM_PYTHON).is_file(),
    reason=f"no vLLM venv at {VLLM_PYTHON}: run `bash scripts/make_vllm_venv.sh .venv-vllm`",
)
def test_vllm_sidecars_on_two_processes_train_like_one(tmp_path):
    """The vLLM engine as two processes, each with its own sidecar sampling half of every batch
    (SplitEngine), against one process with one sidecar: the same per-step metrics,
    evaluation included, from the same random initial checkpoint."""
    from hf_fixtures import random_flax_params

    from dynamo_jax.models import hf_io

    cfg = _config()
    init = hf_io.save_hf_checkpoint(
        random_flax_params(cfg.model, seed=1), cfg.model, tmp_path / "hf"
    )
    extra = (
        "--config.rollout.engine=vllm",
        f"--config.rollout.sidecar_python={VLLM_PYTHON}",
        f"--config.init.checkpoint={init}",
    )
    multi, single, port = tmp_path / "multi", tmp_path / "single", _free_port()
    procs = [_launch(multi, 1, (2, pid, port), *extra) for pid in range(2)]
    procs.append(_launch(single, 2, None, *extra))
    communicate_all(procs, ("process 0", "process 1", "single"), timeout=900)
    got, want = read_metrics(multi), read_metrics(single)
    assert [r["step"] for r in got] == list(range(1, STEPS + 1))
    assert _deterministic(got) == _deterministic(want)
    assert "eval/pass@1" in got[-1]
    # Both sidecars ran (each logs apart), and the single run's one sidecar.
    for d in (multi / "sidecar_process0", multi / "sidecar_process1", single):
        assert (d / "vllm_sidecar.log").is_file(), d


def test_scoring_is_split_over_processes_and_gathered(monkeypatch):
    """Three simulated processes (threads; the all-gather is a barrier) score 7 completions:
    contiguous slices of 3, 3 and 1, each scored once, and every process ends with the rewards
    and verdict shares a single process computes."""
    import threading

    from dynamo_jax import tasks
    from dynamo_jax.rollout.protocol import Completion
    from dynamo_jax.sharding import multihost

    procs, n = 3, 7
    completions = [Completion(10 + i, 0, (1,), (0.0,), "stop", 0) for i in range(n)]
    scored: dict[int, list[int]] = {}
    local, barrier, slots = threading.local(), threading.Barrier(procs), {}

    class FakeTask:
        def score_codes(self, comps):
            scored[local.pid] = [c.prompt_id for c in comps]
            ids = np.asarray([c.prompt_id for c in comps])
            return (ids / 4).astype(np.float32), (ids % 3).astype(np.int32)

        def score(self, comps):
            rewards, codes = self.score_codes(comps)
            return rewards, tasks.status_shares(codes)

    def allgather(x):  # every simulated process deposits its array, then all read the stack
        call = local.calls = getattr(local, "calls", -1) + 1
        slots.setdefault(call, [None] * procs)[local.pid] = x
        barrier.wait()
        return np.stack(slots[call])

    local.pid = 0
    want = FakeTask().score(completions)
    scored.clear()
    monkeypatch.setattr(jax, "process_count", lambda: procs)
    monkeypatch.setattr(jax, "process_index", lambda: local.pid)
    monkeypatch.setattr(multihost, "allgather_host", allgather)
    results = [None] * procs

    def one_process(pid):
        local.pid = pid
        results[pid] = tasks.score_completions(FakeTask(), completions)

    threads = [threading.Thread(target=one_process, args=(i,)) for i in range(procs)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=30)
    assert scored == {0: [10, 11, 12], 1: [13, 14, 15], 2: [16]}
    for rewards, shares in results:
        np.testing.assert_array_equal(rewards, want[0])
        assert shares == want[1]
    assert want[1]["reward/wrong_share"] == 3 / 7  # ids 10, 13, 16 → code 1 ("wrong")


STALENESS_ONE = ("--config.train.max_staleness=1", "--config.checkpoint.every_steps=2")


@pytest.mark.slow
def test_staleness_one_on_two_processes_trains_like_one(tmp_path):
    """max_staleness 1 with the embedded engine: the batch requested ahead, its π_old from the
    kept parameter copy, and the batch in flight at the step-2 checkpoint (its π_old computed
    then, a collective forward inside the host payload) agree between two processes and one."""
    multi, single, port = tmp_path / "multi", tmp_path / "single", _free_port()
    procs = [_launch(multi, 1, (2, pid, port), *STALENESS_ONE) for pid in range(2)]
    procs.append(_launch(single, 2, None, *STALENESS_ONE))
    communicate_all(procs, ("process 0", "process 1", "single"), timeout=900)
    got, want = read_metrics(multi), read_metrics(single)
    assert _deterministic(got) == _deterministic(want)
    assert [r["rollout/staleness"] for r in got] == [0, 1, 1]
    for step in (2, STEPS):
        a, b = _restore(multi, step, None), _restore(single, step, None)
        jax.tree.map(np.testing.assert_array_equal, a.host, b.host)
        for item in ("params", "opt_state"):
            jax.tree.map(np.testing.assert_array_equal, a.device[item], b.device[item])
    assert int(np.asarray(_restore(multi, 2, None).host["pipeline"]["count"])) == 1


@pytest.mark.vllm
@pytest.mark.slow
@pytest.mark.skipif(
    not Path(VLLM_PYTHON).is_file(),
    reason=f"no vLLM venv at {VLLM_PYTHON}: run `bash scripts/make_vllm_venv.sh .venv-vllm`",
)
def test_vllm_sidecars_generating_in_the_background_on_two_processes(tmp_path):
    """max_staleness 1 with two processes and two sidecars: each worker thread generates its
    process's slice while the trainer trains, the all-gather runs on the main thread when the
    batch is taken (and at the checkpoint); the same metrics as one process with one sidecar."""
    from hf_fixtures import random_flax_params

    from dynamo_jax.models import hf_io

    cfg = _config()
    init = hf_io.save_hf_checkpoint(
        random_flax_params(cfg.model, seed=1), cfg.model, tmp_path / "hf"
    )
    extra = (
        "--config.rollout.engine=vllm",
        f"--config.rollout.sidecar_python={VLLM_PYTHON}",
        f"--config.init.checkpoint={init}",
        *STALENESS_ONE,
    )
    multi, single, port = tmp_path / "multi", tmp_path / "single", _free_port()
    procs = [_launch(multi, 1, (2, pid, port), *extra) for pid in range(2)]
    procs.append(_launch(single, 2, None, *extra))
    communicate_all(procs, ("process 0", "process 1", "single"), timeout=900)
    got, want = read_metrics(multi), read_metrics(single)
    assert _deterministic(got) == _deterministic(want)
    assert [r["rollout/staleness"] for r in got] == [0, 1, 1]
    assert all("time/generate_background" in r for r in got)
