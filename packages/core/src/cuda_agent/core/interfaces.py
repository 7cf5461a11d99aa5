"""Base classes of every pluggable component kind.

A component class has a ``name`` (how configs select it), an ``Options`` dataclass (the
schema its ``options`` mapping is checked against) and a ``description``. It is built
with ``cls(options)`` where ``options`` is an instance of ``cls.Options``.

Concrete implementations live in other packages and plugins; the agent loop and the
trainer see only these interfaces.
"""

from __future__ import annotations

import abc
import random
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, Iterator

from .types import CandidateOutcome, CompileResult, RewardResult, Task, Timing, Trajectory

if TYPE_CHECKING:
    from .hookspecs import Stage
    from .run import Run


@dataclass
class NoOptions:
    """Options schema of a component that takes none."""


class Component:
    """Common base: a name, an options schema and a description."""

    kind: ClassVar[str] = "component"
    name: ClassVar[str] = ""
    description: ClassVar[str] = ""
    Options: ClassVar[type] = NoOptions

    def __init__(self, options: Any = None):
        self.options = options if options is not None else self.Options()


class Compiler(Component):
    kind = "compiler"
    backend: ClassVar[str] = "cuda"  # "cuda" or "cpu"

    @abc.abstractmethod
    def build(self, workspace: Path, build_dir: Path | None = None) -> CompileResult:
        """Build the workspace's kernels; reuse cached objects where inputs are unchanged."""


class Profiler(Component):
    kind = "profiler"
    backend: ClassVar[str] = "cuda"

    @abc.abstractmethod
    def time(self, fn: Any, input_sets: list, device: Any = None) -> Timing:
        """Time ``fn(*inputs)`` rotating over ``input_sets``; runs inside an executor worker."""

    def steadier(self) -> "Profiler | None":
        """A mode of this profiler that gives steadier numbers for calls it times unsteadily
        (``cuda_events``: CUDA-graph replay), or None. A task whose eager baseline stays
        unsteady is timed in that mode throughout: baselines and candidates alike."""
        return None

    def steadier_reason(self, fn: Any, input_sets: list, device: Any = None) -> str:
        """Why a task should be timed in the :meth:`steadier` mode from the start, whatever
        its spread (``cuda_events``: its work runs on parallel branches, whose overlap depends
        on host timing); "" when there is no such reason or it cannot be told."""
        return ""

    def method_name(self) -> str:
        """The ``Timing.method`` this profiler's timings start with."""
        return self.name

    def warmup_drift(self, fn: Any, input_sets: list, device: Any = None) -> float:
        """How far ``fn``'s per-call time still moves (relative) once the profiler's fixed
        warm-up is over (``cuda_events``: a GPU whose clock falls at its power limit); 0.0
        when it is level or the profiler cannot tell."""
        return 0.0


class CorrectnessCheck(Component):
    kind = "correctness_check"
    stage: ClassVar[str] = "static"  # "static" (sources) or "runtime"

    @abc.abstractmethod
    def check(self, workspace: Path) -> list[str]:
        """Return violations, each a one-line message naming the rule broken."""


class SandboxSession(abc.ABC):
    """A live sandbox bound to one workspace."""

    workspace: Path

    @abc.abstractmethod
    def run(self, command: str, timeout: float = 60.0, env: dict | None = None) -> Any:
        """Run a shell command in the workspace; returns an object with
        ``exit_code``, ``output``, ``timed_out`` and ``seconds``."""

    @abc.abstractmethod
    def close(self) -> None: ...

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


class Sandbox(Component):
    kind = "sandbox"

    @abc.abstractmethod
    def open(self, workspace: Path, protected: list[str] | None = None) -> SandboxSession:
        """Open a session confined to ``workspace``; ``protected`` paths are read-only."""


class Executor(Component):
    """A pool that runs verification/profiling jobs on GPUs (or the CPU), one job per device."""

    kind = "executor"
    backend: ClassVar[str] = "cuda"

    @abc.abstractmethod
    def submit(self, job: Any) -> Any:
        """Queue a job; returns a ``concurrent.futures.Future``."""

    def build_executor(self) -> Any:
        """An executor (``submit(job) -> Future``) for compile jobs when this pool builds
        elsewhere (for example on CPU nodes of a cluster); None: builds run on this host."""
        return None

    def close(self) -> None:
        pass


class AgentTool(Component):
    """A tool the agent can call, described by an OpenAI function schema."""

    kind = "agent_tool"

    @abc.abstractmethod
    def schema(self) -> dict:
        """The OpenAI function-calling schema ({"type": "function", "function": {...}})."""

    @abc.abstractmethod
    def call(self, arguments: dict, context: Any) -> Any:
        """Run the tool; returns a :class:`~cuda_agent.core.types.ToolResult`."""


class RewardFunction(Component):
    kind = "reward"

    @abc.abstractmethod
    def score(self, outcome: CandidateOutcome) -> RewardResult: ...


class Algorithm(Component):
    """An RL algorithm (PPO, GRPO, RFT): turns scored trajectories into parameter updates."""

    kind = "algorithm"


class Policy(Component):
    """An LLM backend. Chat-level policies answer messages; token-level ones also
    return the exact sampled token ids and their log-probs."""

    kind = "policy"
    token_level: ClassVar[bool] = False


class Dataset(Component):
    kind = "dataset"

    @abc.abstractmethod
    def tasks(self) -> Iterator[Task]: ...


class Tracker(Component):
    """A metric sink. A run builds the trackers its config lists (``trackers:``) in its main
    process and hands them every lifecycle event of the run (through the lifecycle hooks,
    :class:`~cuda_agent.core.trackers.TrackerHooks`): override what you record."""

    kind = "tracker"

    def run_started(self, run: Run) -> None:
        """The run started (``run.id``, ``run.dir``, ``run.config``, ``run.command``)."""

    def stage_started(self, stage: Stage) -> None:
        """A training stage starts (``stage.name``, ``stage.steps``, ``stage.algorithm``)."""

    @abc.abstractmethod
    def log(self, step: int, metrics: dict) -> None:
        """A step ended with these metrics."""

    def trajectory_ended(self, trajectory: Trajectory) -> None:
        """An agent episode ended (its reward set, or None when it was not scored)."""

    def run_ended(self, status: str) -> None:
        """The run ended with ``status`` ("ok", "failed", "interrupted" or "infra_error");
        :meth:`close` follows."""

    def truncate(self, after_step: int) -> None:
        """Forget what was logged for steps after ``after_step``: a resumed run redoes them
        (called once per resumed stage). Trackers that cannot rewrite what they sent keep it."""

    def close(self) -> None:
        pass


class EnvironmentFactory(Component):
    """Makes the environment of each training episode (``trainer.environment``): an object
    with the :class:`~cuda_agent.core.agent.Environment` protocol, one per episode."""

    kind = "environment"
    makes_tasks: ClassVar[bool] = False  # True: tasks() draws the training tasks (no dataset needed)

    def bind(self, config: Any, pm: Any) -> None:
        """Receive the run's composed config and plugin manager before the first episode."""

    @abc.abstractmethod
    def make(self, task: Task, dest: Path | None = None) -> Any:
        """A fresh environment for one episode on ``task`` (in ``dest``, or a folder of its own)."""

    def tasks(self, n: int, rng: random.Random) -> list[Task]:
        """``n`` training tasks drawn with ``rng`` (when :attr:`makes_tasks`)."""
        raise NotImplementedError(f"environment {self.name!r} makes no tasks of its own: set trainer.dataset")

    def tokenizer(self) -> Any:
        """A tokenizer of its own for a model built from scratch (``trainer.model.tokenizer:
        environment``), or None."""
        return None

    def close(self) -> None:
        """Release what the episodes shared (an executor, temporary folders)."""


KINDS: dict[str, type[Component]] = {
    "compiler": Compiler,
    "profiler": Profiler,
    "correctness_check": CorrectnessCheck,
    "sandbox": Sandbox,
    "executor": Executor,
    "agent_tool": AgentTool,
    "reward": RewardFunction,
    "algorithm": Algorithm,
    "policy": Policy,
    "dataset": Dataset,
    "tracker": Tracker,
    "environment": EnvironmentFactory,
}

# registration hook name for each kind
HOOK_FOR_KIND: dict[str, str] = {
    "compiler": "register_compilers",
    "profiler": "register_profilers",
    "correctness_check": "register_correctness_checks",
    "sandbox": "register_sandboxes",
    "executor": "register_executors",
    "agent_tool": "register_agent_tools",
    "reward": "register_rewards",
    "algorithm": "register_algorithms",
    "policy": "register_policies",
    "dataset": "register_datasets",
    "tracker": "register_trackers",
    "environment": "register_environments",
}
