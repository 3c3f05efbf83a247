"""E3 on DeepSeek-R1-Distill-Qwen-7B, 8 GPUs (FSDP), vLLM sidecar rollouts (paper: arXiv 2505.18573).

    python launch.py --config configs/e3_r1_distill_7b.py --workdir workdirs/e3_r1_distill_7b
    python launch.py --config configs/e3_r1_distill_7b.py --dry_run

Rank-based rollout allocation with G = 8 and a widening [G_min, G_max] curriculum, the
entropy-holding temperature scheduler with cosine annealing from 60% of the steps (η = 0.9).
Put the HF checkpoint in hf/DeepSeek-R1-Distill-Qwen-7B (init.checkpoint). See configs/paper.py.
"""

from configs import paper


def get_config(arg: str | None = None):
    paper.base.parse_arg(arg)
    return paper.e3_config(
        "r1-distill-qwen-7b", "hf/DeepSeek-R1-Distill-Qwen-7B", mesh_shape=(1, -1, 1), devices=8
    )
