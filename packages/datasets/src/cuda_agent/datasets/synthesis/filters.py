"""The filters a synthesised candidate must pass, in order (the first failing one removes it).

* static, in the caller's process (:func:`screen`): ``invalid`` (does not parse, or lacks
  Model/get_inputs/get_init_inputs), ``stochastic`` (a random op in the model), ``similar``
  (AST structural similarity to a KernelBench problem above the threshold);
* run, in an executor job without root rights (:func:`check_candidate`, see
  :mod:`..untrusted`): ``eager`` (fails to build or run), ``nonfinite``, ``nondeterministic``,
  ``constant``, ``indistinguishable`` (two inputs agree within the check tolerance),
  ``time_window`` (eager time outside [min_ms, max_ms]) and ``compile`` (fails under
  torch.compile or disagrees with eager), the most expensive, last.
"""

from __future__ import annotations

import ast
import time
from dataclasses import dataclass

from ..validate import flatten_outputs, load_module, short_error, static_problems

FILTERS = (
    "invalid",
    "duplicate",
    "stochastic",
    "similar",
    "eager",
    "nonfinite",
    "nondeterministic",
    "constant",
    "indistinguishable",
    "time_window",
    "compile",
    "timeout",
    "crash",
)

STOCHASTIC_CALLS = {
    "dropout", "Dropout", "Dropout1d", "Dropout2d", "Dropout3d", "AlphaDropout", "FeatureAlphaDropout",
    "alpha_dropout", "feature_alpha_dropout", "dropout1d", "dropout2d", "dropout3d", "rand", "randn",
    "rand_like", "randn_like", "randint", "randint_like", "randperm", "bernoulli", "multinomial",
    "normal", "poisson", "normal_", "uniform_", "exponential_", "geometric_", "cauchy_", "log_normal_",
    "random_", "bernoulli_", "gumbel_softmax", "rrelu", "RReLU",
}


@dataclass
class FilterOptions:
    device: str = "cpu"
    min_ms: float = 0.05
    max_ms: float = 50.0
    warmup: int = 2
    iters: int = 5
    det_rtol: float = 1e-5
    det_atol: float = 1e-6
    tol: float = 1e-2  # verification tolerance (atol = rtol)
    compile: bool = True
    compile_backend: str = "inductor"
    compile_mode: str | None = None
    similarity_threshold: float = 0.9


def stochastic_calls(code: str) -> list[str]:
    """Random ops called in the model's methods (not in ``__init__``: random initial weights
    are fixed by the seed before the model is built; not in get_inputs)."""
    try:
        tree = ast.parse(code)
    except SyntaxError:
        return []
    found = []
    methods = [
        f for c in tree.body if isinstance(c, ast.ClassDef) for f in c.body
        if isinstance(f, (ast.FunctionDef, ast.AsyncFunctionDef)) and f.name != "__init__"
    ]
    inits = [
        f for c in tree.body if isinstance(c, ast.ClassDef) for f in c.body
        if isinstance(f, ast.FunctionDef) and f.name == "__init__"
    ]
    # modules built in __init__ (nn.Dropout) act in forward: scan __init__ for stochastic modules only
    scan = methods + inits
    for fn in scan:
        for node in ast.walk(fn):
            if isinstance(node, ast.Call):
                f = node.func
                name = f.attr if isinstance(f, ast.Attribute) else getattr(f, "id", "")
                if fn in inits and not name[:1].isupper():
                    continue  # torch.randn(...) initial weights in __init__ are fine
                if name in STOCHASTIC_CALLS:
                    p = None
                    for kw in node.keywords:
                        if kw.arg == "p" and isinstance(kw.value, ast.Constant):
                            p = kw.value.value
                    if "ropout" in name and p == 0:
                        continue
                    found.append(name)
    return found


def screen(code: str, decon=None) -> dict:
    """The static filters (no code runs): a rejection, or ``ok`` with the similarity found."""
    problems = static_problems(code)
    if problems:
        return _reject("invalid", "; ".join(problems))
    rnd = stochastic_calls(code)
    if rnd:
        return _reject("stochastic", f"random op in the model: {', '.join(sorted(set(rnd)))}")
    if decon is None:
        return {"ok": True}
    m = decon.closest(code)
    extra = {"similarity": round(m.score, 4), "closest": m.ref_id}
    if m.score > decon.threshold:
        return _reject("similar", f"similarity {m.score:.3f} to {m.ref_id}", **extra)
    return {"ok": True, **extra}


def init_filters(shared: dict, device: str) -> dict:
    """The job's state (before its rights are given up): the options, on the job's device."""
    import torch

    opts = FilterOptions(**shared["filters"])
    if device.startswith("cuda"):
        opts.device = device
        torch.cuda.init()
        # get_inputs() and Model() allocate on the GPU directly (no host-side random fill)
        torch.set_default_device(device)
    else:
        opts.device = "cpu"
    return {"opts": opts, "n": 0}


def _reject(name: str, reason: str, **extra) -> dict:
    return {"ok": False, "filter": name, "reason": reason[:300], **extra}


def _inputs(mod, seed: int, device: str) -> list:
    import torch

    torch.manual_seed(seed)
    xs = mod.get_inputs()
    return [x.to(device) if isinstance(x, torch.Tensor) else x for x in xs]


def _close(a: list, b: list, rtol: float, atol: float) -> bool:
    import torch

    if len(a) != len(b):
        return False
    for x, y in zip(a, b):
        if x.shape != y.shape:
            return False
        if x.is_floating_point():
            if not torch.allclose(x, y, rtol=rtol, atol=atol, equal_nan=False):
                return False
        elif not torch.equal(x, y):
            return False
    return True


def _constant(outs: list) -> bool:
    for o in outs:
        if o.numel() > 1:
            f = o.float()
            if float((f.max() - f.min()).abs()) > 1e-6 * (1.0 + float(f.abs().max())):
                return False
    return any(o.numel() > 1 for o in outs)


def _time_ms(fn, inputs: list, device: str, warmup: int, iters: int) -> float:
    import statistics

    import torch

    for _ in range(warmup):
        fn(*inputs)
    times = []
    if device.startswith("cuda"):
        torch.cuda.synchronize()
        for _ in range(iters):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn(*inputs)
            end.record()
            torch.cuda.synchronize()
            times.append(start.elapsed_time(end))
    else:
        for _ in range(iters):
            t0 = time.perf_counter()
            fn(*inputs)
            times.append((time.perf_counter() - t0) * 1000.0)
    return statistics.median(times)


def check_candidate(code: str, state: dict) -> dict:
    """The run filters on ``code`` (in a job process, see :mod:`..untrusted`; the static ones
    passed already); ``ok`` when it passes them all."""
    import sys
    import tempfile

    import torch

    opts: FilterOptions = state["opts"]
    extra: dict = {}
    state["n"] += 1
    name = f"_cand_{state['n']}"
    dev = opts.device
    try:
        try:
            mod = load_module(code, name, state.setdefault("tmp", tempfile.mkdtemp(prefix="cuda_agent_synth_")))
            torch.manual_seed(1234)
            model = mod.Model(*mod.get_init_inputs()).to(dev)
            x1 = _inputs(mod, 1, dev)
            with torch.no_grad():
                out1 = flatten_outputs(model(*x1))
        except BaseException as exc:  # noqa: BLE001 - the candidate's failure, not ours
            return _reject("eager", short_error(exc), **extra)
        extra["output_shapes"] = [list(o.shape) for o in out1]
        if any(o.is_floating_point() and not bool(torch.isfinite(o).all()) for o in out1):
            return _reject("nonfinite", "output has NaN or inf", **extra)
        with torch.no_grad():
            again = flatten_outputs(model(*x1))
        if not _close(out1, again, opts.det_rtol, opts.det_atol):
            return _reject("nondeterministic", "same input, different output", **extra)
        if _constant(out1):
            return _reject("constant", "every output element is equal", **extra)
        x2 = _inputs(mod, 2, dev)
        with torch.no_grad():
            out2 = flatten_outputs(model(*x2))
        if _close(out1, out2, 1e-6, 1e-7):
            return _reject("constant", "the output does not depend on the input", **extra)
        if _close(out1, out2, opts.tol, opts.tol):
            return _reject("indistinguishable", f"two inputs give outputs within {opts.tol:g}", **extra)
        with torch.no_grad():
            ms = _time_ms(model, x1, dev, opts.warmup, opts.iters)
        extra["eager_ms"] = round(ms, 4)
        if not (opts.min_ms <= ms <= opts.max_ms):
            return _reject("time_window", f"eager {ms:.3f} ms outside [{opts.min_ms:g}, {opts.max_ms:g}] ms", **extra)
        if opts.compile:
            try:
                torch._dynamo.reset()
                kwargs = {"backend": opts.compile_backend}
                if opts.compile_mode:
                    kwargs["mode"] = opts.compile_mode
                compiled = torch.compile(model, **kwargs)
                t0 = time.perf_counter()
                with torch.no_grad():
                    outc = flatten_outputs(compiled(*x1))
                extra["compile_s"] = round(time.perf_counter() - t0, 3)
            except BaseException as exc:  # noqa: BLE001
                return _reject("compile", short_error(exc), **extra)
            finally:
                torch._dynamo.reset()
            if not _close(out1, outc, opts.tol, opts.tol):
                return _reject("compile", "torch.compile output differs from eager", **extra)
        return {"ok": True, "filter": "", "reason": "", **extra}
    finally:
        sys.modules.pop(name, None)
