"""Finding, loading and building plugins.

Two entry-point groups:

* ``cuda_agent.builtin``: the project's own distributions (core, sandbox, rewards, ...).
  Always loaded, unless blocked.
* ``cuda_agent``: third-party plugins. Loaded automatically unless
  ``CUDA_AGENT_DISABLE_PLUGIN_AUTOLOAD`` is set (the test suite sets it).

Environment variables:

* ``CUDA_AGENT_PLUGINS=a,b``: load only these third-party plugins (also when autoload is off).
* ``CUDA_AGENT_BLOCK_PLUGINS=a,b``: never load these plugins (built-in or not; ``core``, which
  every command stands on, cannot be blocked).
* ``CUDA_AGENT_DISABLE_PLUGIN_AUTOLOAD=1``: load no third-party plugin unless named above.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import threading
from dataclasses import dataclass
from importlib import metadata
from typing import Any, Iterable, Iterator

import pluggy

from . import hookspecs
from .errors import ConfigError, PluginError, did_you_mean
from .interfaces import HOOK_FOR_KIND, KINDS, Component

BUILTIN_GROUP = "cuda_agent.builtin"
THIRD_PARTY_GROUP = "cuda_agent"
ENV_ONLY = "CUDA_AGENT_PLUGINS"
ENV_BLOCK = "CUDA_AGENT_BLOCK_PLUGINS"
ENV_NO_AUTOLOAD = "CUDA_AGENT_DISABLE_PLUGIN_AUTOLOAD"
# built-ins that cannot be blocked: the base of every command (base config, tools, trackers, policies)
UNBLOCKABLE = ("core",)


@dataclass
class PluginInfo:
    name: str
    module: str
    distribution: str
    version: str
    builtin: bool


@dataclass
class ComponentInfo:
    kind: str
    name: str
    cls: type
    plugin: PluginInfo


def _csv_env(var: str) -> set[str]:
    return {x.strip() for x in os.environ.get(var, "").split(",") if x.strip()}


def blocked_plugins() -> set[str]:
    """The plugins ``CUDA_AGENT_BLOCK_PLUGINS`` names; naming a core built-in is an error."""
    blocked = _csv_env(ENV_BLOCK)
    core = sorted(blocked & set(UNBLOCKABLE))
    if core:
        raise PluginError(f"{ENV_BLOCK} names {core[0]!r}, a core built-in that cannot be blocked (every command "
                          f"needs its base config, tools, trackers and policies); remove it from {ENV_BLOCK}")
    return blocked


class PluginManager:
    def __init__(self, load_entry_points: bool = True):
        self.pm = pluggy.PluginManager(hookspecs.PROJECT)
        self.pm.add_hookspecs(hookspecs)
        self.infos: dict[str, PluginInfo] = {}
        self._components: dict[str, dict[str, ComponentInfo]] | None = None
        self._lock = threading.Lock()
        if load_entry_points:
            self.load_entry_points()

    @property
    def hook(self):
        return self.pm.hook

    # -- loading -------------------------------------------------------------------

    def load_entry_points(self) -> None:
        blocked = blocked_plugins()
        only = _csv_env(ENV_ONLY)
        autoload = not os.environ.get(ENV_NO_AUTOLOAD)
        eps = metadata.entry_points()
        for group, builtin in ((BUILTIN_GROUP, True), (THIRD_PARTY_GROUP, False)):
            for ep in sorted(eps.select(group=group), key=lambda e: e.name):
                if ep.name in blocked or ep.name in self.infos:
                    continue
                if not builtin:
                    if only and ep.name not in only:
                        continue
                    if not only and not autoload:
                        continue
                try:
                    module = ep.load()
                except Exception as exc:  # a broken plugin must not take the CLI down
                    raise PluginError(
                        f"plugin {ep.name!r} ({ep.value}) failed to import: {type(exc).__name__}: {exc}"
                    ) from exc
                dist = ep.dist.name if ep.dist else "?"
                version = ep.dist.version if ep.dist else "?"
                self.register(module, ep.name, distribution=dist, version=version, builtin=builtin)
        missing = only - set(self.infos)
        if missing:
            known = [e.name for e in eps.select(group=THIRD_PARTY_GROUP)]
            name = sorted(missing)[0]
            raise PluginError(
                f"{ENV_ONLY} names plugin {name!r}, which is not installed; {did_you_mean(name, known)}"
            )

    def register(
        self,
        plugin: Any,
        name: str,
        distribution: str = "?",
        version: str = "?",
        builtin: bool = False,
    ) -> None:
        """Register a module or object holding hook implementations."""
        if name in blocked_plugins():
            return
        self.pm.register(plugin, name=name)
        module = getattr(plugin, "__name__", type(plugin).__name__)
        self.infos[name] = PluginInfo(name, module, distribution, version, builtin)
        self._components = None

    def unregister(self, name: str) -> None:
        self.pm.unregister(name=name)
        self.infos.pop(name, None)
        self._components = None

    def attach(self, hooks: Any, name: str) -> None:
        """Add an object's hook implementations for a while (a run's trackers, a training
        stage's checkpointing); it is not a plugin: not listed, not versioned."""
        self.pm.register(hooks, name=name)

    def detach(self, name: str) -> None:
        """Remove what :meth:`attach` added (nothing when it is not attached)."""
        if self.pm.has_plugin(name):
            self.pm.unregister(name=name)

    def plugins(self) -> list[PluginInfo]:
        return list(self.infos.values())

    # -- components ----------------------------------------------------------------

    def _collect(self) -> dict[str, dict[str, ComponentInfo]]:
        with self._lock:
            if self._components is not None:
                return self._components
            found: dict[str, dict[str, ComponentInfo]] = {k: {} for k in KINDS}
            for kind, hook_name in HOOK_FOR_KIND.items():
                caller = getattr(self.pm.hook, hook_name)
                for impl in reversed(caller.get_hookimpls()):  # registration order
                    info = self.infos.get(impl.plugin_name) or PluginInfo(
                        impl.plugin_name, "?", "?", "?", False
                    )

                    def register(cls: type, _kind=kind, _info=info) -> None:
                        _check_component(cls, _kind)
                        # later registrations (third party) replace earlier ones by name
                        found[_kind][cls.name] = ComponentInfo(_kind, cls.name, cls, _info)

                    impl.function(register=register)
            self._components = found
            return found

    def components(self, kind: str) -> dict[str, ComponentInfo]:
        if kind not in KINDS:
            raise PluginError(f"unknown component kind {kind!r}; {did_you_mean(kind, KINDS)}")
        return dict(self._collect()[kind])

    def all_components(self) -> list[ComponentInfo]:
        out = []
        for kind, comps in self._collect().items():
            out.extend(comps[n] for n in sorted(comps))
        return out

    def get(self, kind: str, name: str, where: str = "") -> type:
        comps = self.components(kind)
        if name not in comps:
            at = f" at {where}" if where else ""
            raise ConfigError(
                f"unknown {kind} {name!r}{at}; {did_you_mean(name, comps)}"
            )
        return comps[name].cls

    def validate_options(self, kind: str, name: str, options: Any, where: str = "") -> Any:
        """Check ``options`` against the plugin's schema; returns an Options instance."""
        from omegaconf import OmegaConf
        from omegaconf.errors import OmegaConfBaseException

        cls = self.get(kind, name, where)
        schema = cls.Options
        given = _plain(options) or {}
        if not isinstance(given, dict):
            raise ConfigError(f"options of {kind} {name!r} must be a mapping, got {given!r}")
        fields = [f.name for f in dataclasses.fields(schema)]
        for key in given:
            if key not in fields:
                at = f"{where}.options." if where else ""
                raise ConfigError(
                    f"unknown option {at}{key} for {kind} {name!r}; {did_you_mean(key, fields)}"
                )
        try:
            merged = OmegaConf.merge(OmegaConf.structured(schema), given)
            return OmegaConf.to_object(merged)
        except OmegaConfBaseException as exc:
            msg = str(exc).splitlines()[0]
            key = getattr(exc, "full_key", None) or getattr(exc, "key", None)
            at = f"{where}.options.{key}" if where and key else (f"options.{key}" if key else where)
            raise ConfigError(f"bad option {at} for {kind} {name!r}: {msg}") from exc

    def create(self, kind: str, spec: Any, where: str = "", **kwargs: Any) -> Any:
        """Build a component from ``{name, options}`` (a mapping or DictConfig)."""
        spec = _plain(spec)
        if isinstance(spec, str):
            spec = {"name": spec}
        if not isinstance(spec, dict) or "name" not in spec:
            raise ConfigError(f"{where or kind} must be a mapping with a 'name', got {spec!r}")
        unknown = set(spec) - {"name", "options"}
        if unknown:
            key = sorted(unknown)[0]
            raise ConfigError(
                f"unknown key {where + '.' if where else ''}{key}; {did_you_mean(key, ['name', 'options'])}"
            )
        cls = self.get(kind, spec["name"], where)
        opts = self.validate_options(kind, spec["name"], spec.get("options") or {}, where)
        return cls(opts, **kwargs)


def _plain(obj: Any) -> Any:
    try:
        from omegaconf import DictConfig, ListConfig, OmegaConf

        if isinstance(obj, (DictConfig, ListConfig)):
            return OmegaConf.to_container(obj, resolve=True)
    except ImportError:  # pragma: no cover
        pass
    return obj


def _check_component(cls: Any, kind: str) -> None:
    base = KINDS[kind]
    if not (isinstance(cls, type) and issubclass(cls, Component)):
        raise PluginError(f"{kind} registration got {cls!r}, which is not a component class")
    if not issubclass(cls, base):
        raise PluginError(f"{cls.__name__} registered as a {kind} but does not derive from {base.__name__}")
    if not cls.name:
        raise PluginError(f"{cls.__name__} has no 'name'")
    if not dataclasses.is_dataclass(cls.Options):
        raise PluginError(f"{cls.__name__}.Options must be a dataclass")


_default: PluginManager | None = None
_default_lock = threading.Lock()


def get_plugin_manager() -> PluginManager:
    """The process-wide plugin manager, built on first use."""
    global _default
    with _default_lock:
        if _default is None:
            _default = PluginManager()
        return _default


@contextlib.contextmanager
def plugin_manager_in_use(pm: PluginManager) -> Iterator[PluginManager]:
    """Make ``pm`` the process-wide plugin manager inside the block (what the commands use)."""
    global _default
    with _default_lock:
        before, _default = _default, pm
    try:
        yield pm
    finally:
        with _default_lock:
            _default = before


def reset_plugin_manager() -> None:
    global _default
    with _default_lock:
        _default = None


def plugin_versions(pm: PluginManager) -> list[dict]:
    return [dataclasses.asdict(i) for i in pm.plugins()]


def iter_kinds() -> Iterable[str]:
    return KINDS.keys()
