"""Hook specifications: the contract between cuda-agent and its plugins.

Registration hooks receive a ``register`` callback and call it once per component
class they provide. A component class carries ``name`` (str), ``Options`` (a
dataclass: the schema of its options) and a short ``description``; see
:mod:`cuda_agent.core.interfaces` for the base classes of each kind.

Lifecycle hooks announce events of a run. Every command that has the event calls it
(``train``: all five; ``eval``: run start/end, a trajectory per agent episode and one
step with the metrics; ``optimize`` and ``demo``: run start/end and the trajectory). The
run's trackers receive them (:class:`~cuda_agent.core.trackers.TrackerHooks`), and so
does the trainer's step checkpointing (``on_step_end``).

Every hook spec here is documented in ``docs/plugins.md`` (a test enforces it).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable, Mapping, Protocol

import pluggy

if TYPE_CHECKING:
    from pathlib import Path

    import click

    from .interfaces import Component
    from .run import Run
    from .types import Trajectory

PROJECT = "cuda_agent"

hookspec = pluggy.HookspecMarker(PROJECT)
hookimpl = pluggy.HookimplMarker(PROJECT)

Register = Callable[["type[Component]"], None]
"""What registration hooks receive: call it with each component class."""

RegisterFragment = Callable[[str, "Mapping[str, Any] | str | Path"], None]
"""``register(source_name, mapping_or_yaml_path)``."""

RegisterSchema = Callable[[str, type], None]
"""``register(section, options_dataclass)``."""


class Stage(Protocol):
    """What ``on_stage_start`` is told of a training stage (the trainer's ``StageSpec``)."""

    name: str
    steps: int
    algorithm: Mapping[str, Any] | str


# --- registration hooks -------------------------------------------------------


@hookspec
def register_compilers(register: Register) -> None:
    """Register :class:`~cuda_agent.core.interfaces.Compiler` classes."""


@hookspec
def register_profilers(register: Register) -> None:
    """Register :class:`~cuda_agent.core.interfaces.Profiler` classes."""


@hookspec
def register_correctness_checks(register: Register) -> None:
    """Register :class:`~cuda_agent.core.interfaces.CorrectnessCheck` classes."""


@hookspec
def register_sandboxes(register: Register) -> None:
    """Register :class:`~cuda_agent.core.interfaces.Sandbox` classes."""


@hookspec
def register_executors(register: Register) -> None:
    """Register :class:`~cuda_agent.core.interfaces.Executor` classes (GPU/CPU job pools)."""


@hookspec
def register_agent_tools(register: Register) -> None:
    """Register :class:`~cuda_agent.core.interfaces.AgentTool` classes."""


@hookspec
def register_rewards(register: Register) -> None:
    """Register :class:`~cuda_agent.core.interfaces.RewardFunction` classes."""


@hookspec
def register_algorithms(register: Register) -> None:
    """Register :class:`~cuda_agent.core.interfaces.Algorithm` classes (RL algorithms)."""


@hookspec
def register_policies(register: Register) -> None:
    """Register :class:`~cuda_agent.core.interfaces.Policy` classes (LLM backends)."""


@hookspec
def register_datasets(register: Register) -> None:
    """Register :class:`~cuda_agent.core.interfaces.Dataset` classes."""


@hookspec
def register_trackers(register: Register) -> None:
    """Register :class:`~cuda_agent.core.interfaces.Tracker` classes (metric sinks)."""


@hookspec
def register_environments(register: Register) -> None:
    """Register :class:`~cuda_agent.core.interfaces.EnvironmentFactory` classes: the
    environments training rolls out in (``trainer.environment``)."""


@hookspec
def register_config_fragments(register: RegisterFragment) -> None:
    """Register config fragments: ``register(source_name, mapping_or_yaml_path)``.

    Fragments are merged over the base config, before files named on the command line
    and ``key=value`` overrides.
    """


@hookspec
def register_config_schemas(register: RegisterSchema) -> None:
    """Register the options dataclass that types a config section: ``register("agent",
    AgentOptions)``; ``name[]`` stands for every element of a list (``trainer.stages[]``).

    Each composed value of the section is checked against its field's annotation and the
    bounds in the field's metadata (:func:`cuda_agent.core.configcheck.bounds`).
    """


@hookspec
def register_commands(cli: click.Group) -> None:
    """Add subcommands to the ``cuda-agent`` command line (a ``click.Group``)."""


# --- policy hooks (first result wins) -----------------------------------------


@hookspec(firstresult=True)
def check_tool_call(tool_name: str, arguments: Mapping[str, Any], workspace: Path) -> str | None:
    """Refuse a tool call before it runs: return a one-line reason, or None to allow it.

    Asked of the plugin manager of the episode's caller (the run's), in the workspace the
    tools run in.
    """


# --- lifecycle hooks ------------------------------------------------------------


@hookspec
def on_run_start(run: Run) -> None:
    """A run has started; ``run`` has ``id``, ``dir``, ``config``, ``command`` and ``log``."""


@hookspec
def on_run_end(run: Run, status: str) -> None:
    """A run has ended with ``status``: "ok", "failed", "interrupted" or "infra_error"."""


@hookspec
def on_stage_start(run: Run, stage: Stage) -> None:
    """A training stage (warm-up, RFT, value pretraining, agentic PPO, ...) starts."""


@hookspec
def on_step_end(run: Run, step: int, metrics: Mapping[str, float]) -> None:
    """A training step (or an evaluation, as step 0) ended with these metrics."""


@hookspec
def on_trajectory_end(run: Run, trajectory: Trajectory) -> None:
    """An agent trajectory finished (its reward is set, or None when it was not scored)."""
