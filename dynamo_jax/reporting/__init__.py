"""What a run writes for people to read (the step's metrics line it is written from is
loop/report.py's `step_metrics`).

- metrics.py: metrics.jsonl, TensorBoard and the progress bar (`MetricsWriter`, `read_metrics`);
- plots.py: PNG plots from a workdir's metrics.jsonl (`python -m dynamo_jax.reporting.plots`);
- summary.py: the end-of-run summary and the exit status it implies;
- runlog.py: the workdir's run.log, where library detail (orbax's tracebacks) goes.

Nothing is imported here, so importing one module does not load matplotlib for the others.
"""
