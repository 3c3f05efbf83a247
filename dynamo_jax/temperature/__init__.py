"""The sampling temperature τ of each step: fixed, or E3's entropy-holding scheduler (Eq. 4 + 5).

registry.py holds the table of schedules (`TemperatureSchedule`), config.py `TemperatureConfig`
(the `temperature` section), scheduler.py the built-in schedules and the `TemperatureScheduler`
the loop asks for τ and feeds each batch's mean token entropy.
"""

from dynamo_jax.temperature.config import TemperatureConfig
from dynamo_jax.temperature.scheduler import TemperatureScheduler

__all__ = ["TemperatureConfig", "TemperatureScheduler"]
