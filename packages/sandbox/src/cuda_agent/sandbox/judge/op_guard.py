"""Run-time blocking of torch operators while ``ModelNew.forward`` runs.

The paper's released scripts blocked only ``torch.nn.functional``; ``torch.matmul``, tensor
methods (``x.relu()``, ``x @ w``) and torch operators called from inside a C++ binding
passed. :func:`forward_guard` closes all of these with two torch modes, active only around
the candidate's forward call:

* a :class:`~torch.overrides.TorchFunctionMode` sees every Python-level torch call:
  ``torch.*`` functions, ``torch.nn.functional.*``, tensor methods and operators, property
  reads and ``torch.ops.<ns>.<op>`` calls;
* a :class:`~torch.utils._python_dispatch.TorchDispatchMode` sees every ATen operator that
  reaches the dispatcher on this thread, including those called from compiled code (a
  pybind11 binding doing ``at::matmul`` or ``torch::relu``).

What may run (configurable through :class:`GuardOptions`):

* tensor creation (``torch.empty``, ``empty_like``, ``zeros``, ``new_empty``, ``fill_``, ...);
* metadata access (``size``, ``shape``, ``stride``, ``data_ptr``, ``dtype``, ``device``,
  ``numel``, ``dim``, ``is_contiguous``, ...);
* views, decided at the ATen level: ``view``, ``reshape``, ``__getitem__``,
  ``contiguous``, ``permute`` ... pass when they only make a view and are refused when
  they would copy or compute (``aten.clone``, ``aten.index``);
* custom operators: calls into compiled code that are not torch operators at all (ctypes
  functions, pybind11 functions of a ``cpp_extension`` module), and ``torch.ops`` operators
  of namespaces registered by the candidate's own library.

Everything else is refused with :class:`ForbiddenOpError`, whose message names the
operator and the rule broken. Violations are also recorded on the guard, so a candidate
that swallows the exception still fails verification.

What does not hold: operators run *inside* a custom ``torch.ops`` operator's own kernel are
not seen (the dispatcher runs them below the mode); the static checks on the kernel sources
(``checks.kernel_sources``) cover that path.
"""

from __future__ import annotations

import contextlib
import threading
from dataclasses import dataclass, field
from typing import Any, Iterator

# --- default allowlists -------------------------------------------------------------

CREATION = frozenset(
    {
        "empty", "empty_like", "empty_strided", "zeros", "zeros_like", "ones", "ones_like",
        "full", "full_like", "new_empty", "new_empty_strided", "new_zeros", "new_ones",
        "new_full", "zero_", "fill_", "tensor", "scalar_tensor", "arange",
    }
)
METADATA = frozenset(
    {
        "size", "stride", "dim", "ndimension", "numel", "nelement", "data_ptr",
        "element_size", "storage_offset", "is_contiguous", "is_floating_point", "is_complex",
        "get_device", "__len__", "__repr__", "__str__", "__format__", "__hash__",
        "untyped_storage", "record_stream", "is_pinned", "is_set_to", "type",
        # properties (read through getset descriptors)
        "shape", "dtype", "device", "ndim", "is_cuda", "is_cpu", "is_meta", "layout",
        "requires_grad", "itemsize", "nbytes", "is_leaf", "grad_fn", "grad", "names",
        "is_sparse", "is_quantized", "is_mkldnn", "is_nested", "_base", "data", "output_nr",
        "_version", "is_xpu", "is_mps",
    }
)
# decided per ATen operator: allowed while they only make views
VIEWS = frozenset(
    {
        "view", "view_as", "reshape", "reshape_as", "flatten", "unflatten", "squeeze",
        "unsqueeze", "contiguous", "detach", "expand", "expand_as", "permute", "transpose",
        "t", "narrow", "select", "split", "chunk", "unbind", "__getitem__", "as_strided",
        "movedim", "swapaxes", "squeeze_", "unsqueeze_", "view_as_real", "view_as_complex",
        "T", "mT",
    }
)
ATEN_ALLOWED = frozenset(
    {
        # creation
        "empty", "empty_like", "empty_strided", "new_empty", "new_empty_strided", "zeros",
        "zeros_like", "ones", "ones_like", "full", "full_like", "new_zeros", "new_ones",
        "new_full", "zero_", "fill_", "arange", "scalar_tensor", "lift_fresh",
        "lift_fresh_copy", "resize_",
        # views and metadata
        "view", "_unsafe_view", "alias", "as_strided", "slice", "select", "narrow",
        "unsqueeze", "squeeze", "expand", "permute", "transpose", "t", "unflatten", "split",
        "split_with_sizes", "unbind", "detach", "_reshape_alias", "sym_size", "sym_stride",
        "sym_numel", "sym_storage_offset", "is_contiguous", "is_same_size", "record_stream",
        "view_as_real", "view_as_complex", "movedim", "squeeze_", "unsqueeze_",
    }
)
# conversions compiled code (a binding) may make before its kernel runs: dtype, device, layout.
# From Python in forward they stay refused (``x.contiguous()`` that copies, ``x.to(...)``)
ATEN_CONVERSIONS = frozenset({"_to_copy", "clone", "copy_", "_copy_from", "_copy_from_and_resize", "contiguous"})
# operator namespaces that belong to torch itself or third-party libraries
BUILTIN_NAMESPACES = frozenset(
    {
        "aten", "prim", "prims", "_c10d_functional", "_c10d_functional_autograd", "c10d",
        "_dtensor", "quantized", "_quantized", "quantized_decomposed", "inductor", "profiler",
        "rngprims", "higher_order", "debugprims", "mkldnn", "onednn", "fbgemm", "torchvision",
        "torchaudio", "triton", "xformers", "_test", "nccl", "cudnn", "sparse", "mkl",
    }
)

RULE_FUNCTIONAL = "runtime.functional"
RULE_TORCH = "runtime.torch-function"
RULE_METHOD = "runtime.tensor-method"
RULE_COMPILED = "runtime.compiled-code-op"
RULE_THIRD_PARTY = "runtime.library-op"

_RULE_TEXT = {
    RULE_FUNCTIONAL: "torch.nn.functional is blocked while ModelNew.forward runs",
    RULE_TORCH: "torch functions other than tensor creation are blocked while ModelNew.forward runs",
    RULE_METHOD: "tensor methods and operators other than metadata, views and creation are blocked "
    "while ModelNew.forward runs",
    RULE_COMPILED: "compiled code may not call torch operators (only tensor creation); "
    "write the computation as a kernel",
    RULE_THIRD_PARTY: "operators of libraries other than the candidate's own are blocked",
}


class ForbiddenOpError(RuntimeError):
    """A torch operator ran inside ModelNew.forward against the rules."""

    def __init__(self, op: str, rule: str, detail: str = ""):
        self.op = op
        self.rule = rule
        msg = f"forbidden op {op} in ModelNew.forward (rule {rule}: {_RULE_TEXT.get(rule, rule)})"
        if detail:
            msg += f"; {detail}"
        super().__init__(msg)


@dataclass
class GuardOptions:
    """Allowlist of the run-time guard.

    ``allow`` adds names (short ``"matmul"`` or qualified ``"torch.Tensor.add"``,
    ``"torch.nn.functional.relu"``, ``"aten.mm"``); ``deny`` removes names from the default
    lists; ``views`` allows view operators; ``custom_namespaces`` lists extra ``torch.ops``
    namespaces that count as the candidate's own (those registered while the candidate
    module was imported count automatically).
    """

    enabled: bool = True
    allow: list[str] = field(default_factory=list)
    deny: list[str] = field(default_factory=list)
    views: bool = True
    custom_namespaces: list[str] = field(default_factory=list)


@dataclass
class Violation:
    op: str
    rule: str
    message: str


class _State(threading.local):
    def __init__(self) -> None:
        self.allowed_depth = 0  # inside an allowed Python-level call: everything below passes
        self.passthrough = 0  # inside the dispatch handler: the function mode steps aside
        self.deferred: list[tuple[str, str]] = []  # Python-level view calls being judged at the ATen level


def _op_namespace(func: Any) -> str | None:
    """The namespace of a ``torch.ops`` operator (overload or packet), else None."""
    from torch._ops import OpOverload, OpOverloadPacket

    if isinstance(func, OpOverload):
        return func.namespace
    if isinstance(func, OpOverloadPacket):
        return func._qualified_op_name.split("::", 1)[0]
    return None


def _qualname(func: Any) -> str:
    from torch.overrides import resolve_name

    try:
        name = resolve_name(func)
    except Exception:  # pragma: no cover - defensive
        name = None
    if name:
        return name
    self_obj = getattr(func, "__self__", None)
    fname = getattr(func, "__name__", repr(func))
    if fname in ("__get__", "__set__", "__delete__") and self_obj is not None:
        return f"torch.Tensor.{getattr(self_obj, '__name__', '?')}.{fname}"
    qual = getattr(func, "__qualname__", fname)
    if qual.startswith(("TensorBase.", "Tensor.")):
        return "torch.Tensor." + qual.split(".", 1)[1]
    mod = getattr(func, "__module__", None) or ""
    return f"{mod}.{fname}" if mod else fname


class RuntimeGuard:
    """Both torch modes plus the record of what they saw; use :func:`forward_guard`."""

    def __init__(self, options: GuardOptions | None = None, custom_namespaces: set[str] | None = None):
        self.options = options or GuardOptions()
        deny = set(self.options.deny)
        allow = set(self.options.allow)
        self.allowed = (CREATION | METADATA | allow) - deny
        self.views = (VIEWS - deny) if self.options.views else frozenset()
        self.aten_allowed = (
            (ATEN_ALLOWED if self.options.views else ATEN_ALLOWED & (CREATION | {"sym_size", "sym_stride", "sym_numel"}))
            | {a.split(".", 1)[1] if a.startswith("aten.") else a for a in allow}
        ) - deny
        self.custom_namespaces = set(custom_namespaces or ()) | set(self.options.custom_namespaces)
        self.violations: list[Violation] = []
        self.allowed_calls: dict[str, int] = {}
        self.custom_calls: dict[str, int] = {}
        self._state = _State()

    # -- decisions ---------------------------------------------------------------------

    def _is_allowed_name(self, qual: str, short: str, names: frozenset | set) -> bool:
        return short in names or qual in self.options.allow

    def _refuse(self, op: str, rule: str, detail: str = "") -> None:
        err = ForbiddenOpError(op, rule, detail)
        self.violations.append(Violation(op, rule, str(err)))
        raise err

    def on_function(self, func: Any, args: tuple, kwargs: dict) -> Any:
        st = self._state
        if st.passthrough or st.allowed_depth:
            return func(*args, **kwargs)
        ns = _op_namespace(func)
        if ns is not None:  # torch.ops.<ns>.<op>
            if ns in self.custom_namespaces:
                key = str(func)
                self.custom_calls[key] = self.custom_calls.get(key, 0) + 1
                return self._run_allowed(func, args, kwargs)
            # an ATen or library operator called directly: judged at the dispatch level
            st.deferred.append((f"torch.ops.{func}", RULE_TORCH))
            try:
                return func(*args, **kwargs)
            finally:
                st.deferred.pop()
        qual = _qualname(func)
        if qual.endswith(".__get__"):
            qual = qual[: -len(".__get__")]
        short = qual.rsplit(".", 1)[-1]
        if qual.endswith((".__set__", ".__delete__")):
            self._refuse(qual.rsplit(".", 1)[0] + " (assignment)", RULE_METHOD)
        if qual.startswith("torch.nn.functional."):
            if qual in self.options.allow:
                return self._run_allowed(func, args, kwargs, qual)
            self._refuse(qual, RULE_FUNCTIONAL)
        is_method = qual.startswith("torch.Tensor.")
        if self._is_allowed_name(qual, short, self.allowed):
            return self._run_allowed(func, args, kwargs, qual)
        if short in self.views:
            st.deferred.append((qual, RULE_METHOD if is_method else RULE_TORCH))
            try:
                return func(*args, **kwargs)
            finally:
                st.deferred.pop()
        self._refuse(qual, RULE_METHOD if is_method else RULE_TORCH)

    def _run_allowed(self, func: Any, args: tuple, kwargs: dict, qual: str | None = None) -> Any:
        st = self._state
        if qual:
            self.allowed_calls[qual] = self.allowed_calls.get(qual, 0) + 1
        st.allowed_depth += 1
        try:
            return func(*args, **kwargs)
        finally:
            st.allowed_depth -= 1

    def on_dispatch(self, func: Any, args: tuple, kwargs: dict) -> Any:
        st = self._state
        ns = getattr(func, "namespace", "aten")
        name = func._schema.name.split("::", 1)[-1]
        op = f"{ns}.{name}"
        if not st.allowed_depth:
            if ns in self.custom_namespaces:
                self.custom_calls[op] = self.custom_calls.get(op, 0) + 1
            elif ns != "aten" and ns not in ("prim", "prims"):
                if op not in self.options.allow:
                    self._refuse(op, RULE_THIRD_PARTY)
            elif name in ATEN_CONVERSIONS and not st.deferred and "aten." + name not in self.options.deny:
                pass
            elif name not in self.aten_allowed and op not in self.options.allow:
                if st.deferred:
                    outer, rule = st.deferred[-1]
                    if outer.startswith("torch.ops."):
                        self._refuse(outer, rule)
                    self._refuse(outer, rule, f"it ran {op}, which copies or computes")
                self._refuse(f"aten.{name}", RULE_COMPILED, "called from compiled code or a custom binding")
        st.passthrough += 1
        try:
            return func(*args, **kwargs)
        finally:
            st.passthrough -= 1

    # -- activation --------------------------------------------------------------------

    @contextlib.contextmanager
    def active(self) -> Iterator["RuntimeGuard"]:
        from torch.overrides import TorchFunctionMode
        from torch.utils._python_dispatch import TorchDispatchMode

        guard = self

        class _FunctionMode(TorchFunctionMode):
            def __torch_function__(self, func, types, args=(), kwargs=None):
                return guard.on_function(func, args, kwargs or {})

        class _DispatchMode(TorchDispatchMode):
            def __torch_dispatch__(self, func, types, args=(), kwargs=None):
                return guard.on_dispatch(func, args, kwargs or {})

        if not self.options.enabled:
            yield self
            return
        with _FunctionMode(), _DispatchMode():
            yield self

    @property
    def first_violation(self) -> Violation | None:
        return self.violations[0] if self.violations else None


def registered_op_names() -> set[str]:
    """Every operator name the dispatcher knows now (to find a candidate's own namespaces)."""
    import torch

    try:
        return set(torch._C._dispatch_get_all_op_names())
    except Exception:  # pragma: no cover
        return set()


def new_namespaces(before: set[str], after: set[str]) -> set[str]:
    return {n.split("::", 1)[0] for n in after - before if "::" in n} - set(BUILTIN_NAMESPACES)


@contextlib.contextmanager
def forward_guard(options: GuardOptions | None = None, custom_namespaces: set[str] | None = None) -> Iterator[RuntimeGuard]:
    """``with forward_guard(opts, namespaces) as g: out = model_new(*inputs)``; then
    ``g.violations`` lists every refusal (also the ones the candidate caught)."""
    guard = RuntimeGuard(options, custom_namespaces)
    with guard.active():
        yield guard
