"""Nsight Compute (``ncu``): per-kernel hardware metrics of a candidate, for the agent's analysis.

ncu replays each kernel many times with counters on, so it gives no usable end-to-end time:
:meth:`NsightComputeProfiler.time` refuses, and :func:`analyze` runs the candidate's forward
once in a child process under ``ncu`` and returns one row per kernel launch (name, grid and
block, duration, compute and memory throughput, occupancy, registers, cache hit rates).
``profile_workspace`` with ``profiler: nsight_compute`` times with ``cuda_events`` and adds
these rows to the result's metadata under ``ncu``.
"""

from __future__ import annotations

import csv
import io
import os
import shutil
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cuda_agent.core.interfaces import Profiler
from cuda_agent.core.types import Timing

from .base import ProfilerError

DEFAULT_METRICS = [
    "gpu__time_duration.sum",
    "sm__throughput.avg.pct_of_peak_sustained_elapsed",
    "gpu__compute_memory_throughput.avg.pct_of_peak_sustained_elapsed",
    "dram__throughput.avg.pct_of_peak_sustained_elapsed",
    "sm__warps_active.avg.pct_of_peak_sustained_active",
    "launch__registers_per_thread",
    "launch__shared_mem_per_block_static",
    "launch__shared_mem_per_block_dynamic",
    "l1tex__t_sector_hit_rate.pct",
    "lts__t_sector_hit_rate.pct",
]
SHORT = {
    "gpu__time_duration.sum": "duration",
    "sm__throughput.avg.pct_of_peak_sustained_elapsed": "sm_throughput_pct",
    "gpu__compute_memory_throughput.avg.pct_of_peak_sustained_elapsed": "memory_throughput_pct",
    "dram__throughput.avg.pct_of_peak_sustained_elapsed": "dram_throughput_pct",
    "sm__warps_active.avg.pct_of_peak_sustained_active": "achieved_occupancy_pct",
    "launch__registers_per_thread": "registers_per_thread",
    "launch__shared_mem_per_block_static": "smem_static_bytes",
    "launch__shared_mem_per_block_dynamic": "smem_dynamic_bytes",
    "l1tex__t_sector_hit_rate.pct": "l1_hit_rate_pct",
    "lts__t_sector_hit_rate.pct": "l2_hit_rate_pct",
}


def _num(text: str) -> Any:
    t = text.replace(",", "").strip()
    try:
        return int(t)
    except ValueError:
        try:
            return float(t)
        except ValueError:
            return text


def parse_ncu_csv(text: str) -> list[dict]:
    """Rows of ``ncu --csv --page raw`` (header, units, one row per kernel launch)."""
    lines = [ln for ln in text.splitlines() if ln.startswith('"')]
    if not lines:
        return []
    rows = list(csv.reader(io.StringIO("\n".join(lines))))
    header = rows[0]
    units: list[str] = []
    body = rows[1:]
    if body and (not body[0] or body[0][0] == ""):  # the units row
        units = body[0]
        body = body[1:]
    out = []
    for r in body:
        rec: dict[str, Any] = {}
        for i, col in enumerate(header):
            if i >= len(r):
                break
            key = SHORT.get(col, col)
            if col == "Kernel Name":
                key = "kernel"
            elif col in ("Block Size", "Grid Size"):
                key = col.lower().replace(" ", "_")
            elif col not in SHORT and col not in ("ID",):
                continue
            val = _num(r[i]) if col not in ("Kernel Name", "Block Size", "Grid Size") else r[i]
            if key == "duration" and units and i < len(units):
                scale = {"nsecond": 1e-6, "usecond": 1e-3, "msecond": 1.0, "second": 1e3}.get(units[i], None)
                if scale is not None and isinstance(val, (int, float)):
                    key, val = "duration_ms", val * scale
            rec[key] = val
        out.append(rec)
    return out


class NsightComputeProfiler(Profiler):
    name = "nsight_compute"
    backend = "cuda"
    description = "per-kernel hardware metrics through ncu (for analysis; times with cuda_events)"

    @dataclass
    class Options:
        ncu: str = "ncu"
        metrics: list[str] = field(default_factory=lambda: list(DEFAULT_METRICS))
        launch_count: int = 50
        kernel_regex: str = ""
        clock_control: str = "none"  # leave the GPU's clocks as they are
        timeout_s: float = 300.0
        extra_args: list[str] = field(default_factory=list)

    def time(self, fn: Any, input_sets: list, device: Any = None, prepare: Any = None) -> Timing:
        raise ProfilerError(
            "nsight_compute replays kernels with counters on and gives no end-to-end time; "
            "time with cuda_events and call nsight_compute.analyze() for per-kernel metrics"
        )

    def analyze(self, workspace: str | Path, device: str = "cuda", candidate: str | None = None, reference: str | None = None, seed: int = 0) -> list[dict]:
        return analyze(workspace, device, candidate, reference, seed, self.options)


def analyze(workspace: str | Path, device: str = "cuda", candidate: str | None = None, reference: str | None = None,
            seed: int = 0, options: NsightComputeProfiler.Options | None = None) -> list[dict]:
    """Run the candidate's forward once under ncu in a child process; one dict per kernel."""
    o = options or NsightComputeProfiler.Options()
    exe = shutil.which(o.ncu) or (o.ncu if os.path.exists(o.ncu) else None)
    if exe is None:
        raise ProfilerError(f"ncu not found ({o.ncu!r}); install Nsight Compute or set options.ncu")
    argv = [exe, "--csv", "--page", "raw", "--target-processes", "all", "--clock-control", o.clock_control,
            "--launch-count", str(o.launch_count), "--metrics", ",".join(o.metrics)]
    if o.kernel_regex:
        argv += ["--kernel-name", f"regex:{o.kernel_regex}"]
    argv += list(o.extra_args)
    argv += [sys.executable, "-m", "cuda_agent.sandbox.judge.profilers.ncu_target", "--workspace", str(workspace),
             "--device", str(device), "--seed", str(seed)]
    if candidate:
        argv += ["--candidate", str(candidate)]
    if reference:
        argv += ["--reference", str(reference)]
    try:
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=o.timeout_s)
    except subprocess.TimeoutExpired as exc:
        raise ProfilerError(f"ncu ran past {o.timeout_s:g} s") from exc
    rows = parse_ncu_csv(proc.stdout)
    if proc.returncode != 0 and not rows:
        tail = " ".join((proc.stderr or proc.stdout).split())[-500:]
        raise ProfilerError(f"ncu failed (exit {proc.returncode}): {tail}")
    return rows
