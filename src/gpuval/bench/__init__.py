"""Benchmarks: one module each, each registering itself with one `register(...)` call at its end."""

from gpuval.bench.registry import (
    Benchmark,
    BenchmarkSkipped,
    Context,
    all_benchmarks,
    get,
    load_all,
    register,
)

__all__ = ["Benchmark", "BenchmarkSkipped", "Context", "all_benchmarks", "get", "load_all", "register"]
