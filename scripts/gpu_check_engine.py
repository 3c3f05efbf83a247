"""Check the embedded JAX engine against transformers `generate` on one GPU, in one call: greedy
agreement and log-probs in float32, then sampled tokens/s of both engines.

    python scripts/gpu_check_engine.py                             # qwen2.5-0.5b, 64 x 8 x 256
    python scripts/gpu_check_engine.py --preset qwen3-0.6b --out engine.json
    python scripts/gpu_check_engine.py --layers 4 --rounds 1       # quicker
    python scripts/gpu_check_engine.py --preset tiny-qwen3 --prompts 4 --samples 2 --new 16 \
        --rounds 1 --prompt_min 8 --prompt_max 16                  # CPU: the wiring, not the speed

Model: random float32 parameters of --preset (`init_params`; --layers overrides the depth) with
the final norm rescaled so the logits' standard deviation is --logit_std (random init gives
near-flat logits, where greedy would be decided by rounding), written once as a Hugging Face
directory (`save_hf_checkpoint`) that transformers loads: both engines run the same weights.
Prompts: --prompts random token sequences of lengths uniform in [--prompt_min, --prompt_max],
never containing the stop id (0, also HF's pad id).

Correctness (float32, JAX matmul precision "highest", torch TF32 off): --check_prompts prompts,
--check_new greedy tokens, JAX engine vs HF `generate(do_sample=False)` (left-padded batch);
the share of identical rows and the median first divergence (an identical row counts its
length). Then the engine's log-probs (the T = 1 distribution under greedy) against log_softmax
of HF's logits from one teacher-forced forward over prompt + the engine's completion: max abs
difference. Exit status 1 when fewer than
--min_identical of the rows agree or the difference exceeds --max_logprob_diff.

Speed (--dtype: bfloat16 on a GPU, float32 on CPU, both engines): --samples completions per
prompt, up to --new tokens, T = 1, top-k and top-p off, the stop id. One warm-up round each
(excluded; the JAX one is its compile + first batch), then --rounds rounds interleaved (jax hf
jax hf ...), round r with seed r. Tokens are the generated ones up to and including a stop
token; tokens/s is the median over rounds, each timed to completion on the host.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
# JAX and torch share the GPU: leave torch (HF) room instead of JAX's default 75 % preallocation.
os.environ.setdefault("XLA_PYTHON_CLIENT_MEM_FRACTION", "0.5")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
import torch  # noqa: E402
import transformers  # noqa: E402

from dynamo_jax.models.hf_io import save_hf_checkpoint  # noqa: E402
from dynamo_jax.models.presets import get_preset  # noqa: E402
from dynamo_jax.models.qwen import forward_jit, init_params  # noqa: E402
from dynamo_jax.rollout.buckets import pow2_bucket  # noqa: E402
from dynamo_jax.rollout.jax_engine import JaxEngine, JaxEngineConfig  # noqa: E402
from dynamo_jax.rollout.protocol import Request, SamplingParams  # noqa: E402

STOP = 0  # stop id and HF pad id; prompts never contain it
TORCH_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}


def produced(row, stop: int = STOP) -> int:
    """Generated tokens up to and including the first stop token (all of them when none)."""
    row = list(row)
    return row.index(stop) + 1 if stop in row else len(row)


def build_model(args):
    """Random float32 params with the logits' std rescaled to --logit_std."""
    overrides = {"num_layers": args.layers} if args.layers else {}
    cfg = get_preset(args.preset, dtype="float32", param_dtype="float32", **overrides)
    params = init_params(cfg, jax.random.key(args.seed))
    tokens = jnp.arange(1, 65, dtype=jnp.int32)[None] % cfg.vocab_size
    with jax.default_matmul_precision("highest"):
        logits = forward_jit(params, cfg, tokens, jnp.arange(64)[None], jnp.ones_like(tokens))
    std = float(jnp.std(logits[0, -16:], axis=-1).mean())
    params["final_norm"]["scale"] = params["final_norm"]["scale"] * (args.logit_std / std)
    return cfg, params


def make_prompts(args, vocab: int) -> list[list[int]]:
    rng = np.random.default_rng(args.seed)
    lengths = rng.integers(args.prompt_min, args.prompt_max + 1, args.prompts)
    return [[int(t) for t in rng.integers(STOP + 1, vocab, n)] for n in lengths]


def jax_engine(cfg, params, rows: int) -> JaxEngine:
    return JaxEngine(cfg, params, JaxEngineConfig(max_batch=pow2_bucket(rows, 8)))


def jax_round(engine, prompts, samples: int, new: int, temperature: float, seed: int):
    sampling = SamplingParams(
        max_new_tokens=new, temperature=temperature, top_p=1.0, top_k=-1,
        stop_token_ids=(STOP,), seed=seed,
    )  # fmt: skip
    requests = [
        Request(prompt_id=i, prompt_token_ids=tuple(p), n=samples) for i, p in enumerate(prompts)
    ]
    return engine.generate(requests, sampling)


class HFEngine:
    """transformers' own loop on the exported directory, every prompt left-padded in one batch."""

    def __init__(self, path: Path, prompts, dtype: str, device: str):
        self.device = device
        self.model = transformers.AutoModelForCausalLM.from_pretrained(
            path, dtype=TORCH_DTYPES[dtype]
        ).to(device).eval()  # fmt: skip
        width = max(len(p) for p in prompts)
        ids = torch.full((len(prompts), width), STOP, dtype=torch.long)
        mask = torch.zeros_like(ids)
        for i, p in enumerate(prompts):  # left padding: every row's last token is its own
            ids[i, width - len(p) :] = torch.tensor(p)
            mask[i, width - len(p) :] = 1
        self.ids, self.mask, self.width = ids.to(device), mask.to(device), width

    def round(self, samples: int, new: int, temperature: float, seed: int) -> list[list[int]]:
        sample = temperature > 0
        # top_k 0 and top_p 1.0 spelled out: left unset, generate() fills in its default top-k 50
        generation = transformers.GenerationConfig(
            max_new_tokens=new, min_new_tokens=0, do_sample=sample,
            **(dict(temperature=temperature, top_k=0, top_p=1.0) if sample else {}),
            num_return_sequences=samples if sample else 1,
            eos_token_id=[STOP], pad_token_id=STOP, use_cache=True,
        )  # fmt: skip
        torch.manual_seed(seed)
        with torch.no_grad():
            out = self.model.generate(
                input_ids=self.ids, attention_mask=self.mask, generation_config=generation
            )
        if self.device == "cuda":
            torch.cuda.synchronize()
        return [row[: produced(row)] for row in out[:, self.width :].tolist()]

    def logprobs(self, prompt, completion) -> np.ndarray:
        """log_softmax of the logits at each completion token, one teacher-forced forward."""
        ids = torch.tensor([list(prompt) + list(completion)], device=self.device)
        with torch.no_grad():
            logits = self.model(input_ids=ids).logits[0].double()
        logp = torch.log_softmax(logits[len(prompt) - 1 : -1], dim=-1)
        return logp.gather(-1, ids[0, len(prompt) :, None])[:, 0].cpu().numpy()

    def close(self) -> None:
        self.model = None
        if self.device == "cuda":
            torch.cuda.empty_cache()


def check(args, cfg, params, path: Path, prompts, device: str) -> dict:
    """Greedy tokens and log-probs of both engines, float32 at full matmul precision."""
    prompts = prompts[: args.check_prompts]
    tf32 = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = False
    hf = HFEngine(path, prompts, "float32", device)
    try:
        with jax.default_matmul_precision("highest"):
            engine = jax_engine(cfg, params, len(prompts))
            got = jax_round(engine, prompts, 1, args.check_new, 0.0, 0)
            engine.close()
        want = hf.round(1, args.check_new, 0.0, 0)
        same, diverge, lp_diff = 0, [], 0.0
        for p, c, w in zip(prompts, got, want):
            a = [int(t) for t in c.token_ids]
            same += a == w
            first = next((i for i, (x, y) in enumerate(zip(a, w)) if x != y), min(len(a), len(w)))
            diverge.append(first if a != w else len(a))
            lp = hf.logprobs(p, a)
            lp_diff = max(lp_diff, float(np.max(np.abs(lp - np.asarray(c.logprobs, np.float64)))))
    finally:
        hf.close()
        torch.backends.cuda.matmul.allow_tf32 = tf32
    out = {
        "rows": len(prompts), "new_tokens": args.check_new,
        "identical_share": same / len(prompts),
        "median_first_divergence": statistics.median(diverge),
        "logprob_max_abs_diff": lp_diff,
        "stopped_rows": sum(c.finish_reason == "stop" for c in got),
    }  # fmt: skip
    print(
        f"check (float32): {same}/{len(prompts)} greedy rows identical over {args.check_new} "
        f"tokens, median first divergence {out['median_first_divergence']}, log-prob max abs "
        f"diff {lp_diff:.2e} ({out['stopped_rows']} rows hit the stop id)",
        flush=True,
    )
    return out


def speed(args, cfg, params, path: Path, prompts, device: str, dtype: str) -> dict:
    cfg_s = cfg.replace(dtype=dtype, param_dtype=dtype)
    params_s = jax.tree.map(lambda x: x.astype(dtype), params)
    engine = jax_engine(cfg_s, params_s, len(prompts) * args.samples)
    hf = HFEngine(path, prompts, dtype, device)
    run = dict(samples=args.samples, new=args.new, temperature=1.0)

    def jax_tokens(seed):
        return sum(len(c.token_ids) for c in jax_round(engine, prompts, seed=seed, **run))

    def hf_tokens(seed):
        return sum(len(r) for r in hf.round(seed=seed, **run))

    timings: dict = {"jax": [], "hf": []}
    try:
        for r in range(args.rounds + 1):  # round 0: the warm-up (JAX compiles), not counted
            if r == 1:
                compiled = engine.num_compilations
            for name, fn in (("jax", jax_tokens), ("hf", hf_tokens)):
                start = time.perf_counter()
                tokens = fn(r)
                seconds = time.perf_counter() - start
                if r == 0:
                    timings[f"{name}_warmup_s"] = seconds
                else:
                    timings[name].append({"tokens": tokens, "seconds": seconds})
                print(
                    f"  {f'round {r}' if r else 'warm-up'} {name:3s} {tokens:7d} tokens in "
                    f"{seconds:7.2f} s = {tokens / seconds:9.1f} tokens/s",
                    flush=True,
                )
        recompiled = engine.num_compilations - compiled
    finally:
        engine.close()
        hf.close()
    rates = {
        k: statistics.median(t["tokens"] / t["seconds"] for t in timings[k]) for k in ("jax", "hf")
    }
    out = {
        "dtype": dtype, "prompts": len(prompts), "samples": args.samples, "new_tokens": args.new,
        "jax_first_batch_s": timings["jax_warmup_s"], "hf_warmup_s": timings["hf_warmup_s"],
        "jax_compilations": compiled, "jax_compilations_in_rounds": recompiled,
        "jax_tokens_per_s": rates["jax"], "hf_tokens_per_s": rates["hf"],
        "jax_over_hf": rates["jax"] / rates["hf"], "rounds": {k: timings[k] for k in ("jax", "hf")},
    }  # fmt: skip
    print(
        f"speed ({dtype}, {len(prompts)} x {args.samples} x <= {args.new} tokens): jax "
        f"{rates['jax']:.1f} tokens/s (compile + first batch {timings['jax_warmup_s']:.1f} s, "
        f"{compiled} programs, {recompiled} more in the rounds), hf {rates['hf']:.1f} tokens/s, "
        f"jax/hf {out['jax_over_hf']:.2f}x",
        flush=True,
    )
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--preset", default="qwen2.5-0.5b")
    parser.add_argument("--layers", type=int, default=0, help="override num_layers (0 = preset)")
    parser.add_argument("--prompts", type=int, default=64)
    parser.add_argument("--prompt_min", type=int, default=64)
    parser.add_argument("--prompt_max", type=int, default=128)
    parser.add_argument("--samples", type=int, default=8, help="speed: completions per prompt")
    parser.add_argument("--new", type=int, default=256, help="speed: max new tokens")
    parser.add_argument("--rounds", type=int, default=3, help="speed: measured rounds per engine")
    parser.add_argument("--dtype", choices=tuple(TORCH_DTYPES), default=None)
    parser.add_argument("--check_prompts", type=int, default=8)
    parser.add_argument("--check_new", type=int, default=32)
    parser.add_argument("--min_identical", type=float, default=0.75)
    parser.add_argument("--max_logprob_diff", type=float, default=1e-3)
    parser.add_argument("--logit_std", type=float, default=4.0)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", default="", help="write every figure here as JSON")
    args = parser.parse_args()
    if (
        not 1 <= args.prompt_min <= args.prompt_max
        or min(args.prompts, args.samples, args.rounds) < 1
    ):
        parser.error("need 1 <= --prompt_min <= --prompt_max; --prompts, --samples, --rounds >= 1")

    transformers.logging.set_verbosity_error()  # no load progress bars or flag warnings
    transformers.logging.disable_progress_bar()
    device = "cuda" if torch.cuda.is_available() else "cpu"
    gpu = torch.cuda.get_device_name(0) if device == "cuda" else "none"
    dtype = args.dtype or ("bfloat16" if jax.default_backend() == "gpu" else "float32")
    print(f"jax devices: {jax.devices()}", flush=True)
    print(
        f"jax {jax.__version__}, torch {torch.__version__}, transformers "
        f"{transformers.__version__}; GPU: {gpu}; torch device: {device}",
        flush=True,
    )
    report: dict = {
        "args": vars(args), "jax": jax.__version__, "torch": torch.__version__,
        "transformers": transformers.__version__, "gpu": gpu,
        "jax_devices": [str(d) for d in jax.devices()],
    }  # fmt: skip
    start = time.perf_counter()
    cfg, params = build_model(args)
    prompts = make_prompts(args, cfg.vocab_size)
    print(
        f"model: random {args.preset} ({cfg.num_layers} layers, {cfg.num_params / 1e6:.1f}M "
        f"params, logit std {args.logit_std}); {len(prompts)} prompts of {args.prompt_min}-"
        f"{args.prompt_max} tokens; built in {time.perf_counter() - start:.1f} s",
        flush=True,
    )
    failures = []
    with tempfile.TemporaryDirectory(prefix="gpu-check-engine-") as tmp:
        path = save_hf_checkpoint(params, cfg, Path(tmp) / "model", dtype="float32")
        report["check"] = check(args, cfg, params, path, prompts, device)
        # where the time goes: on an H200 the check and the first bf16 round (its compiles)
        # together outlasted 100 s at 4 layers, with no line printed in between
        print(f"  ({time.perf_counter() - start:.1f} s since the start)", flush=True)
        if report["check"]["identical_share"] < args.min_identical:
            failures.append(
                f"only {report['check']['identical_share']:.0%} of greedy rows identical "
                f"(< {args.min_identical:.0%})"
            )
        if not report["check"]["logprob_max_abs_diff"] <= args.max_logprob_diff:
            failures.append(
                f"log-prob max abs diff {report['check']['logprob_max_abs_diff']:.2e} > "
                f"{args.max_logprob_diff:.0e}"
            )
        report["speed"] = speed(args, cfg, params, path, prompts, device, dtype)
    report["failures"] = failures
    report["total_s"] = time.perf_counter() - start
    if args.out:
        Path(args.out).write_text(json.dumps(report, indent=1) + "\n")
    print(f"total {report['total_s']:.1f} s", flush=True)
    for reason in failures:
        print(f"FAIL: {reason}", flush=True)
    print("FAIL" if failures else "OK", flush=True)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
