"""Verification of a candidate ``ModelNew`` against the reference ``Model``.

The steps (:class:`Verification`, one method each; the first that fails decides):

1. static checks on the sources (:mod:`.checks`): a violation fails with ``forbidden_op``;
2. the reference, imported and built here (:mod:`.loading`; a failure is a ``crash``);
3. the candidate, imported and built in its own process (:mod:`.candidate`) with the
   workspace first on ``sys.path``, after the same seed; it gets ``Model``'s weights by the
   rule profile's protocol (:mod:`.rules`); an import failure is a ``compile_error``;
4. for each of ``num_inputs`` seeds: fresh inputs (never all zeros), the reference output,
   then the candidate's forward under the run-time guard (:mod:`.op_guard`) with freshly
   allocated memory poisoned (:mod:`.poisoning`), then a comparison (:mod:`.comparison`);
5. extra input draws (``extra_draws``, on by default; :mod:`.draws`): the floating-point
   inputs from other distributions, skipped where the reference is not defined on them;
6. under the ``kernelbench`` profile, the decoy check: a custom kernel must run, and the
   output must change when its outputs are poisoned;
7. with weights by seed, both models built once more after a second seed and compared;

and last, the candidate process's integrity check of the harness (:mod:`.integrity`).

A candidate whose first call is hopeless (more than ``hopeless_factor`` times the reference's
call and more than ``hopeless_min_ms``) is checked on that first input set of step 4 only
(with fresh seeds, step 7 stops as well: the first draw's weights were this job's own), and
``verify_stopped`` says why; the checks that look for other failures than more draws of the
same distribution (steps 5 and 6) still run, so that being slow never skips them. The static checks need neither a build nor a GPU: :func:`static_refusal` runs them
where the caller is, before anything is built.
The reference outputs stay referenced while the candidate runs, so their memory can never
be handed to it.
"""

from __future__ import annotations

import dataclasses
import time
from pathlib import Path
from typing import Any

from cuda_agent.core.types import CheckResult, FailureCategory, VerifyResult

from .comparison import RULE_VACUOUS, VACUOUS_SHARE, Comparison, compare_outputs, compare_tensors, reference_scale
from .draws import (EXTRA_DRAWS, all_finite, extra_draw_inputs, fresh_seed, input_seeds, nudged, reference_on_extra_draw,
                    steady)
from .inputs import describe, draw_inputs, nbytes
from .loading import (LoadFailure, Loaded, build_candidate, build_models, load_candidate, load_module, load_reference,
                      short_exc, workspace_imports)
from .op_guard import GuardOptions
from .options import VerifyOptions
from .phases import PhaseClock
from .poisoning import fill_uninitialized, poison_allocator
from .precision import policy_from, precision_context
from .watchdog import VerifyTimeout, deadline, synchronize

# its own names and the public names of its parts, for code that imports them from here
__all__ = [
    "EXTRA_DRAWS", "RULE_VACUOUS", "VACUOUS_SHARE", "Comparison", "LoadFailure", "Loaded", "Verification",
    "VerifyOptions", "VerifyTimeout", "all_finite", "build_candidate", "build_models", "compare_outputs",
    "compare_tensors", "deadline", "device_info", "extra_draw_inputs", "fill_uninitialized", "fresh_seed",
    "input_seeds", "load_candidate", "load_module", "load_reference", "nudged", "poison_allocator", "reference_scale",
    "static_refusal", "synchronize", "verify_candidate", "workspace_imports",
]


def device_info(device: Any) -> dict:
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

    The candidate runs in a candidate process of its own (:mod:`.candidate`); inputs are
    drawn, the reference is run and outputs are compared here. ``session``: a
    :class:`~.session.JudgeSession` to use (and leave open) instead of a new one."""
    from .session import JudgeSession, job_files

    opts = options or VerifyOptions()
    if isinstance(opts.guard, dict):
        opts.guard = GuardOptions(**opts.guard)
    own = session is None
    if own:
        session = JudgeSession(*job_files(workspace, candidate or opts.candidate, reference or opts.reference), device,
                               drop=opts.drop_privileges)
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
        self.phase = PhaseClock(self.phases)
        self.last_call_ms = 0.0  # the trusted side's clock on the candidate's latest call (output transfer included)
        self.stopped: dict | None = None  # why the checks stopped after one input set (a hopeless first call)

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
        """The verdict on a refusal ``r`` (a category and a message), recorded as the failed
        check ``check`` where one is named."""
        from .client import KILLED_OUTSIDE

        if getattr(r, "extra", {}).get(KILLED_OUTSIDE):
            self.meta[KILLED_OUTSIDE] = r.extra[KILLED_OUTSIDE]
        return self.failed_check(check, r.category, r.message) if check else self.result(False, r.category, r.message)

    def failed_check(self, name: str, failure: FailureCategory, text: str, message: str = "") -> VerifyResult:
        self.checks.append(CheckResult(name=name, passed=False, message=text))
        return self.result(False, failure, message or text)

    def run(self) -> VerifyResult:
        """The steps in order (see the module docstring); the first that fails decides."""
        from .client import CandidateProcessError
        from .session import refusal_from_error

        failed = self.static_checks()
        if failed is not None:
            return failed
        import torch

        self.meta.update(device_info(self.device))
        with workspace_imports(self.s.snap.root), torch.no_grad():
            with self.phase("load"):
                failed = self.reference() or self.candidate()
            if failed is not None:
                return failed
            try:
                with precision_context(self.policy) as flags:
                    self.meta["precision_flags"] = flags
                    failed = self.draws() or self.extra_draws() or self.decoy() or self.second_seed()
                if failed is not None:
                    return failed
                tampered = self.s.integrity()  # a patch made while forward ran
            except CandidateProcessError as exc:
                return self.refused(refusal_from_error(exc, "the candidate process"))
        if tampered is not None:
            return self.refused(tampered, "harness integrity")
        return self.passed()

    def passed(self) -> VerifyResult:
        worst = max((c.max_abs_err or 0.0 for c in self.checks), default=0.0)
        if self.stopped is not None:
            return self.result(True, FailureCategory.NONE, f"correct on the first input set of {self.opts.num_inputs} "
                               f"(max abs err {worst:.3g}); {self.stopped['why']}")
        done = sum(1 for e in self.meta.get("extra_draws", []) if e.get("status") == "passed")
        skipped = sum(1 for e in self.meta.get("extra_draws", []) if e.get("status") == "skipped")
        extra = ""
        if done or skipped:
            extra = f" and {done} extra draw{'s' if done != 1 else ''}" + (f" ({skipped} skipped)" if skipped else "")
        return self.result(True, FailureCategory.NONE, f"correct on {self.opts.num_inputs} inputs{extra} (max abs err {worst:.3g})")

    # -- the steps --------------------------------------------------------------------------

    def static_checks(self) -> VerifyResult | None:
        """1. The static checks, on the files as the job copied them."""
        from .checks import run_static_checks

        bad_file = self.s.refused_files()
        if bad_file:
            return self.result(False, FailureCategory.FORBIDDEN_OP, bad_file)
        with self.phase("static_checks"):
            static = run_static_checks(self.s.snap.root, self.s.candidate, self.opts.static_checks)
        self.checks.extend(static)
        bad = [c for c in static if not c.passed]
        if bad:
            return self.result(False, FailureCategory.FORBIDDEN_OP, bad[0].message.splitlines()[0])
        return None

    def reference(self) -> VerifyResult | None:
        """2. The reference, imported and built here."""
        try:
            self.ref_mod = load_reference(self.s.reference)
            self.ref = build_models(self.ref_mod, None, self.device, self.seed, True, self.s.cand_name)
        except LoadFailure as exc:
            return self.result(False, exc.category, exc.message)
        return None

    def candidate(self) -> VerifyResult | None:
        """3. The candidate, imported and built in its own process, with Model's weights."""
        from .client import CandidateProcessError
        from .session import refusal_from_error

        s, o = self.s, self.opts
        try:
            failed = s.load(self.seed, o.strict_state_dict, o.precision, o.weights)
        except CandidateProcessError as exc:
            return self.refused(refusal_from_error(exc, "loading the candidate"))
        if failed is not None:
            return self.refused(failed, "harness integrity" if failed.extra.get("tampered") else "")
        self.meta["custom_op_namespaces"] = list(s.load_reply.get("namespaces") or [])[:50]
        self.meta["weights"] = s.weights
        self.meta["init_inputs"] = describe(self.ref.init_inputs)
        return None

    def draws(self) -> VerifyResult | None:
        """4. The ``num_inputs`` draws of ``get_inputs()``."""
        o = self.opts
        seeds = input_seeds(self.seed, o.num_inputs)
        self.meta["input_seeds"] = seeds
        for i, s in enumerate(seeds):
            name = f"input[{i}] seed={s}"
            try:
                with self.phase("inputs"):
                    drawn = draw_inputs(self.ref_mod.get_inputs, s, self.device)
            except Exception as exc:
                return self.result(False, FailureCategory.CRASH, f"get_inputs() failed: {short_exc(exc)}")
            if i == 0:
                self.meta["inputs"] = describe(drawn.values)
                self.meta["inputs_replaced_zeros"] = drawn.replaced_zeros
            try:
                with self.phase("reference"):
                    t_ref = time.perf_counter()
                    ref_out = self.ref.ref_model(*drawn.values)
                    synchronize(self.device)
                    t_ref = time.perf_counter() - t_ref
            except Exception as exc:
                return self.result(False, FailureCategory.CRASH, f"reference Model failed on {name}: {short_exc(exc)}")
            if i == 0:
                ref_ms = t_ref * 1e3  # not the phase's rounded seconds: a call under 50 us would read 0
                self.meta["outputs"] = describe(ref_out)
                self.scaled = self.scale_comparable(drawn.values, ref_out)
            del drawn
            failed = self.candidate_on(name, {"seed": s}, ref_out, name)
            if failed is None and i == 0:
                self.stopped = self.hopeless(ref_ms, self.last_call_ms, ref_out)
            del ref_out
            give_back_memory(self.device)
            if failed is not None:
                return failed
            if self.stopped is not None:
                self.meta["verify_stopped"] = self.stopped
                break
        return None

    def hopeless(self, ref_ms: float, cand_ms: float, ref_out: Any) -> dict | None:
        """Why the checks stop after the first input set (None: they go on): the candidate's
        first call took more than ``hopeless_factor`` times the reference's and more than
        ``hopeless_min_ms``. An output that came through host memory is allowed what moving
        the reference's output to the host and back costs here."""
        o = self.opts
        if o.hopeless_factor <= 0 or ref_ms <= 0 or cand_ms <= max(o.hopeless_min_ms, o.hopeless_factor * ref_ms):
            return None
        moved = 0.0 if str(self.device).startswith("cuda") and self.s.ipc else _round_trip_ms(ref_out, self.device)
        spent = cand_ms - moved
        if spent <= max(o.hopeless_min_ms, o.hopeless_factor * ref_ms):
            return None
        ratio = spent / ref_ms
        return {"ratio_vs_reference": round(ratio, 1), "limit": o.hopeless_factor, "candidate_ms": round(cand_ms, 3),
                "reference_ms": round(ref_ms, 4), "output_transfer_ms": round(moved, 3), "inputs_checked": 1,
                "why": f"its first call took {spent:.4g} ms, {ratio:.0f}x the reference's {ref_ms:.4g} ms (more than "
                       f"hopeless_factor {o.hopeless_factor:g}x): checked on that input set only (rule "
                       f"verify.hopeless: a candidate this slow cannot beat eager; make it faster to be checked in full)"}

    def extra_draws(self) -> VerifyResult | None:
        """5. The same shapes, floating-point values from other distributions (inputs outside
        the reference's domain, or on which it is ill-conditioned, are skipped)."""
        o = self.opts
        extra_log: list[dict] = []
        self.meta["extra_draws"] = extra_log
        # also for a hopeless candidate: these draws find what other input sets of the same
        # distribution do not (values past a naive kernel's range), and a check that speed
        # could skip would pay a wrong kernel for being slow
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
                return self.result(False, FailureCategory.CRASH, f"get_inputs() failed: {short_exc(exc)}")
            if not refilled:
                entry.update(status="skipped", reason="no floating-point inputs")
                continue
            with self.phase("reference"):
                ref_out, skip = reference_on_extra_draw(self.ref.ref_model, inputs, s, self.device, o)
            del inputs
            if skip:
                entry.update(status="skipped", reason=skip)
                continue
            failed = self.candidate_on(name, {"seed": s, "extra": kind}, ref_out, f"an extra input draw ({label})")
            del ref_out
            entry["status"] = "failed" if failed is not None else "passed"
            if failed is not None:
                return failed
            if self.stopped is not None:  # a hopeless candidate's later calls, on the trusted clock
                self.stopped.setdefault("later_calls_ms", []).append(round(self.last_call_ms, 3))
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
        stable = steady(self.ref.ref_model, inputs, ref_out, self.seed + 3, self.device, o.atol, o.rtol, o.check_dtype)
        self.meta["tolerance_scale"] = ("the reference's own scale (the tolerance cannot tell it from zero)" if stable
                                        else "atol/rtol only (the reference is rounding noise at its own scale)")
        return stable

    def decoy(self) -> VerifyResult | None:
        """6. Under the kernelbench profile: a custom kernel must run, and the output must change
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

    def second_seed(self) -> VerifyResult | None:
        """7. Weights by seed (KernelBench's protocol): both models built once more after another
        seed and compared on one draw, so that a ModelNew holding one seed's values fails."""
        from .rules import RULE_SEEDED

        if self.s.weights != "seeded" or (self.stopped is not None and self.opts.seed is None):
            return None  # stopped: the first draw already held weights from a seed of this job's own
        seed2 = (self.seed * 7919 + 104729) & 0x7FFFFFFF
        try:
            ref2 = build_models(self.ref_mod, None, self.device, seed2, True, self.s.cand_name)
        except LoadFailure as exc:
            return self.result(False, exc.category, exc.message)
        reply = self.s._request({"op": "reseed", "seed": seed2})
        if not reply.get("ok"):
            return self.result(False, FailureCategory.CRASH, f"ModelNew after a second seed: {str(reply.get('message') or reply.get('error'))[:800]}")
        self.s.loaded_seed = seed2
        s = input_seeds(self.seed ^ 0x3C3C3C3C, 1)[0]
        drawn = draw_inputs(self.ref_mod.get_inputs, s, self.device)
        ref_out = ref2.ref_model(*drawn.values)
        synchronize(self.device)
        del drawn
        self.meta["second_seed"] = seed2
        return self.candidate_on(f"second seed {seed2}", {"seed": s}, ref_out,
                                 f"the models built after a second seed (rule {RULE_SEEDED}: ModelNew must build its "
                                 f"parameters from the seed as Model does, not hold one seed's values)")

    def candidate_on(self, name: str, draw: dict, ref_out: Any, rule: str) -> VerifyResult | None:
        """The candidate (in its process: guarded, memory poisoned) on the inputs ``draw``
        names, compared here with ``ref_out``; a failed VerifyResult, or None when it matched."""
        o = self.opts
        # what this process freed (inputs, the reference's temporaries) back to the driver first:
        # the candidate's process cannot allocate memory held in this one's cache
        give_back_memory(self.device)
        msg = {"op": "run", **draw, "poison": o.poison, "poison_hint": nbytes(ref_out), "timeout_s": o.timeout_s,
               "guard": dataclasses.asdict(o.guard), "candidate": self.s.cand_name}
        t = time.perf_counter()
        with self.phase("candidate"):
            reply, out = self.s.fetch(msg, "output")
        self.last_call_ms = (time.perf_counter() - t) * 1e3
        if "poisoned_bytes" in reply:
            self.meta["poisoned_bytes"] = reply["poisoned_bytes"]
        if isinstance(reply.get("cache_released_bytes"), int):
            self.meta["candidate_cache_released_bytes"] = max(reply["cache_released_bytes"],
                                                              self.meta.get("candidate_cache_released_bytes", 0))
        guard = reply.get("guard") if isinstance(reply.get("guard"), dict) else None
        if guard is not None:
            self.meta["allowed_torch_calls"] = _counts(guard.get("allowed_calls"))
            self.meta["custom_op_calls"] = _counts(guard.get("custom_calls"))
            violations = [str(v)[:1000] for v in (guard.get("violations") or [])[:5]]
            if violations:
                return self.failed_check(name, FailureCategory.FORBIDDEN_OP, violations[0])
        if reply.get("forbidden"):
            return self.failed_check(name, FailureCategory.FORBIDDEN_OP, str(reply["forbidden"])[:1000])
        if reply.get("timeout"):
            text = str(reply["timeout"])[:300]
            return self.failed_check(name, FailureCategory.TIMEOUT, text, f"ModelNew.forward on {name}: {text}")
        if not reply.get("ok"):
            err = reply.get("error") if isinstance(reply.get("error"), dict) else {}
            if err.get("cuda"):
                self.meta["cuda_context_broken"] = True
            text = f"ModelNew.forward raised on {name}: {str(err.get('message', 'unknown error'))[:1500]}"
            return self.failed_check(name, FailureCategory.CRASH, text)
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


KEEP_CACHED = 2 << 30  # bytes of freed device memory this process keeps for its next allocations


def give_back_memory(device: Any) -> None:
    """Hand freed device memory above :data:`KEEP_CACHED` back to the driver: torch's cache
    here is memory the candidate's process cannot allocate (an output of several GB left
    it short of memory on a GPU shared with another job)."""
    import torch

    dev = torch.device(device)
    if dev.type == "cuda" and torch.cuda.memory_reserved(dev) - torch.cuda.memory_allocated(dev) > KEEP_CACHED:
        torch.cuda.empty_cache()


def _round_trip_ms(out: Any, device: str) -> float:
    """Milliseconds to copy ``out``'s tensors to host memory and back here."""
    import torch

    tensors = [out] if isinstance(out, torch.Tensor) else \
        [t for t in (out if isinstance(out, (list, tuple)) else []) if isinstance(t, torch.Tensor)]
    t0 = time.perf_counter()
    for x in tensors:
        x.to("cpu", copy=True).to(x.device, copy=True)
    synchronize(device)
    return (time.perf_counter() - t0) * 1e3


def static_refusal(workspace: str | Path, options: VerifyOptions | None = None) -> VerifyResult | None:
    """The refusals a verification job would give before it runs anything (the judged files,
    the static checks), on a snapshot of the files taken here: the failed VerifyResult, or
    None when the candidate passes them. Needs no build, no GPU and no candidate process, so a
    caller runs it before the build (``checked_before_build`` in the metadata)."""
    opts = options or VerifyOptions()
    files = _JudgedFiles.take(workspace, opts)
    if files is None:
        return None
    try:
        failed = Verification(files, "cpu", opts).static_checks()
    finally:
        files.snap.remove()
    if failed is not None:
        for k in ("seed", "precision_policy", "atol", "rtol"):
            failed.metadata.pop(k, None)
        failed.metadata["checked_before_build"] = True
    return failed


class _JudgedFiles:
    """A job's snapshot of the judged files without a candidate process: what the static
    checks read, as the job's session holds it."""

    def __init__(self, snap: Any, candidate: Path):
        self.snap, self.candidate, self.meta = snap, candidate, {}

    @classmethod
    def take(cls, workspace: str | Path, opts: VerifyOptions) -> "_JudgedFiles | None":
        import os

        from . import snapshot
        from .session import job_files

        ws, cand, ref = job_files(workspace, opts.candidate, opts.reference)
        rels = [os.path.relpath(os.path.abspath(p), os.path.abspath(ws)) for p in (cand, ref)]
        if any(r.startswith("..") for r in rels):
            return None  # files outside one folder: the job takes them as it does
        files, folders = snapshot.workspace_files(ws, *rels)
        snap = snapshot.take(ws, files, folders)
        return cls(snap, snap.path(rels[0]))

    def refused_files(self) -> str:
        from .session import JudgeSession

        return JudgeSession.refused_files(self)  # type: ignore[arg-type]  # reads only .snap


def _counts(v: Any) -> dict:
    if not isinstance(v, dict):
        return {}
    return {str(k)[:200]: int(n) for k, n in list(v.items())[:200] if isinstance(n, int) and not isinstance(n, bool)}
