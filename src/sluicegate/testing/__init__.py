"""Helpers for tests and benchmarks: the reference app served over a real socket."""
