"""What each process named by an out-of-memory message is to the pool: real processes, real /proc."""

from __future__ import annotations

import os
import signal
import subprocess
import sys

from cuda_agent.sandbox.executors.memory_holders import describe, role


def _sleeper(*extra: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)", *extra])


def test_the_processes_an_out_of_memory_message_names_get_their_roles():
    # a "worker" that starts a child, as a worker forks its candidate process
    worker = subprocess.Popen([sys.executable, "-c",
                               "import subprocess, sys, time\n"
                               "c = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)'])\n"
                               "print(c.pid, flush=True)\n"
                               "time.sleep(60)"], stdout=subprocess.PIPE, text=True)
    spare, stranger = _sleeper(), _sleeper("stranger")
    child = 0
    try:
        child = int(worker.stdout.readline())
        gone = _sleeper()
        gone.kill()
        gone.wait()
        workers = {"cuda:0": [worker.pid, spare.pid]}
        message = ("CUDA out of memory. Tried to allocate 16.00 GiB. GPU 0 has a total capacity of 79.18 GiB of which "
                   f"13.23 GiB is free. Process {worker.pid} has 45.72 GiB memory in use. Process {child} has 16.60 GiB "
                   f"memory in use. Process {spare.pid} has 612.00 MiB memory in use. Process {stranger.pid} has 1.00 "
                   f"GiB memory in use. Process {gone.pid} has 2.00 GiB memory in use. Process 77 ha")
        holders = describe(message, workers)
        assert holders[str(worker.pid)] == "45.72 GiB: the active worker of cuda:0"
        assert holders[str(child)].startswith("16.60 GiB: a child of the active worker of cuda:0")
        assert holders[str(spare.pid)] == "612.00 MiB: the spare worker of cuda:0"
        assert holders[str(stranger.pid)].startswith("1.00 GiB: not of this pool (") and "stranger" in holders[str(stranger.pid)]
        assert holders[str(gone.pid)] == "2.00 GiB: ended before the failure was read"
        assert "77" not in holders  # cut off mid-entry: not guessed
        assert describe("RuntimeError: shapes do not match", workers) == {}
        assert role(worker.pid, {}).startswith("not of this pool")
    finally:
        for p in (worker, spare, stranger):
            p.kill()
            p.wait()
        if child:
            os.kill(child, signal.SIGKILL)


def test_the_judge_names_its_own_workers_in_an_out_of_memory_result():
    """The judge's pool, started for real: its worker's pid in a message reads as its worker."""
    from cuda_agent.sandbox.executors import CpuExecutor
    from cuda_agent.sandbox.executors.local import CpuExecutorOptions
    from cuda_agent.sandbox.judge.pipeline import Judge, JudgeOptions

    ex = CpuExecutor(CpuExecutorOptions(timeout=60.0, spares=1)).start()
    try:
        judge = Judge(JudgeOptions(), executor=ex, backend="cpu")
        pids = ex.pool.worker_pids()
        label, (active, *spares) = next(iter(pids.items()))
        msg = f"out of memory (OutOfMemoryError: CUDA out of memory. Process {active} has 40.00 GiB memory in use."
        assert judge._memory_holders(msg) == {str(active): f"40.00 GiB: the active worker of {label}"}
        assert judge._memory_holders(msg.replace("out of memory", "failed")) == {}  # not a memory failure
    finally:
        ex.close()
