"""Benchmarks: `python -m bench --config FILE` runs them all (`make bench`)."""
