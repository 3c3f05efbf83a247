"""The training loop: the stages of one RL step, and the run around them (docs/design.md)."""
