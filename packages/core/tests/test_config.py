"""Config composition: base + fragments + files + overrides; one-line errors."""

from __future__ import annotations

import json

import pytest
import yaml

from cuda_agent.core.config import compose, to_yaml
from cuda_agent.core.errors import ConfigError


def test_compose_base_and_plugin_fragments():
    cfg = compose()
    assert cfg.agent.max_turns == 150
    assert cfg.agent.context_tokens == 131072
    # the rewards plugin ships the reward section; its options get schema defaults
    assert cfg.reward.name == "milestone"
    assert cfg.reward.options.margin == 0.05


def test_files_then_overrides(tmp_path):
    f = tmp_path / "run.yaml"
    f.write_text(yaml.safe_dump({"agent": {"max_turns": 7}, "reward": {"name": "speedup"}}))
    cfg = compose([f], ["agent.max_turns=9", "reward.options.baseline=eager"])
    assert cfg.agent.max_turns == 9
    assert cfg.reward.name == "speedup"
    assert cfg.reward.options.baseline == "eager"
    assert "cap" in cfg.reward.options  # defaults of the newly chosen plugin


@pytest.mark.parametrize(
    "override, pattern",
    [
        ("agent.max_turn=3", r"unknown config key 'agent.max_turn'.*'agent.max_turns'"),
        ("rewrd.name=x", r"unknown config key 'rewrd'.*'reward'"),
        ("reward.name=milstone", r"unknown reward 'milstone'.*'milestone'"),
        ("reward.options.margn=0.1", r"unknown option reward.options.margn.*'margin'"),
        ("reward.nme=x", r"unknown config key 'reward.nme'.*'reward.name'"),
        ("agent.max_turns", r"not of the form key=value"),
    ],
)
def test_typos_are_one_line_errors(override, pattern):
    with pytest.raises(ConfigError, match=pattern) as err:
        compose([], [override])
    assert "\n" not in err.value.one_line()


def test_typo_in_file_names_the_file(tmp_path):
    f = tmp_path / "bad.yaml"
    f.write_text("agent:\n  max_trns: 3\n")
    with pytest.raises(ConfigError, match=r"bad.yaml"):
        compose([f])


def test_invalid_yaml_names_line(tmp_path):
    f = tmp_path / "broken.yaml"
    f.write_text("agent:\n  max_turns: [1, 2\n")
    with pytest.raises(ConfigError, match=r"broken.yaml:\d+: invalid YAML"):
        compose([f])


def test_missing_file():
    with pytest.raises(ConfigError, match="config file not found"):
        compose(["/nonexistent/run.yaml"])


def test_resolved_yaml_round_trips():
    text = to_yaml(compose([], ["run.seed=3"]))
    data = yaml.safe_load(text)
    assert data["run"]["seed"] == 3
    json.dumps(data)
