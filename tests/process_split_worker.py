"""One process of test_rollout_process_split.py's two-process run with real vLLM sidecars.

    python tests/process_split_worker.py CKPT VLLM_PYTHON WORKDIR OUT_JSON   (JAX_* env set)

Joins jax.distributed, loads the checkpoint sharded over an fsdp=2 mesh spanning both processes,
and drives a `SplitEngine` over its own sidecar the way the trainer does (one export per process
into its own push directory, loaded and verified by its sidecar): greedy and sampled generation,
a weight push of changed parameters, greedy again. Writes what it got.
"""

import json
import os
import sys
from pathlib import Path

import jax

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from dynamo_jax.rollout.protocol import Request  # noqa: E402

PROMPTS = [(5, 6, 7, 8), (9, 10, 11, 12, 13, 14, 15), (200, 3), (17,), (40, 41, 42)]
# Uneven counts (as DRA allocates them), a zero, and more samples than prompts per process.
REQUESTS = [Request(100 + i, p, n) for i, (p, n) in enumerate(zip(PROMPTS, [3, 1, 0, 2, 2]))]
NEW = 8


def changed_params(params):
    """A deterministic change of every tensor that survives sharding exactly (elementwise)."""
    return jax.tree.map(lambda x: x * 1.25 + 0.01, params)


def main() -> None:
    ckpt, vllm_python, workdir, out = sys.argv[1:5]
    jax.distributed.initialize(
        os.environ["JAX_COORDINATOR_ADDRESS"],
        num_processes=int(os.environ["JAX_NUM_PROCESSES"]),
        process_id=int(os.environ["JAX_PROCESS_ID"]),
    )
    from dynamo_jax.models import hf_io
    from dynamo_jax.models.config import ModelConfig
    from dynamo_jax.rollout import weight_push
    from dynamo_jax.rollout.process_split import SplitEngine
    from dynamo_jax.rollout.protocol import SamplingParams
    from dynamo_jax.rollout.sidecar_client import SidecarConfig, VLLMSidecarEngine
    from dynamo_jax.sharding.mesh import MeshConfig, build_mesh
    from dynamo_jax.sharding.rules import DEFAULT_RULES
    from dynamo_jax.step.forward import model_param_shardings

    mesh = build_mesh(MeshConfig(shape=(1, 2, 1)), jax.devices())
    cfg = ModelConfig.from_hf_config(hf_io.read_hf_config(ckpt))
    shardings = model_param_shardings(cfg, mesh, DEFAULT_RULES)
    cfg, params = hf_io.load_hf_checkpoint(ckpt, cfg=cfg, shardings=shardings)
    config = SidecarConfig(
        python=vllm_python, model_path=ckpt, dtype="float32", max_model_len=64,
        enforce_eager=True, startup_timeout_s=600, call_timeout_s=300, max_num_seqs=16,
    )  # fmt: skip
    tag = weight_push.push_tag(workdir, jax.process_index())
    local = VLLMSidecarEngine(
        config, cfg, workdir=f"{workdir}/p{jax.process_index()}", push_tag=tag
    )
    export = lambda params, version: weight_push.export_push_dir(
        params, cfg, config.shm_dir, version, config.dtype, tag
    )
    result = {}
    with SplitEngine([local], export) as engine:
        greedy = SamplingParams(max_new_tokens=NEW, temperature=0.0)
        sampled = SamplingParams(max_new_tokens=NEW, temperature=1.0, seed=11)
        for name, params_now, version in (("before", params, 0), ("after", None, 1)):
            if params_now is None:
                engine.update_weights(changed_params(params), version)
            got = engine.generate(REQUESTS, greedy)
            result[name] = [(c.prompt_id, c.sample_index, c.token_ids.tolist()) for c in got]
            result[name + "_versions"] = sorted({c.weight_version for c in got})
            result[name + "_local"] = engine.last_local_samples
        got = engine.generate(REQUESTS, sampled)
        result["sampled"] = [(c.prompt_id, c.sample_index, c.token_ids.tolist()) for c in got]
        result["sampled_logprobs"] = [c.logprobs.tolist() for c in got]
        result["sidecar_pid"] = local.pid
        result["exports"] = engine.exports
    Path(out).write_text(json.dumps(result))


if __name__ == "__main__":
    main()
