"""Packed vs padded rows: tokens/s of the train step and of the old-log-prob pass.

    python -m benchmarks.packing                       # Qwen2.5-0.5B shape, 2 layers, CPU
    python -m benchmarks.packing --layers 2,4,6 --sequences 16   # + per-layer fit, full depth
    python -m benchmarks.packing --shapes_only         # rows and padding of the papers' shapes

Both sides run the trainer's own code on the same model, parameters and sequences: the
sequences are laid into rows by `assemble.lay_out` (data/packing.py), then one optimizer
update (`step.train_step.make_train_step`: DynaMO loss with exact K, AdamW, fp32) and one
old-log-prob pass (`step.forward.make_logprob_fn`) run on them. Padded = one sequence per row of
max_seq_len slots (`train.packing=False`); packed = several whole sequences per row of the same
length (`train.packing=True`, the default). Both are one micro-batch of at most `--sequences`
rows. The figure is the ratio packed / padded of real tokens per second (the same tokens on both
sides, so it is the inverse ratio of the times), timed interleaved (padded, packed, padded, ...)
so that load on a shared machine hits both alike; the median of `--iters` calls is used.

Length distribution (an RLVR batch): prompts uniform in [50, 400] tokens; responses log-normal
with median limit / 4 and σ = ln 4 / z_0.9 = 1.082, so 10% of them would exceed the limit and are
cut at it (as the engine truncates at max_new_tokens). Real tokens per sequence are then about
0.4 of max_seq_len = 400 + limit at limit 1024.

What bounds the ratio: packing removes the padding slots' transformer work (layers and attention
run on every slot of a row), but not the vocabulary projection, which the step already runs on
the trained (response) tokens only. At Qwen2.5-0.5B's 152k vocabulary and 2 layers the
projection of the response tokens is a large share of the step, so the ratio is well below the
slot ratio; at full depth the layers dominate and it approaches the slot ratio.

`--shapes_only` runs no model: for the papers' shapes (DynaMO Table 3: 512 prompts × 16 rollouts,
mini-batches of 32 × 16, responses ≤ 8,192 where the context allows; E3: 64 × 8) it prints the
micro-batches each update and the old-log-prob pass run, and the padding share, padded and
packed, with the same length distribution: the work packing saves on a GPU run, without one.
"""

from __future__ import annotations

import argparse

import numpy as np

from benchmarks.harness import header, load_average, time_interleaved

PROMPT_RANGE = (50, 400)
SIGMA = float(np.log(4.0) / 1.2815515655446004)  # P(response > limit) = P(Z > z_0.9) = 10%


def sample_lengths(rng, n: int, limit: int) -> tuple[np.ndarray, np.ndarray]:
    """(prompt, response) token counts of n sequences (module docstring)."""
    prompt = rng.integers(PROMPT_RANGE[0], PROMPT_RANGE[1] + 1, n)
    response = np.exp(np.log(limit / 4) + SIGMA * rng.standard_normal(n))
    response = np.clip(np.rint(response), 1, limit).astype(np.int64)
    return prompt, response


def rollout_batch(rng, prompt, response, max_len: int, vocab: int):
    """A RolloutBatch of random tokens with these lengths (advantages ±1, old log-probs −ln V)."""
    from dynamo_jax.loop.assemble import RolloutBatch

    n = len(prompt)
    slots = np.arange(max_len)[None]
    length = (prompt + response)[:, None]
    mask = (slots < length).astype(np.int32)
    loss_mask = ((slots >= prompt[:, None]) & (slots < length)).astype(np.float32)
    return RolloutBatch(
        tokens=(rng.integers(1, vocab, (n, max_len)) * mask).astype(np.int32),
        positions=np.maximum(np.cumsum(mask, axis=1) - 1, 0).astype(np.int32),
        attention_mask=mask,
        loss_mask=loss_mask,
        engine_logp=np.zeros_like(loss_mask),
        valid=np.ones(n, bool),
        prompt_id=np.arange(n) // 4,
        response_len=response.astype(np.int32),
        stopped=response < max_len,
        rewards=rng.integers(0, 2, n).astype(np.float32),
        advantages=np.where(rng.random(n) < 0.5, 1.0, -1.0).astype(np.float32),
        temperature=1.0,
        old_logp=np.full_like(loss_mask, -float(np.log(vocab))) * loss_mask,
    )


def run_model(args) -> None:
    """Every depth of `--layers`; with two or more, the per-layer fit of each side's time."""
    from dynamo_jax.models.presets import get_preset

    full = get_preset(args.preset).num_layers
    depths = [int(x) or full for x in str(args.layers).split(",")]  # 0: the preset's depth
    times = {layers: measure(args, layers) for layers in depths}
    if len(set(depths)) < 2:
        return
    print(
        f"per-layer fit, time = per_layer * layers + rest (least squares over {depths} layers), "
        f"extrapolated to the preset's {full} layers:"
    )
    x = np.array(depths, float)
    for what, label in (("train", "train step"), ("logprob", "old-log-prob pass")):
        fit = {
            name: np.polyfit(x, [times[d][what, name] for d in depths], 1)
            for name in ("padded", "packed")
        }
        (a_pad, rest_pad), (a_pack, rest_pack) = fit["padded"], fit["packed"]
        print(
            f"  {label}: per layer padded {a_pad:.2f} s, packed {a_pack:.2f} s "
            f"(ratio {a_pad / a_pack:.2f}x); rest padded {rest_pad:.2f} s, packed "
            f"{rest_pack:.2f} s; at {full} layers packed / padded = "
            f"{np.polyval(fit['padded'], full) / np.polyval(fit['packed'], full):.2f}x"
        )


def measure(args, layers: int) -> dict:
    """Median seconds per (train | logprob, padded | packed) at this depth (0 = the preset's)."""
    import jax
    import optax

    from dynamo_jax.data.packing import RowLayout
    from dynamo_jax.loop import assemble
    from dynamo_jax.losses.config import LossConfig
    from dynamo_jax.models.presets import get_preset
    from dynamo_jax.sharding.mesh import MeshConfig, build_mesh
    from dynamo_jax.step.forward import make_logprob_fn
    from dynamo_jax.step.state import init_train_state
    from dynamo_jax.step.train_step import make_train_step

    overrides = {"num_layers": layers} if layers else {}
    cfg = get_preset(args.preset, scan_layers=True, remat_policy=args.remat, **overrides)
    max_len = PROMPT_RANGE[1] + args.limit
    rng = np.random.default_rng(args.seed)
    prompt, response = sample_lengths(rng, args.sequences, args.limit)
    batch = rollout_batch(rng, prompt, response, max_len, cfg.vocab_size)
    real_tokens = int((prompt + response).sum())
    print(
        f"model {args.preset}, {cfg.num_layers} layers, V={cfg.vocab_size}, fp32, "
        f"remat {cfg.remat_policy}, "
        f"{jax.devices()[0].platform}; {args.sequences} sequences, max_seq_len {max_len} "
        f"(prompts {PROMPT_RANGE[0]}-{PROMPT_RANGE[1]}, responses log-normal, median "
        f"{args.limit // 4}, limit {args.limit})"
    )
    print(
        f"  prompt mean {prompt.mean():.0f}, response mean {response.mean():.0f}, "
        f"{(response == args.limit).mean():.0%} truncated, {real_tokens:,} real tokens"
    )

    mesh_cfg = MeshConfig(shape=(1, 1, 1))
    mesh = build_mesh(mesh_cfg, jax.devices()[:1])
    optimizer = optax.adamw(1e-6)
    loss_cfg = LossConfig.preset("dynamo")
    n = args.sequences
    layouts = {
        name: RowLayout(row_len=max_len, packing=packed, micro_rows=n, max_sequences=n)
        for name, packed in (("padded", False), ("packed", True))
    }
    step, _, batch_sh = make_train_step(
        cfg, loss_cfg, optimizer, mesh, mesh_cfg.rules, batch_size=n, micro_batches=1
    )
    state = init_train_state(cfg, optimizer, mesh, mesh_cfg.rules, jax.random.key(0))
    train_in, logprob_in, logprob = {}, {}, {}
    for name, layout in layouts.items():
        rows, placement = assemble.lay_out(batch, np.arange(n), layout, tuple(batch_sh))
        train_in[name] = jax.device_put(rows, batch_sh)
        logprob[name] = make_logprob_fn(cfg, mesh, mesh_cfg.rules, layout)
        rows, _ = assemble.lay_out(
            batch, np.arange(n), layout, tuple(logprob[name].batch_shardings)
        )
        logprob_in[name] = jax.device_put(rows, logprob[name].batch_shardings)
        print(
            f"  {name}: {placement.rows} rows x {max_len} slots, padding share {placement.padding_share:.1%}"
        )

    holder = {"state": state}

    def train(name):
        holder["state"], metrics = step(holder["state"], train_in[name])
        return metrics

    def forward(name):
        return logprob[name](holder["state"].params, logprob_in[name])

    calls = {}
    for name in layouts:  # in turn: padded's train step, its log-probs, then packed's
        calls["train", name] = lambda name=name: train(name)
        calls["logprob", name] = lambda name=name: forward(name)
    timings = time_interleaved(calls, repeats=args.iters, warmup=1)  # the warm-up compiles
    medians = {key: timing.median for key, timing in timings.items()}
    for what, label in (("train", "train step"), ("logprob", "old-log-prob pass")):
        rate = {name: real_tokens / medians[what, name] for name in layouts}
        print(
            f"{label}: padded {rate['padded']:,.0f} tokens/s ({medians[what, 'padded']:.2f} s), "
            f"packed {rate['packed']:,.0f} tokens/s ({medians[what, 'packed']:.2f} s): "
            f"packed / padded = {rate['packed'] / rate['padded']:.2f}x"
        )
    print(f"load average at the end {load_average():.1f}")
    return medians


# The papers' runs: (name, prompts x rollouts per step, sequences per mini-batch, max prompt,
# response limit, GPUs = row shards, rows per GPU per micro-batch). DynaMO (Table 3): 512 x 16,
# mini-batches of 32 prompts; Qwen2.5-Math's context is 4,096 tokens, so its configs take 1,024
# prompt + 3,072 response tokens (4 such rows fit an 80 GB GPU, docs/scaling.md); Qwen3-14B
# (context 40,960) takes Table 3's 2,048 + 8,192. E3: 64 x 8 in one update, responses <= 8,192.
PAPER_SHAPES = (
    ("DynaMO Qwen2.5-Math-7B, 8 GPUs", 512 * 16, 32 * 16, 1024, 3072, 8, 4),
    ("DynaMO Qwen3-14B, 16 GPUs", 512 * 16, 32 * 16, 2048, 8192, 16, 1),
    ("E3 R1-Distill-Qwen-7B, 8 GPUs", 64 * 8, 64 * 8, 1024, 8192, 8, 1),
)


def _micro_batches_run(placement, micro_rows: int) -> int:
    """Micro-batches that hold a token (the rest of a rounded-up batch is skipped)."""
    filled = len(np.unique(placement.row_S[placement.row_S >= 0]))
    return max(-(-filled // micro_rows), 1)


def shapes_only(args) -> None:
    from dynamo_jax.data.packing import RowLayout

    print(
        f"prompts U[{PROMPT_RANGE[0]}, {PROMPT_RANGE[1]}] tokens, responses log-normal (median "
        "limit / 4, 10% cut at the limit); padding = share of the computed slots without a token"
    )
    rng = np.random.default_rng(args.seed)
    for name, budget, mini, max_prompt, limit, gpus, rows_per_gpu in PAPER_SHAPES:
        row_len = max_prompt + limit
        prompt, response = sample_lengths(rng, budget, limit)
        lengths = prompt + response
        micro_rows = gpus * rows_per_gpu
        print(
            f"{name}: {budget:,} sequences per step, mini-batches of {mini}, rows of {row_len} "
            f"tokens, {rows_per_gpu} per GPU per micro-batch; mean sequence {lengths.mean():.0f}"
        )
        for packed in (False, True):
            layout = RowLayout(row_len, packed, micro_rows, mini, row_shards=gpus)
            placements = [layout.place(lengths[i : i + mini]) for i in range(0, budget, mini)]
            run = sum(_micro_batches_run(p, micro_rows) for p in placements)
            slots = run * micro_rows * row_len
            whole = RowLayout(row_len, packed, micro_rows, budget, row_shards=gpus)
            logprob_run = _micro_batches_run(whole.place(lengths), micro_rows)
            print(
                f"  {'packed' if packed else 'padded'}: {run / len(placements):.1f} micro-batches per "
                f"update (of {np.mean([p.micro_batches for p in placements]):.1f} after rounding), "
                f"padding {1 - lengths.sum() / slots:.1%}; old-log-prob pass {logprob_run} "
                "micro-batches"
            )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--preset", default="qwen2.5-0.5b", help="model preset (models/presets.py)")
    parser.add_argument(
        "--layers",
        default="2",
        help="override num_layers (0 = preset); a comma list runs each and fits time per layer",
    )
    parser.add_argument("--sequences", type=int, default=8, help="sequences of the batch")
    parser.add_argument("--limit", type=int, default=1024, help="response length limit")
    parser.add_argument("--iters", type=int, default=3, help="timed calls per side (median)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--remat",
        default="full",
        help="model.remat_policy (full: as the GPU configs; bounds memory)",
    )
    parser.add_argument("--shapes_only", action="store_true", help="the papers' shapes, no model")
    args = parser.parse_args()
    print(header(f"packing: {args.preset}, layers {args.layers}"))
    if args.shapes_only:
        shapes_only(args)
    else:
        run_model(args)


if __name__ == "__main__":
    main()
