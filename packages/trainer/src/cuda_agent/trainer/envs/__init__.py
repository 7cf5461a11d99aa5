"""Environments the trainer can roll out in, by name (``trainer.environment``)."""

from __future__ import annotations

from typing import Any, Callable

from cuda_agent.core.errors import ConfigError, did_you_mean


def _toy(options: dict) -> Any:
    from .toy import ToyEnvironmentFactory

    return ToyEnvironmentFactory(**options)


def _cuda(options: dict) -> Any:
    try:
        from cuda_agent.sandbox.environment import CudaEnvironment  # noqa: F401
    except ImportError as exc:
        raise ConfigError("environment cuda needs cuda_agent.sandbox.environment.CudaEnvironment "
                          f"(install cuda-agent-sandbox): {exc}")
    from .cuda import CudaEnvironmentFactory

    return CudaEnvironmentFactory(**options)


ENVIRONMENTS: dict[str, Callable[[dict], Any]] = {"toy": _toy, "cuda": _cuda}


def make_environment_factory(spec: dict) -> Any:
    """``{name, options}`` -> an object with ``tasks(n, rng)`` (optional), ``make(task, dest)`` and ``close()``."""
    name = spec.get("name")
    if name not in ENVIRONMENTS:
        raise ConfigError(f"unknown trainer.environment {name!r}; {did_you_mean(str(name), ENVIRONMENTS)}")
    return ENVIRONMENTS[name](dict(spec.get("options") or {}))
