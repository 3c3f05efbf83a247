"""Side by side with TRL's GRPOTrainer: the same init, prompts, reward and settings, per phase.

    bash scripts/make_trl_venv.sh                         # once: TRL 1.16 + CPU torch 2.13
    python -m benchmarks.peer_trl --shape tiny --rounds 4 --steps_per_round 5
    python -m benchmarks.peer_trl --shape small --modes single --rounds 3 --steps_per_round 2
    python -m benchmarks.peer_trl --shape tiny --sample_efficiency --seeds 8 --steps 150 --task mixed

The project side builds the shape's run (configs/tiny.py's GRPO recipe at that shape), exports
its initial weights and tokenizer as an HF directory, and writes the prompts (messages, token ids,
gold answers), the reward of each verdict status and the GRPOConfig arguments mapped one to one
from its config (`trl_settings`; the table is printed with every run). The TRL side
(benchmarks/peer_trl_worker.py, in the TRL venv) loads them and checks that its chat template
gives the project's prompt ids. Each side is a worker process kept alive between rounds; the
rounds alternate (project then TRL, then TRL then project, ...), so load from other work falls
on both. `--modes single`: every worker pinned to core 0 (taskset) with one thread (OpenMP/BLAS
threads 1, XLA's Eigen pool off, torch.set_num_threads(1)); `all`: every core and thread, and
one XLA:CPU device per core, the project's engine decoding on all of them (jax_engine.devices).

Per RL step, both sides split the time into generate (sampling, incl. tokenising/decoding),
score (the reward), old_logprobs (the behaviour policy's log-probs: the no-grad forward before
the updates), update (the optimizer updates: forward, backward, AdamW) and other (the rest of
the step: batching, advantages, weight push, bookkeeping); TRL's come from wrappers around
GRPOTrainer's `_generate`, `_calculate_rewards`, the no-grad `_get_per_token_logps_and_entropies`
and a callback around each optimizer step. Figures are medians over the steps after the first
`--warmup` of each side (JAX compiles, torch allocates); the 1-minute load average is printed
beside each, since other work on the machine slows whichever side runs while it does.
`--sample_efficiency` trains both from the same init (the first `--modes` entry) for `--steps`
steps per seed and prints the reward curves per seed and the steps to each target reward.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benchmarks.harness import ROOT, header, load_average, with_one_thread_flags
from benchmarks.peer_trl_worker import PREFIX, release_free_memory

SHAPES = ("tiny", "small", "smollm2")
PHASES = ("generate", "score", "old_logprobs", "update", "other", "step")
SINGLE_THREAD_ENV = {"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1"}


class Unavailable(Exception):
    """The shape cannot run in this checkout (said in one line, then skipped)."""


# ----------------------------------------------------------------------------- shapes


def shape_config(
    shape: str,
    seed: int,
    steps: int,
    task: str = "max",
    old_logprobs: str = "engine",
    engine_devices: int = 0,
):
    """(ConfigDict, force_length) of a shape: configs/tiny.py's GRPO recipe at that shape, on the
    synthetic `task` (tiny, small), π_old from `old_logprobs` (train.old_logp_source), the
    embedded engine on its own mesh of `engine_devices` (jax_engine.devices; 0 = the trainer's)."""
    from configs import tiny

    config = tiny.get_config(f"method=grpo,task={task}")
    force = False
    if shape == "small":  # small-qwen3 over the synthetic vocabulary, 32 tokens every time
        from configs import base

        config.model = base.model(
            "small-qwen3", vocab_size=config.model.vocab_size, scan_layers=False
        )  # as configs/tiny.py
        config.rollout.max_new_tokens = 32
        force = True
    elif shape == "smollm2":
        config = smollm2_config()
    elif shape != "tiny":
        raise ValueError(f"--shape must be one of {SHAPES}, got {shape!r}")
    config.train.seed = seed
    config.data.seed = seed
    config.train.steps = steps
    # The project's own setting for on-policy work: no log-prob pass that would only recompute
    # what is known. π_old from the engine: the log-probs it sampled with (same weights, the
    # batch's temperature, no top-k/top-p) serve every update and no pass runs; from the
    # trainer: the first update's rows get none (π_old = stop_gradient(π) of that update's
    # forward). RunConfig.old_logp_from_engine_only / first_update_on_policy.
    config.train.skip_on_policy_logprob_pass = True
    config.train.old_logp_source = old_logprobs
    config.jax_engine.devices = engine_devices
    # And its shared-prompt forward: each distinct prompt of a mini-batch runs once in the update
    # and the log-prob pass (the same log-probs and gradients; rows unpacked, prompts aligned).
    config.train.packing = False
    config.train.share_prompts = True
    return config, force


def smollm2_config():
    """configs/smollm2_arith.py's config (the SmolLM2-135M real-model shape), or Unavailable."""
    if not (ROOT / "configs" / "smollm2_arith.py").exists():
        raise Unavailable("configs/smollm2_arith.py is not in this checkout yet")
    try:
        from configs import smollm2_arith

        config = smollm2_arith.get_config()
        # The config accumulates two half-batches (the same gradient, half the activations);
        # TRL's bnpo would normalise each half on its own, so both sides take the whole batch.
        config.train.micro_batches = 1
        from dynamo_jax.config import from_config_dict

        run = from_config_dict(config)
    except Exception as err:  # any failure to load the shape means: not loadable yet
        raise Unavailable(f"configs/smollm2_arith.py does not load here: {err}") from err
    del run
    return config


# ----------------------------------------------------------------------------- settings map


def _need(ok: bool, what: str) -> None:
    if not ok:
        raise ValueError(f"peer_trl: the run cannot be mapped to TRL one to one: {what}")


def trl_settings(cfg, *, force_length: bool) -> tuple[list[tuple[str, str, str, str]], dict]:
    """(table rows (project key, value, TRL argument, value), GRPOConfig kwargs) of a RunConfig.

    Raises ValueError for a setting TRL has no equivalent of (the comparison would not be of the
    same work)."""
    t, loss, opt, roll = cfg.train, cfg.loss, cfg.optim, cfg.rollout
    _need(cfg.allocation.policy == "uniform", f"allocation.policy {cfg.allocation.policy!r}")
    _need(loss.variant == "grpo", f"loss.variant {loss.variant!r} (TRL runs GRPO)")
    _need(loss.loss_agg_mode == "token-mean", f"loss.loss_agg_mode {loss.loss_agg_mode!r}")
    _need(cfg.budget % t.mini_batch_size == 0, "train.mini_batch_size must divide the budget")
    _need(t.micro_batches == 1 and not t.max_tokens_per_micro_batch,
          "micro-batches (TRL's bnpo normalises per micro-batch)")  # fmt: skip
    _need(t.max_staleness == 0 and not t.dynamic_sampling, "off-policy or dynamic sampling")
    # TRL's per-token KL is the k3 estimator exp(r) - r - 1 of r = log pi_ref - log pi
    _need(loss.kl in ("none", "k3"), f"loss.kl {loss.kl!r} (TRL's KL term is k3)")
    _need(loss.dual_clip is None, "loss.dual_clip (TRL's delta clips the other side)")
    _need(cfg.temperature.mode == "fixed", f"temperature.mode {cfg.temperature.mode!r}")
    _need(opt.schedule == "constant" and opt.warmup_steps == 0, "a learning-rate schedule")
    _need(cfg.model.dtype == "float32", f"model.dtype {cfg.model.dtype!r}")
    updates = cfg.budget // t.mini_batch_size
    kl = loss.kl != "none"
    kwargs = dict(
        per_device_train_batch_size=t.mini_batch_size,
        gradient_accumulation_steps=1,
        steps_per_generation=updates,
        num_generations=cfg.allocation.n_avg,
        num_iterations=t.ppo_epochs,
        max_steps=t.steps * updates * t.ppo_epochs,
        loss_type="bnpo",
        epsilon=loss.clip_low,
        epsilon_high=loss.clip_high,
        beta=loss.kl_coef if kl else 0.0,
        scale_rewards="group" if loss.norm_adv_by_std else "none",
        learning_rate=opt.learning_rate,
        weight_decay=opt.weight_decay,
        adam_beta1=opt.b1,
        adam_beta2=opt.b2,
        adam_epsilon=opt.eps,
        max_grad_norm=opt.max_grad_norm if opt.max_grad_norm > 0 else 0.0,
        # TRL's GRPOConfig turns activation recomputation on by default; the same work is the
        # project's remat choice (none unless the model config asks).
        gradient_checkpointing=cfg.model.remat_policy != "none",
        optim="adamw_torch",
        lr_scheduler_type="constant",
        warmup_steps=0,
        max_completion_length=roll.max_new_tokens,
        temperature=float(cfg.temperature.initial),
        top_p=roll.top_p,
        top_k=0 if roll.top_k == -1 else roll.top_k,
        mask_truncated_completions=False,
        seed=t.seed,
        data_seed=cfg.data.seed,
        bf16=False,
        fp16=False,
        use_cpu=True,
        report_to=[],
        save_strategy="no",
        logging_strategy="no",
        disable_tqdm=True,
        dataloader_num_workers=0,
    )
    if force_length:  # the project's engine with no stop token ≙ generate without an eos id
        kwargs["generation_kwargs"] = {"eos_token_id": None}
    n = cfg.allocation.n_avg
    rows = [
        ("train.prompts_per_step x allocation.n_avg", f"{t.prompts_per_step} x {n} (uniform)",
         "generation_batch_size / num_generations",
         f"{t.mini_batch_size * updates} / {kwargs['num_generations']}"),
        ("train.mini_batch_size", t.mini_batch_size, "per_device_train_batch_size",
         kwargs["per_device_train_batch_size"]),
        ("budget / mini_batch_size (updates per step)", updates, "steps_per_generation",
         updates),
        ("train.ppo_epochs", t.ppo_epochs, "num_iterations", t.ppo_epochs),
        ("old log-probs (no-grad pass)",
         ("none (the engine's sampling log-probs)" if cfg.old_logp_from_engine_only
          else "none (one update: its own forward)" if cfg.skips_logprob_pass
          else "rows of updates 2.. (update 1: its own forward)" if cfg.first_update_on_policy
          else "every row"),
         "old_per_token_logps",
         "every row" if updates * t.ppo_epochs > 1 else "none (.detach() of the update's)"),
        ("train.share_prompts (prompt forward)",
         "once per distinct prompt" if t.share_prompts else "every row",
         "(none: every row)", "every row"),
        ("train.micro_batches", t.micro_batches, "gradient_accumulation_steps", 1),
        ("train.steps", t.steps, "max_steps (optimizer steps)", kwargs["max_steps"]),
        ("loss.variant / loss_agg_mode", f"{loss.variant} / {loss.loss_agg_mode}",
         "loss_type", "bnpo"),
        ("loss.clip_low / clip_high", f"{loss.clip_low} / {loss.clip_high}",
         "epsilon / epsilon_high", f"{loss.clip_low} / {loss.clip_high}"),
        ("loss.dual_clip", loss.dual_clip, "delta", None),
        ("loss.kl (coef)", f"{loss.kl} ({loss.kl_coef if kl else 0})", "beta", kwargs["beta"]),
        ("loss.norm_adv_by_std (eps)", f"{loss.norm_adv_by_std} (1e-6)", "scale_rewards (eps)",
         f"{kwargs['scale_rewards']} (1e-4, fixed in TRL)"),
        ("optim: AdamW lr / wd", f"{opt.learning_rate} / {opt.weight_decay}",
         "optim=adamw_torch learning_rate / weight_decay",
         f"{opt.learning_rate} / {opt.weight_decay}"),
        ("optim.b1 / b2 / eps", f"{opt.b1} / {opt.b2} / {opt.eps}",
         "adam_beta1 / adam_beta2 / adam_epsilon", f"{opt.b1} / {opt.b2} / {opt.eps}"),
        ("optim.max_grad_norm", opt.max_grad_norm, "max_grad_norm", kwargs["max_grad_norm"]),
        ("model.remat_policy", cfg.model.remat_policy, "gradient_checkpointing",
         kwargs["gradient_checkpointing"]),
        ("optim.schedule / warmup_steps", f"{opt.schedule} / {opt.warmup_steps}",
         "lr_scheduler_type / warmup_steps", "constant / 0"),
        ("rollout.max_new_tokens", roll.max_new_tokens, "max_completion_length",
         roll.max_new_tokens),
        ("stop token", "none (forced length)" if force_length else "<eos> ends a response",
         "generation_kwargs", kwargs.get("generation_kwargs", "(eos from the tokenizer)")),
        ("temperature (fixed)", cfg.temperature.initial, "temperature", kwargs["temperature"]),
        ("rollout.top_p / top_k", f"{roll.top_p} / {roll.top_k}", "top_p / top_k",
         f"{roll.top_p} / {kwargs['top_k']}"),
        ("(truncated responses trained)", True, "mask_truncated_completions", False),
        ("model.dtype", cfg.model.dtype, "bf16 / fp16", "False / False (float32)"),
        ("train.seed / data.seed", f"{t.seed} / {cfg.data.seed}", "seed / data_seed",
         f"{t.seed} / {cfg.data.seed}"),
    ]  # fmt: skip
    return [tuple(str(c) for c in row) for row in rows], kwargs


# ----------------------------------------------------------------------------- project worker


def task_rows(cfg) -> list[dict]:
    """The task's prompts as the project templates them: messages, token ids, gold answer."""
    from dynamo_jax import data, tasks
    from dynamo_jax.data.prompts import with_system_prompt

    tokenizer = tasks.task_tokenizer(cfg)
    prompts = data.build_prompts(tasks._rows(cfg, cfg.data.paths), tokenizer, cfg.data)
    return [
        {
            "messages": with_system_prompt(row.messages, cfg.data.system_prompt),
            "prompt_ids": list(ids),
            "gold": row.gold,
        }
        for row, ids in zip(prompts.rows, prompts.token_ids)
    ]


def reward_values(reward_cfg) -> dict[str, float]:
    """The reward of each verdict status under the run's reward section."""
    from dynamo_jax.rewards.verdict import STATUSES, reward_for

    return {s: float(reward_for(s, reward_cfg)) for s in STATUSES}


def export_init(params, cfg, out_dir: Path) -> Path:
    """The initial weights (float32) and the task's tokenizer as an HF directory."""
    from dynamo_jax import tasks
    from dynamo_jax.models.hf_io import save_hf_checkpoint

    tokenizer = tasks.task_tokenizer(cfg)
    return save_hf_checkpoint(params, cfg.model, out_dir, tokenizer=tokenizer, dtype="float32")


def say(obj) -> None:
    sys.stdout.write(PREFIX + json.dumps(obj) + "\n")
    sys.stdout.flush()


def project_worker(args) -> None:
    """The project side (`args`: main's, the worker's own `--_*` ones set): build the run, export
    its init + the TRL spec, then train on command."""
    from dynamo_jax.config import from_config_dict
    from dynamo_jax.data.synthetic import MAX_RESPONSE_CHARS
    from dynamo_jax.loop.build import build_trainer
    from dynamo_jax.loop.rl_step import rl_step
    from dynamo_jax.models.fetch import resolve_init

    tmp = args._tmp
    config, force = shape_config(
        args._project_worker, args.seed, args._steps, args.task, args.old_logprobs,
        args._engine_devices,
    )  # fmt: skip
    cfg = resolve_init(from_config_dict(config))  # smollm2: the wheel's GGUF, converted once
    rows, kwargs = trl_settings(cfg, force_length=force)
    tr = build_trainer(cfg, Path(tmp) / "project")
    if force:
        tr.task.stop_token_ids = ()  # no stop token: every response is max_new_tokens long
    model_dir = export_init(tr.state.params, cfg, Path(tmp) / "init_hf")
    spec = {
        "model_dir": str(model_dir),
        "rows": task_rows(cfg),
        "reward_values": reward_values(cfg.reward),
        "max_response_chars": MAX_RESPONSE_CHARS,
        # the synthetic verdict re-implemented in the TRL worker, else the project's scorer
        "reward": "synthetic"
        if cfg.data.task == "synthetic" and args.reward == "auto"
        else "project",
        "trl_args": kwargs,
        "settings": rows,
        "force_length": force,
        "num_params": cfg.model.num_params,
    }
    (Path(tmp) / "spec.json").write_text(json.dumps(spec))
    say({"ready": True, "load": load_average()})
    step = 0
    for line in sys.stdin:
        words = line.split()
        if not words or words[0] == "stop":
            break
        if words[0] == "score":  # for the TRL side: the same verdicts, by the same code
            asked = json.loads(line.split(" ", 1)[1])
            verdicts = tr.task.scorer.score(asked["texts"], asked["golds"])
            say({"rewards": [v.reward for v in verdicts]})
            continue
        out = []
        for _ in range(int(words[1])):
            step += 1
            t0 = time.perf_counter()
            outcome = rl_step(tr, step)
            tr.advance(outcome.state, outcome.consecutive_nonfinite, outcome.skipped_updates)
            m = outcome.metrics
            wall = time.perf_counter() - t0
            phases = {
                "generate": m["time/generate"],
                "score": m["time/score"],
                # no key when the pass is skipped (on-policy, RunConfig.skips_logprob_pass)
                "old_logprobs": m.get("time/old_logprobs", 0.0)
                + m.get("time/behaviour_logprobs", 0.0),
                "update": m["time/update"],
                "step": wall,
            }
            phases.update(reward=m["reward/mean"], length=m["response/len_mean"])
            out.append(phases)
        say({"steps": out, "load": load_average()})
        release_free_memory()
    tr.engine.close()
    tr.task.close()


# ----------------------------------------------------------------------------- the driver


class Worker:
    """A worker process answering PREFIX lines; its other output goes to a log file."""

    def __init__(self, name: str, cmd: list[str], env: dict, log: Path):
        self.name, self.log = name, log
        self.proc = subprocess.Popen(
            cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=open(log, "w"),
            text=True, env=env, cwd=ROOT,
        )  # fmt: skip

    def send(self, line: str) -> None:
        self.proc.stdin.write(line + "\n")
        self.proc.stdin.flush()

    def answer(self, scorer: Worker | None = None) -> dict:
        """The next answer; `score` requests on the way are passed to `scorer` and answered."""
        for line in self.proc.stdout:
            if not line.startswith(PREFIX):
                continue
            got = json.loads(line[len(PREFIX) :])
            if "score" not in got:
                return got
            if scorer is None:
                raise SystemExit(f"peer_trl: the {self.name} worker asked for scores: no scorer")
            scorer.send("score " + json.dumps(got["score"]))
            self.send(json.dumps(scorer.answer()["rewards"]))
        tail = self.log.read_text()[-3000:]
        raise SystemExit(f"peer_trl: the {self.name} worker exited ({self.proc.wait()}):\n{tail}")

    def go(self, steps: int, scorer: Worker | None = None) -> dict:
        self.send(f"go {steps}")
        return self.answer(scorer)

    def stop(self) -> None:
        try:
            self.proc.stdin.write("stop\n")
            self.proc.stdin.flush()
        except (BrokenPipeError, OSError):
            pass
        try:
            self.proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            self.proc.kill()


def worker_env(mode: str) -> tuple[dict, list[str]]:
    """(environment, command prefix) of a worker in thread mode `single` or `all`."""
    env = dict(os.environ, JAX_PLATFORMS="cpu", TRANSFORMERS_OFFLINE="1", HF_HUB_OFFLINE="1")
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    env["TOKENIZERS_PARALLELISM"] = "false"
    if mode == "all":
        # One XLA:CPU device per core: the project's engine decodes on all of them
        # (jax_engine.devices); its trainer keeps one device, whose ops use every core's thread.
        devices = f" --xla_force_host_platform_device_count={engine_devices(mode)}"
        env["XLA_FLAGS"] = env.get("XLA_FLAGS", "") + devices
        return env, []
    env.update(SINGLE_THREAD_ENV)
    env["XLA_FLAGS"] = with_one_thread_flags(env.get("XLA_FLAGS", ""))
    if shutil.which("taskset") is None:
        print("warning: taskset is not on PATH: single-thread workers are not pinned to a core")
        return env, []
    return env, ["taskset", "-c", "0"]


def engine_devices(mode: str) -> int:
    """The project's jax_engine.devices in thread mode `mode`: every core's device in `all`, the
    trainer's one-device mesh in `single`."""
    return os.cpu_count() if mode == "all" else 0


def start_pair(args, mode: str, seed: int, steps: int, tmp: str) -> tuple[Worker, Worker, dict]:
    """The project worker (which writes the spec), then the TRL worker on that spec."""
    env, prefix = worker_env(mode)
    me = [sys.executable, "-m", "benchmarks.peer_trl", "--_project_worker", args.shape]
    me += ["--seed", str(seed), "--_steps", str(steps), "--_tmp", tmp, "--reward", args.reward]
    me += ["--task", args.task, "--old_logprobs", args.old_logprobs]
    me += ["--_engine_devices", str(engine_devices(mode))]
    project = Worker("project", prefix + me, env, Path(tmp) / "project.log")
    project.answer()
    spec = json.loads((Path(tmp) / "spec.json").read_text())
    spec.update(threads=1 if mode == "single" else 0, out_dir=str(Path(tmp) / "trl_out"))
    (Path(tmp) / "spec_trl.json").write_text(json.dumps(spec))
    worker = [str(args.trl_python), "-m", "benchmarks.peer_trl_worker"]
    trl = Worker("TRL", prefix + worker + [str(Path(tmp) / "spec_trl.json")], env,
                 Path(tmp) / "trl.log")  # fmt: skip
    trl.answer()
    return project, trl, spec


def _median(xs: list[float]) -> float:
    xs = sorted(xs)
    n = len(xs)
    return (xs[n // 2] + xs[(n - 1) // 2]) / 2 if n else float("nan")


def phase_medians(steps: list[dict]) -> dict[str, float]:
    """Median seconds of each phase over `steps`; other = step − the named phases."""
    named = PHASES[:4]
    rows = [dict(s, other=s["step"] - sum(s.get(p, 0.0) for p in named)) for s in steps]
    return {p: _median([r.get(p, 0.0) for r in rows]) for p in PHASES}


def print_settings(spec: dict) -> None:
    print(f"settings ({spec['num_params']:,} parameters; project key = value <-> TRL arg = value):")
    for key, value, arg, trl_value in spec["settings"]:
        print(f"  {key:44s} = {value:28s} <-> {arg} = {trl_value}")


def speed(args) -> None:
    for mode in args.modes.split(","):
        steps = args.rounds * args.steps_per_round
        with tempfile.TemporaryDirectory() as tmp:
            project, trl, spec = start_pair(args, mode, args.seed, steps, tmp)
            if mode == args.modes.split(",")[0]:
                print_settings(spec)
            got = {"project": [], "TRL": []}
            loads = {"project": [], "TRL": []}
            try:
                for r in range(args.rounds):  # alternate which side goes first
                    order = (project, trl) if r % 2 == 0 else (trl, project)
                    for w in order:
                        before = load_average()
                        ans = w.go(args.steps_per_round, scorer=project)
                        got[w.name] += ans["steps"]
                        loads[w.name] += [before, ans["load"]]
            finally:
                project.stop()
                trl.stop()
        report(args, mode, got, loads)


def report(args, mode: str, got: dict, loads: dict) -> None:
    kept = {k: v[args.warmup :] for k, v in got.items()}
    med = {k: phase_medians(v) for k, v in kept.items()}
    load = {k: f"{_median(v):.2f} ({min(v):.2f}-{max(v):.2f})" for k, v in loads.items()}
    threads = "1 thread on core 0" if mode == "single" else f"all threads ({os.cpu_count()} CPUs)"
    if engine_devices(mode):
        threads += f"; the project's engine on {engine_devices(mode)} devices (jax_engine.devices)"
    n = len(kept["project"])
    print(f"\n{args.shape}, {threads}: median s/step over {n} steps after {args.warmup} warm-up "
          f"(rounds of {args.steps_per_round}, interleaved); load avg median (min-max)")  # fmt: skip
    print(f"  {'phase':13s} {'project s':>10s} {'TRL s':>10s} {'TRL/project':>12s}")
    for p in PHASES:
        a, b = med["project"][p], med["TRL"][p]
        ratio = f"{b / a:12.2f}" if a > 0 else f"{'-':>12s}"
        print(f"  {p:13s} {a:10.4f} {b:10.4f} {ratio}")
    for k in ("project", "TRL"):
        lengths = [s["length"] for s in got[k]]
        shortest = [s["min_length"] for s in got[k] if "min_length" in s]
        least = f" (shortest {min(shortest)})" if shortest else ""
        print(f"  {k}: load {load[k]}; mean response length {_median(lengths):.1f} tokens{least}")


def sample_efficiency(args) -> None:
    from benchmarks.sample_efficiency import steps_to_target

    targets = [float(t) for t in args.targets.split(",")]
    curves = {"project": {}, "TRL": {}}
    for seed in range(args.seeds):
        with tempfile.TemporaryDirectory() as tmp:
            # threads do not change what is learnt: the first --modes entry (single by default,
            # which suffers least from other work on the machine)
            project, trl, spec = start_pair(args, args.modes.split(",")[0], seed, args.steps, tmp)
            if seed == 0:
                print_settings(spec)
            try:
                for w in (project, trl):  # one after the other: neither slows the other
                    steps = w.go(args.steps, scorer=project)["steps"]
                    curves[w.name][seed] = [s["reward"] for s in steps]
            finally:
                project.stop()
                trl.stop()
        for k in ("project", "TRL"):
            c = curves[k][seed]
            every = max(1, args.steps // 10)
            points = " ".join(f"{sum(c[max(0, i - 4) : i + 1]) / len(c[max(0, i - 4) : i + 1]):.2f}"
                              for i in range(every - 1, len(c), every))  # fmt: skip
            hits = [steps_to_target(c, t) for t in targets]
            print(f"seed {seed} {k:7s}: reward (5-step mean every {every} steps) {points}; "
                  f"steps to {targets}: {hits}", flush=True)  # fmt: skip
    print(f"\nmedian over {args.seeds} seeds of the steps to each target (a miss = {args.steps + 1})"
          " and of the last 10 steps' mean reward; min-max in brackets:")  # fmt: skip
    for k in ("project", "TRL"):
        cells = []
        for t in targets:
            hits = [steps_to_target(c, t) or args.steps + 1 for c in curves[k].values()]
            cells.append(f"to {t}: {_median(hits):.0f} [{min(hits)}-{max(hits)}]")
        finals = [sum(c[-10:]) / len(c[-10:]) for c in curves[k].values()]
        cells.append(f"final {_median(finals):.3f} [{min(finals):.3f}-{max(finals):.3f}]")
        print(f"  {k:7s} " + ", ".join(cells))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shape", default="tiny", choices=SHAPES)
    parser.add_argument("--task", default="max", help="the synthetic task of tiny / small")
    parser.add_argument(
        "--old_logprobs",
        default="engine",
        choices=("engine", "trainer"),
        help="the project's π_old (train.old_logp_source): the engine's sampling log-probs, no "
        "pass; or the trainer's pass over the rows of updates 2.. (TRL: a pass over every row)",
    )
    parser.add_argument("--modes", default="single,all", help="comma list of single | all")
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--steps_per_round", type=int, default=5)
    parser.add_argument("--warmup", type=int, default=2, help="first steps of each side dropped")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--trl_python", type=Path, default=ROOT / ".venv-trl" / "bin" / "python")
    parser.add_argument(
        "--reward",
        default="auto",
        choices=("auto", "project"),
        help="TRL's reward: auto = the synthetic verdict re-implemented in the TRL worker for the "
        "synthetic task, the project's scorer (called from TRL's reward function) otherwise; "
        "project = always the project's scorer",
    )
    parser.add_argument("--sample_efficiency", action="store_true")
    parser.add_argument("--seeds", type=int, default=4)
    parser.add_argument("--steps", type=int, default=100, help="steps per seed (sample efficiency)")
    parser.add_argument("--targets", default="0.5,0.7,0.9")
    parser.add_argument("--_project_worker", default="", help=argparse.SUPPRESS)
    parser.add_argument("--_steps", type=int, default=0, help=argparse.SUPPRESS)
    parser.add_argument("--_tmp", default="", help=argparse.SUPPRESS)
    parser.add_argument("--_engine_devices", type=int, default=0, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args._project_worker:
        return project_worker(args)
    if not args.trl_python.exists():
        sys.exit(f"peer_trl: {args.trl_python} not found: run `bash scripts/make_trl_venv.sh`")
    if any(m not in ("single", "all") for m in args.modes.split(",")):
        parser.error("--modes takes single and/or all")
    if args.shape == "smollm2":
        try:
            smollm2_config()
        except Unavailable as err:
            print(f"peer_trl: skipping shape smollm2: {err}")
            return
    print(header(f"peer_trl {' '.join(sys.argv[1:]) or '(defaults)'}"), flush=True)
    sample_efficiency(args) if args.sample_efficiency else speed(args)


if __name__ == "__main__":
    main()
