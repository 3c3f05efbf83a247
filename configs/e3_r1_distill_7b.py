"""E3 on DeepSeek-R1-Distill-Qwen-7B, 8 GPUs (FSDP), vLLM sidecar rollouts (paper: arXiv 2505.18573).

    python launch.py --config configs/e3_r1_distill_7b.py --workdir workdirs/e3_r1_distill_7b
    python launch.py --config configs/e3_r1_distill_7b.py --dry_run

Rank-based rollout allocation with G = 8 and a widening [G_min, G_max] curriculum (to [4, 12]),
the entropy-holding temperature scheduler from τ = 1 with cosine annealing from 60% of the 480
steps (η = 0.9), lr 2e-6, responses ≤ 6,144 tokens, one update per batch of 64 × 8; 8 GPUs as in
the paper. Put the HF checkpoint in hf/DeepSeek-R1-Distill-Qwen-7B (init.checkpoint).
See configs/paper.py.
"""

from configs import paper


def get_config(arg: str | None = None):
    paper.base.parse_arg(arg)
    return paper.e3_config(
        "r1-distill-qwen-7b",
        "hf/DeepSeek-R1-Distill-Qwen-7B",
        learning_rate=2e-6,
        mesh_shape=(1, -1, 1),
        devices=8,
        # Packed rows of 8,192 tokens, four per GPU per micro-batch with blockwise attention
        # (--dry_run: docs/scaling.md; ~46 GiB, where one row took ~50 GiB with the dense
        # "matmul" scores), so JAX keeps 0.72 of each GPU and vLLM (tensor parallel 2,
        # 4 sidecars per host: 7.6 GB of weights per GPU) the other 0.23
        micro_tokens=4 * 8192,
        vllm=dict(vllm_tensor_parallel=2, gpu_memory_utilization=0.23, jax_memory_fraction=0.72),
    )
