"""Shared building blocks of the config files (not a runnable config itself).

Every section is built from its dataclass (`dynamo_jax/config.py`, `RunConfig`'s fields): all of
the dataclass's fields at the dataclass's defaults, then what the config file sets. The defaults
and the one-line meaning of each field live beside the field in its dataclass, nowhere else.
Config files call these builders and set what differs; `parse_arg` reads the
`file.py:key=value,key=value` argument.
"""

from __future__ import annotations

import dataclasses
import typing

import ml_collections as mlc
from ml_collections import config_dict

from dynamo_jax.config import SECTIONS, check_renamed, section_fields
from dynamo_jax.losses.config import LossConfig
from dynamo_jax.models.presets import get_preset


def parse_arg(arg: str | None, **defaults: str) -> dict[str, str]:
    """'baseline=grpo,ablation=no_gc' → {'baseline': 'grpo', 'ablation': 'no_gc'} over defaults."""
    out = dict(defaults)
    for part in filter(None, (arg or "").split(",")):
        key, sep, value = part.partition("=")
        if not sep or key not in defaults:
            raise ValueError(
                f"config argument {part!r}: expected key=value with key in {sorted(defaults)}"
            )
        out[key] = value
    return out


def _placeholder_type(hint) -> type:
    """`int | None` → int: the type a None default's placeholder accepts."""
    args = [a for a in typing.get_args(hint) if a is not type(None)]
    return args[0] if len(args) == 1 and isinstance(args[0], type) else object


def section(name: str, **values) -> mlc.ConfigDict:
    """The `name` section: every field of its dataclass at the dataclass default, then `values`.

    A None value becomes a typed placeholder, so a `--config.section.field=...` override can
    still set it. Unknown names fail here, as they would when the run config is built.
    """
    cls = SECTIONS[name]
    fields = section_fields(name)
    check_renamed(name, set(values) - set(fields))
    unknown = sorted(set(values) - set(fields))
    if unknown:
        raise ValueError(f"config.{name}: unknown field(s) {unknown} for {cls.__name__}")
    out = mlc.ConfigDict()
    for key, (default, hint) in fields.items():
        if key in values:
            value = values[key]
        elif default is not dataclasses.MISSING:
            value = default
        else:
            raise ValueError(f"config.{name}.{key} has no default: set it")
        if value is None:
            value = config_dict.placeholder(_placeholder_type(hint))
        elif isinstance(value, list):
            value = tuple(value)
        out[key] = value
    return out


def model(preset: str, **overrides) -> mlc.ConfigDict:
    """The model section: every `ModelConfig` field, from a named preset (models/presets.py)."""
    return section("model", **dataclasses.asdict(get_preset(preset, **overrides)))


def init(checkpoint: str = "", tokenizer: str = "") -> mlc.ConfigDict:
    return section("init", checkpoint=checkpoint, tokenizer=tokenizer)


def rollout(engine: str, max_new_tokens: int, **fields) -> mlc.ConfigDict:
    return section("rollout", engine=engine, max_new_tokens=max_new_tokens, **fields)


def jax_engine(max_batch: int = 256, **fields) -> mlc.ConfigDict:
    return section("jax_engine", max_batch=max_batch, **fields)


def allocation(policy: str, n_avg: int, g_min: int, g_max: int, **fields) -> mlc.ConfigDict:
    return section("allocation", policy=policy, n_avg=n_avg, g_min=g_min, g_max=g_max, **fields)


def temperature(mode: str = "fixed", initial: float = 1.0, **fields) -> mlc.ConfigDict:
    return section("temperature", mode=mode, initial=initial, **fields)


def loss(variant: str = "dynamo", **overrides) -> mlc.ConfigDict:
    """The loss section for a loss variant (DynaMO, GRPO or a Table-1 baseline), at its published
    defaults."""
    return section("loss", **LossConfig.preset(variant, **overrides).flat())


def mesh(shape=(1, -1, 1), **fields) -> mlc.ConfigDict:
    return section("mesh", shape=tuple(shape), **fields)


def optim(learning_rate: float, **fields) -> mlc.ConfigDict:
    return section("optim", learning_rate=learning_rate, **fields)


def train(steps: int, prompts_per_step: int, mini_batch_size: int, **fields) -> mlc.ConfigDict:
    return section(
        "train",
        steps=steps,
        prompts_per_step=prompts_per_step,
        mini_batch_size=mini_batch_size,
        **fields,
    )


def checkpoint(every_steps: int, **fields) -> mlc.ConfigDict:
    return section("checkpoint", every_steps=every_steps, **fields)


def evaluation(every_steps: int, n_samples: int, ks=(1,), **fields) -> mlc.ConfigDict:
    return section("eval", every_steps=every_steps, n_samples=n_samples, ks=tuple(ks), **fields)


def logging(**fields) -> mlc.ConfigDict:
    return section("logging", **fields)


def dry_run(**fields) -> mlc.ConfigDict:
    return section("dry_run", **fields)


def data_synthetic(max_prompt_tokens: int = 16, **fields) -> mlc.ConfigDict:
    # The synthetic tokenizer's tiny vocabulary has no words for a system prompt.
    return section(
        "data", task="synthetic", system_prompt="", max_prompt_tokens=max_prompt_tokens, **fields
    )


def data_math(paths, eval_paths=(), **fields) -> mlc.ConfigDict:
    return section("data", task="math", paths=tuple(paths), eval_paths=tuple(eval_paths), **fields)


def reward(**fields) -> mlc.ConfigDict:
    return section("reward", **fields)


# ----------------------------------------------------------------------------- the recipes


def check_choice(where: str, key: str, value: str, options) -> None:
    """A config argument's value is one of `options` (ValueError naming the file and the key)."""
    if value not in options:
        raise ValueError(f"{where}: {key} must be one of {options}, got {value!r}")


# The recipes a small config compares at equal rollout budget (configs/tiny.py says what each
# is); `method_sections` gives each one's allocation, temperature and loss.
METHODS = (
    "dynamo",
    "grpo",
    "e3",
    "dynamo_no_dra",
    "dynamo_no_modulation",
    "dynamo_as_run",
    "dynamo_posterior",
    "dynamo_std",
    "dynamo_entropy",
    "dynamo_posterior_std",
    "grpo_dynamic_sampling",
)
# DynaMO allocation options (docs/algorithm.md#allocation-variants) by method; all else is the
# `dynamo` method's
VARIANTS = {
    "dynamo_posterior": {"priority": "posterior"},
    "dynamo_std": {"allocate_by": "std"},
    "dynamo_entropy": {"entropy_factor": True},
    "dynamo_posterior_std": {"priority": "posterior", "allocate_by": "std"},
}
# The methods with the plain clipped surrogate; every other DynaMO method has GC/UMS modulation.
PLAIN_LOSS = ("grpo", "e3", "dynamo_no_modulation", "grpo_dynamic_sampling")


def method_sections(
    method: str,
    *,
    n_avg: int,
    g_min: int,
    g_max: int,
    fixed_temperature: float = 1.0,
) -> dict[str, mlc.ConfigDict]:
    """The `allocation`, `temperature` and `loss` sections of `method` (one of METHODS): n_avg
    rollouts per prompt on average, within [g_min, g_max] where the method allocates freely;
    E3's scheduler anneals its entropy target over the run (its |V| and length are derived from
    `model.vocab_size` and `train.steps`); every other method samples at `fixed_temperature`."""
    # decay 0.8 (DynaMO only): the history forgets old counts, so P_i follows a policy that
    # changes within a few steps at small scale; with the paper's 1.0 early failures of
    # now-solved prompts keep their priority up and a tiny run can settle on one answer for
    # every prompt.
    dynamo = allocation("dynamo", n_avg=n_avg, g_min=g_min, g_max=g_max, decay=0.8)
    uniform = allocation("uniform", n_avg=n_avg, g_min=g_min, g_max=g_max)
    # [n/2, 3n/2] around n: E3's bounds (its curriculum widens [G, G] by 2 per pass over the
    # data, so a small dataset reaches them within a few steps), and the authors' DynaMO script's
    # band (theirs: [8, 24] around 16), so its exploration target b = max(n_low, 4) is n_low as
    # in their run; cumulative counts (no decay).
    low, high = n_avg // 2, 3 * n_avg // 2
    by_method = {
        "dynamo": dynamo,
        "grpo": uniform,
        "e3": allocation("e3", n_avg=n_avg, g_min=low, g_max=high),
        "dynamo_no_dra": uniform,
        "dynamo_no_modulation": dynamo,
        "dynamo_as_run": allocation("dynamo_as_run", n_avg=n_avg, g_min=low, g_max=high),
        **{
            m: allocation("dynamo", n_avg=n_avg, g_min=g_min, g_max=g_max, decay=0.8, **options)
            for m, options in VARIANTS.items()
        },
        "grpo_dynamic_sampling": uniform,
    }
    if method == "e3":
        tau = temperature("e3", 1.0, anneal=True)
    else:
        tau = temperature("fixed", fixed_temperature)
    return {
        "allocation": by_method[method],
        "temperature": tau,
        "loss": loss("grpo" if method in PLAIN_LOSS else "dynamo"),
    }
