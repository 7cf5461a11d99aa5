"""The candidate process's commands before anything is timed: ``drop`` (become the job's
own user), ``load`` (the reference and the candidate, both models built after the same seed,
the harness snapshot taken first), ``reseed`` (both models built again after another seed)
and ``integrity`` (what the candidate replaced of the harness since the snapshot).
"""

from __future__ import annotations

import ctypes
import importlib.machinery
import os
import sys
import types
from pathlib import Path
from typing import Any

from ..isolation import privdrop
from . import integrity
from .candidate_state import CandidateState, die_with_parent, refused
from .inputs import describe
from .loading import LoadFailure, build_candidate, build_models, load_candidate, load_reference
from .precision import apply_policy, policy_from


def do_drop(st: CandidateState, msg: dict) -> dict:
    """Become the job's own user; with ``prebuilt`` (a folder the trusted side checked), its
    extension files are placed in the job's ``TORCH_EXTENSIONS_DIR`` and ``arch`` becomes
    ``TORCH_CUDA_ARCH_LIST``, as for the build (see :mod:`.prebuild`)."""
    uid = msg.get("uid")
    files = None
    if msg.get("prebuilt"):
        from .prebuild import read_files

        files = read_files(Path(str(msg["prebuilt"])))  # as root, before the job's private view hides it
        if msg.get("arch"):
            os.environ["TORCH_CUDA_ARCH_LIST"] = str(msg["arch"])
    ahead = privdrop.dropped()  # warmed: dropped ahead of the job, into its inbox
    view, meta = privdrop.drop_privileges(msg["workspace"], bool(msg.get("enabled", True)),
                                          uid=int(uid) if uid is not None else None, extensions=files)
    if ahead:  # the job's workspace, now that there is one
        os.environ["CUDA_AGENT_WORKSPACE"] = str(view)
        try:
            os.chdir(view)
        except OSError:
            pass
        if files:
            meta["extensions"] = seed_own_extensions(files, meta)
    die_with_parent()  # a change of user clears the parent-death signal
    st.meta.update(meta)
    st.meta["view"] = str(view)
    return {"ok": True, "meta": meta, "view": str(view)}


def seed_own_extensions(files: list, meta: dict) -> str:
    """Extension files built ahead of the job, written by the job's user itself into its
    ``TORCH_EXTENSIONS_DIR`` (a process that dropped its rights before the job was known)."""
    if meta.get("job_mounts") != "private":
        return f"prebuilt unused: no private /tmp ({meta.get('job_mounts')}), so the build folder's path differs"
    try:
        n = privdrop.write_files(files, Path(privdrop.EXTENSIONS_DIR))
    except OSError as exc:
        return f"prebuilt unused: {exc}"[:300]
    return f"prebuilt ({n} files)"


def do_prebuild(st: CandidateState, msg: dict) -> dict:
    """Import the candidate only, to build its extensions (a build job; see :mod:`.prebuild`)."""
    from .prebuild import build_in_candidate

    return build_in_candidate(msg)


def do_load(st: CandidateState, msg: dict) -> dict:
    import torch

    apply_policy(policy_from(msg.get("precision", "fp32-strict")))
    sys.path.insert(0, msg["workspace"])
    st.harness = integrity.snapshot()
    st.harness_modules = integrity.harness_modules()
    seed, cand = int(msg["seed"]), msg["candidate"]
    name = os.path.basename(cand)
    st.cand_name, st.strict = name, bool(msg.get("strict_state_dict", True))
    try:
        with torch.no_grad():
            st.ref_mod = load_reference(msg["reference"])
            loaded = build_models(st.ref_mod, None, st.device, seed, True, name)
            before = set(sys.modules)
            cand_mod, st.namespaces = load_candidate(cand)
            st.extensions = loaded_extensions(before, cand_mod)
            build_candidate(loaded, cand_mod, st.device, seed, st.strict, name, weights=msg.get("weights", "state_dict"))
    except LoadFailure as exc:
        return {"ok": False, "category": exc.category.value, "message": exc.message,
                "tampered": integrity.tampered(st.harness)}
    loaded.ref_model = None  # only its weights were needed here
    st.loaded = loaded
    return {"ok": True, "namespaces": sorted(st.namespaces), "init_inputs": describe(loaded.init_inputs),
            "weights": loaded.weights, "tampered": integrity.tampered(st.harness)}


def do_reseed(st: CandidateState, msg: dict) -> dict:
    """Both models built again after another seed; ``ModelNew``'s weights by that seed alone
    (``weights: seeded``, the second construction of KernelBench's protocol) or from the
    new ``Model`` (``state_dict``/``auto``, as at load)."""
    import torch

    if st.loaded is None:
        return refused("no candidate loaded")
    try:
        with torch.no_grad():
            loaded = build_models(st.ref_mod, None, st.device, int(msg["seed"]), True, st.cand_name)
            weights = msg.get("weights") if msg.get("weights") in ("state_dict", "auto", "seeded") else "seeded"
            build_candidate(loaded, st.loaded.candidate, st.device, int(msg["seed"]), st.strict, st.cand_name,
                            weights=weights)
    except LoadFailure as exc:
        return {"ok": False, "category": exc.category.value, "message": exc.message}
    loaded.ref_model = None
    st.loaded = loaded
    return {"ok": True}


def do_integrity(st: CandidateState, msg: dict) -> dict:
    """What was replaced since the snapshot, and the harness modules first imported after it
    (``late``: a gap in the process's pre-imports, which the snapshot did not cover)."""
    if st.harness is None:
        return {"ok": True, "tampered": [], "late": []}
    return {"ok": True, "tampered": integrity.tampered(st.harness),
            "late": sorted(integrity.harness_modules() - st.harness_modules)}


def loaded_extensions(before: set, cand_mod: Any) -> list:
    """The compiled modules and kernel libraries the candidate's import loaded: extension
    modules, ctypes libraries it holds, the workspace runtime's kernel libraries."""

    def compiled(obj: Any) -> bool:
        if isinstance(obj, types.ModuleType):
            return str(getattr(obj, "__file__", "") or "").endswith(tuple(importlib.machinery.EXTENSION_SUFFIXES))
        return isinstance(obj, ctypes.CDLL) or hasattr(obj, "_functions")

    found: list = []
    for obj in [sys.modules.get(n) for n in set(sys.modules) - before] + list(vars(cand_mod).values()):
        if compiled(obj) and not any(obj is f for f in found):
            found.append(obj)
    runtime = sys.modules.get("cuda_agent_runtime")
    for v in (getattr(runtime, "_loaded", {}) or {}).values():
        if not any(v is f for f in found):
            found.append(v)
    return found
