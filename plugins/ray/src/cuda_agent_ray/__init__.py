"""``ray`` executor: the GPU pool (and the build pool) of a Ray cluster.

Install: ``pip install -e plugins/ray`` (on the client and every node of the cluster);
select with ``executor.name=ray executor.options.address=auto``. See ``README.md`` here and
``docs/multi_gpu.md``. Ray is imported only when the executor starts.
"""

from __future__ import annotations

from cuda_agent.core.hookspecs import hookimpl

__version__ = "0.1.0"


@hookimpl
def register_executors(register):
    from .executor import RayExecutor

    register(RayExecutor)


@hookimpl
def register_commands(cli):
    from .cli import register_ray_commands

    register_ray_commands(cli)
