"""Imported by the reward pool's forkserver only: load and warm the parsers before any fork.

Every worker forked afterwards shares these pages copy-on-write and starts warm, so replacing a
killed worker costs milliseconds instead of the ~1 s import plus first-parse costs.
"""

from dynamo_jax.rewards.worker import warm_up

warm_up()
