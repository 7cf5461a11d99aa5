"""Static check: no torch operators in the kernel sources (.cu/.cpp, and C++ strings of a
single-file solution).

The custom code may use torch only to describe, create and convert tensors: ``torch::Tensor``,
``TensorOptions``, ``torch::empty``/``empty_like``/``zeros``..., the scalar types, the
current CUDA stream and device guards, ``data_ptr``/``size``/``stride``/... on tensors,
conversions (``.to``, ``.contiguous``, ``.float()``, ``copy_``), and
the macros (``TORCH_CHECK``, ``AT_DISPATCH_*``, ``PYBIND11_MODULE``, ``TORCH_LIBRARY``).
Anything else (``at::matmul``, ``torch::relu``, ``x.sum()``, ``torch::nn::functional``)
computes with torch and is refused. cuBLAS and cuDNN themselves are allowed (GEMMs and
convolutions); torch's own wrappers around them (``at::cuda::blas``) are not.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

from .base import StaticCheck, line_of, strip_cxx

ALLOWED_NAMES = frozenset(
    {
        "Tensor", "TensorOptions", "ScalarType", "Scalar", "Device", "DeviceType", "DeviceGuard",
        "OptionalDeviceGuard", "Layout", "MemoryFormat", "IntArrayRef", "ArrayRef", "SymInt",
        "optional", "nullopt", "Half", "BFloat16", "Float8_e4m3fn", "Float8_e5m2", "complex",
        "kFloat", "kFloat32", "kFloat16", "kHalf", "kBFloat16", "kDouble", "kFloat64", "kInt",
        "kInt32", "kLong", "kInt64", "kShort", "kInt16", "kChar", "kInt8", "kByte", "kUInt8",
        "kBool", "kCUDA", "kCPU", "kStrided", "kFloat8_e4m3fn", "kFloat8_e5m2", "kComplexFloat",
        "empty", "empty_like", "empty_strided", "zeros", "zeros_like", "ones", "ones_like",
        "full", "full_like", "dtype", "device", "requires_grad", "layout", "memory_format",
        "elementSize", "toString", "isFloatingType", "isIntegralType", "typeMetaToScalarType",
        "TensorArg", "CheckedFrom", "checkAllSameGPU", "checkContiguous", "checkDim", "checkSize",
        "checkScalarType", "checkAllSameType", "acc_type", "opmath_type",
        "ScalarTypeToCPPTypeT", "extension", "DimVector", "IntList", "TensorAccessor",
        "PackedTensorAccessor32", "PackedTensorAccessor64", "RestrictPtrTraits",
        "DefaultPtrTraits", "Generator", "library", "Library", "RegisterOperators", "jit",
        "CppFunction", "Dispatcher", "kCompositeExplicitAutograd", "DispatchKey", "get_num_threads",
        "native_handle", "IValue",
    }
)
ALLOWED_CUDA = frozenset(
    {
        "getCurrentCUDAStream", "getDefaultCUDAStream", "CUDAStream", "CUDAGuard",
        "OptionalCUDAGuard", "CUDAStreamGuard", "getCurrentDeviceProperties",
        "getDeviceProperties", "getCurrentCUDABlasHandle", "getCurrentCUDABlasLtHandle",
        "getCurrentCUDASolverDnHandle", "getCUDABlasLtWorkspace", "getCurrentCUDASparseHandle",
        "device_count", "current_device", "set_device", "warp_size", "getStreamFromPool",
        "CUDAEvent", "stream_synchronize", "getCUDADeviceAllocator",
    }
)
ALLOWED_CUDNN = frozenset({"getCudnnHandle"})
# tensor methods that only describe, create or view (static side; the run-time guard judges copies)
ALLOWED_METHODS = frozenset(
    {
        "size", "sizes", "stride", "strides", "numel", "dim", "ndimension", "data_ptr",
        "const_data_ptr", "mutable_data_ptr", "options", "scalar_type", "dtype", "device",
        "is_contiguous", "contiguous", "defined", "is_cuda", "is_cpu", "element_size",
        "storage_offset", "nbytes", "itemsize", "get_device", "accessor", "packed_accessor32",
        "packed_accessor64", "generic_packed_accessor", "view", "reshape", "resize_", "zero_",
        "fill_", "data", "layout", "requires_grad", "type", "is_floating_point", "squeeze",
        "unsqueeze", "flatten", "expand", "view_as", "select", "narrow", "slice", "permute",
        "transpose", "t", "detach", "sym_size", "sym_numel", "new_empty", "new_zeros",
        "new_full", "new_ones", "record_stream", "unsafeGetTensorImpl", "name", "names",
        "storage", "is_same", "use_count", "suggest_memory_format", "is_non_overlapping_and_dense",
        "cuda", "cpu",
        # conversions: a binding may hand its kernel a tensor of the dtype, device or layout it takes
        "to", "type_as", "float", "half", "double", "bfloat16", "int", "long", "bool", "char", "byte", "short",
        "copy_", "clone",
        # cooperative groups / cub / common C++ member names that clash with tensor methods
        "any", "all", "ballot", "sync", "shfl", "shfl_down", "shfl_up", "shfl_xor",
        "thread_rank", "num_threads", "meta_group_rank", "index", "begin", "end", "first",
        "second", "push_back", "emplace_back", "back", "front", "at", "get", "set", "reset",
        "count", "find", "insert", "erase", "clear", "empty", "reserve", "resize", "swap",
        "str", "c_str", "length", "x", "y", "z", "w", "load", "store", "exchange", "wait",
        "signal", "put", "take", "apply_", "map_", "tile", "real", "imag", "sub",
    }
)
_FALLBACK_METHODS = (
    "matmul mm bmm addmm addmv addbmm baddbmm mv dot conv1d conv2d conv3d relu relu_ sigmoid "
    "tanh gelu silu softmax log_softmax exp log sqrt rsqrt pow sum mean prod max min amax amin "
    "argmax argmin norm std var cumsum cumprod sort topk clamp clamp_ add add_ mul mul_ div div_ "
    "neg abs sign sin cos where masked_fill index_select gather scatter scatter_add copy_ clone "
    "to float half double bfloat16 int long bool einsum linear layer_norm batch_norm "
    "group_norm instance_norm dropout transpose_ triu tril flip roll repeat tile expm1 log1p "
    "erf lerp maximum minimum hardtanh elu selu softplus logsumexp addcmul addcdiv"
).split()


def _tensor_methods() -> frozenset:
    try:
        import torch

        names = {n for n in dir(torch.Tensor) if not n.startswith("_")}
    except Exception:  # pragma: no cover - torch is always there in practice
        names = set(_FALLBACK_METHODS)
    return frozenset(names - ALLOWED_METHODS)


_QUALIFIED = re.compile(r"\b(torch|at|c10)\s*::\s*(\w+)(?:\s*::\s*(\w+))?(?:\s*::\s*(\w+))?")
_METHOD_CALL = re.compile(r"(?:\.|->)\s*(\w+)\s*(?:<[^<>;()]*>)?\s*\(")


class KernelTorchOpsCheck(StaticCheck):
    name = "kernel_torch_ops"
    rule = "static.kernel-torch-op"
    why = "kernel sources may use torch only to describe and create tensors; write the computation as CUDA"
    description = "Refuses torch/ATen operators (at::matmul, torch::relu, x.sum(), ...) in .cu/.cpp sources."

    @dataclass
    class Options:
        allow: list[str] = field(default_factory=list)  # extra allowed names (e.g. "at::cuda::blas", "sum")

    def check(self, workspace: Path, candidate=None) -> list[str]:
        allow = set(self.options.allow)
        methods = _tensor_methods() - allow
        out: list[str] = []
        for label, first_line, raw in self.kernel_sources(Path(workspace), candidate):
            text = strip_cxx(raw)
            for m in _QUALIFIED.finditer(text):
                ns, a, b, c = m.group(1), m.group(2), m.group(3), m.group(4)
                qual = "::".join(x for x in (ns, a, b, c) if x)
                if qual in allow or f"{ns}::{a}" in allow:
                    continue
                if ns == "c10" or a in ALLOWED_NAMES:
                    continue
                if a == "cuda" and (b is None or b in ALLOWED_CUDA):
                    continue
                if a == "cudnn" and b in ALLOWED_CUDNN:
                    continue
                where = f"{label}:{first_line - 1 + line_of(text, m.start())}"
                out.append(self.violation(where, f"{qual} is a torch operator or internal"))
            for m in _METHOD_CALL.finditer(text):
                meth = m.group(1)
                if meth in methods:
                    where = f"{label}:{first_line - 1 + line_of(text, m.start())}"
                    out.append(self.violation(where, f"tensor method .{meth}() computes with torch"))
        return out
