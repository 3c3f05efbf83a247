"""Benchmarks, run from the repository root as `python -m benchmarks.<script>` (README.md)."""
