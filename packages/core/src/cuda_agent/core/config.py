"""Run configuration: base YAML + plugin fragments + files + ``key=value`` overrides.

Component nodes are mappings ``{name, options}`` found under keys named after a
component kind (``policy``, ``sandbox``, ``compiler``, ``executor``, ``profiler``,
``reward``, ``dataset``, ``algorithm``, ``environment``) or inside lists named ``trackers``, ``checks``
or ``tools``. Their options are checked against the chosen plugin's schema and filled
with its defaults.

Keys are checked against the composed structure: an unknown key is a one-line
:class:`ConfigError` naming it and the closest valid keys. Mappings named ``options``
(and any node listed in ``OPEN_KEYS``) accept any keys. Values are then checked for type
and range (:mod:`.configcheck`), with the same kind of one-line errors. A command that
declares what it reads (:mod:`.configreads`) refuses an override of any other key.
"""

from __future__ import annotations

from importlib import resources
from pathlib import Path
from typing import Any, Iterable

import yaml
from omegaconf import DictConfig, ListConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from .configcheck import check_values, collect_schemas, schema_defaults
from .configreads import Reads, check_overrides
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
    "environment": "environment",  # trainer.environment; the top-level environment: section names none
}
# list key -> kind of its elements
LIST_SLOT_KINDS = {"trackers": "tracker", "checks": "correctness_check", "tools": "agent_tool"}
# mappings whose keys are free-form
OPEN_KEYS = {"options", "metadata", "env", "extra", "sampling", "verify_options", "profile_options", "judge"}


def base_config() -> DictConfig:
    """``configs/base.yaml`` and the ``agent:`` section, made from :class:`AgentOptions`'s defaults."""
    from .agent.loop import AgentOptions

    text = resources.files("cuda_agent.core").joinpath("configs/base.yaml").read_text()
    cfg = OmegaConf.create(yaml.safe_load(text))
    cfg.agent = schema_defaults(AgentOptions)
    return cfg


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


def parse_override(item: str) -> tuple[str, Any]:
    """``key=value`` split into its key and the value read as YAML (as omegaconf reads it)."""
    if "=" not in item:
        raise ConfigError(f"override {item!r} is not of the form key=value")
    key, raw = item.split("=", 1)
    key = key.strip()
    if not key:
        raise ConfigError(f"override {item!r} has no key before '='")
    try:
        value = OmegaConf.from_dotlist([f"value={raw}"])["value"]
    except Exception as exc:  # yaml's parser errors are not omegaconf's
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        raise ConfigError(f"bad override {item!r}: the value is not valid YAML ({problem})") from exc
    if isinstance(value, (DictConfig, ListConfig)):
        value = OmegaConf.to_container(value, resolve=False)
    return key, value


def _check_override_key(cfg: DictConfig, key: str, value: Any) -> None:
    """An override's key must exist in the config composed so far (list items by index)."""
    node: Any = cfg
    path = ""
    for part in key.split("."):
        if isinstance(node, ListConfig):
            if not part.lstrip("-").isdigit() or not -len(node) <= int(part) < len(node):
                raise ConfigError(f"bad override key {key!r}: {path} is a list of {len(node)} item(s), "
                                  f"{part!r} is not an index in it")
            return  # list items are checked by their schemas when the config is complete
        if not isinstance(node, DictConfig):
            return  # under a null or a scalar: the value check decides
        full = f"{path}.{part}" if path else part
        if part not in node:
            raise _unknown_key(full, path, node, "overrides")
        if part in OPEN_KEYS:
            return
        try:
            node = node[part]
        except OmegaConfBaseException:
            return  # an interpolation: the value check reports it
        path = full
    if isinstance(value, dict) and isinstance(node, DictConfig):
        check_keys(node, OmegaConf.create(value), "overrides", path)


def apply_override(cfg: DictConfig, item: str) -> None:
    """Set one ``key=value`` in ``cfg`` (mappings are merged, lists and scalars replaced)."""
    key, value = parse_override(item)
    _check_override_key(cfg, key, value)
    try:
        existing = OmegaConf.select(cfg, key, throw_on_missing=False)
    except OmegaConfBaseException:
        existing = None
    if isinstance(existing, DictConfig) and value is not None and not isinstance(value, dict):
        shown = repr(value) if len(repr(value)) <= 60 else repr(value)[:57] + "..."
        raise ConfigError(f"bad value for {key}: expected a mapping (or {key}.KEY=VALUE), got {shown}")
    try:
        OmegaConf.update(cfg, key, value, merge=True)
    except Exception as exc:
        raise ConfigError(f"bad override {item!r}: {str(exc).splitlines()[0]}") from exc


def _unknown_key(full: str, path: str, known: DictConfig, source: str) -> ConfigError:
    return ConfigError(f"unknown config key {full!r} (in {source}); "
                       + did_you_mean(full, [f"{path}.{k}" if path else str(k) for k in known.keys()]))


def check_keys(known: Any, given: Any, source: str, path: str = "") -> None:
    """Raise ConfigError for a key in ``given`` that ``known`` does not have."""
    if not isinstance(given, DictConfig) or not isinstance(known, DictConfig):
        return
    for key in given.keys():
        full = f"{path}.{key}" if path else str(key)
        if key not in known:
            raise _unknown_key(full, path, known, source)
        if key in OPEN_KEYS:
            continue
        try:
            sub_known = known[key]
            sub_given = given[key]
        except OmegaConfBaseException:
            continue
        check_keys(sub_known, sub_given, source, full)


def default_config(pm: PluginManager | None = None) -> DictConfig:
    """The base config with every plugin's fragments merged over it: the defaults of a run."""
    cfg = base_config()
    for _source, frag in fragments(pm or get_plugin_manager()):
        cfg = OmegaConf.merge(cfg, frag)
    return cfg


def compose(
    files: Iterable[str | Path] = (),
    overrides: Iterable[str] = (),
    pm: PluginManager | None = None,
    validate: bool = True,
    reads: Reads | None = None,
) -> DictConfig:
    """Compose the run config; validate components when ``validate``. ``reads``: what the
    command reads (:mod:`.configreads`); an override of any other key is refused."""
    pm = pm or get_plugin_manager()
    overrides = list(overrides)
    cfg = default_config(pm)
    defaults = OmegaConf.to_container(cfg, resolve=False)
    for f in files:
        source, layer = str(f), load_yaml(f)
        check_keys(cfg, layer, source)
        try:
            cfg = OmegaConf.merge(cfg, layer)
        except Exception as exc:
            raise ConfigError(f"{source}: {str(exc).splitlines()[0]}") from exc
    for item in overrides:
        apply_override(cfg, item)
    if reads is not None:
        check_overrides(reads, [parse_override(item) for item in overrides])
    if validate:
        check_values(cfg, defaults, collect_schemas(pm), OPEN_KEYS)
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
