"""Defaults in one place: a config section's default lives in its YAML fragment or in its
options dataclass, never in both by hand. Where both give one they must agree, and a field
without a default must get one from a fragment."""

from __future__ import annotations

from dataclasses import dataclass, field

from omegaconf import OmegaConf

from cuda_agent.core.agent import AgentOptions
from cuda_agent.core.config import base_config, compose
from cuda_agent.core.configcheck import default_disagreements, schema_defaults


def test_every_installed_section_has_its_defaults_in_one_place(plugintester):
    """Every section a built-in (or an installed plugin) types with an options dataclass."""
    assert plugintester.default_disagreements() == []


@dataclass
class Inner:
    depth: int = 2


@dataclass
class Opts:
    size: int = 4
    name: str = "a"
    typed_only: float = field(default=0.5)
    inner: Inner = field(default_factory=Inner)


@dataclass
class TypesOnly:
    rate: float = field(metadata={"min": 0})


def test_disagreements_are_found_one_line_each():
    schemas = {"sec": Opts, "only": TypesOnly, "listed[]": Opts}
    defaults = {"sec": {"size": 4, "name": "b", "inner": {"depth": 3}, "stray": 1}, "only": {},
                "listed": [{"size": 99}]}
    problems = default_disagreements(defaults, schemas)
    assert problems == [
        "only.rate: no default anywhere (no config fragment gives it and TypesOnly.rate has none)",
        "sec.name: the config fragment says 'b' but Opts.name says 'a'; keep the default in one place",
        "sec.inner.depth: the config fragment says 3 but Inner.depth says 2; keep the default in one place",
        "sec.stray: in a config fragment but no field of Opts",
    ]
    agreeing = {"sec": {"size": 4, "name": "a", "inner": {"depth": 2}}, "only": {"rate": 1.0}}
    assert default_disagreements(agreeing, schemas) == []
    assert default_disagreements({"sec": {"size": True}}, {"sec": Opts}) != []  # true is not 4


def test_generated_sections_hold_the_dataclass_defaults():
    assert schema_defaults(Opts) == {"size": 4, "name": "a", "typed_only": 0.5, "inner": {"depth": 2}}
    assert OmegaConf.to_container(base_config().agent) == schema_defaults(AgentOptions)
    cfg = compose([], ["agent.max_turns=7"])
    assert cfg.agent.max_turns == 7 and cfg.agent.context_tokens == AgentOptions().context_tokens
