"""Precision policy: which reduced-precision shortcuts torch may take while timing or verifying.

The paper's released scripts timed baselines in plain FP32 while a candidate kernel was free to
use TF32 (or FP16) and still pass a 1e-2 tolerance, which inflates matmul and convolution
speedups. Here the same policy applies to the baselines *and* the candidate: by default TF32 is
off for both cuBLAS matmuls and cuDNN convolutions. A profile can additionally report speedups
against baselines measured with TF32 on (``ProfileOptions.report_tf32_baselines``).

The policy is applied with :func:`precision_context` and recorded with :func:`precision_flags`.
"""

from __future__ import annotations

import contextlib
from dataclasses import asdict, dataclass
from typing import Any, Iterator


@dataclass(frozen=True)
class PrecisionPolicy:
    """``allow_tf32`` turns TF32 on for cuBLAS matmuls and cuDNN convolutions/RNNs."""

    allow_tf32: bool = False

    @property
    def key(self) -> str:
        return "tf32" if self.allow_tf32 else "fp32-strict"

    def to_dict(self) -> dict:
        return asdict(self) | {"key": self.key}


STRICT = PrecisionPolicy(allow_tf32=False)
TF32 = PrecisionPolicy(allow_tf32=True)


def policy_from(value: Any) -> PrecisionPolicy:
    """Accept a PrecisionPolicy, a mapping, a bool or one of the keys "fp32-strict"/"tf32"."""
    if isinstance(value, PrecisionPolicy):
        return value
    if value is None:
        return STRICT
    if isinstance(value, bool):
        return PrecisionPolicy(allow_tf32=value)
    if isinstance(value, str):
        v = value.strip().lower()
        if v in ("tf32", "allow_tf32", "tf32-on"):
            return TF32
        if v in ("fp32", "fp32-strict", "strict", "ieee", "highest"):
            return STRICT
        from cuda_agent.core.errors import ConfigError

        raise ConfigError(f"unknown precision policy {value!r}; valid: fp32-strict, tf32")
    if isinstance(value, dict):
        return PrecisionPolicy(allow_tf32=bool(value.get("allow_tf32", False)))
    raise TypeError(f"cannot read a precision policy from {value!r}")


def _new_api(torch) -> bool:
    return hasattr(torch.backends, "cuda") and hasattr(torch.backends.cuda.matmul, "fp32_precision")


def _quiet():
    import warnings

    w = warnings.catch_warnings()
    w.__enter__()
    warnings.simplefilter("ignore")
    return w


def precision_flags() -> dict:
    """The torch flags in force now (what a result records)."""
    import torch

    w = _quiet()
    try:
        flags: dict[str, Any] = {"cudnn_enabled": bool(torch.backends.cudnn.enabled)}
        for key, getter in (
            ("matmul_allow_tf32", lambda: bool(torch.backends.cuda.matmul.allow_tf32)),
            ("cudnn_allow_tf32", lambda: bool(torch.backends.cudnn.allow_tf32)),
            ("float32_matmul_precision", torch.get_float32_matmul_precision),
        ):
            try:
                flags[key] = getter()
            except RuntimeError:  # torch refuses legacy getters after a mix of old and new APIs
                flags[key] = None
        if _new_api(torch):
            flags["matmul_fp32_precision"] = torch.backends.cuda.matmul.fp32_precision
            flags["cudnn_conv_fp32_precision"] = torch.backends.cudnn.conv.fp32_precision
            flags["cudnn_rnn_fp32_precision"] = torch.backends.cudnn.rnn.fp32_precision
        flags["matmul_allow_fp16_reduced_precision_reduction"] = bool(
            torch.backends.cuda.matmul.allow_fp16_reduced_precision_reduction
        )
        flags["matmul_allow_bf16_reduced_precision_reduction"] = bool(
            torch.backends.cuda.matmul.allow_bf16_reduced_precision_reduction
        )
    finally:
        w.__exit__(None, None, None)
    return flags


def apply_policy(policy: PrecisionPolicy) -> None:
    """Set torch's global flags to ``policy`` (process-wide).

    Uses the long-standing ``allow_tf32`` switches: they keep every getter of both the old
    and the per-backend API answering consistently (mixing the two APIs makes torch refuse
    the old getters, which inductor still reads)."""
    import torch

    w = _quiet()
    try:
        torch.backends.cuda.matmul.allow_tf32 = policy.allow_tf32
        torch.backends.cudnn.allow_tf32 = policy.allow_tf32
    finally:
        w.__exit__(None, None, None)


def _snapshot() -> tuple:
    import torch

    w = _quiet()
    try:
        try:
            return ("old", bool(torch.backends.cuda.matmul.allow_tf32), bool(torch.backends.cudnn.allow_tf32))
        except RuntimeError:
            return (
                "new",
                torch.backends.cuda.matmul.fp32_precision,
                torch.backends.cudnn.conv.fp32_precision,
                torch.backends.cudnn.rnn.fp32_precision,
            )
    finally:
        w.__exit__(None, None, None)


def _restore(snap: tuple) -> None:
    import torch

    w = _quiet()
    try:
        if snap[0] == "old":
            torch.backends.cuda.matmul.allow_tf32 = snap[1]
            torch.backends.cudnn.allow_tf32 = snap[2]
        else:
            torch.backends.cuda.matmul.fp32_precision = snap[1]
            torch.backends.cudnn.conv.fp32_precision = snap[2]
            torch.backends.cudnn.rnn.fp32_precision = snap[3]
    finally:
        w.__exit__(None, None, None)


@contextlib.contextmanager
def precision_context(policy: PrecisionPolicy | Any = None) -> Iterator[dict]:
    """Apply ``policy`` for the duration of the block; yields the flags in force."""
    policy = policy_from(policy)
    snap = _snapshot()
    apply_policy(policy)
    try:
        yield precision_flags()
    finally:
        _restore(snap)
