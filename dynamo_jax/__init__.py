"""dynamo_jax: RLVR for LLMs in JAX/Flax with DynaMO and E3 on top of GRPO.

Shape letters, one legend for the whole package. Array names carry their shape as a suffix
(`logits_BxLxV`, `rewards_B`); the same letter means the same dimension everywhere:

    B  rows of a batch: sequences (completions) of a rollout or training batch, engine rows
    L  tokens per row (training batch: max prompt + max new tokens)
    N  tokens flattened over rows (B·L), or the scored tokens of the vocabulary pass
    Np N padded to a whole number of token blocks; b tokens of one block
    M  micro-batches of an optimizer mini-batch
    D  hidden size;   F  MLP width;   V  vocabulary;   Vt  one vocabulary tile
    H  query heads;   K  key/value heads;   Q = H / K query heads per kv head;   E  head dim
    S  key slots of a KV cache
    P  padded prompt length;   T  generated-token bucket;   U  distinct prompts (the rollout engine)
    J  blocks and C entries per block of a two-level scan;   Y  stop-id slots

Algorithm symbols that are not shapes keep their papers' names in prose (G_i rollouts of prompt
i, K_t the concentration term of docs/algorithm.md#update-magnitude-stabilisation, n_i the allocation).
"""

__version__ = "0.1.0"
