"""Plugin manager: built-ins, registration, validation, loading rules."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

import pytest

from cuda_agent.core import hookimpl, hookspecs
from cuda_agent.core.errors import ConfigError, PluginError
from cuda_agent.core.interfaces import RewardFunction, Tracker
from cuda_agent.core.plugins import PluginManager
from cuda_agent.core.types import RewardResult

REPO = Path(__file__).resolve().parents[3]


@dataclass
class _Opts:
    scale: float = 1.0
    label: str = "x"


class _ConstReward(RewardFunction):
    name = "const"
    description = "test reward"
    Options = _Opts

    def score(self, outcome):
        return RewardResult(value=self.options.scale, reward=self.name)


class _Plugin:
    @hookimpl
    def register_rewards(self, register):
        register(_ConstReward)


def test_builtins_are_registered_through_entry_points():
    pm = PluginManager()
    names = {p.name for p in pm.plugins()}
    assert {"core", "rewards"} <= names
    assert all(p.builtin for p in pm.plugins()), "tests must not auto-load third-party plugins"
    assert "jsonl" in pm.components("tracker")
    assert {"milestone", "speedup"} <= set(pm.components("reward"))
    info = pm.components("reward")["milestone"]
    assert info.plugin.distribution == "cuda-agent-rewards"
    assert re.match(r"\d+\.\d+", info.plugin.version)


def test_register_object_and_create_with_validated_options():
    pm = PluginManager(load_entry_points=False)
    pm.register(_Plugin(), "testplugin")
    reward = pm.create("reward", {"name": "const", "options": {"scale": 2.5}})
    assert isinstance(reward, _ConstReward)
    assert reward.options.scale == 2.5 and reward.options.label == "x"
    assert reward.score(None).value == 2.5


def test_unknown_option_names_closest():
    pm = PluginManager(load_entry_points=False)
    pm.register(_Plugin(), "testplugin")
    with pytest.raises(ConfigError, match=r"unknown option .*scal.*did you mean 'scale'"):
        pm.create("reward", {"name": "const", "options": {"scal": 2}})


def test_bad_option_type_is_one_line():
    pm = PluginManager(load_entry_points=False)
    pm.register(_Plugin(), "testplugin")
    with pytest.raises(ConfigError) as err:
        pm.create("reward", {"name": "const", "options": {"scale": "fast"}})
    assert "\n" not in err.value.one_line() and "scale" in str(err.value)


def test_unknown_component_names_closest():
    pm = PluginManager(load_entry_points=False)
    pm.register(_Plugin(), "testplugin")
    with pytest.raises(ConfigError, match="unknown reward 'cnst'.*did you mean 'const'"):
        pm.get("reward", "cnst")


def test_registration_rejects_wrong_kind():
    class BadPlugin:
        @hookimpl
        def register_rewards(self, register):
            register(_Tracker)

    class _Tracker(Tracker):
        name = "t"

        def log(self, step, metrics):
            pass

    pm = PluginManager(load_entry_points=False)
    pm.register(BadPlugin(), "bad")
    with pytest.raises(PluginError, match="does not derive from RewardFunction"):
        pm.components("reward")


def test_block_env_blocks_builtin(monkeypatch):
    monkeypatch.setenv("CUDA_AGENT_BLOCK_PLUGINS", "rewards")
    pm = PluginManager()
    assert "rewards" not in {p.name for p in pm.plugins()}
    assert "milestone" not in pm.components("reward")


def test_core_cannot_be_blocked(monkeypatch):
    monkeypatch.setenv("CUDA_AGENT_BLOCK_PLUGINS", "rewards, core")
    with pytest.raises(PluginError) as err:
        PluginManager()
    msg = err.value.one_line()
    assert "CUDA_AGENT_BLOCK_PLUGINS names 'core', a core built-in that cannot be blocked" in msg
    assert "\n" not in msg and "remove it from CUDA_AGENT_BLOCK_PLUGINS" in msg


def test_attached_hooks_are_called_and_not_listed_as_plugins():
    from cuda_agent.core.hookspecs import hookimpl

    class Listener:
        def __init__(self):
            self.steps = []

        @hookimpl
        def on_step_end(self, run, step, metrics):
            self.steps.append((step, dict(metrics)))

    pm = PluginManager(load_entry_points=False)
    listener = Listener()
    pm.attach(listener, "listener")
    pm.hook.on_step_end(run=None, step=3, metrics={"a": 1.0})
    assert listener.steps == [(3, {"a": 1.0})] and pm.plugins() == []
    pm.detach("listener")
    pm.detach("listener")  # twice: nothing left to remove
    pm.hook.on_step_end(run=None, step=4, metrics={})
    assert len(listener.steps) == 1


def test_only_env_names_missing_plugin(monkeypatch):
    monkeypatch.setenv("CUDA_AGENT_PLUGINS", "no-such-plugin")
    with pytest.raises(PluginError, match="no-such-plugin.*not installed"):
        PluginManager()


def test_every_hookspec_is_documented():
    doc = (REPO / "docs" / "plugins.md").read_text()
    specs = [
        name
        for name in dir(hookspecs)
        if callable(getattr(hookspecs, name))
        and hasattr(getattr(hookspecs, name), "cuda_agent_spec")
    ]
    assert len(specs) >= 18, specs
    missing = [s for s in specs if f"### {s}\n" not in doc]
    assert not missing, f"hook specs missing from docs/plugins.md: {missing}"
