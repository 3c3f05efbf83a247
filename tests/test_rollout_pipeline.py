"""The in-flight queue: which batch is requested when and by which weights, the version and
staleness checks, the kept parameter copies, and the checkpoint payload (through orbax)."""

import threading

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from dynamo_jax.allocation import AllocationResult
from dynamo_jax.checkpoint import DEVICE_ITEMS, CheckpointConfig, Checkpointer
from dynamo_jax.rollout.background import BackgroundEngine
from dynamo_jax.rollout.pipeline import (
    BatchPlan,
    Behaviour,
    RolloutPipeline,
    StaleBatchError,
)
from dynamo_jax.rollout.protocol import Completion, Request, SamplingParams


class FakeEngine:
    """Samples are a function of (seed, prompt id, sample index); `version_offset` makes it
    report other weights than it was given (a faulty engine)."""

    def __init__(self, version_offset=0):
        self.weight_version = 0
        self.version_offset = version_offset
        self.calls = []  # (seed, version) of each generate
        self.gate = None  # a threading.Event generate_local waits on, if set

    def generate(self, requests, sampling):
        self.calls.append((sampling.seed, self.weight_version))
        out = []
        for r in requests:
            for i in range(r.n):
                tok = np.array([sampling.seed % 7, r.prompt_id % 5, i], np.int32)
                out.append(
                    Completion(r.prompt_id, i, tok, -np.arange(1, 4, dtype=np.float32) / 8,
                               "stop" if i % 2 else "length",
                               self.weight_version + self.version_offset)
                )  # fmt: skip
        return out

    def update_weights(self, params, version):
        self.weight_version = version

    def close(self):
        pass

    # BackgroundCapable
    def generate_local(self, requests, sampling):
        if self.gate is not None:
            assert self.gate.wait(10)
        return self.generate(requests, sampling)

    def finish_generate(self, requests, local):
        return local

    def export_weights(self, params, version):
        return version

    def load_weights(self, version):
        self.weight_version = version


def _plan(step, version, n=(2, 3)):
    rows = np.arange(len(n), dtype=np.int64) + 10 * step
    return BatchPlan(
        step=step,
        rows=rows,
        epoch_end=step % 2 == 0,
        allocation=AllocationResult(np.asarray(n, np.int64), 1, {"alloc/x": 0.1 * step}),
        requests=tuple(Request(int(r) + 100, (1, 2, int(r)), k) for r, k in zip(rows, n)),
        sampling=SamplingParams(max_new_tokens=3, temperature=0.7 + step / 3, seed=1000 + step),
        version=version,
    )


def _fill(pipeline, step, params):
    """The loop's request: the batches due, planned with the engine's version step - 1."""
    pipeline.fill(step, [_plan(s, step - 1) for s in pipeline.due(step)], params)


def _run(pipeline, engine, steps, params_of=lambda v: {"w": jnp.full(3, float(v))}):
    """The trainer's loop as the pipeline sees it: fill, take, push version `step`."""
    log = []
    for step in range(1, steps + 1):
        requested = len(engine.calls)
        _fill(pipeline, step, params_of(step - 1))
        taken = pipeline.take(step)
        log.append((step, taken.plan.version, len(engine.calls) - requested))
        engine.update_weights(params_of(step), step)
    return log


def test_staleness_two_requests_ahead_with_the_weights_of_the_moment():
    # k = 2, 5 steps. Step 1 requests batches 1, 2, 3 with version 0; step 2 batch 4 with
    # version 1; step 3 batch 5 with version 2; steps 4-5 request nothing (5 is the last step).
    # Batch s is sampled by version max(0, s - 3): staleness min(s - 1, 2) = 0, 1, 2, 2, 2.
    engine = FakeEngine()
    pipeline = RolloutPipeline(engine, max_staleness=2, last_step=5, source="engine")
    log = _run(pipeline, engine, 5)
    assert log == [(1, 0, 3), (2, 0, 1), (3, 0, 1), (4, 1, 0), (5, 2, 0)]
    assert [seed - 1000 for seed, _ in engine.calls] == [1, 2, 3, 4, 5]
    assert [v for _, v in engine.calls] == [0, 0, 0, 1, 2]
    assert pipeline.in_flight == [] and pipeline.kept_versions == []


def test_synchronous_pipeline_requests_and_takes_within_the_step():
    engine = FakeEngine()
    pipeline = RolloutPipeline(engine, max_staleness=0, last_step=3, source="trainer")
    assert _run(pipeline, engine, 3) == [(1, 0, 1), (2, 1, 1), (3, 2, 1)]
    assert pipeline.kept_versions == []  # nothing is kept when on-policy


def test_a_batch_of_the_wrong_version_is_refused():
    engine = FakeEngine(version_offset=-1)  # reports the weights before the ones it was given
    pipeline = RolloutPipeline(engine, max_staleness=1, last_step=4, source="engine")
    _fill(pipeline, 1, None)
    with pytest.raises(StaleBatchError, match=r"weight version\(s\) \[-1\].*held version 0"):
        pipeline.take(1)


def test_a_batch_older_than_the_bound_is_refused():
    # Batches requested with staleness 2 (3 in flight after step 1, all version 0), resumed in
    # a run allowed staleness 1: step 2's batch (1 behind) passes, step 3's (2 behind) does not.
    engine = FakeEngine()
    ahead = RolloutPipeline(engine, max_staleness=2, last_step=5, source="engine")
    _fill(ahead, 1, None)
    ahead.take(1)
    state = ahead.state_dict(None)
    engine.update_weights(None, 1)
    strict = RolloutPipeline(engine, max_staleness=1, last_step=5, source="engine")
    strict.load_state_dict(state)
    _fill(strict, 2, None)
    assert strict.take(2).plan.version == 0
    engine.update_weights(None, 2)
    _fill(strict, 3, None)
    with pytest.raises(StaleBatchError, match="version 0, 2 versions behind the trainer's 2"):
        strict.take(3)


def test_the_engine_must_hold_the_pushed_version():
    engine = FakeEngine()
    pipeline = RolloutPipeline(engine, max_staleness=1, last_step=3, source="engine")
    with pytest.raises(
        StaleBatchError, match="engine holds weight version 0, the trainer pushed 1"
    ):
        _fill(pipeline, 2, None)


def test_only_the_batches_due_are_requested():
    """`fill` takes the plans of exactly the steps `due` names: up to step + k, not past the
    last step, none requested twice."""
    engine = FakeEngine()
    pipeline = RolloutPipeline(engine, max_staleness=2, last_step=4, source="engine")
    assert list(pipeline.due(1)) == [1, 2, 3]
    with pytest.raises(RuntimeError, match=r"plans for steps \[1, 2\], but steps \[1, 2, 3\]"):
        pipeline.fill(1, [_plan(1, 0), _plan(2, 0)], None)
    _fill(pipeline, 1, None)
    pipeline.take(1)
    engine.update_weights(None, 1)
    assert list(pipeline.due(2)) == [4]  # 2 and 3 are in flight; 5 is past the last step
    _fill(pipeline, 2, None)
    pipeline.take(2)
    engine.update_weights(None, 2)
    assert list(pipeline.due(3)) == []  # 3 and 4 are in flight; 4 is the last step


def test_parameter_copies_of_in_flight_versions():
    """Under "trainer" the behaviour policy's parameters are copied at request time (the update
    then donates the originals) and dropped once the last batch of that version is taken."""
    engine = FakeEngine()
    pipeline = RolloutPipeline(engine, max_staleness=2, last_step=5, source="trainer")
    current = {"w": jnp.zeros(3)}
    _fill(pipeline, 1, current)
    assert pipeline.kept_versions == [0]  # batches 2 and 3 are trained later
    taken = pipeline.take(1)
    assert taken.behaviour_params is not None  # version 0's copy, still needed by 2 and 3
    current["w"].delete()  # as the update's donation does
    engine.update_weights(None, 1)
    current = {"w": jnp.ones(3)}
    _fill(pipeline, 2, current)  # batch 4 by version 1
    taken = pipeline.take(2)
    np.testing.assert_array_equal(taken.behaviour_params["w"], np.zeros(3))
    assert pipeline.kept_versions == [0, 1]
    engine.update_weights(None, 2)
    _fill(pipeline, 3, {"w": jnp.full(3, 2.0)})  # batch 5 by version 2
    taken = pipeline.take(3)  # the last batch of version 0
    np.testing.assert_array_equal(taken.behaviour_params["w"], np.zeros(3))
    assert pipeline.kept_versions == [1, 2]
    engine.update_weights(None, 3)
    _fill(pipeline, 4, None)
    np.testing.assert_array_equal(pipeline.take(4).behaviour_params["w"], np.ones(3))
    assert pipeline.kept_versions == [2]


def _assert_same(a, b):
    assert (a.plan.step, a.plan.version, a.plan.epoch_end) == (
        b.plan.step,
        b.plan.version,
        b.plan.epoch_end,
    )
    np.testing.assert_array_equal(a.plan.rows, b.plan.rows)
    np.testing.assert_array_equal(a.plan.allocation.n, b.plan.allocation.n)
    assert a.plan.allocation.shortfall == b.plan.allocation.shortfall
    assert a.plan.allocation.diagnostics == b.plan.allocation.diagnostics
    assert a.plan.sampling == b.plan.sampling and a.plan.requests == b.plan.requests
    assert len(a.completions) == len(b.completions)
    for x, y in zip(a.completions, b.completions):
        assert (x.prompt_id, x.sample_index, x.finish_reason, x.weight_version) == (
            y.prompt_id, y.sample_index, y.finish_reason, y.weight_version)  # fmt: skip
        np.testing.assert_array_equal(x.token_ids, y.token_ids)
        np.testing.assert_array_equal(x.logprobs, y.logprobs)


def test_checkpoint_payload_round_trips_through_orbax(tmp_path):
    """Batches in flight (plans, completions, behaviour log-probs computed at save time from the
    kept copy) come back exactly from a real checkpoint."""
    engine = FakeEngine()
    reference = RolloutPipeline(engine, max_staleness=2, last_step=6, source="trainer")
    _fill(reference, 1, {"w": jnp.full(3, 0.5)})
    reference.take(1)
    seen = []

    class Behaviours:  # the loop's side of the BehaviourSource protocol
        def behaviour(self, plan, completions, params):
            seen.append((plan.step, float(params["w"][0])))
            return Behaviour(np.full((4, 3), plan.step / 3, np.float32), f"layout{plan.step}")

    ckpt = Checkpointer(tmp_path, CheckpointConfig())
    device = {name: {"x": jnp.zeros(2)} for name in DEVICE_ITEMS}
    host = {"pipeline": reference.state_dict(Behaviours())}
    ckpt.save(1, device=device, host=host, meta={})
    restored = ckpt.restore(1, {"params": {"x": jax.ShapeDtypeStruct((2,), jnp.float32)}})
    ckpt.close()
    assert seen == [(2, 0.5), (3, 0.5)]  # each in-flight batch, from version 0's copy
    resumed = RolloutPipeline(engine, max_staleness=2, last_step=6, source="trainer")
    resumed.load_state_dict(restored.host["pipeline"])
    assert resumed.kept_versions == []  # no copies needed any more
    engine.update_weights(None, 1)
    for step in (2, 3):
        a, b = reference.take(step), resumed.take(step)
        _assert_same(a, b)
        assert b.behaviour.layout == f"layout{step}" and b.behaviour_params is None
        np.testing.assert_array_equal(a.behaviour.logp, b.behaviour.logp)


def test_background_generation_does_not_block_the_trainer():
    """With a BackgroundEngine, `fill` returns while the batch is still being generated, and
    `take` waits for it; pushes queue behind the generation in flight."""
    engine = FakeEngine()
    engine.gate = threading.Event()
    background = BackgroundEngine(engine)
    pipeline = RolloutPipeline(background, max_staleness=1, last_step=3, source="engine")
    _fill(pipeline, 1, None)  # returns at once although generation is held up
    assert engine.calls == []
    background.update_weights(None, 1)  # queued behind both generations
    assert background.weight_version == 1 and engine.weight_version == 0
    engine.gate.set()
    taken = pipeline.take(1)
    assert taken.plan.version == 0 and taken.generate_s >= 0
    _fill(pipeline, 2, None)  # batch 3, by version 1
    assert pipeline.take(2).plan.version == 0
    background.update_weights(None, 2)
    _fill(pipeline, 3, None)
    assert pipeline.take(3).plan.version == 1
    assert [v for _, v in engine.calls] == [0, 0, 1]
    background.close()
