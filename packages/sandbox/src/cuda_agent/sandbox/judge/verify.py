"""Verification of a candidate ``ModelNew`` against the reference ``Model``.

Steps (:func:`verify_candidate`):

1. static checks on the sources (``checks``): a violation fails with ``forbidden_op``;
2. import of the reference and of the candidate module, each in a fresh module namespace
   with the workspace first on ``sys.path`` (the candidate loads its built kernels through
   ``cuda_agent_runtime.load_kernels()``); an import failure is a ``compile_error``;
3. ``Model(*get_init_inputs())`` and ``ModelNew(*get_init_inputs())``; ModelNew loads
   Model's ``state_dict`` strictly (same parameter and buffer names and shapes);
4. for each of ``num_inputs`` seeds: fresh inputs (never all zeros), the reference output,
   then the candidate's forward under the run-time guard (:mod:`.guard`) with freshly
   allocated memory poisoned, then a comparison: same structure, shapes and dtypes,
   ``|out - ref| <= atol + rtol * |ref|`` everywhere, and no NaN/Inf where the reference
   has none.
5. extra input draws (``extra_draws``, on by default): ``get_inputs()`` decides the value
   distribution, and a narrow one lets a wrong candidate pass (``torch.rand`` inputs are all
   positive, so "ReLU" returning its input unchanged matches). Each extra draw keeps the
   shapes, dtypes and non-floating-point inputs (indices, sizes) of a ``get_inputs()`` draw
   and refills every floating-point input from another distribution: ``normal`` (standard
   normal) and ``wide`` (uniform on [-8, 8]: mixed signs, larger magnitudes). The reference
   runs first; where it is not finite everywhere, raises, or is ill-conditioned (its output
   moves beyond the tolerance when the inputs are scaled by 1 +- a few ulps, e.g. a sum that
   cancels to almost zero), the inputs are outside what the task is defined for and the draw
   is skipped (recorded in ``metadata["extra_draws"]``); otherwise the candidate must match it
   like on any other input.

Poisoned outputs (what holds). The harness cannot hand the candidate pre-filled output
buffers, so uninitialised memory is made visible instead, two ways:

* while the candidate runs, torch's deterministic fill is on
  (``torch.utils.deterministic.fill_uninitialized_memory`` with deterministic algorithms in
  warn-only mode): every tensor made by ``empty``/``empty_like``/``empty_strided``/
  ``new_empty`` -- from Python or from C++ (``torch::empty``) -- starts as NaN (floating
  types) or the largest integer, so an output element the kernel never writes shows up;
* on CUDA, before each candidate run the caching allocator is emptied and a large block
  (at least four times the inputs plus reference outputs, at most half the free memory)
  plus a set of small blocks are allocated, filled with 0xFF bytes (NaN in every float
  format) and freed, so memory the allocator hands out later -- also to code that bypasses
  the fill -- holds NaN rather than an earlier result. The reference outputs stay
  referenced while the candidate runs, so their memory can never be handed to it.

Memory obtained outside torch (a raw ``cudaMalloc`` in the kernel code) is not covered, but
such memory cannot be returned as a torch output without going through torch.
"""

from __future__ import annotations

import contextlib
import dataclasses
import importlib.util
import itertools
import os
import signal
import sys
import threading
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator

from cuda_agent.core.types import CheckResult, FailureCategory, VerifyResult

from .op_guard import GuardOptions, new_namespaces, registered_op_names
from .inputs import clone_inputs, describe, draw_inputs, nbytes, seed_everything, to_device
from .precision import policy_from, precision_context

_COUNTER = itertools.count()


@dataclass
class VerifyOptions:
    """Options of verification (a run config's ``verify`` node maps onto these)."""

    num_inputs: int = 5
    seed: int | None = None  # None: fresh seeds every call (recorded in the result)
    atol: float = 1e-2
    rtol: float = 1e-2
    check_dtype: bool = True
    precision: str = "fp32-strict"  # or "tf32"
    guard: GuardOptions = field(default_factory=GuardOptions)
    static_checks: list[Any] | None = None  # names (or {name, options}); None = every registered static check
    poison: bool = True
    strict_state_dict: bool = True  # with weights: state_dict, every name must match (False: a partial load)
    # the rule profile (cuda-agent | kernelbench | none) and how ModelNew gets Model's
    # weights (state_dict | auto | seeded); see judge/rules.py
    rules: str = "cuda-agent"
    weights: str = "state_dict"
    timeout_s: float = 0.0  # Python-level watchdog per forward call (0 = none); the executor kills hung kernels
    reference: str = "model.py"
    candidate: str = "model_new.py"
    max_message_chars: int = 2000
    # extra draws with the floating-point inputs from other distributions (see EXTRA_DRAWS);
    # [] turns them off
    extra_draws: list[str] = field(default_factory=lambda: ["normal", "wide"])
    extra_draw_stability_check: bool = True  # skip draws on which the reference is ill-conditioned
    # as root on Linux: run the candidate as an unprivileged user (see .privdrop); off only
    # on hosts where that breaks the GPU (CUDA_AGENT_DROP_PRIVILEGES=0 switches it off too)
    drop_privileges: bool = True

    def __post_init__(self) -> None:
        from .rules import apply_profile

        if isinstance(self.guard, dict):
            self.guard = GuardOptions(**self.guard)
        apply_profile(self)
        if isinstance(self.extra_draws, str):
            self.extra_draws = [self.extra_draws]
        self.extra_draws = list(self.extra_draws or [])
        unknown = [k for k in self.extra_draws if k not in EXTRA_DRAWS]
        if unknown:
            from cuda_agent.core.errors import ConfigError

            raise ConfigError(f"verify option extra_draws: unknown draw {unknown[0]!r}; valid: {', '.join(EXTRA_DRAWS)}")


class VerifyTimeout(Exception):
    pass


# --- loading modules ------------------------------------------------------------------

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


def _short_exc(exc: BaseException, limit: int = 600, files: tuple[str, ...] = ()) -> str:
    msg = f"{type(exc).__name__}: {' '.join(str(exc).split())}"
    if len(msg) > limit:
        msg = msg[: limit - 3] + "..."
    # point at the deepest frame in the candidate's own files
    where = ""
    for fs in traceback.extract_tb(exc.__traceback__):
        if any(fs.filename.endswith(f) for f in files):
            where = f"{Path(fs.filename).name}:{fs.lineno}"
    return f"{msg} (at {where})" if where else msg


# --- comparison -----------------------------------------------------------------------


@dataclass
class Comparison:
    ok: bool
    message: str = ""
    where: str = ""
    max_abs_err: float = 0.0
    max_rel_err: float = 0.0


def _unravel(flat_index: int, shape: tuple) -> tuple:
    idx = []
    for dim in reversed(shape):
        idx.append(flat_index % dim if dim else 0)
        flat_index //= dim if dim else 1
    return tuple(reversed(idx))


# a tolerance that cannot tell the reference from zero: at most this share of its elements
# are larger than atol (softmax over very wide rows: every output near 1e-6)
VACUOUS_SHARE = 0.01
RULE_VACUOUS = "tolerance.vacuous"


def compare_tensors(ref: Any, out: Any, atol: float, rtol: float, path: str, check_dtype: bool = True,
                    scaled: bool = True) -> Comparison:
    """``|out - ref| <= atol + rtol |ref|`` everywhere, NaN/Inf only where the reference has
    them. Where the tolerance cannot tell the reference from zero (``scaled``; see
    :data:`VACUOUS_SHARE`), the output is also compared at the reference's own scale
    (``atol`` times its largest magnitude) and a constant output is refused where the
    reference is not (rule ``tolerance.vacuous``)."""
    import torch

    if not isinstance(out, torch.Tensor):
        return Comparison(False, f"{path}: expected a tensor, got {type(out).__name__}", path)
    if tuple(out.shape) != tuple(ref.shape):
        return Comparison(False, f"{path}: shape {tuple(out.shape)} != reference {tuple(ref.shape)}", path)
    if check_dtype and out.dtype != ref.dtype:
        return Comparison(False, f"{path}: dtype {out.dtype} != reference {ref.dtype}", path)
    if out.device != ref.device:
        return Comparison(False, f"{path}: on {out.device}, reference on {ref.device}", path)
    if out.is_complex() or ref.is_complex():
        out, ref = torch.view_as_real(out), torch.view_as_real(ref)
    work = torch.float64 if ref.dtype == torch.float64 else torch.float32
    o = out.reshape(-1)
    r = ref.reshape(-1)
    n = r.numel()
    max_abs = 0.0
    max_rel = 0.0
    chunk = 1 << 26
    first_bad = None
    first_kind = ""
    for start in range(0, n, chunk):
        oc = o[start : start + chunk].to(work)
        rc = r[start : start + chunk].to(work)
        ofin = torch.isfinite(oc)
        rfin = torch.isfinite(rc)
        both = ofin & rfin
        diff = torch.where(both, (oc - rc).abs(), torch.zeros((), dtype=work, device=oc.device))
        tol = atol + rtol * rc.abs()
        bad_val = both & (diff > tol)
        # non-finite: NaN/Inf where the reference is finite, or a different non-finite value
        rnan, onan = torch.isnan(rc), torch.isnan(oc)
        bad_nonfinite = (rfin & ~ofin) | (~rfin & ~((rnan & onan) | (~rnan & ~onan & (oc == rc))))
        if both.any():
            max_abs = max(max_abs, float(diff.max()))
            rel = diff / rc.abs().clamp_min(max(atol, 1e-12))
            max_rel = max(max_rel, float(torch.where(both, rel, torch.zeros((), dtype=work, device=oc.device)).max()))
        if first_bad is None:
            nf = bad_nonfinite.nonzero()
            bv = bad_val.nonzero()
            cands = []
            if nf.numel():
                cands.append((int(nf[0, 0]) + start, "nonfinite"))
            if bv.numel():
                cands.append((int(bv[0, 0]) + start, "value"))
            if cands:
                first_bad, first_kind = min(cands)
    if first_bad is None:
        vacuous = _vacuous(out, ref, atol, rtol, path, check_dtype) if scaled and n else None
        return vacuous or Comparison(True, "", path, max_abs, max_rel)
    idx = _unravel(first_bad, tuple(ref.shape)) if ref.dim() else ()
    got = out.reshape(-1)[first_bad].item() if not out.is_complex() else "?"
    want = ref.reshape(-1)[first_bad].item() if not ref.is_complex() else "?"
    where = f"{path} at index {idx}"
    if first_kind == "nonfinite":
        msg = f"{where}: got {got}, reference {want} (NaN/Inf where the reference has none: unwritten or overflowing output)"
    else:
        msg = (
            f"{where}: got {got}, reference {want}; max abs err {max_abs:.3g}, max rel err {max_rel:.3g} "
            f"(atol={atol}, rtol={rtol})"
        )
    return Comparison(False, msg, where, max_abs, max_rel)


def reference_scale(ref: Any, atol: float) -> float | None:
    """The largest magnitude of a reference the tolerance cannot tell from zero (see
    :func:`compare_tensors`), or None when the tolerance can."""
    import torch

    if not isinstance(ref, torch.Tensor) or not ref.is_floating_point() or atol <= 0:
        return None
    finite = ref[torch.isfinite(ref)]
    if finite.numel() == 0:
        return None
    mag = finite.abs()
    scale = float(mag.max())
    if scale <= 0 or (scale > atol and float((mag > atol).float().mean()) > VACUOUS_SHARE):
        return None
    return scale


def _vacuous(out: Any, ref: Any, atol: float, rtol: float, path: str, check_dtype: bool) -> Comparison | None:
    """A failed Comparison when ``out`` passed only because the tolerance is too coarse for
    ``ref``'s scale (see :func:`compare_tensors`), else None."""
    import torch

    scale = reference_scale(ref, atol)
    if scale is None:
        return None
    finite = ref[torch.isfinite(ref)]
    fin_out = out[torch.isfinite(out)]
    if fin_out.numel() and float(fin_out.max()) == float(fin_out.min()) and float(finite.max()) != float(finite.min()):
        return Comparison(False, f"{path}: the output is constant ({float(fin_out.max()):.3g}) where the reference is not "
                                 f"(it spans {float(finite.min()):.3g} .. {float(finite.max()):.3g}, all within "
                                 f"atol={atol} of zero) (rule {RULE_VACUOUS}: an output must be computed, not "
                                 f"guessed at a scale the tolerance cannot see)", path)
    at_scale = compare_tensors(ref, out, atol * scale, rtol, path, check_dtype, scaled=False)
    if at_scale.ok:
        return None
    return Comparison(False, f"{at_scale.message} -- compared at the reference's own scale (largest magnitude "
                             f"{scale:.3g}, below atol={atol}: the tolerance alone could not tell it from zero) "
                             f"(rule {RULE_VACUOUS})", at_scale.where, at_scale.max_abs_err, at_scale.max_rel_err)


def compare_outputs(ref: Any, out: Any, atol: float, rtol: float, path: str = "output", check_dtype: bool = True,
                    scaled: bool = True) -> Comparison:
    """Recursive comparison: same structure (tensor / tuple / list / dict / scalar)."""
    import torch

    if isinstance(ref, torch.Tensor):
        return compare_tensors(ref, out, atol, rtol, path, check_dtype, scaled)
    if isinstance(ref, (list, tuple)):
        if not isinstance(out, (list, tuple)):
            return Comparison(False, f"{path}: expected a {type(ref).__name__} of {len(ref)}, got {type(out).__name__}", path)
        if len(out) != len(ref):
            return Comparison(False, f"{path}: {len(out)} outputs, reference has {len(ref)}", path)
        worst = Comparison(True, "", path)
        for i, (r, o) in enumerate(zip(ref, out)):
            c = compare_outputs(r, o, atol, rtol, f"{path}[{i}]", check_dtype, scaled)
            if not c.ok:
                return c
            worst.max_abs_err = max(worst.max_abs_err, c.max_abs_err)
            worst.max_rel_err = max(worst.max_rel_err, c.max_rel_err)
        return worst
    if isinstance(ref, dict):
        if not isinstance(out, dict) or set(out) != set(ref):
            return Comparison(False, f"{path}: keys {sorted(map(str, out)) if isinstance(out, dict) else type(out).__name__} != reference {sorted(map(str, ref))}", path)
        worst = Comparison(True, "", path)
        for k in ref:
            c = compare_outputs(ref[k], out[k], atol, rtol, f"{path}[{k!r}]", check_dtype, scaled)
            if not c.ok:
                return c
            worst.max_abs_err = max(worst.max_abs_err, c.max_abs_err)
            worst.max_rel_err = max(worst.max_rel_err, c.max_rel_err)
        return worst
    if isinstance(ref, (int, float, bool)) and not isinstance(out, torch.Tensor):
        if not isinstance(out, (int, float, bool)):
            return Comparison(False, f"{path}: expected a number, got {type(out).__name__}", path)
        import math

        if math.isnan(float(ref)) != math.isnan(float(out)) or abs(float(out) - float(ref)) > atol + rtol * abs(float(ref)):
            return Comparison(False, f"{path}: got {out}, reference {ref}", path)
        return Comparison(True, "", path, abs(float(out) - float(ref)))
    if ref is None:
        return Comparison(out is None, "" if out is None else f"{path}: expected None, got {type(out).__name__}", path)
    if isinstance(out, torch.Tensor):
        return Comparison(False, f"{path}: expected {type(ref).__name__}, got a tensor", path)
    return Comparison(out == ref, "" if out == ref else f"{path}: got {out!r}, reference {ref!r}", path)


# --- extra input draws --------------------------------------------------------------------

# name -> (label used in messages, sampler(shape, generator, device) -> float32 tensor)
EXTRA_DRAWS: dict[str, tuple[str, Any]] = {
    "normal": ("standard normal", lambda shape, gen, dev: _torch().randn(shape, generator=gen, device=dev)),
    "wide": ("uniform on [-8, 8], mixed signs",
             lambda shape, gen, dev: _torch().rand(shape, generator=gen, device=dev).mul_(16.0).sub_(8.0)),
}


def _torch() -> Any:
    import torch

    return torch


def extra_draw_inputs(values: list, kind: str, seed: int, device: Any) -> tuple[list, int]:
    """``values`` (a get_inputs() draw) with every floating-point tensor refilled from the
    distribution ``kind``: same shape, dtype, strides and device; everything else kept.
    Returns (new values, number of tensors refilled)."""
    import torch

    if kind not in EXTRA_DRAWS:
        raise ValueError(f"unknown extra input draw {kind!r}; valid: {', '.join(EXTRA_DRAWS)}")
    sampler = EXTRA_DRAWS[kind][1]
    dev = torch.device(device)
    gen = torch.Generator(device=dev)
    gen.manual_seed(seed)
    out, refilled = [], 0
    for v in values:
        if isinstance(v, torch.Tensor) and v.is_floating_point() and v.numel() > 0:
            new = torch.empty_like(v)
            new.copy_(sampler(tuple(v.shape), gen, v.device))
            out.append(new)
            refilled += 1
        else:
            out.append(v)
    return out, refilled


def all_finite(obj: Any) -> bool:
    """True when every floating-point value in ``obj`` (tensors, nested containers, floats) is finite."""
    import math

    import torch

    if isinstance(obj, torch.Tensor):
        if obj.is_floating_point() or obj.is_complex():
            return bool(torch.isfinite(obj).all())
        return True
    if isinstance(obj, (list, tuple)):
        return all(all_finite(v) for v in obj)
    if isinstance(obj, dict):
        return all(all_finite(v) for v in obj.values())
    if isinstance(obj, float):
        return math.isfinite(obj)
    return True


def nudged(values: list, seed: int) -> list:
    """Copies of ``values`` with floating-point tensors scaled elementwise by 1 +- 4 ulps
    (signs kept), to probe how sensitive the reference is to rounding-sized changes."""
    import torch

    out = []
    gen = None
    for v in values:
        if isinstance(v, torch.Tensor) and v.is_floating_point() and v.numel() > 0:
            if gen is None:
                gen = torch.Generator(device=v.device)
                gen.manual_seed(seed)
            work = torch.float64 if v.dtype == torch.float64 else torch.float32
            eps = torch.finfo(v.dtype).eps
            u = torch.rand(v.shape, generator=gen, device=v.device, dtype=work).mul_(2.0).sub_(1.0)
            out.append((v.to(work) * (1.0 + 4.0 * eps * u)).to(v.dtype))
        else:
            out.append(v)
    return out


# --- poisoning --------------------------------------------------------------------------


@contextlib.contextmanager
def fill_uninitialized() -> Iterator[None]:
    """NaN-fill every tensor torch creates uninitialised (see the module docstring)."""
    import warnings

    import torch

    was_on = torch.are_deterministic_algorithms_enabled()
    was_warn = torch.is_deterministic_algorithms_warn_only_enabled()
    det = getattr(torch.utils, "deterministic", None)
    was_fill = getattr(det, "fill_uninitialized_memory", None)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.use_deterministic_algorithms(True, warn_only=True)
        if det is not None:
            det.fill_uninitialized_memory = True
        try:
            yield
        finally:
            torch.use_deterministic_algorithms(was_on, warn_only=was_warn)
            if det is not None and was_fill is not None:
                det.fill_uninitialized_memory = was_fill


def poison_allocator(device: Any, nbytes_hint: int = 0) -> int:
    """Fill the CUDA caching allocator's free memory with 0xFF bytes; returns bytes poisoned."""
    import torch

    dev = torch.device(device)
    if dev.type != "cuda":
        return 0
    torch.cuda.synchronize(dev)
    torch.cuda.empty_cache()
    free, _total = torch.cuda.mem_get_info(dev)
    size = max(4 * nbytes_hint, 256 << 20)
    size = int(min(size, free // 2))
    blocks = []
    if size > 0:
        blocks.append(torch.empty(size, dtype=torch.uint8, device=dev))
    # the small-block pool (allocations up to 1 MiB live in 2 MiB segments)
    blocks.extend(torch.empty(512 << 10, dtype=torch.uint8, device=dev) for _ in range(32))
    for b in blocks:
        b.fill_(0xFF)
    torch.cuda.synchronize(dev)
    total = sum(b.numel() for b in blocks)
    del blocks
    return total


# --- the watchdog -----------------------------------------------------------------------


@contextlib.contextmanager
def deadline(seconds: float) -> Iterator[None]:
    """Raise VerifyTimeout in Python code that runs past ``seconds`` (main thread only)."""
    if not seconds or threading.current_thread() is not threading.main_thread() or not hasattr(signal, "setitimer"):
        yield
        return

    def _alarm(signum, frame):
        raise VerifyTimeout(f"forward did not finish within {seconds:g} s")

    old = signal.signal(signal.SIGALRM, _alarm)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)


def synchronize(device: Any) -> None:
    import torch

    dev = torch.device(device)
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)


# --- loaded task + candidate ------------------------------------------------------------


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
        raise LoadFailure(FailureCategory.CRASH, f"reference {Path(reference_path).name} failed to import: {_short_exc(exc)}")
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
            f"importing {path.name} failed (is the kernel library built and loadable?): {_short_exc(exc, files=(path.name, 'cuda_agent_runtime.py'))}",
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
        raise LoadFailure(FailureCategory.CRASH, f"reference Model failed to build: {_short_exc(exc)}")
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
        raise LoadFailure(FailureCategory.CRASH, f"ModelNew(*get_init_inputs()) failed: {_short_exc(exc, files=(cand_name,))}")
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


def fresh_seed() -> int:
    return int.from_bytes(os.urandom(4), "little") & 0x7FFFFFFF


def input_seeds(base: int, n: int) -> list[int]:
    return [(base + 1000003 * (i + 1)) & 0x7FFFFFFF for i in range(n)]


def _device_info(device: Any) -> dict:
    import torch

    dev = torch.device(device)
    info = {"device": str(dev), "torch": torch.__version__}
    if dev.type == "cuda":
        info["gpu"] = torch.cuda.get_device_name(dev)
        info["cuda"] = torch.version.cuda
    else:
        import platform

        info["gpu"] = None
        info["cpu"] = platform.processor() or platform.machine()
    return info


# --- the verification itself ------------------------------------------------------------


def verify_candidate(
    workspace: str | Path,
    device: str = "cpu",
    options: VerifyOptions | None = None,
    candidate: str | Path | None = None,
    reference: str | Path | None = None,
    session: Any = None,
) -> VerifyResult:
    """Verify ``candidate`` (default ``<workspace>/model_new.py``) against ``reference``
    (default ``<workspace>/model.py``). Never raises for a bad candidate: the result says
    what failed.

    The candidate runs in a candidate process of its own (:mod:`.judge`); inputs are drawn,
    the reference is run and outputs are compared here. ``session``: a
    :class:`~.judge.session.JudgeSession` to use (and leave open) instead of a new one."""
    from .session import JudgeSession

    opts = options or VerifyOptions()
    if isinstance(opts.guard, dict):
        opts.guard = GuardOptions(**opts.guard)
    ws = Path(workspace)
    cand_path = Path(candidate or opts.candidate)
    cand_path = cand_path if cand_path.is_absolute() else ws / cand_path
    ref_path = Path(reference or opts.reference)
    ref_path = ref_path if ref_path.is_absolute() else ws / ref_path
    own = session is None
    if own:
        session = JudgeSession(ws, cand_path, ref_path, device, drop=opts.drop_privileges)
    res = None
    try:
        res = Verification(session, device, opts).run()
        return res
    finally:
        if own:
            session.close_into(res)


class Verification:
    """The steps of :func:`verify_candidate`, run on the trusted side of a job."""

    def __init__(self, session: Any, device: str, opts: VerifyOptions):
        self.s = session
        self.device = device
        self.opts = opts
        self.t0 = time.perf_counter()
        self.seed = opts.seed if opts.seed is not None else fresh_seed()
        self.policy = policy_from(opts.precision)
        self.meta: dict[str, Any] = {"seed": self.seed, "precision_policy": self.policy.key, "atol": opts.atol,
                                     "rtol": opts.rtol}
        self.meta["rule_profile"] = opts.rules
        self.checks: list[CheckResult] = []
        self.first_output: Any = None  # the candidate's output on the first draw (for the decoy check)
        self.scaled = True  # tiny outputs compared at their own scale (see scale_comparable)
        self.phases: dict[str, float] = {}  # where the job's time went (seconds per phase)
        self.meta["phase_seconds"] = self.phases

    @contextlib.contextmanager
    def phase(self, name: str) -> Iterator[None]:
        t = time.perf_counter()
        try:
            yield
        finally:
            self.phases[name] = round(self.phases.get(name, 0.0) + time.perf_counter() - t, 4)

    def result(self, ok: bool, failure: FailureCategory, message: str) -> VerifyResult:
        from .rules import rule_of

        o = self.opts
        if not ok:
            self.meta["rule"] = rule_of(message) or failure.value
        if len(message) > o.max_message_chars:
            message = message[: o.max_message_chars - 3] + "..."
        self.meta.update({k: v for k, v in self.s.meta.items() if k not in self.meta})
        return VerifyResult(ok=ok, failure=failure, message=message, checks=self.checks,
                            seconds=time.perf_counter() - self.t0, metadata=self.meta)

    def refused(self, r: Any, check: str = "") -> VerifyResult:
        if check:
            self.checks.append(CheckResult(name=check, passed=False, message=r.message))
        return self.result(False, r.category, r.message)

    def run(self) -> VerifyResult:
        from .checks import run_static_checks
        from .client import CandidateProcessError
        from .session import refusal_from_error

        s, o = self.s, self.opts
        # 1. static checks, on the files as the job copied them
        bad_file = s.refused_files()
        if bad_file:
            return self.result(False, FailureCategory.FORBIDDEN_OP, bad_file)
        with self.phase("static_checks"):
            static = run_static_checks(s.snap.root, s.candidate, o.static_checks)
        self.checks.extend(static)
        bad = [c for c in static if not c.passed]
        if bad:
            return self.result(False, FailureCategory.FORBIDDEN_OP, bad[0].message.splitlines()[0])
        import torch

        self.meta.update(_device_info(self.device))
        # 2. the reference, here
        with workspace_imports(s.snap.root), torch.no_grad():
            with self.phase("load"):
                try:
                    self.ref_mod = load_reference(s.reference)
                    self.ref = build_models(self.ref_mod, None, self.device, self.seed, True, s.cand_name)
                except LoadFailure as exc:
                    return self.result(False, exc.category, exc.message)
                try:
                    # 3. the candidate, in its own process
                    failed = s.load(self.seed, o.strict_state_dict, o.precision, o.weights)
                except CandidateProcessError as exc:
                    return self.refused(refusal_from_error(exc, "loading the candidate"))
            if failed is not None:
                return self.refused(failed, "harness integrity" if failed.extra.get("tampered") else "")
            self.meta["custom_op_namespaces"] = list(s.load_reply.get("namespaces") or [])[:50]
            self.meta["weights"] = s.weights
            self.meta["init_inputs"] = describe(self.ref.init_inputs)
            try:
                with precision_context(self.policy) as flags:
                    self.meta["precision_flags"] = flags
                    out = self.draws()
                if out is not None:
                    return out
                tampered = s.integrity()  # a patch made while forward ran
            except CandidateProcessError as exc:
                return self.refused(refusal_from_error(exc, "the candidate process"))
        if tampered is not None:
            return self.refused(tampered, "harness integrity")
        worst = max((c.max_abs_err or 0.0 for c in self.checks), default=0.0)
        done = sum(1 for e in self.meta.get("extra_draws", []) if e.get("status") == "passed")
        skipped = sum(1 for e in self.meta.get("extra_draws", []) if e.get("status") == "skipped")
        extra = ""
        if done or skipped:
            extra = f" and {done} extra draw{'s' if done != 1 else ''}" + (f" ({skipped} skipped)" if skipped else "")
        return self.result(True, FailureCategory.NONE, f"correct on {o.num_inputs} inputs{extra} (max abs err {worst:.3g})")

    # -- the draws ------------------------------------------------------------------------

    def draws(self) -> VerifyResult | None:
        o = self.opts
        seeds = input_seeds(self.seed, o.num_inputs)
        self.meta["input_seeds"] = seeds
        for i, s in enumerate(seeds):
            name = f"input[{i}] seed={s}"
            try:
                with self.phase("inputs"):
                    drawn = draw_inputs(self.ref_mod.get_inputs, s, self.device)
            except Exception as exc:
                return self.result(False, FailureCategory.CRASH, f"get_inputs() failed: {_short_exc(exc)}")
            if i == 0:
                self.meta["inputs"] = describe(drawn.values)
                self.meta["inputs_replaced_zeros"] = drawn.replaced_zeros
            try:
                with self.phase("reference"):
                    ref_out = self.ref.ref_model(*drawn.values)
                    synchronize(self.device)
            except Exception as exc:
                return self.result(False, FailureCategory.CRASH, f"reference Model failed on {name}: {_short_exc(exc)}")
            if i == 0:
                self.meta["outputs"] = describe(ref_out)
                self.scaled = self.scale_comparable(drawn.values, ref_out)
            del drawn
            failed = self.candidate_on(name, {"seed": s}, ref_out, name)
            del ref_out
            if failed is not None:
                return failed
        return self.extra_draws() or self.decoy() or self.second_seed()

    def extra_draws(self) -> VerifyResult | None:
        """The same shapes, floating-point values from other distributions (inputs outside
        the reference's domain, or on which it is ill-conditioned, are skipped)."""
        o = self.opts
        extra_log: list[dict] = []
        self.meta["extra_draws"] = extra_log
        extra_seeds = input_seeds(self.seed ^ 0x5A5A5A5A, len(o.extra_draws or []))
        for kind, s in zip(o.extra_draws or [], extra_seeds):
            label = EXTRA_DRAWS[kind][0] if kind in EXTRA_DRAWS else kind
            name = f"extra[{kind}] seed={s}"
            entry: dict[str, Any] = {"draw": kind, "label": label, "seed": s}
            extra_log.append(entry)
            try:
                with self.phase("inputs"):
                    base = draw_inputs(self.ref_mod.get_inputs, s, self.device).values
                    inputs, refilled = extra_draw_inputs(base, kind, s, self.device)
                    del base
            except ValueError as exc:
                return self.result(False, FailureCategory.CRASH, f"verify option extra_draws: {exc}")
            except Exception as exc:
                return self.result(False, FailureCategory.CRASH, f"get_inputs() failed: {_short_exc(exc)}")
            if not refilled:
                entry.update(status="skipped", reason="no floating-point inputs")
                continue
            try:
                with self.phase("reference"):
                    ref_out = self.ref.ref_model(*clone_inputs(inputs))
                    synchronize(self.device)
            except Exception as exc:  # inputs outside the reference's domain
                entry.update(status="skipped", reason=f"reference raised: {_short_exc(exc, 200)}")
                continue
            if not all_finite(ref_out):
                entry.update(status="skipped", reason="reference output not finite (inputs outside its domain)")
                continue
            if o.extra_draw_stability_check:
                try:
                    with self.phase("reference"):
                        probe = self.ref.ref_model(*nudged(inputs, s + 1))
                        synchronize(self.device)
                    stable = all_finite(probe) and compare_outputs(ref_out, probe, o.atol, o.rtol, "output",
                                                                   o.check_dtype).ok
                    del probe
                except Exception:
                    stable = False
                if not stable:
                    entry.update(status="skipped",
                                 reason="reference ill-conditioned (output moves beyond the tolerance under ulp-sized input changes)")
                    continue
            del inputs
            failed = self.candidate_on(name, {"seed": s, "extra": kind}, ref_out, f"an extra input draw ({label})")
            del ref_out
            entry["status"] = "failed" if failed is not None else "passed"
            if failed is not None:
                return failed
        return None

    def scale_comparable(self, inputs: list, ref_out: Any) -> bool:
        """Whether outputs the tolerance cannot tell from zero are compared at the reference's
        own scale: not when the reference itself moves at that scale under ulp-sized input
        changes (an output made of rounding noise, e.g. a sum that cancels)."""
        import torch

        o = self.opts
        tensors = [ref_out] if isinstance(ref_out, torch.Tensor) else \
            [t for t in (ref_out if isinstance(ref_out, (list, tuple)) else []) if isinstance(t, torch.Tensor)]
        scales = [reference_scale(t, o.atol) for t in tensors]
        if not any(x is not None for x in scales):
            return True
        try:
            probe = self.ref.ref_model(*nudged(inputs, self.seed + 3))
            synchronize(self.device)
            stable = compare_outputs(ref_out, probe, o.atol, o.rtol, "output", o.check_dtype, scaled=True).ok
        except Exception:
            stable = False
        self.meta["tolerance_scale"] = ("the reference's own scale (the tolerance cannot tell it from zero)" if stable
                                        else "atol/rtol only (the reference is rounding noise at its own scale)")
        return stable

    def second_seed(self) -> VerifyResult | None:
        """Weights by seed (KernelBench's protocol): both models built once more after another
        seed and compared on one draw, so that a ModelNew holding one seed's values fails."""
        from .rules import RULE_SEEDED

        if self.s.weights != "seeded":
            return None
        seed2 = (self.seed * 7919 + 104729) & 0x7FFFFFFF
        try:
            ref2 = build_models(self.ref_mod, None, self.device, seed2, True, self.s.cand_name)
        except LoadFailure as exc:
            return self.result(False, exc.category, exc.message)
        reply = self.s._request({"op": "reseed", "seed": seed2})
        if not reply.get("ok"):
            return self.result(False, FailureCategory.CRASH, f"ModelNew after a second seed: {str(reply.get('message') or reply.get('error'))[:800]}")
        s = input_seeds(self.seed ^ 0x3C3C3C3C, 1)[0]
        drawn = draw_inputs(self.ref_mod.get_inputs, s, self.device)
        ref_out = ref2.ref_model(*drawn.values)
        synchronize(self.device)
        self.meta["second_seed"] = seed2
        return self.candidate_on(f"second seed {seed2}", {"seed": s}, ref_out,
                                 f"the models built after a second seed (rule {RULE_SEEDED}: ModelNew must build its "
                                 f"parameters from the seed as Model does, not hold one seed's values)")

    def decoy(self) -> VerifyResult | None:
        """Under the kernelbench profile: a custom kernel must run, and the output must change
        when the custom kernels' outputs are poisoned."""
        from .rules import RULE_CUSTOM, RULE_DECOY

        if self.opts.rules != "kernelbench" or self.first_output is None:
            return None
        s = self.meta["input_seeds"][0]
        reply, poisoned = self.s.fetch({"op": "run", "seed": s, "poison": False, "poison_custom": True,
                                        "guard": dataclasses.asdict(self.opts.guard), "candidate": self.s.cand_name},
                                       "output")
        calls = reply.get("custom_kernel_calls") if isinstance(reply.get("custom_kernel_calls"), int) else 0
        self.meta["custom_kernel_calls"] = calls
        if not calls:
            return self.result(False, FailureCategory.FORBIDDEN_OP,
                               f"no custom kernel ran in ModelNew.forward (rule {RULE_CUSTOM}: under the kernelbench "
                               f"rules at least one kernel of the candidate's own must compute part of the result)")
        if poisoned is not None and compare_outputs(self.first_output, poisoned, 0.0, 0.0, "output").ok:
            return self.result(False, FailureCategory.FORBIDDEN_OP,
                               f"the output does not change when the custom kernels' outputs are replaced by NaN "
                               f"(rule {RULE_DECOY}: a custom kernel whose result is unused or overwritten by torch "
                               f"does not count; the result must come from the candidate's kernels)")
        self.meta["decoy_check"] = "passed"
        return None

    def candidate_on(self, name: str, draw: dict, ref_out: Any, rule: str) -> VerifyResult | None:
        """The candidate (in its process: guarded, memory poisoned) on the inputs ``draw``
        names, compared here with ``ref_out``; a failed VerifyResult, or None when it matched."""
        o = self.opts
        msg = {"op": "run", **draw, "poison": o.poison, "poison_hint": nbytes(ref_out), "timeout_s": o.timeout_s,
               "guard": dataclasses.asdict(o.guard), "candidate": self.s.cand_name}
        with self.phase("candidate"):
            reply, out = self.s.fetch(msg, "output")
        if "poisoned_bytes" in reply:
            self.meta["poisoned_bytes"] = reply["poisoned_bytes"]
        guard = reply.get("guard") if isinstance(reply.get("guard"), dict) else None
        if guard is not None:
            self.meta["allowed_torch_calls"] = _counts(guard.get("allowed_calls"))
            self.meta["custom_op_calls"] = _counts(guard.get("custom_calls"))
            violations = [str(v)[:1000] for v in (guard.get("violations") or [])[:5]]
            if violations:
                self.checks.append(CheckResult(name=name, passed=False, message=violations[0]))
                return self.result(False, FailureCategory.FORBIDDEN_OP, violations[0])
        if reply.get("forbidden"):
            text = str(reply["forbidden"])[:1000]
            self.checks.append(CheckResult(name=name, passed=False, message=text))
            return self.result(False, FailureCategory.FORBIDDEN_OP, text)
        if reply.get("timeout"):
            text = str(reply["timeout"])[:300]
            self.checks.append(CheckResult(name=name, passed=False, message=text))
            return self.result(False, FailureCategory.TIMEOUT, f"ModelNew.forward on {name}: {text}")
        if not reply.get("ok"):
            err = reply.get("error") if isinstance(reply.get("error"), dict) else {}
            text = f"ModelNew.forward raised on {name}: {str(err.get('message', 'unknown error'))[:1500]}"
            self.checks.append(CheckResult(name=name, passed=False, message=text))
            if err.get("cuda"):
                self.meta["cuda_context_broken"] = True
            return self.result(False, FailureCategory.CRASH, text)
        with self.phase("compare"):
            cmp = compare_outputs(ref_out, out, o.atol, o.rtol, "output", o.check_dtype, self.scaled)
        self.checks.append(CheckResult(name=name, passed=cmp.ok, max_abs_err=cmp.max_abs_err,
                                       max_rel_err=cmp.max_rel_err, where=cmp.where if not cmp.ok else "",
                                       message=cmp.message))
        if "candidate_outputs" not in self.meta:
            self.meta["candidate_outputs"] = describe(out)
            if self.opts.rules == "kernelbench":
                self.first_output = out
        del out
        if not cmp.ok:
            return self.result(False, FailureCategory.WRONG_RESULT, f"wrong result on {rule}: {cmp.message}")
        return None


def _counts(v: Any) -> dict:
    if not isinstance(v, dict):
        return {}
    return {str(k)[:200]: int(n) for k, n in list(v.items())[:200] if isinstance(n, int) and not isinstance(n, bool)}
