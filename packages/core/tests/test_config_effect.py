"""A key a command accepts has its effect, or the command refuses it.

Every ``cuda-agent`` subcommand that takes ``key=value`` overrides declares the config keys
it reads (:mod:`cuda_agent.core.configreads`). These tests walk the command tree and check
the declarations both ways, by what the commands do:

* an override of any key of the run config outside a command's declaration is refused with
  a one-line error that names the key and what the command reads (every command, every key);
* what a command declares, it reads: the command runs for real (small) while every read of
  its composed config is recorded, and each declared key must have been read;
* the two keys a new user found ignored have their effect: the run-level ``backend=cpu``
  reaches the executor (``local`` and ``ray``), and ``demo run.output_dir=X`` writes under X.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import click
import pytest
from omegaconf import DictConfig, ListConfig, OmegaConf

from cuda_agent.core import config as config_mod
from cuda_agent.core.cli import cli, main
from cuda_agent.core.config import default_config
from cuda_agent.core.configreads import EVERYTHING, check_overrides, command_reads, registered, unread_keys
from cuda_agent.core.errors import ConfigError

# --- the commands and the keys of the run config ------------------------------------------


@pytest.fixture(scope="module", autouse=True)
def every_plugin():
    """The command tree with every installed plugin's commands (the suite loads no third-party
    plugin by default): a fresh ``cuda-agent`` group that ``main`` runs, on a plugin manager
    that loads them all."""
    from importlib import metadata

    from cuda_agent.core import cli as cli_mod
    from cuda_agent.core.plugins import get_plugin_manager, reset_plugin_manager

    names = sorted({e.name for e in metadata.entry_points(group="cuda_agent")})
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("CUDA_AGENT_PLUGINS", ",".join(names))
        reset_plugin_manager()
        group = click.Group("cuda-agent", commands={k: cli.commands[k] for k in ("plugins", "config")})
        get_plugin_manager().hook.register_commands(cli=group)
        mp.setattr(cli_mod, "cli", group)
        mp.setattr(cli_mod, "_commands_loaded", True)
        yield group
    reset_plugin_manager()


def _override_commands(group: click.Group) -> dict[str, click.Command]:
    """Every subcommand (by path) with a variadic ARGS argument: CONFIG files and key=value overrides."""
    out: dict[str, click.Command] = {}

    def walk(g: click.Group, path: list[str]) -> None:
        for name, cmd in g.commands.items():
            if isinstance(cmd, click.Group):
                walk(cmd, [*path, name])
            elif any(isinstance(p, click.Argument) and p.nargs == -1 for p in cmd.params):
                out[" ".join([*path, name])] = cmd

    walk(group, [])
    return out


def _leaves(node, path: str = "") -> list[str]:
    """Dotted keys of the leaves of a config node; plugin ``options`` mappings and empty
    mappings count as one key each (their keys belong to the plugin's schema)."""
    if isinstance(node, DictConfig) and len(node) and not path.endswith("options"):
        return [k for key in node.keys() for k in _leaves(node._get_node(key), f"{path}.{key}" if path else str(key))]
    if isinstance(node, ListConfig) and len(node):
        return [k for i in range(len(node)) for k in _leaves(node._get_node(i), f"{path}.{i}")]
    return [path]


def _override_of(cfg, key: str) -> str:
    """``key=<its default value>``: valid for the config, so only the command's reads decide."""
    value = OmegaConf.select(cfg, key)
    if isinstance(value, (DictConfig, ListConfig)):
        value = OmegaConf.to_container(value, resolve=True)
    return f"{key}={json.dumps(value)}"  # JSON is YAML's flow style


CHECKOUT = Path(__file__).resolve().parents[3]

# positional arguments a command needs before its ARGS (config is composed before they are used)
POSITIONAL = {"optimize": ["model.py"], "verify": ["no-such-solution"], "profile": ["no-such-solution"],
              "eval --solutions": ["."]}


# every command with overrides (in the checkout: the ones of each package and installed plugin)
COMMANDS = ["baselines", "config show", "data list", "data synthesize", "data validate", "demo", "eval",
            "executor check", "optimize", "profile", "ray down", "ray status", "train", "verify"]


def test_every_command_that_takes_overrides_declares_what_it_reads(every_plugin):
    commands = _override_commands(every_plugin)
    assert set(COMMANDS) <= set(commands), sorted(set(COMMANDS) - set(commands))
    undeclared = sorted(set(commands) - set(registered()))
    assert not undeclared, f"commands that take key=value but declare no reads: {undeclared}"
    # a declaration is for a command, or one of its modes ("eval --solutions")
    stale = sorted(c for c in registered() if c.split(" --")[0] not in commands and c != "test-only reads")
    assert not stale, f"reads declared for commands that do not exist: {stale}"


def test_reads_cover_keys_below_them_and_mappings_key_by_key():
    reads = command_reads("test-only reads", "run.output_dir", "executor")
    try:
        assert unread_keys(reads, [("executor.options.backend", "cpu"), ("run.output_dir", "x")]) == []
        assert unread_keys(reads, [("run", {"output_dir": "x", "seed": 3})]) == ["run.seed"]
        with pytest.raises(ConfigError, match=r"run\.seed has no effect on `cuda-agent test-only reads`, which reads "
                                              r"run\.output_dir, executor; remove it"):
            check_overrides(reads, [("run", {"seed": 3})])
    finally:
        registered_now = registered()
        assert "test-only reads" in registered_now
        from cuda_agent.core import configreads

        configreads._REGISTRY.pop("test-only reads")


@pytest.mark.parametrize("command", COMMANDS + ["eval --solutions"])
def test_a_key_the_command_does_not_read_is_refused_in_one_line(command, capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # nothing a refused command might write lands in the checkout
    reads = registered()[command]
    cfg = default_config()
    keys = _leaves(cfg)
    unread = [k for k in keys if not reads.covers(k)]
    if EVERYTHING in reads.keys:
        assert unread == []
        return
    assert unread, f"{command} reads every key of the run config; declare it as reading everything"
    # every key outside the declaration is refused ...
    for key in unread:
        with pytest.raises(ConfigError, match="^" + re.escape(key) + r"(\.\S+)? has no effect"):
            check_overrides(reads, [config_mod.parse_override(_override_of(cfg, key))])
    # ... and the command itself says so in one line, before doing anything (a mode's own refusal
    # shows on a key that the command's other mode reads)
    key = next((k for k in unread if registered()[command.split(" --")[0]].covers(k)), unread[0])
    rc = main([*command.split(), *POSITIONAL.get(command, []), _override_of(cfg, key)])
    err = capsys.readouterr().err.strip()
    assert rc == 2, err
    assert err.count("\n") == 0 and err.startswith(f"error: {key} has no effect on `cuda-agent {command}`"), err
    assert f"which reads {reads.shown()}" in err, err


# --- what a command declares, it reads ------------------------------------------------------


class Stop(Exception):
    """Raised where a command would start its work: every config key it reads is read by then."""


class ReadRecorder:
    """Records the keys of a composed run config that are read (attribute, item, ``get``,
    ``in``, ``to_container``), from the moment ``compose`` returns it. Writing the config out
    (``to_yaml``: ``config.yaml`` of a run) is no read."""

    def __init__(self, monkeypatch):
        self.roots: list = []
        self.keys: set[str] = set()
        self._paused = 0
        rec = self

        for cls in (DictConfig, ListConfig):
            original = cls._get_node

            def get_node(node, key, *args, _original=original, **kwargs):
                out = _original(node, key, *args, **kwargs)
                if not rec._paused and rec.roots:
                    rec._paused += 1
                    try:
                        if any(node._get_root() is r for r in rec.roots):
                            rec.keys.add(re.sub(r"\[(\d+)\]", r".\1", node._get_full_key(key)))
                    finally:
                        rec._paused -= 1
                return out

            monkeypatch.setattr(cls, "_get_node", get_node)

        validate = config_mod.validate_components

        def validate_and_track(cfg, pm):  # compose's last step: the config it returns
            validate(cfg, pm)
            rec.roots.append(cfg)

        monkeypatch.setattr(config_mod, "validate_components", validate_and_track)
        to_yaml = OmegaConf.to_yaml

        def unrecorded_yaml(cfg, *args, **kwargs):
            rec._paused += 1
            try:
                return to_yaml(cfg, *args, **kwargs)
            finally:
                rec._paused -= 1

        monkeypatch.setattr(OmegaConf, "to_yaml", staticmethod(unrecorded_yaml))

    def leaves(self) -> list[str]:
        """The leaves of the config the command composed (walking them is no read)."""
        self._paused += 1
        try:
            return _leaves(self.roots[-1])
        finally:
            self._paused -= 1

    def read_undeclared(self, declared: tuple[str, ...]) -> list[str]:
        """Leaves outside ``declared`` that were read: a refusal of them could be wrong."""
        if EVERYTHING in declared:
            return []
        leaves = self.leaves()
        return [k for k in leaves if k in self.keys and not any(k == d or k.startswith(d + ".") for d in declared)]

    def unread(self, declared: tuple[str, ...]) -> list[str]:
        """Leaves of the default config under ``declared`` keys that were never read."""
        leaves = [k for k in self.leaves() if any(k == d or k.startswith(d + ".") for d in declared)]
        return [k for k in leaves if k not in self.keys]


NOTHING = object()
AFTER = object()  # in a dry run's table: stop once the function has run


def _stop_at(monkeypatch, target, name: str, keep: dict | None = None, returns=NOTHING):
    """Make ``target.name`` raise Stop (after calling it when ``keep`` is given: its result goes
    there), or return ``returns`` at once (the work skipped, the command goes on to its end)."""
    original = getattr(target, name)

    def stopped(*args, **kwargs):
        if returns is not NOTHING:
            return returns
        if keep is not None:
            keep["result"] = original(*args, **kwargs)
        raise Stop(name)

    monkeypatch.setattr(target, name, stopped)


def _dry_run(argv: list[str]) -> None:
    with pytest.raises(Stop):
        main(argv)


@pytest.fixture
def recorder(monkeypatch):
    return ReadRecorder(monkeypatch)


def _declared(command: str) -> tuple[str, ...]:
    return registered()[command].keys


def test_executor_check_reads_the_run_backend_and_it_reaches_the_executor(recorder, monkeypatch, tmp_path):
    from cuda_agent.sandbox.executors import configured

    monkeypatch.chdir(tmp_path)
    made: dict = {}
    _stop_at(monkeypatch, configured, "make_executor", made)
    _dry_run(["executor", "check", "backend=cpu"])
    assert recorder.unread(_declared("executor check")) == []
    assert recorder.read_undeclared(_declared("executor check")) == []
    assert recorder.unread(("run.seed", "executor.name")) == ["run.seed"]  # the recorder can tell
    assert made["result"].name == "cpu" and made["result"].backend == "cpu"  # the GPU pool had nothing to run on
    # before: `executor check backend=cpu` built the GPU pool ("executor local: no GPU found")


@pytest.mark.parametrize("command", ["ray status", "ray down"])
def test_the_ray_executor_takes_the_run_backend(command, recorder, monkeypatch, tmp_path):
    from cuda_agent.sandbox.executors import configured

    monkeypatch.chdir(tmp_path)
    made: dict = {}
    _stop_at(monkeypatch, configured, "make_executor", made)
    _dry_run([*command.split(), "backend=cpu"])
    assert recorder.unread(_declared(command)) == [] and recorder.read_undeclared(_declared(command)) == []
    ex = made["result"]
    # before: the run-level backend stayed out of the ray executor, which asked the cluster for GPUs
    assert ex.name == "ray" and ex.backend == "cpu" and ex.resource != "GPU"


def test_a_backend_that_disagrees_with_the_executors_own_is_one_line(capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert main(["ray", "status", "backend=cuda", "executor.options.backend=cpu"]) == 2
    err = capsys.readouterr().err.strip()
    assert err == "error: backend=cuda but executor.options.backend=cpu: they disagree; set one of them (or both to the same)"
    assert main(["executor", "check", "backend=cuda", "executor.name=cpu"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: backend=cuda but executor.name=cpu runs jobs on cpu;") and "\n" not in err


@pytest.mark.parametrize("command", ["demo", "optimize"])
def test_an_episode_command_reads_what_it_declares_and_writes_under_run_output_dir(command, recorder, monkeypatch,
                                                                                   tmp_path):
    from cuda_agent.sandbox.workspace import optimize

    monkeypatch.chdir(tmp_path)
    model, recording = optimize.demo_paths("cpu")
    _stop_at(monkeypatch, optimize, "run_episode_sync")
    _stop_at(monkeypatch, optimize, "check_model_up_front", returns=None)  # the model runs: no config read
    out = tmp_path / "elsewhere"
    argv = ["demo", "--quiet"] if command == "demo" else [
        "optimize", str(model), "--quiet", "--policy", "replay", "--recording", str(recording), "backend=cpu"]
    _dry_run([*argv, f"run.output_dir={out}"])
    assert recorder.unread(_declared(command)) == [] and recorder.read_undeclared(_declared(command)) == []
    # before: run.output_dir was accepted and the run went to ./runs
    runs = list(out.iterdir())
    assert len(runs) == 1 and (runs[0] / "config.yaml").is_file() and runs[0].name.endswith(
        "-optimize-" + ("demo" if command == "demo" else model.stem))
    assert not (tmp_path / "runs").exists()


def test_demo_takes_the_backend_from_an_override_as_from_its_option(capsys, monkeypatch, tmp_path):
    from cuda_agent.sandbox.workspace import optimize

    monkeypatch.chdir(tmp_path)
    assert main(["demo", "--backend", "cuda", "backend=cpu"]) == 2
    assert capsys.readouterr().err.strip() == "error: --backend cuda and backend=cpu disagree; give one of them"
    seen: dict = {}
    real = optimize.run_optimize

    def spy(cfg, task, *args, **kwargs):
        seen["task"], seen["backend"] = task.name, cfg.backend
        raise Stop

    monkeypatch.setattr(optimize, "run_optimize", spy)
    _dry_run(["demo", "backend=cpu"])
    assert seen == {"task": optimize.DEMOS["cpu"][2], "backend": "cpu"} and real is not spy


# Keys that eval and train read once per episode, through CudaEnvironment.from_config (the
# function whose every read the demo's dry run above records), not before their first task.
PER_EPISODE = ("environment", "sandbox", "service", "reward")


@pytest.fixture
def tiny_task(tmp_path):
    """A folder dataset of one task (the CPU demo's model), a folder of one solution for it
    and a solution folder (model.py + model_new.py) as ``best/`` holds one."""
    from cuda_agent.sandbox.workspace.optimize import demo_paths

    model, _ = demo_paths("cpu")
    code = model.read_text()
    (tmp_path / "tasks").mkdir()
    (tmp_path / "tasks" / "running_sum.py").write_text(code)
    new = code.replace("class Model(", "class ModelNew(")
    (tmp_path / "solutions").mkdir()
    (tmp_path / "solutions" / "running_sum.py").write_text(new)
    (tmp_path / "best").mkdir()
    (tmp_path / "best" / "model.py").write_text(code)
    (tmp_path / "best" / "model_new.py").write_text(new)
    return tmp_path


def _dry_runs(t: Path) -> dict:
    """command -> (argv, where it stops: module path, attribute[, what it returns instead of
    working: the command then runs to its end]; declared keys read later)."""
    from cuda_agent.sandbox.workspace.optimize import demo_paths

    folder = [f"dataset.name=folder", f"dataset.options.path={t / 'tasks'}"]
    evalset = [f"eval.dataset.name=folder", f"eval.dataset.options.path={t / 'tasks'}", f"run.output_dir={t / 'runs'}"]
    return {
        "data list": (["data", "list", *folder], None, ()),
        "data validate --no-run": (["data", "validate", "--no-run", *folder], None, ()),
        "data validate": (["data", "validate", *folder], ("cuda_agent.datasets.untrusted", "run_tasks"), ()),
        "data synthesize": (["data", "synthesize", f"synthesis.output_dir={t / 'synth'}",
                             "synthesis.decontamination.enabled=false", *folder],
                            ("cuda_agent.datasets.synthesis.pipeline:Synthesizer", "__init__"), ()),
        "verify": (["verify", str(t / "best"), "executor.name=cpu"],
                   ("cuda_agent.sandbox.workspace.service:WorkspaceService", "handle"), ()),
        "profile": (["profile", str(t / "best"), "executor.name=cpu"],
                    ("cuda_agent.sandbox.workspace.service:WorkspaceService", "handle"), ()),
        "eval --solutions": (["eval", "--solutions", str(t / "solutions"), "backend=cpu", *evalset],
                             ("cuda_agent.evaluation.evaluate", "run_tasks", []), ()),  # no task scored: the report
        "eval": (["eval", "backend=cpu", "policy.name=replay", f"policy.options.path={demo_paths('cpu')[1]}", *evalset],
                 ("cuda_agent.evaluation.evaluate", "run_tasks", []), PER_EPISODE),
        # the toy environment: no episode sections; rollouts from the actor: no policy
        "train": (["train", str(CHECKOUT / "configs" / "toy.yaml"), f"run.output_dir={t / 'runs'}"],
                  ("cuda_agent.trainer.stages:StageRunner", "_agent_options", AFTER), ()),
        "baselines": (["baselines", "backend=cpu", *evalset[:2]],
                      ("cuda_agent.evaluation.baselines", "measure_task_baselines"), ()),
    }


@pytest.mark.parametrize("command", ["data list", "data validate --no-run", "data validate", "data synthesize",
                                     "verify", "profile", "eval --solutions", "eval", "baselines", "train"])
def test_a_command_reads_every_key_it_declares_and_no_other(command, tiny_task, recorder, monkeypatch):
    import importlib

    monkeypatch.chdir(tiny_task)
    argv, stop, later = _dry_runs(tiny_task)[command]
    if stop is None:
        assert main(argv) == 0
    else:
        where, name, *returns = stop
        module, _, cls = where.partition(":")
        target = importlib.import_module(module)
        after = bool(returns) and returns[0] is AFTER
        _stop_at(monkeypatch, getattr(target, cls) if cls else target, name, keep={} if after else None,
                 returns=returns[0] if returns and not after else NOTHING)
        if returns and not after:
            assert main(argv) == 0
        else:
            _dry_run(argv)
    declared = _declared(command)
    if command == "train":  # what this run reads: the toy environment, rollouts from the actor
        from cuda_agent.trainer.cli import run_reads

        recorder._paused += 1
        declared = run_reads(recorder.roots[-1]).keys
        recorder._paused -= 1
        assert "backend" not in declared and "policy" not in declared
    unread = recorder.unread(tuple(k for k in declared if k not in later))
    assert unread == [], unread
    read = recorder.read_undeclared(declared)
    assert read == [], read


def test_train_on_the_toy_environment_refuses_the_episode_keys(capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert main(["train", str(CHECKOUT / "configs" / "toy.yaml"), "backend=cpu"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: backend has no effect on `cuda-agent train` (trainer.environment.name=toy, "
                          "trainer.rollout.engine=actor), which reads run, logging, trackers, trainer, agent;"), err
    assert not (tmp_path / "runs").exists()
