"""The options of a verification job (:class:`VerifyOptions`).

A run config's ``verify`` node (or a service's ``verify_options``) maps onto these fields;
the rule profile (:mod:`.rules`) sets its defaults when the options are made, and an
unknown extra draw is refused then with a one-line error.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from .draws import EXTRA_DRAWS
from .op_guard import GuardOptions


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
    # a candidate whose first call takes more than hopeless_factor times the reference's (and
    # more than hopeless_min_ms) is checked on that first input set only (the extra draws and
    # the decoy check still run: being slow skips no check of another kind): the rest would hold
    # the GPU for nothing (verify_stopped in the metadata says why; 0: off). A job that then
    # times it and finds its timed calls not hopeless verifies it again in full. The floor is
    # higher than profiling's: a first call also pays the round trip to the candidate's
    # process, poisoned memory, lazy initialisation and the output's transfer.
    hopeless_factor: float = 20.0
    hopeless_min_ms: float = 500.0

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
