"""The training loop: the stages of one RL step, a module each, and the run around them.

In the order a step runs them (rl_step.py calls them so; docs/design.md#one-step-as-data):
- generate.py: request a batch (prompts, allocation n_i, temperature τ, seed) from the rollout
  engine, take it, score it, and DAPO's further rounds (dynamic_sampling.py), one stage
  (`generate.generate`);
- assemble.py: the scored completions → the fixed-shape `RolloutBatch` with advantages, each
  update's rows (`mini_batch_order`), and a set of its sequences laid into the rows of a row
  layout on the devices (`device_rows`), as the jitted functions take them;
- behaviour_pass.py: π_old (the behaviour policy's log-probs), the entropy and π_ref per token;
- rl_step.py: `rl_step` runs the stages above, then `update` (the optimizer steps) and `record`
  (allocator history, temperature scheduler), and returns a `StepOutcome`;
- report.py: the step's metrics line (`step_metrics`); timings.py: each stage's result carries
  its own timings (`Stopwatch`), which the step adds up (`add_timings`);
- build.py: `build_trainer`, everything built once from the config (`Trainer`);
- train.py: `run`, the steps with checkpoints, evaluation, the failure policy and the summary;
  `dry_run`, the sharding planner on this config.

The names keep apart what a newcomer could confuse: generate.py drives the engines of rollout/;
assemble.py builds the step's batch, where losses/batch.py holds the loss's per-token inputs and
data/packing.py the row layouts; behaviour_pass.py runs the forward, losses/logprobs.py has the
formulas; dynamic_sampling.py draws prompts again, rollout/sampling.py samples tokens.
"""
