"""Hook specifications: the contract between cuda-agent and its plugins.

Registration hooks receive a ``register`` callback and call it once per component
class they provide. A component class carries ``name`` (str), ``Options`` (a
dataclass: the schema of its options) and a short ``description``; see
:mod:`cuda_agent.core.interfaces` for the base classes of each kind.

Lifecycle hooks announce events of a run; trackers and checkpointers implement them.

Every hook spec here is documented in ``docs/plugins.md`` (a test enforces it).
"""

from __future__ import annotations

from typing import Any, Callable

import pluggy

PROJECT = "cuda_agent"

hookspec = pluggy.HookspecMarker(PROJECT)
hookimpl = pluggy.HookimplMarker(PROJECT)

Register = Callable[[type], None]


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
def register_config_fragments(register: Callable[[str, Any], None]) -> None:
    """Register config fragments: ``register(source_name, mapping_or_yaml_path)``.

    Fragments are merged over the base config, before files named on the command line
    and ``key=value`` overrides.
    """


@hookspec
def register_config_schemas(register: Callable[[str, type], None]) -> None:
    """Register the options dataclass that types a config section: ``register("agent",
    AgentOptions)``; ``name[]`` stands for every element of a list (``trainer.stages[]``).

    Each composed value of the section is checked against its field's annotation and the
    bounds in the field's metadata (:func:`cuda_agent.core.configcheck.bounds`).
    """


@hookspec
def register_commands(cli: Any) -> None:
    """Add subcommands to the ``cuda-agent`` command line (a ``click.Group``)."""


# --- policy hooks (first result wins) -----------------------------------------


@hookspec(firstresult=True)
def check_tool_call(tool_name: str, arguments: dict, workspace: Any) -> str | None:
    """Refuse a tool call before it runs: return a one-line reason, or None to allow it."""


# --- lifecycle hooks ------------------------------------------------------------


@hookspec
def on_run_start(run: Any) -> None:
    """A run has started; ``run`` has ``id``, ``dir``, ``config`` and ``log``."""


@hookspec
def on_run_end(run: Any, status: str) -> None:
    """A run has ended with ``status`` ("ok", "failed" or "interrupted")."""


@hookspec
def on_stage_start(run: Any, stage: Any) -> None:
    """A training stage (warm-up, RFT, value pretraining, agentic PPO, ...) starts."""


@hookspec
def on_step_end(run: Any, step: int, metrics: dict) -> None:
    """A training or evaluation step ended with these metrics."""


@hookspec
def on_trajectory_end(run: Any, trajectory: Any) -> None:
    """An agent trajectory finished (its reward is set)."""
