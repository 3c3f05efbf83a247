"""Two REAL vLLM sidecars in one process, built by the engine factory as a run builds them.

Oracles: the embedded JAX engine on the same weights (greedy), and each sidecar alone answering
the whole batch (a fleet of one: `SplitEngine` over that sidecar), for greedy and sampled
output. One fleet serves the module (a vLLM start costs 20-60 s here); the tests run in order
and each states the weight version it expects. The sidecars run `tests/stale_sidecar_server.py`,
the real server plus a hook that skips one sidecar's reload when the last test asks it to.
"""

from __future__ import annotations

import dataclasses
import os
import signal
import time
from pathlib import Path

import jax
import numpy as np
import pytest
from hf_fixtures import make_tiny_hf_checkpoint

from configs import tiny
from dynamo_jax import engine_factory as factory
from dynamo_jax.config import from_config_dict
from dynamo_jax.errors import SidecarError
from dynamo_jax.models import hf_io
from dynamo_jax.rollout import sidecar_client, weight_push
from dynamo_jax.rollout.jax_engine import JaxEngine, JaxEngineConfig
from dynamo_jax.rollout.process_split import SplitEngine
from dynamo_jax.rollout.protocol import Request, SamplingParams

REPO = Path(__file__).resolve().parents[1]
VLLM_PYTHON = os.environ.get("DYNAMO_VLLM_PYTHON", str(REPO / ".venv-vllm" / "bin" / "python"))
pytestmark = [
    pytest.mark.vllm,
    pytest.mark.slow,
    pytest.mark.skipif(
        not Path(VLLM_PYTHON).is_file(),
        reason=f"no vLLM venv at {VLLM_PYTHON}: run `bash scripts/make_vllm_venv.sh .venv-vllm`",
    ),
]
SHAPE = dict(hidden=64, heads=2, kv_heads=1, intermediate=128, vocab=256, seed=5)
PROMPTS = [(5, 6, 7, 8), (9, 10, 11, 12, 13, 14, 15), (200, 3), (17,), (40, 41, 42)]
# 8 samples, first samples at 0, 3, 4, 4, 6: over 2 sidecars requests go to start * 2 // 8 =
# 0, 0, 1, 1, 1, i.e. 4 samples each; an n = 0 request in the middle.
GREEDY_COUNTS = [3, 1, 0, 2, 2]
SAMPLED_COUNTS = [3, 5, 0, 4, 2]
NEW = 8


def _requests(counts):
    return [Request(100 + i, p, n) for i, (p, n) in enumerate(zip(PROMPTS, counts))]


def _changed(params, scale):
    return jax.tree.map(lambda x: x * scale + 0.01, params)


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    root = tmp_path_factory.mktemp("fleet")
    ckpt = make_tiny_hf_checkpoint(root, "qwen2", tie=False, **SHAPE)
    model_cfg, params = hf_io.load_hf_checkpoint(ckpt)
    config = tiny.get_config()
    for key, value in dataclasses.asdict(model_cfg).items():
        config.model[key] = value
    config.init.checkpoint = str(ckpt)
    config.rollout.update(
        engine="vllm", sidecar_python=VLLM_PYTHON, vllm_dtype="float32", max_new_tokens=NEW,
        vllm_enforce_eager=True, vllm_max_num_seqs=16, sidecars_per_host=2, call_timeout_s=300.0,
    )  # fmt: skip
    cfg = from_config_dict(config)
    stale_file = root / "stale"
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(sidecar_client, "SERVER_SCRIPT", REPO / "tests" / "stale_sidecar_server.py")
        mp.setenv("DYNAMO_TEST_STALE_FILE", str(stale_file))
        fleet = factory.build_sidecar_fleet(cfg, root / "work", [])
        embedded = JaxEngine(model_cfg, params, JaxEngineConfig(min_batch=4, max_batch=16))
        try:
            yield fleet, embedded, params, stale_file, weight_push.push_tag(root / "work", 0)
        finally:
            fleet.close()
            embedded.close()


def _tokens(completions):
    return [(c.prompt_id, c.sample_index, c.token_ids.tolist()) for c in completions]


def _alone(sidecar):
    """The whole batch on one sidecar: a fleet of one."""
    return SplitEngine([sidecar], process_index=0, process_count=1)


def _check_against_oracles(fleet, embedded, version):
    greedy = SamplingParams(max_new_tokens=NEW, temperature=0.0)
    requests = _requests(GREEDY_COUNTS)
    got = fleet.generate(requests, greedy)
    assert {c.weight_version for c in got} == {version}
    assert fleet.last_samples == [4, 4]  # each sidecar drew its own slice only
    want = _tokens(embedded.generate(requests, greedy))
    assert _tokens(got) == want
    for sidecar in fleet.local:
        assert _tokens(_alone(sidecar).generate(requests, greedy)) == want
    sampled = SamplingParams(max_new_tokens=NEW, temperature=1.0, seed=11)
    requests = _requests(SAMPLED_COUNTS)
    split = fleet.generate(requests, sampled)
    assert [s.stop - s.start for s in fleet.slices(requests)] == [2, 3]
    assert fleet.last_samples == [8, 6]
    one = _alone(fleet.local[0]).generate(requests, sampled)
    assert _tokens(split) == _tokens(one)  # sampling does not depend on the split
    np.testing.assert_allclose(  # batch shape may move float32 rounding only
        np.concatenate([c.logprobs for c in split]),
        np.concatenate([c.logprobs for c in one]),
        atol=1e-5,
    )
    counts = [sum(c.prompt_id == r.prompt_id for c in split) for r in requests]
    assert counts == SAMPLED_COUNTS
    return want, split


def test_two_sidecars_generate_what_one_does_and_what_the_embedded_engine_does(setup):
    fleet, embedded, params, _, tag = setup
    # Each sidecar's environment carries its device group (nominal on CPU).
    for group, sidecar in zip(["0", "1"], fleet.local):
        environ = Path(f"/proc/{sidecar.pid}/environ").read_bytes().split(b"\0")
        assert f"CUDA_VISIBLE_DEVICES={group}".encode() in environ
        assert sidecar.log_path.name == f"vllm_sidecar{group}.log"
    before, _ = _check_against_oracles(fleet, embedded, version=0)

    changed = _changed(params, 1.25)
    fleet.update_weights(changed, 1)
    embedded.update_weights(changed, 1)
    assert fleet.exports == 1  # one export for both sidecars
    pushes = list(Path("/dev/shm").glob(f"dynamo-push-{tag}-*"))
    assert pushes == [fleet._push.directory]  # the one shared directory
    push = fleet.last_push
    assert push.reload_s > 0 and push.verify_s > 0
    print(
        f"2 sidecars, tiny qwen2 push: export {push.export_s * 1e3:.1f} ms, reload "
        f"{push.reload_s * 1e3:.1f} ms, verify {push.verify_s * 1e3:.1f} ms"
    )
    after, _ = _check_against_oracles(fleet, embedded, version=1)
    assert after != before


def test_killing_one_sidecar_restarts_it_alone_and_the_run_goes_on(setup):
    fleet, embedded, _, _, _ = setup
    sampled = SamplingParams(max_new_tokens=NEW, temperature=1.0, seed=11)
    requests = _requests(SAMPLED_COUNTS)
    want = fleet.generate(requests, sampled)
    pids = [s.pid for s in fleet.local]
    os.kill(pids[1], signal.SIGKILL)
    deadline = time.monotonic() + 30
    while fleet.local[1]._res.process.popen.poll() is None and time.monotonic() < deadline:
        time.sleep(0.1)
    got = fleet.generate(requests, sampled)  # sidecar 1 is restarted, re-given version 1
    assert [s.restarts for s in fleet.local] == [0, 1]
    assert fleet.local[0].pid == pids[0] and fleet.local[1].pid not in (None, pids[1])
    assert _tokens(got) == _tokens(want) and {c.weight_version for c in got} == {1}
    assert "restarting" not in fleet.local[0].log_path.read_text()
    _check_against_oracles(fleet, embedded, version=1)


def test_a_stale_push_is_caught_by_the_verification(setup):
    fleet, _, params, stale_file, _ = setup
    stale_file.write_text("1")  # sidecar 1 (devices "1") will skip its next reload
    try:
        with pytest.raises(
            SidecarError,
            match=r"sidecar 1 \(devices 1\) .* does not serve the pushed weights of version 2: "
            r"tensor (lm_head|model\.)[\w.]+ \(tensor-parallel rank 0",
        ):
            fleet.update_weights(_changed(params, 0.8), 2)
    finally:
        stale_file.unlink()
    assert "test hook: reload" in fleet.local[1].log_path.read_text()
    assert "test hook" not in fleet.local[0].log_path.read_text()
