"""DynaMO on Qwen2.5-Math-1.5B, 8 GPUs (FSDP), vLLM sidecar rollouts (paper: arXiv 2602.19208).

    python launch.py --config configs/dynamo_qwen25_math_1p5b.py --workdir workdirs/dynamo_qwen25_math_1p5b
    python launch.py --config configs/dynamo_qwen25_math_1p5b.py:baseline=clip_higher --workdir W  # Table 1
    python launch.py --config configs/dynamo_qwen25_math_1p5b.py:ablation=no_ums --workdir W       # Table 2
    python launch.py --config configs/dynamo_qwen25_math_1p5b.py --dry_run                         # memory plan

baseline: dynamo | grpo | clip_higher | entropy_loss | fork_tokens | entropy_adv | clip_cov |
kl_cov | w_reinforce.  ablation (with baseline=dynamo): none | no_dra | no_gc | no_ums |
no_modulation.  Put the HF checkpoint in hf/Qwen2.5-Math-1.5B (init.checkpoint).  Hyperparameters and the
effective clip values are explained in configs/paper.py.
"""

from configs import paper


def get_config(arg: str | None = None):
    return paper.dynamo_config(
        "qwen2.5-math-1.5b", "hf/Qwen2.5-Math-1.5B", arg, mesh_shape=(1, -1, 1), devices=8
    )
