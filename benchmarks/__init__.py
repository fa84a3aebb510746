"""Benchmarks: measurements, not tests (this machine is shared and noisy)."""
