"""DynaMO on Qwen3-14B, 16 GPUs (FSDP 8 x tensor 2), vLLM sidecar rollouts (paper: arXiv 2602.19208).

    python launch.py --config configs/dynamo_qwen3_14b.py --workdir workdirs/dynamo_qwen3_14b
    python launch.py --config configs/dynamo_qwen3_14b.py:baseline=clip_higher --workdir W  # Table 1
    python launch.py --config configs/dynamo_qwen3_14b.py:ablation=no_ums --workdir W       # Table 2
    python launch.py --config configs/dynamo_qwen3_14b.py --dry_run                         # memory plan

baseline: dynamo | grpo | clip_higher | entropy_loss | fork_tokens | entropy_adv | clip_cov |
kl_cov | w_reinforce.  ablation (with baseline=dynamo): none | no_dra | no_gc | no_ums |
no_modulation.  Put the HF checkpoint in hf/Qwen3-14B (init.checkpoint).  Hyperparameters and the
effective clip values are explained in configs/paper.py.
"""

from configs import paper


def get_config(arg: str | None = None):
    return paper.dynamo_config("qwen3-14b", "hf/Qwen3-14B", arg, mesh_shape=(1, -1, 2), devices=16)
