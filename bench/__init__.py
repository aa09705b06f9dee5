"""Benchmarks (print figures; never assert anything about speed)."""
