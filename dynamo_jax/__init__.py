"""dynamo_jax: RLVR for LLMs in JAX/Flax with DynaMO and E3 on top of GRPO."""

__version__ = "0.1.0"
