"""Our agent tools as the typed, documented Python methods TRL exposes to the model.

TRL reads a tool's schema from its signature and Google-style docstring
(``transformers.utils.get_json_schema``) and calls it with the parsed arguments as
keywords. :func:`tool_method` builds such a function from a tool's OpenAI schema; the
method forwards the call to ``self._call(tool_name, arguments)``.
"""

from __future__ import annotations

import inspect
import keyword
import re
from typing import Any, Callable

_SCALARS: dict[str, Any] = {"string": str, "integer": int, "number": float, "boolean": bool, "object": dict}


def python_type(prop: dict) -> Any:
    """The type hint that makes transformers write back the JSON schema type ``prop``."""
    kind = prop.get("type", "string")
    if isinstance(kind, list):  # ["string", "null"]: the first real type
        kind = next((k for k in kind if k != "null"), "string")
    if kind == "array":
        return list[python_type(prop.get("items") or {"type": "string"})]
    return _SCALARS.get(kind, str)


def method_name(tool_name: str) -> str:
    """A Python identifier for a tool name (``-`` and other characters become ``_``)."""
    name = re.sub(r"\W", "_", tool_name)
    if not name or name[0].isdigit() or keyword.iskeyword(name):
        name = f"tool_{name}"
    return name


def _one_line(text: str) -> str:
    return " ".join(str(text or "").split())


def tool_method(schema: dict) -> Callable[..., Any]:
    """A method ``(self, **arguments) -> str`` whose signature and docstring state ``schema``."""
    fn = schema.get("function", schema)
    tool_name = fn["name"]
    params = fn.get("parameters") or {}
    props: dict = params.get("properties") or {}
    required = set(params.get("required") or [])
    names = {p: method_name(p) for p in props}

    def method(self: Any, **kwargs: Any) -> str:
        back = {v: k for k, v in names.items()}
        return self._call(tool_name, {back.get(k, k): v for k, v in kwargs.items()})

    parameters = [inspect.Parameter("self", inspect.Parameter.POSITIONAL_OR_KEYWORD)]
    annotations: dict[str, Any] = {}
    ordered = [p for p in props if p in required] + [p for p in props if p not in required]
    for prop in ordered:
        hint = python_type(props[prop])
        default = inspect.Parameter.empty if prop in required else None
        parameters.append(inspect.Parameter(names[prop], inspect.Parameter.KEYWORD_ONLY, default=default,
                                            annotation=hint))
        annotations[names[prop]] = hint
    annotations["return"] = str
    args = "\n".join(f"    {names[p]}: {_one_line(props[p].get('description')) or p}" for p in ordered)
    doc = _one_line(fn.get("description")) or tool_name
    method.__doc__ = f"{doc}\n\nArgs:\n{args}\n\nReturns:\n    The tool's output." if args else \
        f"{doc}\n\nReturns:\n    The tool's output."
    method.__name__ = method.__qualname__ = method_name(tool_name)
    method.__signature__ = inspect.Signature(parameters, return_annotation=str)  # type: ignore[attr-defined]
    method.__annotations__ = annotations
    return method
