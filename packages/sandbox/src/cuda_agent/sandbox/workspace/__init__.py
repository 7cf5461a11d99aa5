"""The agent's side: its workspace and everything that serves it.

* :mod:`.workspace` -- the workspace folder (template, read-only files, snapshots, history);
* :mod:`.service` -- the service the tool scripts talk to (compile, verify, profile): what
  each request does (its steps through :class:`..judge.pipeline.Judge`); its options in
  :mod:`.service_options`, its socket in :mod:`.unix_server`, the text the agent reads back in
  :mod:`.agent_text`;
* :mod:`.environment` -- ``CudaEnvironment``, the agent loop's environment for CUDA tasks;
* :mod:`.episodes` -- episodes for trainers outside cuda-agent (TRL, OpenEnv, verl adapters);
* :mod:`.optimize` -- ``cuda-agent optimize`` and ``cuda-agent demo``;
* :mod:`.solution` -- a run's ``best/`` as a folder that stands on its own, and
  ``cuda-agent verify`` / ``cuda-agent profile``, which re-check one with no service running;
* :mod:`.modelcheck` -- a task's ``model.py`` run once, without rights, before an episode;
* :mod:`.runtime_loader` -- copied into every workspace as ``cuda_agent_runtime.py``.

May import: ``cuda_agent.core`` and every other system of the sandbox package (the top).
Concrete plugins (compilers, sandboxes, executors, rewards) are reached through the plugin
manager by the names a config gives.
"""

from __future__ import annotations

from typing import Any

SUBMODULES = ("workspace", "service", "service_options", "unix_server", "agent_text", "solution",
              "environment", "episodes", "optimize", "modelcheck", "runtime_loader")


def __getattr__(name: str) -> Any:
    """``from cuda_agent.sandbox.workspace import Workspace`` as before the package had
    subpackages: the public names of :mod:`.workspace` are this package's too."""
    if name.startswith("_") or name in SUBMODULES:
        raise AttributeError(name)
    import importlib

    try:
        return getattr(importlib.import_module(".workspace", __name__), name)
    except AttributeError:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}") from None
