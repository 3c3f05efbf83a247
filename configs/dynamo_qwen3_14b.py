"""DynaMO on Qwen3-14B, 16 GPUs (FSDP 8 x tensor 2), vLLM sidecar rollouts (paper: arXiv 2602.19208).

    python launch.py --config configs/dynamo_qwen3_14b.py --workdir workdirs/dynamo_qwen3_14b
    python launch.py --config configs/dynamo_qwen3_14b.py:baseline=clip_higher --workdir W  # Table 1
    python launch.py --config configs/dynamo_qwen3_14b.py:ablation=no_ums --workdir W       # Table 2
    python launch.py --config configs/dynamo_qwen3_14b.py:allocation=dynamo_released --workdir W
    python launch.py --config configs/dynamo_qwen3_14b.py --dry_run                         # memory plan

baseline: dynamo | grpo | clip_higher | entropy_loss | fork_tokens | entropy_adv | clip_cov |
kl_cov | w_reinforce.  ablation (with baseline=dynamo): none | no_dra | no_gc | no_ums |
no_modulation.  allocation (with DRA on): any allocation policy (default dynamo, paper Alg. 1).
Put the HF checkpoint in hf/Qwen3-14B (init.checkpoint).

Table 3's settings as published (configs/paper.py): prompts ≤ 2,048 (left-truncated), responses
≤ 8,192, well inside Qwen3's 40,960-token context. Modulation: the tied α = 0.4, γ = 50, τ = 0.9
of the dynamo preset. Two 8-GPU hosts (see README, "Several hosts").
"""

from configs import paper


def get_config(arg: str | None = None):
    return paper.dynamo_config(
        "qwen3-14b",
        "hf/Qwen3-14B",
        arg,
        mesh_shape=(1, -1, 2),
        devices=16,
        max_prompt_tokens=2048,
        max_new_tokens=8192,
        # Packed rows of 10,240 tokens, one per FSDP group per micro-batch (--dry_run:
        # docs/scaling.md). With blockwise attention that row needs ~35 GiB (53 with the dense
        # "matmul" scores), so the memory goes back to vLLM: JAX 0.55 of each GPU, vLLM 0.40 at
        # tensor parallel 4 (2 sidecars per host: 7 GB of weights per GPU, the rest KV cache);
        # four rows per micro-batch (~74 GiB) would not fit beside any vLLM share
        micro_tokens=10240,
        vllm=dict(vllm_tensor_parallel=4, gpu_memory_utilization=0.40, jax_memory_fraction=0.55),
    )
