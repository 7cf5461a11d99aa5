"""The executor pool over several (simulated) devices, with generation work beside it.

A CPU pool with one worker slot per device label stands in for a GPU pool (one worker per
GPU); the labels are locked machine-wide exactly as the GPU pool locks GPU ids. Real jobs
(verification and profiling of a compiled g++ candidate) run through it while a thread of
this process generates with a small random-weight causal LM on device ``sim0``, holding
that device's lock during each generation turn as a rollout worker sharing a GPU would.
Every job records its start and end inside the worker (CLOCK_MONOTONIC is shared by all
processes of the machine), so the records prove where and when each job ran.
"""

from __future__ import annotations

import fcntl
import os
import re
import sys
import threading
import time
from pathlib import Path

import pytest

from cuda_agent.core.types import Task

HERE = Path(__file__).resolve().parent
if str(HERE) not in sys.path:  # pool workers resolve "test_multidevice:timed" through sys.path
    sys.path.append(str(HERE))

TIMED = "test_multidevice:timed"
VERIFY = "cuda_agent.sandbox.judge.tasks:verify"
PROFILE = "cuda_agent.sandbox.judge.tasks:profile"


def timed(fn: str, kwargs: dict, device: str = "") -> dict:
    """Job wrapper (runs in a worker): the inner job's result, and when and where it ran."""
    from cuda_agent.sandbox.executors.worker import resolve

    t0 = time.monotonic()
    result = resolve(fn)(device=device, **kwargs)
    t1 = time.monotonic()
    return {"result": result, "start": t0, "end": t1, "pid": os.getpid(),
            "label": os.environ.get("CUDA_AGENT_WORKER_DEVICE", "")}


def lock_path(lock_dir: Path, label: str) -> Path:
    """The file the pool locks while it runs a job on ``label`` (executors/pool.py)."""
    return lock_dir / ("device-" + "".join(c if c.isalnum() or c in "-_." else "_" for c in label) + ".lock")


def overlapping(intervals: list[dict], kinds: tuple[str, ...] | None = None) -> list[tuple[dict, dict]]:
    """Pairs on the same device whose intervals intersect (and, with ``kinds``, one of them is such a kind)."""
    out = []
    for i, a in enumerate(intervals):
        for b in intervals[i + 1:]:
            if a["device"] != b["device"] or a["end"] <= b["start"] or b["end"] <= a["start"]:
                continue
            if kinds is None or a["kind"] in kinds or b["kind"] in kinds:
                out.append((a, b))
    return out


@pytest.fixture(scope="module")
def workspace(tmp_path_factory):
    """The template's worked example (axpby) with its correct g++ candidate, compiled."""
    from cuda_agent.core.plugins import get_plugin_manager
    from cuda_agent.sandbox.workspace.workspace import create_workspace, tools_dir

    ex = tools_dir() / "template" / "gxx" / "examples"
    model, n = re.subn(r"torch\.randn\(\d+, \d+\)", "torch.randn(128, 512)", (ex / "model.py").read_text())
    assert n == 2, model
    ws = create_workspace(Task(id="axpby", source="test", code=model), tmp_path_factory.mktemp("ws") / "w",
                          backend="cpu", compiler="gxx")
    files = {"model_new.py": (ex / "model_new.py").read_text()}
    files.update({f"kernels/{k.name}": k.read_text() for k in (ex / "kernels").iterdir()})
    ws.restore(files)
    res = get_plugin_manager().create("compiler", {"name": "gxx", "options": {}}).build(ws.root)
    assert res.ok, res.log[-2000:]
    return ws.root


class Generator(threading.Thread):
    """Generation turns with a tiny random-weight LM; each turn holds ``lock`` (if any) and is recorded."""

    def __init__(self, lock: Path | None, device: str, pause: float = 0.15):
        super().__init__(daemon=True)
        import torch
        from transformers import AutoModelForCausalLM, Qwen2Config

        torch.manual_seed(0)
        cfg = Qwen2Config(vocab_size=128, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                          num_key_value_heads=2, intermediate_size=64, max_position_embeddings=128)
        self.model = AutoModelForCausalLM.from_config(cfg).eval()
        if lock is not None:
            lock.parent.mkdir(parents=True, exist_ok=True)
        self.lock = open(lock, "a+") if lock is not None else None
        self.device = device
        self.pause = pause
        self.stop = threading.Event()
        self.turns: list[dict] = []
        self.tokens = 0
        self.error: BaseException | None = None

    def turn(self) -> int:
        import torch

        ids = torch.randint(3, 120, (2, 8))
        with torch.no_grad():
            out = self.model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), max_new_tokens=12,
                                      min_new_tokens=12, do_sample=True, pad_token_id=0)
        return int(out.shape[0] * (out.shape[1] - ids.shape[1]))

    def run(self) -> None:
        try:
            while not self.stop.is_set():
                if self.lock is not None:
                    fcntl.flock(self.lock.fileno(), fcntl.LOCK_EX)
                try:
                    t0 = time.monotonic()
                    n = self.turn()
                    t1 = time.monotonic()
                finally:
                    if self.lock is not None:
                        fcntl.flock(self.lock.fileno(), fcntl.LOCK_UN)
                self.tokens += n
                self.turns.append({"kind": "generate", "device": self.device, "start": t0, "end": t1})
                if self.pause:
                    time.sleep(self.pause)  # the agent runs its tools; the device is free meanwhile
        except BaseException as exc:  # reported by the test
            self.error = exc


def run_jobs(ex, workspace: Path, n_pairs: int) -> list[dict]:
    from cuda_agent.sandbox.executors import Job

    vopts = {"seed": 1, "num_inputs": 2}
    popts = {"baselines": False, "seed": 2, "attempts": 1, "profiler_options": {"target_ms": 40.0, "warmup_ms": 5.0}}
    futs = []
    for i in range(n_pairs):
        futs.append(ex.submit(Job(fn=TIMED, kwargs={"fn": VERIFY, "kwargs": {"workspace": str(workspace), "options": vopts}},
                                  kind="verify", label=f"verify-{i}")))
        futs.append(ex.submit(Job(fn=TIMED, kwargs={"fn": PROFILE, "kwargs": {"workspace": str(workspace), "options": popts}},
                                  kind="profile", label=f"profile-{i}")))
    jobs = []
    for f in futs:
        r = f.result(timeout=600)
        rec = f.record
        assert r["label"] == rec.device  # the worker that ran it belongs to the slot the record names
        assert rec.started <= r["start"] <= r["end"] <= rec.finished
        jobs.append({"kind": rec.kind, "device": rec.device, "start": r["start"], "end": r["end"], "pid": r["pid"],
                     "ok": bool(r["result"].ok), "message": r["result"].message, "id": rec.job_id})
    return jobs


def test_pool_spreads_jobs_and_profiling_never_shares_a_device(tmp_path, workspace):
    pytest.importorskip("transformers")
    from cuda_agent.sandbox.executors import CpuExecutor

    devices = ["sim0", "sim1", "sim2"]
    lock_dir = tmp_path / "locks"
    ex = CpuExecutor(CpuExecutor.Options(devices=",".join(devices), threads=1, spares=0, recycle="on_error",
                                         exclusive=True, lock_dir=str(lock_dir), timeout=300)).start()
    gen = Generator(lock_path(lock_dir, "sim0"), "sim0")
    try:
        gen.start()
        jobs = run_jobs(ex, workspace, n_pairs=len(devices))
    finally:
        gen.stop.set()
        gen.join(timeout=60)
        ex.close()
    assert gen.error is None, gen.error
    assert all(j["ok"] for j in jobs), [j["message"] for j in jobs if not j["ok"]]

    # spread: every device ran jobs, each in its own worker processes, several devices at once
    per = {d: [j for j in jobs if j["device"] == d] for d in devices}
    assert all(per[d] for d in devices), {d: len(v) for d, v in per.items()}
    pids = {d: {j["pid"] for j in v} for d, v in per.items()}
    assert not any(pids[a] & pids[b] for a in devices for b in devices if a < b)  # a worker serves one device
    parallel = sum(1 for a in jobs for b in jobs if a["device"] < b["device"] and a["start"] < b["end"] and b["start"] < a["end"])
    assert parallel > 0, "no two jobs ever ran at the same time on different devices"

    # exclusive: no job overlapped another job or a generation turn on its device
    intervals = jobs + gen.turns
    assert not overlapping(intervals), overlapping(intervals)[:3]

    # concurrent: generation went on while profiling jobs ran, on its own device too (between turns)
    assert len(gen.turns) >= 2 and gen.tokens > 0
    g0, g1 = gen.turns[0]["start"], gen.turns[-1]["end"]
    during = [j for j in jobs if j["kind"] == "profile" and j["start"] < g1 and j["end"] > g0]
    assert during, "no profiling job ran while generation was going on"
    assert any(j["device"] == "sim0" and g0 < j["start"] < g1 for j in jobs), "no job interleaved with generation on sim0"


def test_overlap_check_catches_generation_that_ignores_the_lock(tmp_path, workspace):
    """Negative control: a generator that does not take the device lock shares sim0 with the
    profiling job, and the same record check sees it."""
    pytest.importorskip("transformers")
    from cuda_agent.sandbox.executors import CpuExecutor

    ex = CpuExecutor(CpuExecutor.Options(devices="sim0", threads=1, spares=0, recycle="on_error",
                                         exclusive=True, lock_dir=str(tmp_path / "locks"), timeout=300)).start()
    gen = Generator(None, "sim0", pause=0.0)
    try:
        gen.start()
        while not gen.turns and gen.error is None:
            time.sleep(0.05)
        jobs = run_jobs(ex, workspace, n_pairs=1)
    finally:
        gen.stop.set()
        gen.join(timeout=60)
        ex.close()
    assert gen.error is None, gen.error
    bad = overlapping(jobs + gen.turns, kinds=("profile",))
    assert bad, "a profiling job and unlocked generation on the same device should overlap"
