"""Benchmarks; see README.md. Run from the repository root: ``python bench/bench_claims.py``."""
