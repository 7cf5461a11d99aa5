"""A task's baselines timed as a candidate is timed: the reference (and its compiled form)
loaded as ``ModelNew`` into a candidate's process of its own and timed there by the same
commands, checks and input rotation as any candidate (:func:`..jobs.profile_file`).

Why: on one H100 and one H200, a reference timed by CUDA-graph replay as its own candidate
came out 3-7% faster than its baseline timed in the trusted process (L1/71 ConvTranspose2d
0.95, L3/35 LSTM 0.93, L3/19 MobileNetV1 0.97), while the same commands run in the trusted
process (``scripts/gpu/graph_paths.py``'s ``judged_inproc``) and a fresh plain process matched
the baseline, with the same kernels in the captured graphs and the same recorded settings.
Whatever the candidate's process does differently, a baseline timed in such a process meets
it on the same terms. In the plain mode the two kinds of process agreed within 1-2%, so by
default (``BaselineOptions.as_candidate`` ``"graph"``) only tasks timed by graph replay are
timed this way; ``"always"`` and ``"never"`` are the other choices.

The trusted process still decides the task's mode (its eager timing, the parallel-branch
check) and keeps its own timings in the record (``eager_trusted``, ``compile_trusted``); the
reported ones are the candidate-process timings. A reference (or compiled form) that fails
there, or is not timed there in the task's mode, keeps the trusted timing, and the record
says why (``as_candidate_error``, ``compile_as_candidate_error``).
"""

from __future__ import annotations

import os
import shutil
import tempfile
from dataclasses import asdict
from pathlib import Path
from typing import Any

from cuda_agent.core.types import Timing

CHOICES = ("graph", "always", "never")
WHERE = "a candidate's process"

_EAGER = """

class ModelNew(Model):
    pass
"""

_COMPILED = """

import torch as _torch_of_the_baseline


class ModelNew(Model):
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self._compiled_forward = _torch_of_the_baseline.compile(super().forward, mode={mode!r})

    def forward(self, *args, **kwargs):
        return self._compiled_forward(*args, **kwargs)
"""


def wanted(choice: str, device: Any, steadier: bool) -> bool:
    """Whether a task's baselines are timed as a candidate: ``choice`` (one of
    :data:`CHOICES`), on a CUDA device, for a task timed in the steadier mode (``steadier``)."""
    if choice not in CHOICES:
        raise ValueError(f"BaselineOptions.as_candidate {choice!r} is not one of {CHOICES}")
    if choice != "graph":
        return choice == "always"
    return steadier and str(device).startswith("cuda")


def mismatch(rec: dict, choice: str, device: Any) -> str:
    """Why a cached record was timed in another kind of process than ``choice`` wants now
    ("" when it was not, or when timing it as a candidate failed before: that stands)."""
    if rec.get("as_candidate_error"):
        return ""
    want = wanted(choice, device, bool(rec.get("timing_mode")))
    have = rec.get("timed_in") == WHERE
    if want == have:
        return ""
    return (f"process: timed in the trusted process, wanted in {WHERE} (as_candidate {choice!r})" if want
            else f"process: timed in {WHERE}, wanted in the trusted process (as_candidate {choice!r})")


def candidate_source(code: str, compile_mode: str | None = None) -> str:
    """The reference's code with a ``ModelNew`` that is ``Model`` (``compile_mode``: its
    forward compiled by ``torch.compile`` in that mode)."""
    if compile_mode is None:
        return code + _EAGER
    # torch.compile's own default for "" and "default", as the trusted compile baseline has it
    return code + _COMPILED.format(mode=None if compile_mode in ("", "default") else compile_mode)


def time_as_candidate(code: str, device: str, o: Any, steadier: bool, compile_mode: str | None = None) -> tuple[Timing, dict]:
    """(the timing, the profile's metadata) of the reference (``compile_mode``: its compiled
    form) timed as a candidate, in the mode given (``steadier``: the profiler's steadier
    one), with the profiler, precision, threads and seed of the baseline options ``o``.
    Raises :class:`.measure.BaselineError` with the profile's message when it fails."""
    from ..jobs import ProfileOptions, profile_file
    from .measure import BaselineError

    work = Path(tempfile.mkdtemp(prefix="cuda-agent-baseline-"))
    try:
        os.chmod(work, 0o755)  # read by the job's own user
        (work / "model.py").write_text(code)
        (work / "model_new.py").write_text(candidate_source(code, compile_mode))
        popts = ProfileOptions(
            profiler=o.profiler, profiler_options=dict(o.profiler_options), precision=o.precision,
            baselines=False, compile_baseline=False, baseline_seed=o.seed, seed=o.seed,
            num_input_sets=o.num_input_sets, max_spread=o.max_spread, attempts=o.attempts,
            cpu_threads=o.cpu_threads, weights="state_dict", hopeless_factor=0.0,
            timing_mode="steadier" if steadier else "configured",
        )
        res = profile_file(str(work / "model_new.py"), str(work / "model.py"), device, popts)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    what = "compiled reference" if compile_mode is not None else "reference"
    if not res.ok or res.candidate is None:
        raise BaselineError(f"the {what} timed as a candidate failed: {res.message}"[:600])
    meta = dict(res.metadata or {})
    mode = str(meta.get("timing_mode", ""))
    if steadier and (not mode or "(baselines:" in mode):
        # not captured there: timed in the configured mode, unlike the task's other timings
        raise BaselineError(f"the {what} timed as a candidate was not timed in the task's steadier mode: "
                            f"{mode or res.candidate.method}"[:600])
    return res.candidate, meta


def retime(rec: dict, code: str, device: str, o: Any, steadier: bool) -> dict:
    """``rec`` (a baseline record just measured in the trusted process) with its eager and
    compile timings taken again as a candidate's (see the module notes); the trusted ones
    kept as ``eager_trusted`` and ``compile_trusted``."""
    out = dict(rec)
    eager, meta = time_as_candidate(code, device, o, steadier)
    out["eager_trusted"], out["eager"] = rec.get("eager"), asdict(eager)
    out["timed_in"] = WHERE
    flags = meta.get("candidate_flags")
    if isinstance(flags, dict):  # the settings of the process the baselines were timed in
        out["process_flags"] = flags
    if rec.get("compile") is not None:
        from ...isolation import hostlock

        try:
            # it compiles in the candidate's process, in the job: alone against other jobs'
            # timings, as a compile in this process is (its timed sections hold their device)
            with hostlock.cpu_heavy():
                comp, _ = time_as_candidate(code, device, o, steadier, o.compile_mode)
            out["compile_trusted"], out["compile"] = rec.get("compile"), asdict(comp)
        except Exception as exc:  # noqa: BLE001 - the trusted timing stands, and the record says why
            out["compile_as_candidate_error"] = " ".join(str(exc).split())[:400]
    return out
