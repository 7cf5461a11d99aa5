"""The executor a run config names, with the run-level ``backend`` carried into it.

``backend: cpu`` (or ``cuda``) at the top of a run config means the same to every command:
the jobs run on that backend. :func:`executor_spec` turns the ``executor:`` section into the
spec of an executor that does:

* an executor whose options have a ``backend`` field (``ray``) gets the run's backend where
  its options leave theirs at the default; one set to the other backend is a one-line error;
* ``local`` (the GPU pool) under ``backend: cpu`` becomes ``cpu``, keeping the options the CPU
  pool shares with it (a GPU list does not carry over);
* any other executor that declares a backend (``backend = "cpu"`` on its class) other than the
  run's is a one-line error naming both.

``backend: auto`` changes nothing: the executor runs where its own options say.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from cuda_agent.core.errors import ConfigError

BACKENDS = ("cuda", "cpu")


def _plain(node: Any) -> Any:
    try:
        from omegaconf import DictConfig, ListConfig, OmegaConf

        if isinstance(node, (DictConfig, ListConfig)):
            return OmegaConf.to_container(node, resolve=True)
    except ImportError:  # pragma: no cover
        pass
    return node


def _defaults(options_cls: Any) -> dict[str, Any]:
    out: dict[str, Any] = {}
    if options_cls is None or not dataclasses.is_dataclass(options_cls):
        return out
    for f in dataclasses.fields(options_cls):
        if f.default is not dataclasses.MISSING:
            out[f.name] = f.default
        elif f.default_factory is not dataclasses.MISSING:  # type: ignore[misc]
            out[f.name] = f.default_factory()  # type: ignore[misc]
    return out


def _declared_backend(cls: Any) -> str | None:
    """The backend an executor class declares (``backend = "cpu"``), None when only the
    interface's default stands."""
    for c in cls.__mro__:
        if c.__module__.startswith("cuda_agent.core"):
            return None
        value = c.__dict__.get("backend")
        if isinstance(value, str):
            return value
    return None


def executor_spec(spec: Any, backend: Any, pm: Any = None, where: str = "executor") -> dict[str, Any]:
    """``{name, options}`` of the executor ``spec`` names, made to run on ``backend``
    (``auto``, ``cuda`` or ``cpu``; see the module's docstring)."""
    from cuda_agent.core.plugins import get_plugin_manager

    spec = _plain(spec)
    if isinstance(spec, str):
        spec = {"name": spec}
    if not isinstance(spec, dict) or not spec.get("name"):
        raise ConfigError(f"{where} must name an executor ({where}.name=local, cpu, ray ...), got {spec!r}")
    spec = {"name": str(spec["name"]), "options": dict(spec.get("options") or {})}
    backend = str(backend or "auto")
    if backend == "auto":
        return spec
    if backend not in BACKENDS:
        raise ConfigError(f"backend must be auto, cuda or cpu, got {backend!r}")
    pm = pm or get_plugin_manager()
    cls = pm.get("executor", spec["name"], where)
    options_cls = getattr(cls, "Options", None)
    defaults = _defaults(options_cls)
    if "backend" in defaults:  # the executor takes its backend as an option
        own = spec["options"].get("backend", defaults["backend"])
        if own != backend and own != defaults["backend"]:
            raise ConfigError(f"backend={backend} but {where}.options.backend={own}: they disagree; "
                              f"set one of them (or both to the same)")
        spec["options"]["backend"] = backend
        return spec
    own = _declared_backend(cls)
    if own is None or own == backend:  # an executor that does not say where it runs is taken at its word
        return spec
    if spec["name"] == "local" and backend == "cpu":
        cpu = pm.get("executor", "cpu", where)
        shared = _defaults(getattr(cpu, "Options", None))
        kept = {k: v for k, v in spec["options"].items()
                if k in shared and k != "devices" and (k not in defaults or v != defaults[k])}
        return {"name": "cpu", "options": kept}
    raise ConfigError(f"backend={backend} but {where}.name={spec['name']} runs jobs on {own}; "
                      f"choose an executor for {backend} (for example {where}.name="
                      f"{'cpu' if backend == 'cpu' else 'local'}) or backend={own}")


def make_executor(cfg: Any, pm: Any = None, where: str = "executor") -> Any:
    """The executor of a run config (its ``executor:`` section on its ``backend``), not started."""
    from cuda_agent.core.plugins import get_plugin_manager

    pm = pm or get_plugin_manager()
    spec = executor_spec(cfg.get("executor"), cfg.get("backend", "auto"), pm, where)
    return pm.create("executor", spec, where=where)
