"""The training loop's stages for one fixed policy, as benchmarks/gradient_variance.py runs them:
sample → score → build_batch → old_logprobs → one update whose optimizer captures the gradient
(`capture_gradient`: zero updates, the incoming gradient kept as its state)."""

from __future__ import annotations

import dataclasses
import time
from types import SimpleNamespace

import numpy as np

ENGINE_BATCH = 1024  # rows per sampler program: the draws are pooled into few engine calls


def capture_gradient():
    """An optax transformation that applies no update and keeps the incoming gradient as its
    state: the train step's state then holds exactly the gradient it computed."""
    import jax
    import jax.numpy as jnp
    import optax

    def init(params):
        return jax.tree.map(jnp.zeros_like, params)

    def update(grads, state, params=None):
        del state, params
        return jax.tree.map(jnp.zeros_like, grads), grads

    return optax.GradientTransformation(init, update)


def sized_config(cfg, prompts: int, n_avg: int):
    """`cfg` with a batch of `prompts` prompts x `n_avg` rollouts taken as one mini-batch."""
    from dynamo_jax.allocation import AllocationConfig

    train_cfg = dataclasses.replace(
        cfg.train, prompts_per_step=prompts, mini_batch_size=prompts * n_avg, ppo_epochs=1
    )
    alloc = AllocationConfig(policy="uniform", n_avg=n_avg, g_min=2, g_max=max(n_avg, 2))
    return dataclasses.replace(cfg, train=train_cfg, allocation=alloc)


@dataclasses.dataclass
class _Shape:
    cfg: object  # RunConfig sized to the batch
    logprob: object
    step: object = None  # TrainStep, built on first use
    state: object = None  # its TrainState (donated and replaced at every call)


class Pipeline:
    """The training loop's stages for one fixed policy: sample → score → build_batch →
    old_logprobs → one update whose optimizer captures the gradient."""

    def __init__(self, cfg, params, workdir: str, engine_batch: int = ENGINE_BATCH):
        """`engine_batch`: the sampler's rows per program (a real model keeps its config's
        jax_engine.max_batch: its KV cache grows with it)."""
        import jax

        from dynamo_jax import tasks
        from dynamo_jax.engine_factory import build_engine
        from dynamo_jax.sharding.mesh import build_mesh
        from dynamo_jax.step.forward import model_param_shardings
        from dynamo_jax.temperature import TemperatureScheduler

        self.cfg = cfg
        self.mesh = build_mesh(cfg.mesh, jax.devices()[:1])
        self.task = tasks.build_task(cfg)
        self.temperature = TemperatureScheduler(cfg.temperature).current()
        shardings = model_param_shardings(cfg.model, self.mesh, cfg.mesh.rules)
        self.params = jax.device_put(params, shardings)
        engine_cfg = dataclasses.replace(
            cfg, jax_engine=dataclasses.replace(cfg.jax_engine, max_batch=engine_batch)
        )
        self.engine = build_engine(engine_cfg, self.params, self.mesh, shardings, workdir)
        self._shardings = shardings
        self._shapes: dict[tuple[int, int], _Shape] = {}
        self._version = 0
        self.clock = GradientClock()

    def set_config(self, cfg) -> None:
        """Measure under another RunConfig of the same model and task (the loss, the update's
        layout): the compiled steps are dropped."""
        self.cfg = cfg
        self._shapes.clear()

    def set_params(self, params) -> None:
        """Measure another policy with the functions already compiled."""
        import jax

        from dynamo_jax.step.state import train_state_from_params

        self.params = jax.device_put(params, self._shardings)
        self._version += 1
        self.engine.update_weights(self.params, self._version)
        for shape in self._shapes.values():
            if shape.step is not None:
                shape.state = train_state_from_params(
                    self.params, capture_gradient(), shape.step.state_shardings
                )

    def close(self) -> None:
        self.engine.close()
        self.task.close()

    def sample(self, rows: np.ndarray, n: np.ndarray, seed: int) -> dict[int, list]:
        """n[i] completions of dataset row rows[i], by row."""
        from dynamo_jax.rollout.protocol import Request, SamplingParams

        task = self.task
        requests = [
            Request(int(task.prompt_ids[r]), task.prompt_tokens[r], int(k))
            for r, k in zip(rows, n)
            if k > 0
        ]
        sampling = SamplingParams(
            max_new_tokens=self.cfg.rollout.max_new_tokens,
            temperature=self.temperature,
            top_p=self.cfg.rollout.top_p,
            top_k=self.cfg.rollout.top_k,
            stop_token_ids=task.stop_token_ids,
            seed=seed,
        )
        t0 = time.perf_counter()
        completions = self.engine.generate(requests, sampling)
        self.clock.sampled(time.perf_counter() - t0)
        by_id: dict[int, list] = {}
        for c in completions:
            by_id.setdefault(c.prompt_id, []).append(c)
        return {int(r): by_id.get(int(task.prompt_ids[r]), []) for r in rows}

    def _shape(self, prompts: int, n_avg: int, with_step: bool) -> _Shape:
        from dynamo_jax.step.forward import make_logprob_fn
        from dynamo_jax.step.state import train_state_from_params
        from dynamo_jax.step.train_step import make_train_step

        key = (prompts, n_avg)
        if key not in self._shapes:
            cfg = sized_config(self.cfg, prompts, n_avg)
            logprob_layout = self._layouts(cfg).logprob_pass
            logprob = make_logprob_fn(cfg.model, self.mesh, cfg.mesh.rules, logprob_layout)
            self._shapes[key] = _Shape(cfg, logprob)
        shape = self._shapes[key]
        if with_step and shape.step is None:
            optimizer = capture_gradient()
            cfg = shape.cfg
            train_layout = self._layouts(cfg).update
            shape.step = make_train_step(
                cfg.model,
                cfg.loss,
                optimizer,
                self.mesh,
                cfg.mesh.rules,
                batch_size=train_layout.max_rows,
                micro_batches=train_layout.max_micro_batches,
                seed=cfg.train.seed,
                shared_prompts=train_layout.shared_prompts,
                is_weights=cfg.train.rollout_correction.weights,
            )
            shape.state = train_state_from_params(
                self.params, optimizer, shape.step.state_shardings
            )
        return shape

    def _layouts(self, cfg):
        """The row layouts build.build_trainer gives this config (assemble.StepLayouts)."""
        from dynamo_jax.loop.assemble import step_layouts
        from dynamo_jax.sharding.rules import row_shards

        return step_layouts(cfg, row_shards(self.mesh.shape, cfg.mesh.rules))

    def batch(
        self, completions: list, prompts: int, n_avg: int, with_step: bool = False, stats=True
    ):
        """(shape, the scored RolloutBatch with old log-probs and entropy, its group stats).

        Without `stats`, where the config's one update is on-policy
        (RunConfig.first_update_on_policy: its loss takes stop_gradient of its own forward), the
        log-prob pass is left out as the training loop leaves it out: old log-probs and entropy
        are NaN placeholders the update never reads, and the gradient is the same."""
        from dynamo_jax import tasks
        from dynamo_jax.loop import assemble, behaviour_pass

        shape = self._shape(prompts, n_avg, with_step)
        rewards = np.zeros(shape.cfg.budget, np.float32)
        rewards[: len(completions)], _ = tasks.score_completions(self.task, completions)
        batch = assemble.build_batch(shape.cfg, self.task, completions, self.temperature, rewards)
        if stats or not (with_step and shape.cfg.first_update_on_policy):
            logprob = shape.logprob
            rows = assemble.device_rows(
                batch, np.arange(batch.rows), logprob.layout, logprob.batch_shardings
            )
            batch = behaviour_pass.old_logprobs(batch, rows, logprob, self.params, None)
        else:
            unknown = np.full_like(batch.loss_mask, np.nan)
            batch = dataclasses.replace(batch, old_logp=unknown, entropy=unknown)
        groups = assemble.group_stats(
            batch.prompt_id, batch.rewards, batch.valid, batch.entropy, batch.loss_mask
        )
        return shape, batch, groups

    def gradient(
        self, completions: list, prompts: int, n_avg: int, stats: bool = True
    ) -> tuple[np.ndarray, dict]:
        """The training loss's gradient on these completions (float64, flattened), and the
        batch's group stats (their entropy NaN without `stats`: `batch`)."""
        import jax
        from jax.flatten_util import ravel_pytree

        from dynamo_jax.loop import assemble, rl_step

        t0 = time.perf_counter()
        shape, batch, groups = self.batch(completions, prompts, n_avg, True, stats)
        # update() reads these of the Trainer (loop/build.py); a full one would build an engine
        trainer = SimpleNamespace(
            cfg=shape.cfg,
            layouts=self._layouts(shape.cfg),
            train_step=shape.step,
            state=shape.state,
            consecutive_nonfinite=0,
        )
        order = assemble.mini_batch_order(shape.cfg, 0, batch.rows)
        state, result = rl_step.update(trainer, batch, order)
        shape.state = state
        if any(result.skipped):
            raise FloatingPointError("non-finite loss or gradient in a measured batch")
        flat, _ = ravel_pytree(jax.device_get(state.opt_state))
        self.clock.tick((prompts, n_avg), len(completions), time.perf_counter() - t0)
        return np.asarray(flat, np.float64), groups

    def by_row(self, groups: dict, rows: np.ndarray, field: str) -> np.ndarray:
        """A group-stats field (groups are sorted by prompt id) in the order of `rows`."""
        position = {int(i): k for k, i in enumerate(groups["prompt_id"])}
        return np.asarray([groups[field][position[int(self.task.prompt_ids[r])]] for r in rows])


class GradientClock:
    """What the measured gradients cost: per gradient its batch shape (prompts, rollouts per
    prompt), completions and seconds (scoring, the log-prob pass, the update), and the seconds
    spent sampling. The first gradient of each shape compiles its programs, so the rates leave
    those out."""

    def __init__(self):
        self.shapes: list[tuple[int, int]] = []
        self.rows: list[int] = []
        self.seconds: list[float] = []
        self.compiled: list[bool] = []  # the first gradient of its shape
        self.sampling = 0.0

    def tick(self, shape: tuple[int, int], rows: int, seconds: float) -> None:
        self.compiled.append(shape not in self.shapes)
        self.shapes.append(shape)
        self.rows.append(rows)
        self.seconds.append(seconds)

    def sampled(self, seconds: float) -> None:
        self.sampling += seconds

    def _timed(self) -> list[tuple[tuple[int, int], int, float]]:
        columns = zip(self.shapes, self.rows, self.seconds, self.compiled)
        return [(shape, rows, s) for shape, rows, s, compiled in columns if not compiled]

    def seconds_per_row(self) -> float:
        """Seconds per completion over the gradients that compiled nothing (NaN before one)."""
        timed = self._timed()
        rows = sum(r for _, r, _ in timed)
        return sum(s for _, _, s in timed) / rows if rows else float("nan")

    def seconds_per_gradient(self, shape: tuple[int, int]) -> float:
        """Mean seconds of a gradient of `shape` that compiled nothing (NaN before one)."""
        times = [s for sh, _, s in self._timed() if sh == shape]
        return sum(times) / len(times) if times else float("nan")

    def sampling_per_row(self) -> float:
        """Sampling seconds per completion a gradient was taken of (0 before any)."""
        return self.sampling / sum(self.rows) if self.rows else 0.0
