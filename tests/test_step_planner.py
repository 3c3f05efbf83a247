"""Dry-run planner (dynamo_jax/step/planner.py) on a tiny preset, in a subprocess.

The figures for Qwen2.5-Math-7B / Qwen3-14B come from benchmarks/dry_run_scaling.py (minutes
each); here one small compile checks that the report is exact where it can be: parameter count
against the config's closed form, per-device parameter and optimizer-state bytes against a hand
count of the sharded shapes, and the peak against XLA's own memory analysis.
"""

import pytest

from dynamo_jax.data.packing import RowLayout
from dynamo_jax.losses import LossConfig
from dynamo_jax.models.presets import get_preset
from dynamo_jax.sharding.mesh import MeshConfig
from dynamo_jax.step.planner import (
    GIB,
    format_report,
    row_batch_shape,
    run_dry_run,
)


@pytest.fixture(scope="module")
def tiny_report():
    # 1 MiB of "device memory": the tiny step's peak (~1.5 MB) must NOT fit.
    return run_dry_run(
        get_preset("tiny-qwen3"),
        LossConfig(),
        MeshConfig(shape=(1, -1, 1)),
        num_devices=8,
        batch_size=8,
        seq_len=32,
        device_memory_gb=1.0 / 1024,
    )


def test_report_counts_are_exact(tiny_report):
    cfg = get_preset("tiny-qwen3")
    assert tiny_report["num_params"] == cfg.num_params == 131_520
    assert tiny_report["mesh"] == {"data": 1, "fsdp": 8, "tensor": 1}
    # Every parameter has an `embed` (64) or `vocab` (512) dimension that fsdp=8 splits, except
    # q_norm/k_norm scales ([layers=2, head_dim=32], replicated): 2 x 2 x 32 = 128 of them.
    qk_norm = 2 * 2 * 32
    per = tiny_report["per_device_bytes"]
    assert per["params"] == 4 * ((cfg.num_params - qk_norm) // 8 + qk_norm)
    # AdamW: mu and nu like the params, plus one int32 step counter.
    assert per["opt_state"] == 2 * per["params"] + 4
    # tokens/positions/segment_ids int32 and three float32 [8, 32] fields, 1 row per device,
    # plus the replicated 0-d temperature and on_policy flag.
    assert per["batch"] == 6 * 32 * 4 + 2 * 4
    xla = tiny_report["xla_memory_analysis"]
    assert xla["argument"] == per["params"] + per["opt_state"] + per["batch"] + 4  # + step
    assert per["peak"] == xla["argument"] + xla["output"] - xla["alias"] + xla["temp"]
    assert per["temporaries"] > 0


def test_fits_is_decided_against_device_memory(tiny_report):
    assert tiny_report["per_device_bytes"]["peak"] > GIB / 1024
    assert tiny_report["fits"] is False
    text = format_report(tiny_report)
    assert "parameters: 131,520" in text and "GiB device: NO" in text


def test_packed_layouts_are_planned_at_their_worst_case(tiny_report):
    """A packed run compiles per micro-batch count; the planner takes the largest (every
    sequence alone in a row): 512 sequences, 2 rows of 4096 per device on 8 row shards → 16
    rows per micro-batch, 32 micro-batches. Memory is one micro-batch's."""
    layout = RowLayout(row_len=4096, packing=True, micro_rows=8 * 2, max_sequences=512)
    assert row_batch_shape(layout) == dict(
        batch_size=512, seq_len=4096, micro_batches=32, shared_prompts=None
    )
    # The tiny plan: 8 rows of 32 tokens on 8 devices in one micro-batch.
    assert tiny_report["tokens_per_device_micro_batch"] == 32
    assert "1 micro-batch(es) of 32 tokens per device" in format_report(tiny_report)


def test_a_shared_prompt_step_is_planned_with_its_prompt_table():
    """train.share_prompts' step (prompts in 8 slots, 2 per micro-batch) compiles on the 8-device
    fsdp mesh, and its batch adds the two int32 [B] prompt-table fields to the unshared one."""
    layout = RowLayout(32, False, 8, 8, row_shards=8, prompt_slots=8, prompt_groups=2)
    assert row_batch_shape(layout)["shared_prompts"] == (8, 2)
    report = run_dry_run(
        get_preset("tiny-qwen3"),
        LossConfig(),
        MeshConfig(shape=(1, -1, 1)),
        num_devices=8,
        device_memory_gb=1.0,
        **row_batch_shape(layout),
    )
    assert report["per_device_bytes"]["batch"] == 6 * 32 * 4 + 2 * 4 + 2 * 4


def test_mesh_not_matching_device_count_fails_before_spawning():
    with pytest.raises(ValueError, match=r"needs 12 devices but 8 are available"):
        run_dry_run(
            get_preset("tiny-qwen3"),
            LossConfig(),
            MeshConfig(shape=(1, 3, 4)),
            num_devices=8,
            batch_size=8,
            seq_len=32,
        )


@pytest.mark.slow
def test_qwen25_math_7b_dry_run_on_8_devices():
    """The real 7B step compiled from abstract shapes on 8 simulated devices (fsdp=8), no
    allocation: ~15 s of CPU, 1-2 min wall on a busy 2-core machine."""
    cfg = get_preset(
        "qwen2.5-math-7b", dtype="bfloat16", param_dtype="float32", remat_policy="full"
    )
    report = run_dry_run(
        cfg,
        LossConfig(),
        MeshConfig(shape=(1, 8, 1)),
        num_devices=8,
        batch_size=8,
        seq_len=2048,
        device_memory_gb=80.0,
    )
    assert report["num_params"] == 7_615_616_512  # the published count
    # fsdp splits every weight's `embed` dimension; only the q/k/v biases ([heads, head_dim],
    # no embed axis) stay whole: 28 layers x (28 + 4 + 4) x 128 = 129,024 float32 values.
    biases = 28 * (28 + 4 + 4) * 128
    per = report["per_device_bytes"]
    assert per["params"] == 4 * ((report["num_params"] - biases) // 8 + biases)
    assert per["opt_state"] == 2 * per["params"] + 4
    assert report["fits"] and per["peak"] < 80 * GIB
    assert per["temporaries"] > GIB  # activations, gathered layers and gradients are counted
