"""cuda-agent sandbox: the systems that build, run and judge an agent's CUDA code.

One subpackage per system; imports point only down this list (and into ``cuda_agent.core``):

* :mod:`.workspace` -- what the agent sees: the workspace folder, the service its tool scripts
  talk to, the CUDA training environment, ``cuda-agent optimize`` and episodes for other trainers;
* :mod:`.judge` -- verification, profiling and baselines: static checks, the trusted process and
  the candidate process, profilers, the run-time op guard, integrity checks;
* :mod:`.executors` -- pools of worker processes that run jobs (one per GPU at a time);
* :mod:`.compilers` -- compiler plugins, the content-addressed build cache, source checks;
* :mod:`.isolation` -- sandboxes for the agent's shell, privilege drop, host-wide locks.

:mod:`.builtin` registers the plugins of all five with the plugin manager.

Modules that lived at the top of this package before it had subpackages are still importable
under their old names (``cuda_agent.sandbox.verify`` is ``cuda_agent.sandbox.judge.verify``),
so job strings and imports written against them keep working.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.util
import sys

__version__ = "0.1.0"

# old module name (under this package) -> where it lives now
MOVED = {
    "privdrop": "isolation.privdrop",
    "hostlock": "isolation.hostlock",
    "sandboxes.cli": "workspace.sandbox_cli",
    "sandboxes": "isolation.sandboxes",
    "buildcache": "compilers.buildcache",
    "frozen": "compilers.frozen",
    "compilers.guard": "compilers.source_check",
    "executors.jobs": "executors.job",
    "executors.tasks": "judge.tasks",
    "verify": "judge.verify",
    "jobs": "judge.jobs",
    "baselines": "judge.baselines",
    "checks": "judge.checks",
    "profilers": "judge.profilers",
    "guard": "judge.op_guard",
    "integrity": "judge.integrity",
    "inputs": "judge.inputs",
    "precision": "judge.precision",
    "service": "workspace.service",
    "environment": "workspace.environment",
    "optimize": "workspace.optimize",
    "episodes": "workspace.episodes",
    "modelcheck": "workspace.modelcheck",
    "runtime_loader": "workspace.runtime_loader",
    "workspace.service_jobs": "judge.pipeline",
}


def moved_to(name: str) -> str | None:
    """The current name of a module imported by an old name (``None`` if it never moved)."""
    prefix = __name__ + "."
    if not name.startswith(prefix):
        return None
    rest = name[len(prefix):]
    for old in sorted(MOVED, key=len, reverse=True):
        if rest == old or rest.startswith(old + "."):
            return prefix + MOVED[old] + rest[len(old):]
    return None


class _OldNames(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Imports an old module name as the module that now holds it (one object, two names)."""

    def find_spec(self, fullname, path=None, target=None):
        if moved_to(fullname) is None:
            return None
        return importlib.util.spec_from_loader(fullname, self)

    def create_module(self, spec):
        return importlib.import_module(moved_to(spec.name))

    def exec_module(self, module):
        pass  # already executed under its current name


if not any(isinstance(f, _OldNames) for f in sys.meta_path):
    sys.meta_path.insert(0, _OldNames())  # before the path finder, which would load a second copy
