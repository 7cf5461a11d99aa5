"""Rule profiles and weight protocols: which rules a verification applies.

Profiles (``VerifyOptions.rules``, written in every result as ``rule_profile``):

* ``cuda-agent`` (default: ``optimize``, training, ``eval``): the paper's SKILL.md rules. Every
  static check, the run-time guard (no torch computation in ``forward`` or in the kernel
  sources; creation, views and conversions pass).
* ``kernelbench``: KernelBench's acceptance. Torch operators may run in ``forward`` around
  the custom kernels, and at least one custom kernel must run and matter: the custom
  kernels' outputs are poisoned once and the final output must change (rule
  ``kernelbench.decoy``). The static checks that keep the reference, the harness,
  fallbacks and Python run from C++ out stay on.
* ``none``: no rules, for scoring plain PyTorch (the references).

Every profile keeps what guards the measurement itself: the candidate in its own process,
inputs, reference and comparison on the trusted side, the timing checks, input rotation,
poisoned memory, the precision policy.

Weights (``VerifyOptions.weights``):

* ``state_dict``: ``Model``'s state_dict loads strictly into ``ModelNew`` (same names and
  shapes; what SKILL.md asks of the agent's workspace form);
* ``seeded``: both models are built after the same seed, KernelBench's protocol, and
  checked once more after a second seed (a ``ModelNew`` that hard-codes one seed's values
  fails, rule ``weights.seeded``);
* ``auto``: ``state_dict`` when it loads, else ``seeded`` (single-file solutions).
"""

from __future__ import annotations

from typing import Any

from cuda_agent.core.errors import ConfigError

PROFILES = ("cuda-agent", "kernelbench", "none")
WEIGHTS = ("state_dict", "auto", "seeded")
KERNELBENCH_CHECKS = ["no_reference_model", "no_fallback", "no_guard_tampering", "no_native_python"]
RULE_DECOY = "kernelbench.decoy"
RULE_CUSTOM = "kernelbench.custom-kernel"
RULE_SEEDED = "weights.seeded"
RULE_STATE_DICT = "state-dict"


def apply_profile(opts: Any) -> None:
    """Check ``opts.rules`` and ``opts.weights`` and set what the profile implies (static
    checks and the run-time guard) where the options leave it open."""
    if opts.rules not in PROFILES:
        raise ConfigError(f"verify option rules: unknown rule profile {opts.rules!r}; valid: {', '.join(PROFILES)}")
    if opts.weights not in WEIGHTS:
        raise ConfigError(f"verify option weights: {opts.weights!r}; valid: {', '.join(WEIGHTS)}")
    if opts.rules == "none":
        opts.static_checks = []
        opts.guard.enabled = False
    elif opts.rules == "kernelbench":
        if opts.static_checks is None:
            opts.static_checks = list(KERNELBENCH_CHECKS)
        opts.guard.enabled = False


def rule_of(message: str) -> str:
    """The rule a refusal message names (``(rule <name>: ...)``), or ""."""
    import re

    m = re.search(r"\brule ([\w.\-]+)[:)]", message or "")
    return m.group(1) if m else ""


def state_dict_mismatch(ref_state: dict, cand_state: dict) -> str:
    """What to rename in ModelNew for Model's state_dict to load (names and shapes)."""
    missing = [k for k in ref_state if k not in cand_state]
    unexpected = [k for k in cand_state if k not in ref_state]
    shapes = [k for k in ref_state if k in cand_state and tuple(ref_state[k].shape) != tuple(cand_state[k].shape)]
    parts = []
    if missing:
        parts.append("Model has " + ", ".join(f"{k!r} {tuple(ref_state[k].shape)}" for k in missing[:6])
                     + (" ..." if len(missing) > 6 else "") + " that ModelNew lacks")
    if unexpected:
        parts.append("ModelNew has " + ", ".join(f"{k!r} {tuple(cand_state[k].shape)}" for k in unexpected[:6])
                     + (" ..." if len(unexpected) > 6 else "") + " that Model lacks")
    if shapes:
        parts.append("shapes differ for " + ", ".join(
            f"{k!r} ({tuple(cand_state[k].shape)}, Model {tuple(ref_state[k].shape)})" for k in shapes[:6]))
    hint = ""
    pairs = list(zip(unexpected, missing))
    if pairs and len(missing) == len(unexpected) and all(
            tuple(cand_state[u].shape) == tuple(ref_state[m].shape) for u, m in pairs):
        hint = "; rename " + ", ".join(f"{u!r} to {m!r}" for u, m in pairs[:6])
    return "; ".join(parts) + hint
