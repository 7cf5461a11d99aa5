"""Run configuration: base YAML + plugin fragments + files + ``key=value`` overrides.

Component nodes are mappings ``{name, options}`` found under keys named after a
component kind (``policy``, ``sandbox``, ``compiler``, ``executor``, ``profiler``,
``reward``, ``dataset``, ``algorithm``) or inside lists named ``trackers``, ``checks``
or ``tools``. Their options are checked against the chosen plugin's schema and filled
with its defaults.

Keys are checked against the composed structure: an unknown key is a one-line
:class:`ConfigError` naming it and the closest valid keys. Mappings named ``options``
(and any node listed in ``OPEN_KEYS``) accept any keys.
"""

from __future__ import annotations

from importlib import resources
from pathlib import Path
from typing import Any, Iterable

import yaml
from omegaconf import DictConfig, ListConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from .errors import ConfigError, did_you_mean
from .plugins import PluginManager, get_plugin_manager

# key under which a component node sits -> component kind
SLOT_KINDS = {
    "policy": "policy",
    "sandbox": "sandbox",
    "compiler": "compiler",
    "executor": "executor",
    "profiler": "profiler",
    "reward": "reward",
    "dataset": "dataset",
    "algorithm": "algorithm",
    "tracker": "tracker",
}
# list key -> kind of its elements
LIST_SLOT_KINDS = {"trackers": "tracker", "checks": "correctness_check", "tools": "agent_tool"}
# mappings whose keys are free-form
OPEN_KEYS = {"options", "metadata", "env", "extra", "sampling", "verify_options", "profile_options"}


def base_config() -> DictConfig:
    text = resources.files("cuda_agent.core").joinpath("configs/base.yaml").read_text()
    return OmegaConf.create(yaml.safe_load(text))


def _load_fragment(source: str, fragment: Any) -> DictConfig:
    if isinstance(fragment, (str, Path)):
        path = Path(fragment)
        if not path.exists():
            raise ConfigError(f"config fragment of {source!r} not found: {path}")
        return load_yaml(path)
    return OmegaConf.create(fragment)


def load_yaml(path: str | Path) -> DictConfig:
    path = Path(path)
    if not path.exists():
        raise ConfigError(f"config file not found: {path}")
    try:
        data = yaml.safe_load(path.read_text()) or {}
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f":{mark.line + 1}" if mark is not None else ""
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        raise ConfigError(f"{path}{where}: invalid YAML: {problem}") from exc
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: a config file must hold a mapping, got {type(data).__name__}")
    return OmegaConf.create(data)


def fragments(pm: PluginManager) -> list[tuple[str, DictConfig]]:
    out: list[tuple[str, DictConfig]] = []

    def register(source: str, fragment: Any) -> None:
        out.append((source, _load_fragment(source, fragment)))

    pm.hook.register_config_fragments(register=register)
    return out


def parse_overrides(overrides: Iterable[str]) -> DictConfig:
    items = list(overrides)
    for item in items:
        if "=" not in item:
            raise ConfigError(f"override {item!r} is not of the form key=value")
    try:
        return OmegaConf.from_dotlist(items)
    except OmegaConfBaseException as exc:
        raise ConfigError(f"bad override: {str(exc).splitlines()[0]}") from exc


def check_keys(known: Any, given: Any, source: str, path: str = "") -> None:
    """Raise ConfigError for a key in ``given`` that ``known`` does not have."""
    if not isinstance(given, DictConfig) or not isinstance(known, DictConfig):
        return
    for key in given.keys():
        full = f"{path}.{key}" if path else str(key)
        if key not in known:
            raise ConfigError(
                f"unknown config key {full!r} (in {source}); "
                + did_you_mean(full, [f"{path}.{k}" if path else str(k) for k in known.keys()])
            )
        if key in OPEN_KEYS:
            continue
        try:
            sub_known = known[key]
            sub_given = given[key]
        except OmegaConfBaseException:
            continue
        check_keys(sub_known, sub_given, source, full)


def compose(
    files: Iterable[str | Path] = (),
    overrides: Iterable[str] = (),
    pm: PluginManager | None = None,
    validate: bool = True,
) -> DictConfig:
    """Compose the run config; validate components when ``validate``."""
    pm = pm or get_plugin_manager()
    cfg = base_config()
    for _source, frag in fragments(pm):
        cfg = OmegaConf.merge(cfg, frag)
    layers: list[tuple[str, DictConfig]] = [(str(f), load_yaml(f)) for f in files]
    ov = list(overrides)
    if ov:
        layers.append(("overrides", parse_overrides(ov)))
    for source, layer in layers:
        check_keys(cfg, layer, source)
        try:
            cfg = OmegaConf.merge(cfg, layer)
        except OmegaConfBaseException as exc:
            raise ConfigError(f"{source}: {str(exc).splitlines()[0]}") from exc
    if validate:
        validate_components(cfg, pm)
    return cfg


def validate_components(cfg: DictConfig, pm: PluginManager) -> None:
    """Check every component node and fill in its options' defaults."""

    def visit(node: Any, path: str) -> None:
        if isinstance(node, DictConfig):
            for key in list(node.keys()):
                if key in OPEN_KEYS:
                    continue
                child = node[key]
                full = f"{path}.{key}" if path else str(key)
                if key in SLOT_KINDS and isinstance(child, DictConfig) and "name" in child:
                    _fill(child, SLOT_KINDS[key], full)
                elif key in LIST_SLOT_KINDS and isinstance(child, ListConfig):
                    for i, item in enumerate(child):
                        if isinstance(item, DictConfig) and "name" in item:
                            _fill(item, LIST_SLOT_KINDS[key], f"{full}[{i}]")
                else:
                    visit(child, full)
        elif isinstance(node, ListConfig):
            for i, item in enumerate(node):
                visit(item, f"{path}[{i}]")

    def _fill(node: DictConfig, kind: str, where: str) -> None:
        extra = set(node.keys()) - {"name", "options"}
        if extra:
            key = sorted(map(str, extra))[0]
            raise ConfigError(f"unknown key {where}.{key}; {did_you_mean(key, ['name', 'options'])}")
        if node.name is None:
            return
        opts = pm.validate_options(kind, node.name, node.get("options") or {}, where)
        node.options = OmegaConf.structured(opts)

    visit(cfg, "")


def to_yaml(cfg: DictConfig) -> str:
    return OmegaConf.to_yaml(cfg, resolve=True)
