"""The TRL side of benchmarks/peer_trl.py: runs under the TRL venv (scripts/make_trl_venv.sh).

    .venv-trl/bin/python -m benchmarks.peer_trl_worker SPEC.json

Never imports dynamo_jax (the TRL venv has no JAX): everything it needs comes in SPEC.json,
written by the project side — the exported initial weights and tokenizer (an HF directory), the
prompts (chat messages, their project token ids and gold answers), the reward of each verdict
status, and the GRPOConfig arguments mapped from the project's config (peer_trl.trl_settings).

Protocol on stdin/stdout (lines; the worker's own answers start with PREFIX, so TRL's and
transformers' prints are ignored): after building the trainer it answers `ready`, then per
`go K` it trains K RL steps (2·K optimizer steps at steps_per_generation 2) and answers one JSON
object with per-step phase seconds, rewards and completion lengths; `stop` ends training.
The reward function is the synthetic task's verdict re-implemented here (`synthetic_reward`;
tests/test_peer_trl.py proves it equal to dynamo_jax.data.synthetic's on every 1- and 2-token
completion and the edge cases), or with spec "reward": "project" (any other task, or
`--reward project`) the project's own scorer: the worker answers `score` with the decoded texts
and gold answers and reads back one JSON line of rewards, which the driver gets from the
project worker (its `Task.scorer`, idle while TRL runs).
"""

from __future__ import annotations

import json
import os
import re
import sys
import time

PREFIX = "@@peer_trl "
# dynamo_jax.data.synthetic: the stop token and the other special strings a decoded text may hold
EOS, PAD, BOS_TURN = "<|im_end|>", "<|endoftext|>", "<|im_start|>"


def synthetic_status(text, gold: str, max_chars: int) -> str:
    """The synthetic task's verdict status: correct | wrong | no_answer | parse_error."""
    if not isinstance(text, str) or len(text) > max_chars:
        return "parse_error"
    text = text.split(EOS, 1)[0]
    for special in (PAD, BOS_TURN):
        text = text.replace(special, "")
    match = re.match(r"\s*(\d+)", text)
    if match is None:
        return "no_answer"
    return "correct" if match.group(1) == gold else "wrong"


def synthetic_reward(text, gold: str, rewards: dict, max_chars: int) -> float:
    return float(rewards[synthetic_status(text, gold, max_chars)])


def release_free_memory() -> None:
    """Return freed heap pages to the OS while this side waits for the other (never timed).

    With several threads glibc keeps each thread's freed arenas: after an all-threads SmolLM2
    step TRL's worker held 10.6 GB it no longer used, and the project's next update (13.5 GB)
    ran the 24 GB machine out of memory. Both workers call this after each batch of steps."""
    import ctypes
    import gc

    gc.collect()
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):  # not glibc: nothing to trim
        pass


def say(obj) -> None:
    sys.stdout.write(PREFIX + json.dumps(obj) + "\n")
    sys.stdout.flush()


class Phases:
    """Seconds per phase of the current RL step, from wrappers around the trainer's methods."""

    def __init__(self):
        self.now: dict[str, float] = {}
        self.in_prepare = False

    def add(self, name: str, seconds: float) -> None:
        self.now[name] = self.now.get(name, 0.0) + seconds

    def wrap(self, obj, method: str, name, around=None):
        inner = getattr(obj, method)

        def timed(*args, **kwargs):
            label = name() if callable(name) else name
            if around is not None:
                around(True)
            t0 = time.perf_counter()
            try:
                return inner(*args, **kwargs)
            finally:
                if label:
                    self.add(label, time.perf_counter() - t0)
                if around is not None:
                    around(False)

        setattr(obj, method, timed)


def build(spec: dict):
    import torch
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    threads = int(spec["threads"])
    if threads:
        torch.set_num_threads(threads)
        torch.set_num_interop_threads(threads)
    tok = AutoTokenizer.from_pretrained(spec["model_dir"])
    for row in spec["rows"]:  # the same prompt tokens as the project, or no comparison at all
        ids = tok.apply_chat_template(row["messages"], add_generation_prompt=True, tokenize=True)
        ids = ids["input_ids"] if isinstance(ids, dict) or hasattr(ids, "keys") else ids
        if list(ids) != list(row["prompt_ids"]):
            raise SystemExit(f"peer_trl_worker: prompt {row['messages']!r}: TRL's chat template "
                             f"gives {list(ids)}, the project {row['prompt_ids']}")  # fmt: skip
    model = AutoModelForCausalLM.from_pretrained(spec["model_dir"], dtype=torch.float32)
    data = Dataset.from_list([{"prompt": r["messages"], "gold": r["gold"]} for r in spec["rows"]])
    log = {"reward": [], "length": [], "min_length": []}
    values, max_chars = spec["reward_values"], int(spec["max_response_chars"])

    def reward(prompts, completions, completion_ids, gold, **_):
        texts = [c[-1]["content"] if isinstance(c, list) else c for c in completions]
        if spec["reward"] == "project":  # the project's own scorer, through the driver
            say({"score": {"texts": texts, "golds": list(gold)}})
            out = [float(r) for r in json.loads(sys.stdin.readline())]
        else:
            out = [synthetic_reward(t, g, values, max_chars) for t, g in zip(texts, gold)]
        log["reward"].append(sum(out) / len(out))
        log["length"].append(sum(map(len, completion_ids)) / len(completion_ids))
        log["min_length"].append(min(map(len, completion_ids)))
        return out

    reward.__name__ = "synthetic_verdict"
    args = GRPOConfig(output_dir=spec["out_dir"], **spec["trl_args"])
    phases = Phases()

    class Rounds(TrainerCallback):
        """Times each optimizer step, and pauses after each round of K RL steps for the driver."""

        def __init__(self):
            self.updates_per_step = int(args.steps_per_generation) * int(args.num_iterations)
            self.todo = 0
            self.steps: list[dict] = []

        def wait(self, control):
            line = sys.stdin.readline().split()
            if not line or line[0] == "stop":
                control.should_training_stop = True
                self.todo = 0
                return
            self.todo, self.steps = int(line[1]), []

        def on_train_begin(self, args_, state, control, **kw):
            say({"ready": True, "load": os.getloadavg()[0]})
            self.wait(control)

        def on_step_begin(self, args_, state, control, **kw):
            if state.global_step % self.updates_per_step == 0:
                phases.now = {}
                self.t_step = time.perf_counter()
            self.t_update = time.perf_counter()

        def on_step_end(self, args_, state, control, **kw):
            phases.add("optimizer_step_total", time.perf_counter() - self.t_update)
            if state.global_step % self.updates_per_step:
                return
            p = dict(phases.now)
            p["step"] = time.perf_counter() - self.t_step
            # The update is the optimizer steps' time less the generation batch's preparation
            # (which TRL runs inside the first optimizer step's training_step).
            p["update"] = p.pop("optimizer_step_total") - p.get("prepare", 0.0)
            p["reward"], p["length"] = log["reward"][-1], log["length"][-1]
            p["min_length"] = log["min_length"][-1]
            self.steps.append(p)
            self.todo -= 1
            if self.todo == 0:
                say({"steps": self.steps, "load": os.getloadavg()[0]})
                release_free_memory()
                self.wait(control)

    trainer = GRPOTrainer(
        model=model,
        reward_funcs=[reward],
        args=args,
        train_dataset=data,
        processing_class=tok,
        callbacks=[Rounds()],
    )
    if spec["force_length"]:
        # Every completion runs to max_completion_length, as the project's engine does with no
        # stop token: the end-of-turn token is an ordinary token (sampled, trained on).
        trainer.eos_token_ids = [-1]
        trainer.generation_config.eos_token_id = None
        trainer.generation_kwargs["eos_token_id"] = None
        model.generation_config.eos_token_id = None
    # Behaviour log-probs: the no-grad forward inside the generation batch's preparation; the
    # same method under grad is the update's forward.
    torch_grad = torch.is_grad_enabled
    phases.wrap(trainer, "_generate", "generate")
    phases.wrap(trainer, "_calculate_rewards", "score")
    phases.wrap(trainer, "_get_per_token_logps_and_entropies",
                lambda: "old_logprobs" if not torch_grad() else None)  # fmt: skip
    phases.wrap(trainer, "_generate_and_score_completions", "prepare")
    return trainer


def main() -> None:
    spec = json.loads(open(sys.argv[1]).read())
    trainer = build(spec)
    trainer.train()
    say({"done": True})


if __name__ == "__main__":
    main()
