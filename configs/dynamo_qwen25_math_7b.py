"""DynaMO on Qwen2.5-Math-7B, 8 GPUs (FSDP), vLLM sidecar rollouts (paper: arXiv 2602.19208).

    python launch.py --config configs/dynamo_qwen25_math_7b.py --workdir workdirs/dynamo_qwen25_math_7b
    python launch.py --config configs/dynamo_qwen25_math_7b.py:baseline=clip_higher --workdir W  # Table 1
    python launch.py --config configs/dynamo_qwen25_math_7b.py:ablation=no_ums --workdir W       # Table 2
    python launch.py --config configs/dynamo_qwen25_math_7b.py:allocation=dynamo_released --workdir W
    python launch.py --config configs/dynamo_qwen25_math_7b.py --dry_run                         # memory plan

baseline: dynamo | grpo | clip_higher | entropy_loss | fork_tokens | entropy_adv | clip_cov |
kl_cov | w_reinforce.  ablation (with baseline=dynamo): none | no_dra | no_gc | no_ums |
no_modulation.  allocation (with DRA on): any allocation policy (default dynamo, paper Alg. 1).
Put the HF checkpoint in hf/Qwen2.5-Math-7B (init.checkpoint).

Table 3's settings (configs/paper.py) with one cut: Qwen2.5-Math's context is 4,096 tokens
(max_position_embeddings), so prompts ≤ 1,024 (left-truncated: 5 of the 10,240 training prompts
are longer) and responses ≤ 3,072 instead of 2,048 + 8,192. The authors' 7B script's modulation:
α_c = 0.2 (μ_max 1.2), α_s = 0.4 (λ_min 0.6), γ = 50, τ = 0.99.
"""

from configs import paper


def get_config(arg: str | None = None):
    return paper.dynamo_config(
        "qwen2.5-math-7b",
        "hf/Qwen2.5-Math-7B",
        arg,
        mesh_shape=(1, -1, 1),
        devices=8,
        max_prompt_tokens=1024,
        max_new_tokens=3072,
        # Packed rows of 4,096 tokens, 4 per GPU per micro-batch with blockwise attention
        # (--dry_run: docs/scaling.md; 2 with the dense "matmul" scores)
        micro_tokens=4 * 4096,
        # Table 3's vLLM tensor parallel 2: 4 sidecars per 8-GPU host, colocated; vLLM 0.4 and
        # JAX 0.55 of each GPU (Table 3's 0.8 is verl's time-sharing: configs/paper.py)
        vllm=dict(vllm_tensor_parallel=2, gpu_memory_utilization=0.4, jax_memory_fraction=0.55),
        dynamo_loss=dict(alpha_comp=0.2, alpha_stab=0.4, ums_tau=0.99),
    )
