"""Train-step throughput: the jitted JAX step vs HF transformers (PyTorch) forward + backward.

    python -m benchmarks.step_throughput                      # CPU, two shapes + full depth
    python -m benchmarks.step_throughput --mfu --preset qwen2.5-math-1.5b --batch 8 --seq 2048 \
        --no-torch --peak_tflops 989                          # on a GPU: MFU of the real shape

Both sides run the same model shape on the same batch of random tokens and do a full policy
update: forward, per-token log-probs of the sampled tokens, an advantage-weighted loss, backward
and an AdamW step. JAX runs `step.train_step.make_train_step` (the trainer's own step with the
DynaMO loss, which also computes entropy and K); PyTorch runs the model's forward with full
logits, `log_softmax`, gather, backward and `torch.optim.AdamW`. Prints tokens/s for each and the
ratio JAX / PyTorch (target >= 1.5x on CPU). With --mfu: model FLOPs utilisation,
6·N·tokens/s (+ attention) over the device's peak.

Roofline (with PyTorch on): both sides' model FLOPs per second (the MFU numerator) against this
machine's GEMM rate, measured in the same run on the shape's widest layer matmul in both
libraries (they run a tuned GEMM at about the same speed). A step that must do the model's
FLOPs cannot beat that rate, so `ceiling` = GEMM rate / PyTorch's model FLOP rate is the
largest ratio any implementation could reach at that shape on this machine; JAX can pass 100%
only by skipping work (the prompt tokens' unembedding backward, below).

One JAX line per `LossConfig.logits_residual` mode, the default ("recompute": no [N, V] residual,
the backward recomputes each logit tile) first, then the opt-in modes that keep the forward's
logits (V·2 / V·4 bytes per token). In every mode the JAX step skips the unembedding work of
tokens with loss_mask 0, forward and backward (no loss reads their log-probs, and their gradient
is exactly zero); the batch here has a quarter prompt, and PyTorch's dense logits and
log_softmax do not skip it. The last row (--full_depth_batch)
is the Qwen2.5-0.5B shape at its real 24 layers with a smaller batch (first mode only), where
the vocabulary projection is a smaller share of the step.
"""

from __future__ import annotations

import argparse
import os

from benchmarks.harness import header, load_average, time_calls


def model_cfg(preset: str, layers: int | None, attention: str = "matmul", remat: str = "none"):
    from dynamo_jax.models.presets import get_preset

    overrides = {"scan_layers": True, "attention_impl": attention, "remat_policy": remat}
    if layers:
        overrides["num_layers"] = layers
    return get_preset(preset, **overrides)


def one_device_step(cfg, loss_cfg, batch: int, seq: int, learning_rate: float, shared=None):
    """(jitted step, train state, device batch) of the trainer's own step on one device, with
    `batch x seq` random tokens: a quarter prompt (loss_mask 0), the rest response. `shared` =
    (P, G): G prompts of P tokens, each on batch / G consecutive rows, run once per update
    (train.share_prompts)."""
    import jax
    import numpy as np
    import optax

    from dynamo_jax.sharding.mesh import MeshConfig, build_mesh
    from dynamo_jax.step.state import init_train_state
    from dynamo_jax.step.train_step import make_train_step

    mesh_cfg = MeshConfig(shape=(1, 1, 1))
    mesh = build_mesh(mesh_cfg, jax.devices()[:1])
    optimizer = optax.adamw(learning_rate)
    step, _, _ = make_train_step(
        cfg, loss_cfg, optimizer, mesh, mesh_cfg.rules, batch_size=batch, shared_prompts=shared
    )
    state = init_train_state(cfg, optimizer, mesh, mesh_cfg.rules, jax.random.key(0))
    rng = np.random.default_rng(0)
    loss_mask = np.zeros((batch, seq), np.float32)
    prompt = seq // 4 if shared is None else shared[0]
    loss_mask[:, prompt:] = 1.0
    tokens = rng.integers(0, cfg.vocab_size, (batch, seq), dtype=np.int32)
    extra = {}
    if shared is not None:
        rows_per_prompt = batch // shared[1]
        source = np.arange(batch, dtype=np.int32) // rows_per_prompt
        tokens[:, :prompt] = tokens[source * rows_per_prompt, :prompt]
        table = np.zeros(batch, np.int32)
        table[: shared[1]] = np.arange(shared[1]) * rows_per_prompt
        extra = {"prompt_table": table, "prompt_source": source}
    data = {
        **extra,
        "tokens": tokens,
        "positions": np.broadcast_to(np.arange(seq, dtype=np.int32), (batch, seq)).copy(),
        "segment_ids": np.ones((batch, seq), np.int32),  # one sequence per row
        "loss_mask": loss_mask,
        "advantages": rng.standard_normal(batch).astype(np.float32),
        "old_logp": np.full((batch, seq), -float(np.log(cfg.vocab_size)), np.float32),
        "temperature": np.float32(1.0),
        "on_policy": np.float32(0.0),
    }
    return step, state, jax.device_put(data)


def jax_tokens_per_s(
    cfg, batch: int, seq: int, iters: int, dtype: str, residual: str, trace: str = ""
) -> float:
    """Tokens/s of the median timed step (after one compiling call); with `trace`, one more
    step under the JAX profiler, its trace written there (TensorBoard / Perfetto), outside the
    timing."""
    import jax

    from dynamo_jax.losses.config import LossConfig

    loss_cfg = LossConfig.preset("dynamo", logits_residual=residual)
    step, state, data = one_device_step(cfg.replace(dtype=dtype), loss_cfg, batch, seq, 1e-5)
    holder = {"state": state}

    def update():
        holder["state"], metrics = step(holder["state"], data)
        return holder["state"], metrics

    tokens_per_s = batch * seq / time_calls(update, repeats=iters, warmup=1).median
    if trace:
        with jax.profiler.trace(trace):
            jax.block_until_ready(update())
    return tokens_per_s


def torch_tokens_per_s(cfg, batch: int, seq: int, iters: int) -> float:
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    hf = cfg.to_hf_config(dtype="float32")
    config = AutoConfig.for_model(hf.pop("model_type"), **hf)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model.train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-5)
    gen = torch.Generator().manual_seed(0)
    tokens = torch.randint(0, cfg.vocab_size, (batch, seq), generator=gen)
    mask = torch.zeros(batch, seq - 1)
    mask[:, seq // 4 :] = 1.0
    adv = torch.randn(batch, 1, generator=gen)

    def update():
        logits = model(input_ids=tokens).logits[:, :-1].float()
        logp = torch.log_softmax(logits, -1).gather(-1, tokens[:, 1:, None])[..., 0]
        loss = -(logp * adv * mask).sum() / mask.sum()
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()

    return batch * seq / time_calls(update, repeats=iters, warmup=1).median


def gemm_gflops(m: int, k: int, n: int, iters: int = 5) -> tuple[float, float]:
    """Best-of-`iters` fp32 GFLOP/s of one [m, k] @ [k, n] matmul in JAX and in PyTorch.

    The machine's practical ceiling for a step made of matmuls: both libraries call a tuned
    GEMM here, so a whole train step can at best run its FLOPs at this rate.
    """
    import jax
    import jax.numpy as jnp
    import numpy as np
    import torch

    rng = np.random.default_rng(0)
    a = rng.standard_normal((m, k), np.float32)
    b = rng.standard_normal((k, n), np.float32)
    flops = 2.0 * m * k * n

    def best(fn) -> float:
        return flops / time_calls(fn, repeats=iters, warmup=1).min / 1e9

    mm = jax.jit(jnp.dot)
    ja, jb = jnp.asarray(a), jnp.asarray(b)
    ta, tb = torch.from_numpy(a), torch.from_numpy(b)
    return best(lambda: mm(ja, jb)), best(lambda: ta @ tb)


def train_flops_per_token(cfg, seq: int) -> float:
    """6·N (matmul parameters, embeddings excluded unless tied to the head) + attention 12·L·d·s."""
    n = cfg.num_params - cfg.vocab_size * cfg.hidden_size * (0 if cfg.tie_word_embeddings else 1)
    attn = 12 * cfg.num_layers * cfg.num_heads * cfg.head_dim * seq / 2  # causal: half the keys
    return 6 * n + attn


def run_shape(preset: str, layers: int | None, batch: int, residuals: list[str], args) -> None:
    """Print one line per logits_residual mode for this shape, with the PyTorch ratio."""
    cfg = model_cfg(preset, layers, args.attention, args.remat)
    head = f"{preset} ({cfg.num_layers} layers, d={cfg.hidden_size}, V={cfg.vocab_size}, "
    head += f"{batch} x {args.seq}): "
    results = []
    for residual in residuals:
        trace = args.trace and f"{args.trace}/{preset}-{cfg.num_layers}l-{residual}"
        tps = jax_tokens_per_s(cfg, batch, args.seq, args.iters, args.dtype, residual, trace)
        results.append((residual, tps))
    torch_tps = torch_tokens_per_s(cfg, batch, args.seq, args.iters) if args.torch else None
    flops_per_token = train_flops_per_token(cfg, args.seq)
    gemm = None
    if torch_tps:  # the machine's matmul ceiling at this shape's widest layer matmul
        gemm_shape = (batch * args.seq, cfg.hidden_size, cfg.intermediate_size)
        gemm = gemm_gflops(*gemm_shape)
    for residual, tps in results:
        line = head + f"JAX step [logits_residual={residual}] {tps:,.0f} tokens/s"
        if torch_tps:
            line += f", PyTorch fwd+bwd {torch_tps:,.0f} tokens/s, ratio {tps / torch_tps:.2f}x"
        print(line, flush=True)
        if gemm:
            rate = flops_per_token * tps / 1e9
            print(
                f"  JAX model FLOPs at {rate:,.0f} GFLOP/s = {rate / max(gemm):.0%} of the GEMM rate"
            )
        if args.mfu:
            flops = flops_per_token * tps
            print(f"  MFU {flops / (args.peak_tflops * 1e12):.1%} of {args.peak_tflops:g} TFLOP/s")
    if gemm:
        torch_rate = flops_per_token * torch_tps / 1e9
        m, k, n = gemm_shape
        print(
            f"  PyTorch model FLOPs at {torch_rate:,.0f} GFLOP/s = {torch_rate / max(gemm):.0%} of "
            f"the GEMM rate; GEMM [{m}, {k}] @ [{k}, {n}]: JAX {gemm[0]:,.0f}, PyTorch "
            f"{gemm[1]:,.0f} GFLOP/s; ceiling (the model's FLOPs at the GEMM rate) "
            f"{max(gemm) / torch_rate:.2f}x PyTorch",
            flush=True,
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--preset", action="append", help="model preset(s) (models/presets.py)")
    parser.add_argument("--layers", type=int, default=2, help="override num_layers (0 = preset)")
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--seq", type=int, default=256)
    parser.add_argument("--iters", type=int, default=3)
    parser.add_argument("--dtype", default="float32", help="JAX compute dtype")
    parser.add_argument(
        "--residuals",
        default="recompute,store_bf16,store_fp32",
        help="LossConfig.logits_residual modes to time, comma-separated (default mode first)",
    )
    parser.add_argument(
        "--full_depth_batch",
        type=int,
        default=4,
        help="batch of an extra qwen2.5-0.5b row at its full 24 layers (0 = skip)",
    )
    parser.add_argument(
        "--attention",
        default="matmul",
        help="ModelConfig.attention_impl; on a GPU at long sequences 'pallas' (the dense "
        "[B, L, S] scores of 'matmul' need ~100 GB at Qwen2.5-0.5B, 8 x 2048)",
    )
    parser.add_argument("--remat", default="none", help="ModelConfig.remat_policy")
    parser.add_argument("--no-torch", dest="torch", action="store_false")
    parser.add_argument("--mfu", action="store_true", help="print model FLOPs utilisation")
    parser.add_argument("--peak_tflops", type=float, default=989.0, help="device peak (H100 bf16)")
    parser.add_argument("--trace", default="", help="profile one extra JAX step into this dir")
    args = parser.parse_args()
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    presets = args.preset or ["small-qwen3", "qwen2.5-0.5b"]
    import jax

    print(
        header(f"step_throughput: batch {args.batch} x {args.seq} tokens, median of {args.iters}")
    )
    print(f"devices: {jax.devices()}")
    for preset in presets:
        run_shape(preset, args.layers or None, args.batch, args.residuals.split(","), args)
    if args.full_depth_batch:  # the first (default) mode only: a full-depth JAX run is minutes
        run_shape("qwen2.5-0.5b", None, args.full_depth_batch, args.residuals.split(",")[:1], args)
    print(f"load average at the end {load_average():.1f}")


if __name__ == "__main__":
    main()
