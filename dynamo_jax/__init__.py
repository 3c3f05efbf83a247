"""dynamo_jax: RLVR for LLMs in JAX/Flax with DynaMO and E3 on top of GRPO.

Array names carry their shape as a suffix (`logits_BxLxV`, `rewards_B`); the letters, one
meaning each, are defined once, in docs/design.md#shape-letters.
"""

__version__ = "0.1.0"
