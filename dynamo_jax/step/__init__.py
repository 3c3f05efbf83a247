"""The jitted train step, the log-prob function and the train state (built from losses + models).

How the training loop uses this package (every process runs the same code):

    state = init_train_state(model_cfg, optimizer, mesh, rules, rng)             # state.py
    #   or train_state_from_params(imported_params, optimizer, state_shardings)
    step = make_train_step(model_cfg, loss_cfg, optimizer, mesh, rules,
                           batch_size=B, micro_batches=M, seed=seed)              # train_step.py
    state, metrics = step.fn(state, batch)       # ONE jax.jit, state donated; metrics on device
    logprob = make_logprob_fn(model_cfg, mesh, rules, layout)                    # forward.py
    logp, entropy = logprob.fn(params, batch)    # old/reference log π at the batch temperature

Batch layout (rows of token slots holding one sequence or several packed ones, per-token arrays
indexed by the token they score): see `forward.py`; `layout` is a `data.packing.RowLayout`.
The optimizer (AdamW with warm-up, global-norm clip) is `optimizer.make_optimizer`.
"""
