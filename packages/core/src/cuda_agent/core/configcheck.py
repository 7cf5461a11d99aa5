"""Type and range checks of the values of a composed run config.

A value is checked against the first of:

* the field of an options dataclass that a package registered for its section through
  the ``register_config_schemas`` hook (``agent`` -> ``AgentOptions``, ``service`` ->
  ``ServiceOptions``, ``trainer.stages[]`` -> ``StageSpec`` for every stage, ...): the
  field's annotation gives the type, its ``metadata`` may give bounds (:func:`bounds`);
* the default the base config and the plugins' fragments give the key: an integer
  default takes integers, a mapping takes a mapping, and so on. A null default takes
  anything.

Mappings named in ``OPEN_KEYS`` (plugin ``options`` among them) are left to their
plugin's own schema. A number written as a string (``"1e-3"``, which YAML files read as
text) is turned into the number its field asks for. Every problem is a one-line
:class:`~cuda_agent.core.errors.ConfigError` naming the key, what it takes and what it got.
"""

from __future__ import annotations

import dataclasses
import types
import typing
from typing import Any, Mapping

from omegaconf import DictConfig, ListConfig, OmegaConf

from .errors import ConfigError

Schemas = dict[str, type]  # section pattern ("agent", "trainer.stages[]") -> options dataclass


def bounds(min: float | None = None, max: float | None = None) -> dict:
    """Field metadata bounding a number: ``field(default=150, metadata=bounds(min=1))``."""
    out: dict = {}
    if min is not None:
        out["min"] = min
    if max is not None:
        out["max"] = max
    return out


def collect_schemas(pm: Any) -> Schemas:
    """The section schemas every loaded plugin registers (later registrations win)."""
    found: Schemas = {}

    def register(section: str, schema: type) -> None:
        if not dataclasses.is_dataclass(schema):
            raise ConfigError(f"config schema for {section!r} must be a dataclass, got {schema!r}")
        found[section] = schema

    hook = getattr(pm.hook, "register_config_schemas", None)
    if hook is not None:
        hook(register=register)
    return found


# --- one value against one type ---------------------------------------------------------

_NAMES = {int: "an integer", float: "a number", bool: "true or false", str: "a string",
          list: "a list", tuple: "a list", dict: "a mapping", type(None): "null"}


def _describe(tp: Any) -> str:
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        return " or ".join(_describe(a) for a in typing.get_args(tp))
    return _NAMES.get(origin or tp, getattr(tp, "__name__", str(tp)))


def _number(value: str, kind: type) -> Any:
    text = value.strip()
    try:
        return kind(text) if kind is int else float(text)
    except ValueError:
        return None


def coerce(value: Any, tp: Any) -> tuple[bool, Any]:
    """``(True, value)`` (possibly converted) when ``value`` fits the annotation ``tp``."""
    if tp is Any or tp is object:
        return True, value
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        args = typing.get_args(tp)
        for exact in (True, False):  # a member the value already is wins over a conversion
            for arg in args:
                ok, out = coerce(value, arg)
                if ok and (not exact or out is value or type(out) is type(value)):
                    return True, out
        return False, value
    if origin is typing.Literal:
        return value in typing.get_args(tp), value
    base = origin or tp
    if base is type(None):
        return value is None, value
    if base is bool:
        return isinstance(value, bool), value
    if base in (int, float):  # a float takes an integer too
        if isinstance(value, (int, float) if base is float else int) and not isinstance(value, bool):
            return True, value
        if isinstance(value, str):
            n = _number(value, base)
            return n is not None, n if n is not None else value
        return False, value
    if base is str:
        # numbers become text; a YAML yes/no/on/off read as a boolean does not
        if isinstance(value, str):
            return True, value
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return True, str(value)
        return False, value
    if base in (list, tuple, set, frozenset) or base is typing.Sequence:
        return isinstance(value, (list, tuple, ListConfig)), value
    if base in (dict, Mapping) or base is typing.Mapping:
        return isinstance(value, (dict, DictConfig)), value
    return True, value  # a type this check does not know: left to its user


def _shown(value: Any) -> str:
    if isinstance(value, (DictConfig, ListConfig)):
        value = OmegaConf.to_container(value, resolve=False)
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _check_bounds(where: str, value: Any, meta: Mapping) -> None:
    if not isinstance(value, (int, float)) or isinstance(value, bool):
        return
    lo, hi = meta.get("min"), meta.get("max")
    if lo is not None and value < lo:
        raise ConfigError(f"bad value for {where}: must be at least {lo:g}, got {value:g}")
    if hi is not None and value > hi:
        raise ConfigError(f"bad value for {where}: must be at most {hi:g}, got {value:g}")


def _fields(schema: type) -> dict[str, tuple[Any, Mapping]]:
    hints = typing.get_type_hints(schema)
    return {f.name: (hints.get(f.name, Any), f.metadata) for f in dataclasses.fields(schema)}


# --- the walk ------------------------------------------------------------------------------


def check_values(cfg: DictConfig, defaults: Any, schemas: Schemas, open_keys: set[str]) -> None:
    """Check (and convert in place) every value of ``cfg``; ``defaults`` is the plain
    mapping the base config and the fragments compose to."""
    fields_of: dict[str, dict] = {k: _fields(v) for k, v in schemas.items()}

    def check(where: str, value: Any, tp: Any, meta: Mapping) -> Any:
        ok, out = coerce(value, tp)
        if not ok:
            hint = ""
            if isinstance(value, bool) and coerce("text", tp)[0]:
                hint = " (YAML reads an unquoted yes/no/on/off as true or false: quote it, e.g. 'no')"
            raise ConfigError(f"bad value for {where}: expected {_describe(tp)}, got {_shown(value)}{hint}")
        _check_bounds(where, out, meta)
        return out

    def like_default(where: str, value: Any, default: Any) -> Any:
        if default is None or value is None:
            return value
        if isinstance(default, dict):
            tp: Any = dict
        elif isinstance(default, list):
            tp = list
        else:
            tp = float if isinstance(default, float) else type(default)
        ok, out = coerce(value, tp)
        if not ok:
            raise ConfigError(f"bad value for {where}: expected {_describe(tp)} (like the default "
                              f"{_shown(default)}), got {_shown(value)}")
        return out

    def visit(node: Any, pattern: str, where: str, default: Any) -> None:
        fields = fields_of.get(pattern, {})
        if isinstance(node, DictConfig):
            for key in list(node.keys()):
                key = str(key)
                sub_where = f"{where}.{key}" if where else key
                sub_pattern = f"{pattern}.{key}" if pattern else key
                try:
                    value = node[key]
                except Exception as exc:  # an interpolation that does not resolve
                    raise ConfigError(f"bad value for {sub_where}: {str(exc).splitlines()[0]}") from exc
                sub_default = default.get(key) if isinstance(default, dict) else None
                if key in fields:
                    tp, meta = fields[key]
                    new = check(sub_where, value, tp, meta)
                elif sub_pattern in fields_of:  # a section with a schema of its own
                    new = check(sub_where, value, dict | None, {})
                else:
                    new = like_default(sub_where, value, sub_default)
                if not isinstance(value, (DictConfig, ListConfig)) and new is not value:
                    node[key] = new
                if key in open_keys:
                    continue
                if isinstance(value, (DictConfig, ListConfig)):
                    visit(value, sub_pattern, sub_where, sub_default)
        elif isinstance(node, ListConfig):
            # list elements are typed by schemas only: a user's list replaces the default's
            for i, item in enumerate(node):
                if isinstance(item, (DictConfig, ListConfig)):
                    visit(item, f"{pattern}[]", f"{where}[{i}]", None)

    visit(cfg, "", "", defaults)


# --- one place for each default ------------------------------------------------------------

_NO_DEFAULT = object()


def field_default(f: dataclasses.Field) -> Any:
    """A field's default (its factory called), or ``_NO_DEFAULT`` for a field without one."""
    if f.default is not dataclasses.MISSING:
        return f.default
    if f.default_factory is not dataclasses.MISSING:  # type: ignore[misc]
        return f.default_factory()  # type: ignore[misc]
    return _NO_DEFAULT


def schema_defaults(schema: type) -> dict:
    """The defaults of an options dataclass as plain config values (nested dataclasses as
    mappings, tuples as lists): what a config fragment generated from it holds. Every field
    must have a default."""
    out: dict = {}
    for f in dataclasses.fields(schema):
        value = field_default(f)
        if value is _NO_DEFAULT:
            raise ConfigError(f"{schema.__name__}.{f.name} has no default to put in a config fragment")
        out[f.name] = _plain_value(value)
    return out


def _plain_value(value: Any) -> Any:
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {k: _plain_value(v) for k, v in dataclasses.asdict(value).items()}
    if isinstance(value, (list, tuple)):
        return [_plain_value(v) for v in value]
    if isinstance(value, dict):
        return {k: _plain_value(v) for k, v in value.items()}
    return value


def default_disagreements(defaults: Mapping, schemas: Schemas) -> list[str]:
    """Where the composed defaults (base config and fragments) and the options dataclasses
    that type their sections say different things, one line each:

    * a key whose fragment default differs from its field's default (both set by hand);
    * a field with no default whose key no fragment gives (a default nowhere);
    * a fragment key that is no field of the section's schema.

    Sections of list elements (``trainer.stages[]``) hold presets, not defaults, and a
    section whose default is null (``trainer.agent_defaults``) takes the dataclass's.
    """
    problems: list[str] = []

    def compare(node: Mapping, schema: type, path: str) -> None:
        names = {f.name for f in dataclasses.fields(schema)}
        for f in dataclasses.fields(schema):
            key, default = f"{path}.{f.name}", field_default(f)
            if f.name not in node:
                if default is _NO_DEFAULT:
                    problems.append(f"{key}: no default anywhere (no config fragment gives it and "
                                    f"{schema.__name__}.{f.name} has none)")
                continue
            value = node[f.name]
            if default is _NO_DEFAULT:
                continue
            if dataclasses.is_dataclass(default) and isinstance(value, Mapping):
                compare(value, type(default), key)
            elif not _same(value, _plain_value(default)):
                problems.append(f"{key}: the config fragment says {_shown(value)} but {schema.__name__}.{f.name} "
                                f"says {_shown(_plain_value(default))}; keep the default in one place")
        for k in node:
            if k not in names:
                problems.append(f"{path}.{k}: in a config fragment but no field of {schema.__name__}")

    for section, schema in sorted(schemas.items()):
        if "[]" in section:
            continue
        node: Any = defaults
        for part in section.split("."):
            node = node.get(part) if isinstance(node, Mapping) else None
        if isinstance(node, Mapping):
            compare(node, schema, section)
    return problems


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, Mapping) and isinstance(b, Mapping):
        return set(a) == set(b) and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    if isinstance(a, bool) or isinstance(b, bool):
        return a is b
    return a == b
