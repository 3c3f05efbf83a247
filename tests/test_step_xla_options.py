"""The trainer programs' XLA options: on CPU, matrix products by XLA's own emitter."""

import types

import jax
import numpy as np

from dynamo_jax.step.xla_options import trainer_compiler_options


def _mesh_on(platform):
    device = types.SimpleNamespace(platform=platform)
    return types.SimpleNamespace(devices=np.array([device], dtype=object))


def test_cpu_programs_turn_ynnpack_off_and_other_platforms_get_none():
    assert trainer_compiler_options(_mesh_on("cpu")) == {"xla_cpu_experimental_ynn_fusion_type": ""}
    assert trainer_compiler_options(_mesh_on("gpu")) is None


def test_the_option_reaches_the_compiled_program():
    """Compiled with it, a product is no YNNPACK fusion; without it (XLA's default) it is."""
    mesh = jax.sharding.Mesh(np.array(jax.devices()[:1]), ("data",))
    x = np.ones((256, 256), np.float32)
    product = lambda a, b: a @ b
    plain = jax.jit(product).lower(x, x).compile().as_text()
    ours = jax.jit(product, compiler_options=trainer_compiler_options(mesh))
    assert "ynn" in plain and "ynn" not in ours.lower(x, x).compile().as_text()


def test_the_train_step_is_compiled_with_it():
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
    from step_throughput import one_device_step

    from dynamo_jax.losses.config import LossConfig
    from dynamo_jax.models.presets import get_preset

    cfg = get_preset("tiny-qwen3", scan_layers=False)
    step, state, data = one_device_step(cfg, LossConfig.preset("grpo"), 8, 16, 1e-3)
    text = step.lower(state, data).compile().as_text()
    assert "dot" in text and "ynn" not in text
