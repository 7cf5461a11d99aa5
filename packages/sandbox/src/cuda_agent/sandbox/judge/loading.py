"""Loading a task's two modules and building its two models, for the judge.

The reference (``Model``, ``get_inputs``, ``get_init_inputs``) and the candidate
(``ModelNew``) are each imported as a fresh module, with the workspace first on
``sys.path`` while a job runs (the candidate loads its built kernels through
``cuda_agent_runtime.load_kernels()``). ``Model(*get_init_inputs())`` and ``ModelNew`` are
built after the same seed, and ``ModelNew`` gets ``Model``'s weights by the job's protocol
(``state_dict``, ``seeded`` or ``auto``; see :mod:`.rules`). Every failure is a
:class:`LoadFailure` with the category it counts as.
"""

from __future__ import annotations

import contextlib
import importlib.util
import itertools
import os
import sys
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator

from cuda_agent.core.types import FailureCategory

from .inputs import seed_everything, to_device
from .op_guard import new_namespaces, registered_op_names

_COUNTER = itertools.count()
_WORKSPACE_MODULES = ("cuda_agent_runtime", "model", "model_new")


@contextlib.contextmanager
def workspace_imports(workspace: str | Path) -> Iterator[None]:
    """Put ``workspace`` first on ``sys.path`` and forget, afterwards, every module imported
    from it (a worker process serves many workspaces; names like ``cuda_agent_runtime``
    must resolve to the current one)."""
    ws = str(workspace)
    if not ws.startswith("/proc/self/fd/"):  # a handle of a job that gave up root (see .privdrop)
        ws = str(Path(workspace).resolve())
    for name in _WORKSPACE_MODULES:
        sys.modules.pop(name, None)
    saved = list(sys.path)
    before = set(sys.modules)
    sys.path.insert(0, ws)
    try:
        yield
    finally:
        sys.path[:] = saved
        for name in set(sys.modules) - before:
            mod = sys.modules.get(name)
            f = getattr(mod, "__file__", None) or ""
            if f and os.path.abspath(f).startswith(ws + os.sep):
                sys.modules.pop(name, None)
        for name in _WORKSPACE_MODULES:
            sys.modules.pop(name, None)


def load_module(path: str | Path, prefix: str = "_cuda_agent_mod") -> Any:
    """Import the file at ``path`` as a new module with a unique name."""
    path = Path(path)
    name = f"{prefix}_{next(_COUNTER)}_{os.getpid()}"
    spec = importlib.util.spec_from_file_location(name, str(path))
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot import {path}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    except BaseException:
        sys.modules.pop(name, None)
        raise
    return module


def short_exc(exc: BaseException, limit: int = 600, files: tuple[str, ...] = ()) -> str:
    """``exc`` in one line of at most ``limit`` characters, pointing at the deepest frame in
    ``files`` (the candidate's own) where there is one."""
    msg = f"{type(exc).__name__}: {' '.join(str(exc).split())}"
    if len(msg) > limit:
        msg = msg[: limit - 3] + "..."
    where = ""
    for fs in traceback.extract_tb(exc.__traceback__):
        if any(fs.filename.endswith(f) for f in files):
            where = f"{Path(fs.filename).name}:{fs.lineno}"
    return f"{msg} (at {where})" if where else msg


@dataclass
class Loaded:
    reference: Any
    candidate: Any | None
    ref_model: Any = None
    cand_model: Any = None
    init_inputs: list = field(default_factory=list)
    custom_namespaces: set = field(default_factory=set)
    weights: str = ""  # how ModelNew got Model's weights: state_dict | seeded


class LoadFailure(Exception):
    def __init__(self, category: FailureCategory, message: str):
        super().__init__(message)
        self.category = category
        self.message = message


def load_reference(reference_path: str | Path) -> Any:
    try:
        mod = load_module(reference_path, "_cuda_agent_ref")
    except Exception as exc:
        raise LoadFailure(FailureCategory.CRASH, f"reference {Path(reference_path).name} failed to import: {short_exc(exc)}")
    for attr in ("Model", "get_inputs", "get_init_inputs"):
        if not hasattr(mod, attr):
            raise LoadFailure(FailureCategory.CRASH, f"reference {Path(reference_path).name} defines no {attr}")
    return mod


def load_candidate(candidate_path: str | Path) -> tuple[Any, set]:
    """Import the candidate; returns (module, torch.ops namespaces it registered)."""
    path = Path(candidate_path)
    if not path.is_file():
        raise LoadFailure(FailureCategory.COMPILE_ERROR, f"{path.name} not found")
    before = registered_op_names()
    try:
        mod = load_module(path, "_cuda_agent_cand")
    except Exception as exc:
        raise LoadFailure(
            FailureCategory.COMPILE_ERROR,
            f"importing {path.name} failed (is the kernel library built and loadable?): {short_exc(exc, files=(path.name, 'cuda_agent_runtime.py'))}",
        )
    if not hasattr(mod, "ModelNew"):
        raise LoadFailure(FailureCategory.COMPILE_ERROR, f"{path.name} defines no ModelNew")
    return mod, new_namespaces(before, registered_op_names())


def build_models(ref_mod: Any, cand_mod: Any | None, device: Any, seed: int, strict_state_dict: bool = True, cand_name: str = "model_new.py") -> Loaded:
    import torch

    dev = torch.device(device)
    seed_everything(seed)
    try:
        init = ref_mod.get_init_inputs()
        init = list(init) if isinstance(init, (list, tuple)) else [init]
        with torch.device(dev):
            ref_model = ref_mod.Model(*init)
        ref_model = ref_model.to(dev)
    except Exception as exc:
        raise LoadFailure(FailureCategory.CRASH, f"reference Model failed to build: {short_exc(exc)}")
    loaded = Loaded(ref_mod, cand_mod, ref_model=ref_model, init_inputs=init)
    if cand_mod is None:
        return loaded
    return build_candidate(loaded, cand_mod, device, seed, strict_state_dict, cand_name)


def build_candidate(loaded: Loaded, cand_mod: Any, device: Any, seed: int, strict_state_dict: bool = True,
                    cand_name: str = "model_new.py", state: dict | None = None, weights: str = "state_dict") -> Loaded:
    """Build ``ModelNew`` beside the reference of ``loaded`` (after the same seed) and give it
    the reference's weights: its ``state_dict`` (or ``state``) with ``weights`` ``state_dict``,
    none with ``seeded`` (both models built after the same seed), whichever applies with
    ``auto``. ``loaded.weights`` says which it was."""
    import torch

    from .rules import RULE_STATE_DICT, state_dict_mismatch

    dev = torch.device(device)
    init = loaded.init_inputs
    ref_model = loaded.ref_model
    loaded.candidate = cand_mod
    try:
        seed_everything(seed)
        with torch.device(dev):
            cand_model = cand_mod.ModelNew(*to_device(init, dev))
        cand_model = cand_model.to(dev)
    except Exception as exc:
        raise LoadFailure(FailureCategory.CRASH, f"ModelNew(*get_init_inputs()) failed: {short_exc(exc, files=(cand_name,))}")
    loaded.cand_model = cand_model
    if weights == "seeded":
        loaded.weights = "seeded"
        return loaded
    ref_state = ref_model.state_dict() if state is None else state
    try:
        cand_model.load_state_dict(ref_state, strict=strict_state_dict)
        loaded.weights = "state_dict"
    except Exception as exc:
        if weights == "auto":  # KernelBench's protocol: both built after the same seed
            loaded.weights = "seeded"
            return loaded
        what = state_dict_mismatch(ref_state, cand_model.state_dict()) or " ".join(str(exc).split())[:800]
        raise LoadFailure(
            FailureCategory.WRONG_RESULT,
            f"ModelNew does not load Model's state_dict (rule {RULE_STATE_DICT}: same parameter and buffer names and "
            f"shapes as Model): {what}",
        )
    return loaded
