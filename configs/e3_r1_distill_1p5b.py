"""E3 on DeepSeek-R1-Distill-Qwen-1.5B, 4 GPUs (FSDP), vLLM sidecar rollouts (paper: arXiv 2505.18573).

    python launch.py --config configs/e3_r1_distill_1p5b.py --workdir workdirs/e3_r1_distill_1p5b
    python launch.py --config configs/e3_r1_distill_1p5b.py --dry_run

Rank-based rollout allocation with G = 8 and a widening [G_min, G_max] curriculum (to [4, 12]),
the entropy-holding temperature scheduler from τ = 1 with cosine annealing from 60% of the 480
steps (η = 0.9), lr 5e-6, responses ≤ 6,144 tokens, one update per batch of 64 × 8; 4 GPUs as in
the paper. Put the HF checkpoint in hf/DeepSeek-R1-Distill-Qwen-1.5B (init.checkpoint).
See configs/paper.py.
"""

from configs import paper


def get_config(arg: str | None = None):
    paper.base.parse_arg(arg)
    return paper.e3_config(
        "r1-distill-qwen-1.5b",
        "hf/DeepSeek-R1-Distill-Qwen-1.5B",
        learning_rate=5e-6,
        mesh_shape=(1, -1, 1),
        devices=4,
        # Packed rows of 8,192 tokens, 4 per GPU per micro-batch with blockwise attention
        # (--dry_run: docs/scaling.md; 2 with the dense "matmul" scores)
        micro_tokens=4 * 8192,
        # one vLLM sidecar per GPU (the paper states no tensor parallel), colocated
        vllm=dict(vllm_tensor_parallel=1, gpu_memory_utilization=0.4, jax_memory_fraction=0.55),
    )
