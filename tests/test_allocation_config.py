"""AllocationConfig validation: each bad field is rejected by name; a policy owns its keys."""

import pytest

from dynamo_jax.allocation import AllocationConfig


def test_defaults_are_valid():
    AllocationConfig()
    AllocationConfig(policy="dynamo_as_run", n_avg=16, g_min=8, g_max=24)
    AllocationConfig(
        policy="dynamo", allocate_by="std", priority="posterior", prior_a=0.5, entropy_factor=True
    )


@pytest.mark.parametrize(
    "kwargs, field",
    [
        ({"policy": "dynamic"}, "policy"),
        ({"g_min": 0, "n_avg": 1}, "g_min"),
        ({"g_min": 4, "n_avg": 3}, "n_avg"),
        ({"n_avg": 9, "g_max": 8}, "n_avg"),
        ({"n_avg": 8.0}, "n_avg"),
        ({"policy": "dynamo", "min_history": 1}, "min_history"),
        ({"decay": 0.0}, "decay"),
        ({"decay": 1.5}, "decay"),
        ({"policy": "e3", "e3_curriculum_step": 0}, "e3_curriculum_step"),
        ({"policy": "dynamo_released", "released_priority_floor": 0.0}, "released_priority_floor"),
        ({"policy": "dynamo_released", "released_mastered_acc": 1.2}, "released_mastered_acc"),
        (
            {"policy": "dynamo_released", "released_explore_rollouts": 0},
            "released_explore_rollouts",
        ),
        ({"policy": "dynamo_released", "released_explore_below": 2.5}, "released_explore_below"),
        ({"policy": "dynamo", "allocate_by": "sigma"}, "allocate_by"),
        ({"policy": "dynamo", "priority": "bayes"}, "priority"),
        ({"policy": "dynamo", "prior_a": 0.0}, "prior_a"),
        ({"policy": "dynamo", "prior_b": float("inf")}, "prior_b"),
        ({"policy": "dynamo", "prior_b": True}, "prior_b"),
        ({"policy": "dynamo", "entropy_factor": 1}, "entropy_factor"),
        # the options of docs/algorithm.md#allocation-variants belong to "dynamo": elsewhere they would be silently ignored
        ({"policy": "uniform", "allocate_by": "std"}, "allocate_by"),
        ({"policy": "dynamo_as_run", "priority": "posterior"}, "priority"),
        ({"policy": "e3", "entropy_factor": True}, "entropy_factor"),
        # a policy's own key, set under another policy (it would be silently ignored)
        ({"min_history": 3}, "min_history: a setting of allocation policy 'dynamo' only"),
        ({"policy": "dynamo_as_run", "released_mastered_acc": 0.9}, "released_mastered_acc"),
        ({"policy": "dynamo_as_run", "as_run_priority_floor": 0.0}, "as_run_priority_floor"),
        ({"policy": "dynamo_as_run", "as_run_mastered_acc": 1.2}, "as_run_mastered_acc"),
        ({"policy": "dynamo_as_run", "as_run_explore_to": -1}, "as_run_explore_to"),
        ({"policy": "dynamo_as_run", "as_run_min_history": 1}, "as_run_min_history"),
        ({"policy": "dynamo_as_run", "as_run_tie_break": -1e-6}, "as_run_tie_break"),
        ({"policy": "dynamo_as_run", "as_run_tie_break": float("nan")}, "as_run_tie_break"),
        # the authors' counts are cumulative over the run
        ({"policy": "dynamo_as_run", "decay": 0.9}, "decay"),
    ],
)
def test_allocation_config_rejects(kwargs, field):
    with pytest.raises(ValueError, match=f"AllocationConfig.{field}"):  # noqa: RUF043
        AllocationConfig(**kwargs)


def test_g_min_two_needed_with_std_normalisation():
    cfg = AllocationConfig(g_min=1, n_avg=4, g_max=8)
    cfg.validate_against(norm_adv_by_std=False)  # Dr.GRPO: a group of one is fine
    with pytest.raises(ValueError, match="AllocationConfig.g_min.*norm_adv_by_std"):
        cfg.validate_against(norm_adv_by_std=True)
    AllocationConfig(g_min=2, n_avg=4, g_max=8).validate_against(norm_adv_by_std=True)


def test_one_record_per_policy_and_every_key_belongs_to_one():
    """The policies are listed once (allocation/registry.py); each policy's settings record is
    built from AllocationConfig's flat keys, and every key is shared or one policy's own."""
    import dataclasses

    from dynamo_jax.allocation import registry, settings
    from dynamo_jax.config import section_fields

    keys = set(section_fields("allocation"))
    owned: list[str] = []
    for policy in registry.POLICIES.specs():
        record = policy.settings
        assert issubclass(record, settings.PolicySettings) and record.__dataclass_params__.frozen
        owned += [f.name for f in dataclasses.fields(record)]
        cfg = AllocationConfig(policy=policy.name)
        assert type(cfg.settings) is record
        assert type(policy.allocator(cfg)).__name__.endswith("Allocator")
    assert len(owned) == len(set(owned)) and set(owned) <= keys  # each key has one owner
    assert keys - set(owned) == {"policy", "n_avg", "g_min", "g_max", "decay"}
    got = AllocationConfig(policy="dynamo_as_run", as_run_tie_break=0.5, as_run_mastered_acc=0.9)
    assert (got.settings.as_run_tie_break, got.settings.as_run_mastered_acc) == (0.5, 0.9)
    with pytest.raises(ValueError, match="unknown allocation policy 'x'"):
        registry.get("x")
