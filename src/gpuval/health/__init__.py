"""Health checks: one module per family, each registering itself with one `register(...)` call."""

from gpuval.health.registry import HealthCheck, HealthContext, all_checks, register, run_health

__all__ = ["HealthCheck", "HealthContext", "all_checks", "register", "run_health"]
