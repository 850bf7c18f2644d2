"""Benchmarks: `tide bench` (docs/benchmarks.md)."""
