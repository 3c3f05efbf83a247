"""FLOPs per token of the compiled train step, against the model's 6·N (+ attention), per remat
policy: what XLA says the step costs, and where the excess over 6·N goes.

    python -m benchmarks.flops                          # tiny, 1.5B, 7B at 4,096 tokens
    python -m benchmarks.flops --presets tiny-qwen2 --seq 512

Nothing is allocated: the step (forward, DynaMO loss, backward, AdamW update; one device, one
micro-batch of `--rows` rows x `--seq` tokens) is lowered from ShapeDtypeStructs and compiled,
and `compiled.cost_analysis()["flops"]` is read. Two things make that count honest:

- XLA's cost analysis counts a loop body once, whatever its trip count. So the layers are
  unrolled (scan_layers=False), the step is compiled with 1 and with 2 layers, and the full
  depth is extrapolated as f(1) + (layers - 1)·(f(2) - f(1)) (the 7B step is never compiled at
  28 layers); the log-prob kernel's token-block and vocab-tile loops are given one trip (block
  = all tokens, tile = the whole vocabulary); attention is "matmul" (no loop).
- "matmul" attention computes every (query, key) pair, masked or not: the dense count.

Columns: compiled FLOPs per token; the ideal 6·N + 6·(attention, causal half) (the PaLM-style
model FLOPs: N matmul parameters, embeddings excluded, the untied head included); and an
analytic account of the excess: what the remat policy recomputes (full: 2·N_layers + the
causal attention forward; dots_with_no_batch_dims_saveable: the attention forward; dots_saveable:
no matmul), attention's masked half (the dense kernel computes as much again as the causal
count, in every pass it runs), the log-prob kernel's
recomputed logits in the backward (2·D·V per token); "other" is what remains (norms, RoPE,
softmax/elementwise, optimizer: XLA counts elementwise ops too).
"""

from __future__ import annotations

import argparse
import functools

import jax

from benchmarks.harness import header
from dynamo_jax.losses import LossConfig
from dynamo_jax.models.presets import get_preset
from dynamo_jax.sharding.mesh import MeshConfig, build_mesh
from dynamo_jax.step.planner import _with_shardings, abstract_batch, default_optimizer

POLICIES = ("none", "full", "dots_saveable", "dots_with_no_batch_dims_saveable")
# Dense BF16 peaks (no sparsity), from the vendors' datasheets.
PEAK_TFLOPS = {"A100 80GB (bf16)": 312.0, "H100 SXM (bf16)": 989.0}


def _cost(compiled) -> float:
    ca = compiled.cost_analysis()
    ca = ca[0] if isinstance(ca, list) else ca
    return float(ca["flops"])


def step_flops(cfg, rows: int, seq: int) -> float:
    """Compiled FLOPs of one train step (loops with one trip each; module docstring)."""
    from dynamo_jax.losses import logprobs
    from dynamo_jax.step import forward
    from dynamo_jax.step.state import abstract_train_state
    from dynamo_jax.step.train_step import make_train_step

    # One vocab tile: the kernel's tile loop is then counted in full (cost analysis counts a
    # loop body once). The call site passes no vocab_tile, so this changes only the tile size.
    original = forward.sharded_token_logprobs_entropy
    forward.sharded_token_logprobs_entropy = functools.partial(
        logprobs.sharded_token_logprobs_entropy, vocab_tile=cfg.vocab_size
    )
    try:
        mesh_cfg = MeshConfig(shape=(1, 1, 1))
        mesh = build_mesh(mesh_cfg, devices=jax.devices()[:1])
        optimizer = default_optimizer()
        step, state_sh, batch_sh = make_train_step(
            cfg,
            LossConfig(),
            optimizer,
            mesh,
            mesh_cfg.rules,
            batch_size=rows,
            block_size=rows * seq,  # one token block
        )
        state = abstract_train_state(cfg, optimizer)
        batch = abstract_batch(batch_sh, rows, seq)
        return _cost(step.lower(_with_shardings(state, state_sh), batch).compile())
    finally:
        forward.sharded_token_logprobs_entropy = original


def model_flops(cfg, seq: int) -> dict[str, float]:
    """Per-token analytic terms (see the module docstring)."""
    d, v = cfg.hidden_size, cfg.vocab_size
    n = cfg.num_params - v * d * (0 if cfg.tie_word_embeddings else 1)
    # Forward attention per token: QK^T and PV, 2·2·H·E per key, over the causal half.
    attn_fwd_causal = 4 * cfg.num_layers * cfg.num_heads * cfg.head_dim * seq / 2
    # The decoder layers' matmul parameters: what a full remat recomputes (not the head).
    layers = cfg.num_params - v * d * (1 if cfg.tie_word_embeddings else 2) - d
    return dict(
        n=n,
        six_n=6 * n,
        layers=layers,
        attn=3 * attn_fwd_causal,
        attn_fwd=attn_fwd_causal,
        dv=2 * d * v,
    )


def analyse(preset: str, rows: int, seq: int, policy: str) -> dict:
    base = get_preset(
        preset, dtype="bfloat16", param_dtype="float32", remat_policy=policy, scan_layers=False
    )
    f1 = step_flops(base.replace(num_layers=1), rows, seq)
    f2 = step_flops(base.replace(num_layers=2), rows, seq)
    total = f1 + (base.num_layers - 1) * (f2 - f1)
    tokens = rows * seq
    m = model_flops(base, seq)
    per_token = total / tokens
    ideal = m["six_n"] + m["attn"]
    # What each policy recomputes in the backward: "full" the whole layer forward;
    # "dots_with_no_batch_dims_saveable" keeps the weight matmuls but not attention's batched
    # ones; "dots_saveable" keeps every matmul (only elementwise work is recomputed).
    recompute_attn = policy in ("full", "dots_with_no_batch_dims_saveable")
    remat = 2 * m["layers"] if policy == "full" else 0.0
    remat += m["attn_fwd"] if recompute_attn else 0.0
    # The dense kernel computes the masked half too: as much again as the causal count, for
    # the forward, the backward and any recomputed forward.
    masked = m["attn"] + (m["attn_fwd"] if recompute_attn else 0.0)
    loss_recompute = m["dv"]
    other = per_token - ideal - remat - masked - loss_recompute
    return dict(
        preset=preset,
        layers=base.num_layers,
        policy=policy,
        per_token=per_token,
        six_n=m["six_n"],
        ideal=ideal,
        ratio=per_token / ideal,
        remat=remat,
        masked=masked,
        loss=loss_recompute,
        other=other,
        per_layer=(f2 - f1) / tokens,
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--presets", default="tiny-qwen2,qwen2.5-math-1.5b,qwen2.5-math-7b")
    parser.add_argument("--policies", default=",".join(POLICIES))
    parser.add_argument("--rows", type=int, default=1)
    parser.add_argument("--seq", type=int, default=4096)
    parser.add_argument("--tokens_per_step", type=float, default=512 * 4096)
    parser.add_argument("--gpus", type=int, default=8)
    args = parser.parse_args()
    g = lambda x: f"{x / 1e9:.4g}"
    print(header("flops"))
    print(
        f"FLOPs per token (GFLOP), {args.rows} x {args.seq} tokens, compiled on "
        f"{jax.default_backend()} (layers extrapolated from 1 and 2 unrolled layers)"
    )
    print(
        "| model | layers | remat | compiled | 6N | 6N + attn | ratio | remat fwd | "
        "masked attn | loss recompute | other |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    results = []
    for preset in args.presets.split(","):
        for policy in args.policies.split(","):
            r = analyse(preset, args.rows, args.seq, policy)
            results.append(r)
            print(
                f"| {preset} | {r['layers']} | {policy} | {g(r['per_token'])} | {g(r['six_n'])} | "
                f"{g(r['ideal'])} | {r['ratio']:.2f} | {g(r['remat'])} | {g(r['masked'])} | "
                f"{g(r['loss'])} | {g(r['other'])} |",
                flush=True,
            )
    print(
        f"\nPREDICTION (not measured): step time for {args.tokens_per_step:,.0f} tokens on "
        f"{args.gpus} GPUs at 100% / 50% of peak; MFU bound = 6N+attn / compiled"
    )
    print("| model | remat | GPU | step s at peak | step s at 50% | MFU bound |")
    print("|---|---|---|---|---|---|")
    for r in results:
        for gpu, tflops in PEAK_TFLOPS.items():
            sec = r["per_token"] * args.tokens_per_step / (args.gpus * tflops * 1e12)
            print(
                f"| {r['preset']} | {r['policy']} | {gpu} | {sec:.1f} | {2 * sec:.1f} | "
                f"{1 / r['ratio']:.0%} |"
            )


if __name__ == "__main__":
    main()
