"""tasks.build_task: the training pool `data.max_train_problems` keeps."""

import pytest

from configs import math_tiny
from dynamo_jax import tasks
from dynamo_jax.config import from_config_dict


def _task(**data_fields):
    config = math_tiny.get_config()
    config.data.update(data_fields)
    return tasks.build_task(from_config_dict(config))


def test_max_train_problems_keeps_the_first_rows_in_file_order():
    everything = _task()
    first_five = _task(max_train_problems=5)
    try:
        assert everything.num_prompts > 5
        assert first_five.num_prompts == 5
        assert first_five.answers == everything.answers[:5]
        assert list(first_five.prompt_ids) == list(everything.prompt_ids[:5])
        # the held-out problems are not touched
        assert first_five.eval_rows == everything.eval_rows
    finally:
        everything.close()
        first_five.close()


def test_max_train_problems_must_be_non_negative():
    config = math_tiny.get_config()
    config.data.max_train_problems = -1
    with pytest.raises(ValueError, match="max_train_problems"):
        from_config_dict(config)
