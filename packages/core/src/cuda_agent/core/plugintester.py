"""A test harness for plugin authors, in the manner of pytest's ``pytester``.

The ``plugintester`` fixture (this module is a pytest plugin, registered through the
``pytest11`` entry point of cuda-agent-core) gives a :class:`PluginTester`: a plugin
manager with the installed built-ins plus the plugins a test chooses, and tiny runs of the
real commands on the CPU backend, in-process, with every hook call recorded::

    def test_my_reward_is_used(plugintester):
        plugintester.register(my_plugin)               # a module or object with hook impls
        res = plugintester.optimize("reward.name=my_reward")
        assert res.exit_code == 0, res.output
        (traj,) = res.hook_kwargs("on_trajectory_end", "trajectory")
        assert traj.reward.reward == "my_reward"

``eval`` runs an agent episode on one small task (a replayed policy), ``optimize`` the same
on a ``model.py``, ``train`` one PPO step of a tiny random model (``environment="toy"``:
the guessing game; ``"cuda"``: CUDA workspaces on the CPU backend, scored by the run's
reward). Each needs the package that ships the command (cuda-agent-evaluation,
cuda-agent-sandbox, cuda-agent-trainer); without it the test is skipped with its name.
"""

from __future__ import annotations

import contextlib
import io
import json
import threading
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path
from typing import Any, Iterable

import pytest

# a small task in KernelBench's form (Model, get_inputs, get_init_inputs)
TASK_CODE = (
    "import torch\n"
    "import torch.nn as nn\n"
    "\n"
    "\n"
    "class Model(nn.Module):\n"
    "    def forward(self, x):\n"
    "        return torch.relu(x)\n"
    "\n"
    "\n"
    "def get_inputs():\n"
    "    return [torch.randn(64, 32)]\n"
    "\n"
    "\n"
    "def get_init_inputs():\n"
    "    return []\n"
)

# the replayed agent: reads the task, then ends (final message "DONE")
DEFAULT_TURNS = [{"content": "", "tool_calls": [{"name": "read", "arguments": {"path": "model.py"}}]}]

COMMAND_PACKAGES = {"eval": "cuda-agent-evaluation", "optimize": "cuda-agent-sandbox", "train": "cuda-agent-trainer"}

LIFECYCLE_HOOKS = ("on_run_start", "on_stage_start", "on_step_end", "on_trajectory_end", "on_run_end")


@dataclass
class HookCall:
    """One call of a hook: its name and keyword arguments."""

    name: str
    kwargs: dict

    def __getattr__(self, key: str) -> Any:
        try:
            return self.kwargs[key]
        except KeyError:
            raise AttributeError(f"hook call {self.name} has no argument {key!r}") from None


class HookRecorder:
    """Every hook call made on a plugin manager, in order (pluggy's hook-call monitoring)."""

    def __init__(self, pm: Any):
        self.calls: list[HookCall] = []
        self._lock = threading.Lock()

        def before(hook_name: str, hook_impls: Any, kwargs: dict) -> None:
            with self._lock:
                self.calls.append(HookCall(hook_name, dict(kwargs)))

        def after(outcome: Any, hook_name: str, hook_impls: Any, kwargs: dict) -> None:
            pass

        self._undo = pm.pm.add_hookcall_monitoring(before, after)

    def getcalls(self, *names: str) -> list[HookCall]:
        """The calls of these hooks (all calls when none is named), in order."""
        with self._lock:
            return [c for c in self.calls if not names or c.name in names]

    def mark(self) -> int:
        """A position: :meth:`since` returns the calls after it."""
        with self._lock:
            return len(self.calls)

    def since(self, mark: int) -> list[HookCall]:
        with self._lock:
            return list(self.calls[mark:])

    def close(self) -> None:
        self._undo()


@dataclass
class CommandResult:
    """What one ``cuda-agent`` command did: exit code, output, run folder and its hook calls."""

    args: list[str]
    exit_code: int
    stdout: str
    stderr: str
    calls: list[HookCall] = field(default_factory=list)

    @property
    def output(self) -> str:
        return self.stdout + self.stderr

    def getcalls(self, *names: str) -> list[HookCall]:
        return [c for c in self.calls if not names or c.name in names]

    def hook_kwargs(self, name: str, key: str) -> list[Any]:
        """Argument ``key`` of every call of hook ``name``."""
        return [c.kwargs[key] for c in self.getcalls(name)]

    def lifecycle(self) -> list[str]:
        """The names of the lifecycle hooks called, in order."""
        return [c.name for c in self.calls if c.name in LIFECYCLE_HOOKS]

    @property
    def run_dir(self) -> Path | None:
        runs = self.hook_kwargs("on_run_start", "run")
        return Path(runs[-1].dir) if runs else None


class PluginTester:
    """A plugin manager with the built-ins and chosen plugins, and tiny runs of the commands.

    ``register(plugin)`` adds a module or object with hook implementations; ``load(name)``
    loads an installed third-party plugin by its entry-point name (also when autoload is
    off). Commands run in-process with this manager as the process-wide one, so they see
    exactly these plugins; ``recorder`` holds every hook call.
    """

    def __init__(self, path: Path, cache: Path | None = None):
        self.path = Path(path)
        self.cache = Path(cache) if cache is not None else self.path / "cache"
        self._pm: Any = None
        self._pending: list[tuple[Any, str]] = []
        self.recorder: HookRecorder | None = None

    # -- the plugin manager ------------------------------------------------------------

    @property
    def pm(self) -> Any:
        if self._pm is None:
            from .plugins import PluginManager

            self._pm = PluginManager()
            for plugin, name in self._pending:
                self._pm.register(plugin, name)
            self.recorder = HookRecorder(self._pm)
        return self._pm

    def register(self, plugin: Any, name: str | None = None) -> None:
        """Add ``plugin`` (a module or an object with hook implementations)."""
        name = name or getattr(plugin, "__name__", None) or f"{type(plugin).__name__}-{id(plugin)}"
        if self._pm is None:
            self._pending.append((plugin, name))
        else:
            self._pm.register(plugin, name)

    def load(self, name: str) -> None:
        """Load the installed third-party plugin ``name`` (entry point of the ``cuda_agent`` group)."""
        from .errors import PluginError, did_you_mean
        from .plugins import THIRD_PARTY_GROUP

        eps = {ep.name: ep for ep in metadata.entry_points().select(group=THIRD_PARTY_GROUP)}
        if name not in eps:
            raise PluginError(f"no installed plugin {name!r}; {did_you_mean(name, eps)}")
        ep = eps[name]
        self.pm.register(ep.load(), name, distribution=ep.dist.name if ep.dist else "?",
                         version=ep.dist.version if ep.dist else "?")

    def compose(self, *overrides: str, files: Iterable[str | Path] = ()) -> Any:
        """The run config these plugins compose (base, fragments, files, overrides)."""
        from .config import compose

        return compose(list(files), list(overrides), pm=self.pm)

    def default_disagreements(self) -> list[str]:
        """Where these plugins' config fragments and options dataclasses give a section's
        defaults differently (one line each; see :func:`~cuda_agent.core.configcheck.default_disagreements`).
        A plugin's test asserts it is empty."""
        from omegaconf import OmegaConf

        from .config import default_config
        from .configcheck import collect_schemas, default_disagreements

        defaults = OmegaConf.to_container(default_config(self.pm), resolve=False)
        return default_disagreements(defaults, collect_schemas(self.pm))

    # -- commands --------------------------------------------------------------------------

    def run(self, *args: str) -> CommandResult:
        """``cuda-agent ARGS`` in-process, with this plugin manager as the process-wide one."""
        from . import cli
        from .plugins import plugin_manager_in_use

        pm = self.pm
        mark = self.recorder.mark()
        out, err = io.StringIO(), io.StringIO()
        with plugin_manager_in_use(pm), contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            code = cli.main([str(a) for a in args])
        return CommandResult([str(a) for a in args], code, out.getvalue(), err.getvalue(), self.recorder.since(mark))

    def require(self, command: str) -> None:
        """Skip the test when no installed package offers ``cuda-agent COMMAND``."""
        from . import cli
        from .plugins import plugin_manager_in_use

        with plugin_manager_in_use(self.pm):
            cli._load_plugin_commands()
        if command not in cli.cli.commands:
            pytest.skip(f"cuda-agent {command} is not installed ({COMMAND_PACKAGES.get(command, 'its package')})")

    def task(self, code: str = TASK_CODE, name: str = "relu") -> Path:
        """A folder holding one task file ``NAME.py`` (KernelBench format); returns the file."""
        folder = self.path / "tasks"
        folder.mkdir(parents=True, exist_ok=True)
        path = folder / f"{name}.py"
        path.write_text(code)
        return path

    def script(self, turns: list[dict] | None = None) -> Path:
        """A recording for the ``replay`` policy: the assistant's turns, then "DONE"."""
        path = self.path / f"script-{len(list(self.path.glob('script-*.json')))}.json"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps({"turns": DEFAULT_TURNS if turns is None else turns}))
        return path

    def _common(self) -> list[str]:
        return ["backend=cpu", "executor.name=cpu", f"run.output_dir={self.path / 'runs'}", "logging.console=false"]

    def eval(self, *overrides: str, turns: list[dict] | None = None, task: Path | None = None) -> CommandResult:
        """``cuda-agent eval``: one agent episode (``turns`` replayed) on one task, CPU backend."""
        self.require("eval")
        task = task or self.task()
        return self.run("eval", f"eval.dataset={{name: folder, options: {{path: {task.parent}}}}}",
                        "policy.name=replay", f"policy.options.path={self.script(turns)}", "eval.progress=false",
                        "eval.formats=[json]", "eval.profile.options.baselines=false", *self._common(), *overrides)

    def optimize(self, *overrides: str, turns: list[dict] | None = None, task: Path | None = None) -> CommandResult:
        """``cuda-agent optimize``: one agent episode (``turns`` replayed) on a ``model.py``, CPU backend."""
        self.require("optimize")
        task = task or self.task()
        out = self.path / "optimize" / f"out{len(list((self.path / 'optimize').glob('out*')))}"
        return self.run("optimize", task, "--policy", "replay", "--recording", self.script(turns), "--out", out,
                        "--quiet", *self._common(), *overrides)

    def train(self, *overrides: str, environment: str = "toy", steps: int = 1) -> CommandResult:
        """``cuda-agent train``: ``steps`` PPO steps of a tiny random model in ``environment``
        (``toy``: the guessing game; ``cuda``: CUDA workspaces on the CPU backend for the task of
        :meth:`task`, episodes of one turn scored by the run's reward)."""
        self.require("train")
        model = (["trainer.model.build={hidden_size: 32, num_layers: 1, num_heads: 2, intermediate_size: 64, "
                  "max_position_embeddings: 256}", "trainer.model.tokenizer=environment"]
                 if environment == "toy" else
                 [f"trainer.model.path={self.tiny_model()}",
                  f"trainer.dataset={{name: folder, options: {{path: {self.task().parent}}}}}"])
        stage = (f"trainer.stages=[{{name: ppo, steps: {steps}, algorithm: {{name: ppo, options: {{batch_size: 2, "
                 "mini_batch_size: 2, micro_batch_size: 2, actor_lr: 1.0e-3, critic_lr: 1.0e-3}}}]")
        return self.run("train", f"trainer.environment.name={environment}", *model, "trainer.model.dtype=float32",
                        "trainer.engine.backend=accelerate", "trainer.engine.device=cpu",
                        "trainer.engine.mixed_precision='no'", "trainer.engine.gradient_checkpointing=false",
                        "trainer.rollout.max_new_tokens=4", "trainer.rollout.concurrency=2",
                        "trainer.agent_defaults={max_turns: 1, max_tokens_per_turn: 4, min_generation_tokens: 1}",
                        stage, *(self._common() if environment == "cuda" else self._common()[2:]),  # toy: no backend
                        "--no-progress", *overrides)

    def tiny_model(self) -> Path:
        """A random-weight chat model and its tokenizer, built once per cache folder."""
        from .policies.tiny import build_tiny_model

        dest = self.cache / "tiny-model"
        if not (dest / "config.json").exists():
            build_tiny_model(dest, hidden_size=32, num_layers=1, num_heads=2)
        return dest

    def close(self) -> None:
        if self.recorder is not None:
            self.recorder.close()


@pytest.fixture
def plugintester(tmp_path: Path, tmp_path_factory: pytest.TempPathFactory) -> Any:
    """A :class:`PluginTester` in the test's temporary folder (the tiny model is shared by the session)."""
    tester = PluginTester(tmp_path, cache=tmp_path_factory.getbasetemp() / "plugintester-cache")
    try:
        yield tester
    finally:
        tester.close()
