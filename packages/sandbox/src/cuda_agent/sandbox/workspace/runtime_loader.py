"""cuda_agent_runtime: load the kernels built from this workspace.

This file is copied, read-only, into every workspace as ``cuda_agent_runtime.py``.
It depends on the Python standard library and torch only, so it runs wherever the
workspace is visible (the agent's shell, an executor worker, a container).

    from cuda_agent_runtime import load_kernels
    kernels = load_kernels()

* With the ``cpp_extension`` compiler the result is the compiled torch extension module:
  its attributes are the functions your ``*_binding.cpp`` files registered.
* With the ``nvcc`` and ``gxx`` compilers the result wraps the shared library: its
  attributes are your ``extern "C"`` functions. Call them with torch tensors (their data
  pointer is passed; tensors must be contiguous and on the right device), Python ints and
  floats; argument types come from the function's C declaration.

Build first (``python tools/compile.py``); the build writes ``.cuda_agent/build/manifest.json``
which names the library of the latest successful build.
"""

from __future__ import annotations

import ctypes
import importlib.machinery
import importlib.util
import json
import os
import threading

__all__ = ["load_kernels", "KernelsNotBuilt", "KernelLibrary"]

_HERE = os.path.dirname(os.path.abspath(__file__))
_lock = threading.Lock()
_loaded: dict = {}


class KernelsNotBuilt(RuntimeError):
    """No successful build was found for this workspace."""


_CTYPES = {
    "void": None,
    "ptr": ctypes.c_void_p,
    "bool": ctypes.c_bool,
    "i8": ctypes.c_int8,
    "u8": ctypes.c_uint8,
    "i16": ctypes.c_int16,
    "u16": ctypes.c_uint16,
    "i32": ctypes.c_int32,
    "u32": ctypes.c_uint32,
    "i64": ctypes.c_int64,
    "u64": ctypes.c_uint64,
    "f32": ctypes.c_float,
    "f64": ctypes.c_double,
}


def _manifest(workspace: str) -> dict:
    path = os.path.join(workspace, ".cuda_agent", "build", "manifest.json")
    try:
        with open(path, encoding="utf-8") as f:
            return json.load(f)
    except FileNotFoundError:
        raise KernelsNotBuilt(
            f"no build found in {workspace}: run `python tools/compile.py` first"
        ) from None


class KernelFunction:
    """One ``extern "C"`` function; converts tensors/ints/floats to its C argument types."""

    def __init__(self, name: str, cfunc, argtypes: list, restype: str, device_type: str):
        self.__name__ = name
        self._f = cfunc
        self._kinds = list(argtypes)
        self._device = device_type
        self._f.argtypes = [_CTYPES[a] for a in argtypes]
        self._f.restype = _CTYPES[restype]

    def _convert(self, i: int, kind: str, value):
        if kind == "ptr":
            if value is None or isinstance(value, int):
                return value
            data_ptr = getattr(value, "data_ptr", None)
            if data_ptr is None:
                raise TypeError(
                    f"{self.__name__}: argument {i + 1} is a pointer; pass a torch tensor, "
                    f"an int address or None, not {type(value).__name__}"
                )
            if not value.is_contiguous():
                raise TypeError(
                    f"{self.__name__}: argument {i + 1} is not contiguous; pass t.contiguous()"
                )
            if self._device and value.device.type != self._device:
                raise TypeError(
                    f"{self.__name__}: argument {i + 1} is on {value.device}, "
                    f"the kernels expect {self._device} tensors"
                )
            return data_ptr()
        if hasattr(value, "item") and getattr(value, "numel", lambda: 0)() == 1:
            value = value.item()
        if kind in ("f32", "f64"):
            return float(value)
        if kind == "bool":
            return bool(value)
        if isinstance(value, float):
            raise TypeError(
                f"{self.__name__}: argument {i + 1} is an integer ({kind}), got a float"
            )
        return int(value)

    def __call__(self, *args):
        if len(args) != len(self._kinds):
            raise TypeError(
                f"{self.__name__} takes {len(self._kinds)} arguments, got {len(args)}"
            )
        return self._f(*[self._convert(i, k, a) for i, (k, a) in enumerate(zip(self._kinds, args))])

    def __repr__(self) -> str:
        return f"<kernel function {self.__name__}({', '.join(self._kinds)})>"


class KernelLibrary:
    """The shared library of a build; attributes are its ``extern "C"`` functions."""

    def __init__(self, path: str, functions: dict, device_type: str):
        self.path = path
        self._lib = ctypes.CDLL(path, mode=ctypes.RTLD_LOCAL)
        self._functions = {}
        for name, sig in functions.items():
            self._functions[name] = KernelFunction(
                name, getattr(self._lib, name), sig["argtypes"], sig["restype"], device_type
            )

    def __getattr__(self, name: str):
        try:
            return self.__dict__["_functions"][name]
        except KeyError:
            known = ", ".join(sorted(self.__dict__.get("_functions", {}))) or "none"
            raise AttributeError(
                f"no extern \"C\" function {name!r} in the kernels (found: {known})"
            ) from None

    def __dir__(self):
        return sorted(self._functions)

    def __repr__(self) -> str:
        return f"<kernels {os.path.basename(self.path)}: {', '.join(sorted(self._functions))}>"


def _load_extension(path: str, module: str):
    import torch  # noqa: F401  (loads the libraries the extension links against)

    loader = importlib.machinery.ExtensionFileLoader(module, path)
    spec = importlib.util.spec_from_file_location(module, path, loader=loader)
    mod = importlib.util.module_from_spec(spec)
    loader.exec_module(mod)
    return mod


def load_kernels(workspace: str | None = None):
    """Load the kernels of the latest successful build of ``workspace`` (default: this one)."""
    workspace = os.path.abspath(workspace or os.environ.get("CUDA_AGENT_WORKSPACE") or _HERE)
    man = _manifest(workspace)
    if not man.get("ok", True) or "artifact" not in man:
        first = (man.get("errors") or ["unknown error"])[0]
        raise KernelsNotBuilt(f"the last build failed ({first}): fix it and run `python tools/compile.py`")
    path = os.path.join(workspace, ".cuda_agent", "build", man["artifact"])
    with _lock:
        if path in _loaded:
            return _loaded[path]
        if not os.path.exists(path):
            raise KernelsNotBuilt(f"build artifact {man['artifact']} is missing: compile again")
        if man["kind"] == "torch_extension":
            obj = _load_extension(path, man.get("module", "cuda_extension"))
        else:
            device = "cuda" if man.get("backend") == "cuda" else "cpu"
            obj = KernelLibrary(path, man.get("functions", {}), device)
        _loaded[path] = obj
        return obj
