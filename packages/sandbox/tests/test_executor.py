"""Executor pool mechanics with real worker processes: priority, timeouts, crashes, recovery.

The ``cpu`` executor (and the ``local`` one on fake device ids, without CUDA) run real
jobs that abort, segfault, hang, raise and exhaust memory under an RLIMIT.
"""

from __future__ import annotations

import os
import threading
import time
from concurrent.futures import wait

import pytest

from cuda_agent.core.errors import ConfigError
from cuda_agent.core.types import FailureCategory
from cuda_agent.sandbox.executors import CpuExecutor, Job, JobError, LocalExecutor
from cuda_agent.sandbox.executors.job import classify_exception, describe_exit
from cuda_agent.sandbox.executors.local import CpuExecutorOptions, LocalExecutorOptions

S = "cuda_agent.sandbox.executors.selftest:"


def cpu(**kw) -> CpuExecutor:
    kw.setdefault("preload", [])
    kw.setdefault("warm_plugins", False)
    kw.setdefault("timeout", 20.0)
    kw.setdefault("prestart", False)  # self-test jobs, no judge job: no candidate process ahead of them
    return CpuExecutor(CpuExecutorOptions(**kw))


@pytest.fixture
def ex():
    e = cpu(workers=1, memory_limit_mb=600)
    yield e
    e.close()


def run_err(ex, fn, **kw) -> JobError:
    timeout = kw.pop("timeout", None)
    with pytest.raises(JobError) as info:
        ex.run(Job(S + fn, kw, timeout=timeout))
    return info.value


def test_job_runs_in_a_worker_process(ex):
    r = ex.run(Job(S + "echo", {"value": 42}))
    assert r["value"] == 42
    assert r["device"] == "cpu"
    assert r["pid"] != os.getpid()
    assert r["worker"] == "cpu0"
    assert r["visible"] == ""  # CPU workers see no GPU


def test_crashes_are_reported_and_the_pool_keeps_serving(ex):
    e = run_err(ex, "abort")
    assert e.reason == "crash" and str(e) == "crashed: aborted (signal 6)"
    assert e.failure is FailureCategory.CRASH
    e = run_err(ex, "segfault")
    assert str(e) == "crashed: segmentation fault (signal 11)"
    assert "Fatal Python error" in e.details or "Segmentation fault" in e.details  # faulthandler output
    e = run_err(ex, "exit_code", code=7)
    assert str(e) == "crashed: the worker exited with code 7"
    assert ex.run(Job(S + "echo", {"value": "after"}))["value"] == "after"
    stats = ex.stats()
    assert stats["results"]["crash"] == 3 and stats["restarts"]["cpu0"] >= 3


def test_hanging_job_times_out_and_worker_is_replaced(ex):
    t0 = time.monotonic()
    e = run_err(ex, "hang", timeout=1.5)
    assert e.reason == "timeout" and str(e) == "timed out after 1.5 s"
    assert e.failure is FailureCategory.TIMEOUT
    assert time.monotonic() - t0 < 10
    assert ex.run(Job(S + "echo", {"value": 1}))["value"] == 1


def test_timeout_kills_processes_the_job_started(ex, tmp_path):
    pid_file = tmp_path / "child.pid"
    run_err(ex, "hang_with_child", pid_file=str(pid_file), timeout=2)
    child = int(pid_file.read_text())
    for _ in range(50):
        try:
            os.kill(child, 0)
        except ProcessLookupError:
            break
        # a zombie reaped by init still answers kill(0) for a moment
        time.sleep(0.1)
    else:
        with open(f"/proc/{child}/status") as f:
            assert "zombie" in f.read().lower(), "grandchild survived the timeout"


def test_exceptions_cuda_errors_and_out_of_memory(ex):
    e = run_err(ex, "fail", message="bad shape")
    assert e.reason == "exception" and str(e) == "ValueError: bad shape"
    assert "selftest.py" in e.details  # traceback kept for reports
    e = run_err(ex, "fake_cuda_error")
    assert e.reason == "cuda_error"
    assert str(e) == "CUDA error: an illegal memory access was encountered"
    e = run_err(ex, "allocate", mb=2000)  # over the 600 MB RLIMIT_AS
    assert e.reason == "oom" and str(e).startswith("out of memory")
    assert ex.run(Job(S + "allocate", {"mb": 50})) == 50 * 1024 * 1024


def test_unpicklable_result_is_an_error_not_a_hang(ex):
    e = run_err(ex, "unpicklable_result")
    assert "could not be sent back" in str(e)


def test_bad_function_path(ex):
    e = run_err(ex, "does_not_exist")
    assert e.reason == "exception" and "does_not_exist" in str(e)
    with pytest.raises(JobError):
        Job("")


def test_recycle_always_gives_each_job_a_fresh_process():
    e = cpu(workers=1, recycle="always")
    try:
        pid1 = e.run(Job(S + "set_global", {"value": "leak"}))
        assert e.run(Job(S + "get_global")) is None
        assert e.run(Job(S + "echo"))["pid"] != pid1
    finally:
        e.close()


def test_recycle_never_keeps_the_worker():
    e = cpu(workers=1, recycle="never", spares=0)
    try:
        pid1 = e.run(Job(S + "set_global", {"value": "kept"}))
        assert e.run(Job(S + "get_global")) == "kept"
        run_err(e, "fail")  # an exception does not cost the worker
        assert e.run(Job(S + "echo"))["pid"] == pid1
        run_err(e, "abort")  # a crash does
        assert e.run(Job(S + "echo"))["pid"] != pid1
    finally:
        e.close()


def test_verification_is_served_before_profiling(tmp_path):
    e = cpu(workers=1)
    order = tmp_path / "order.txt"
    try:
        blocker = e.submit(Job(S + "record", {"path": str(order), "value": "blocker", "seconds": 1.5}))
        time.sleep(0.5)  # the blocker is running; queue the rest behind it
        futs = [
            e.submit(Job(S + "record", {"path": str(order), "value": "baseline1"}, kind="baseline")),
            e.submit(Job(S + "record", {"path": str(order), "value": "profile1"}, kind="profile")),
            e.submit(Job(S + "record", {"path": str(order), "value": "verify1"}, kind="verify")),
            e.submit(Job(S + "record", {"path": str(order), "value": "profile2"}, kind="profile")),
            e.submit(Job(S + "record", {"path": str(order), "value": "verify2"}, kind="verify")),
            e.submit(Job(S + "record", {"path": str(order), "value": "urgent"}, kind="profile", priority=-1)),
        ]
        wait([blocker, *futs], timeout=60)
        got = order.read_text().split()
        assert got == ["blocker", "urgent", "verify1", "verify2", "profile1", "profile2", "baseline1"]
    finally:
        e.close()


def test_one_job_per_device_and_all_devices_used():
    e = cpu(devices="a,b,c")
    try:
        assert e.devices == ["a", "b", "c"]
        e.start()
        time.sleep(1.0)  # let the workers come up
        t0 = time.monotonic()
        futs = [e.submit(Job(S + "sleep", {"seconds": 1.0, "value": i})) for i in range(6)]
        results = [f.result(timeout=60) for f in futs]
        elapsed = time.monotonic() - t0
        workers = [r["worker"] for r in results]
        assert sorted(set(workers)) == ["a", "b", "c"]
        assert all(workers.count(w) == 2 for w in "abc")
        # 6 one-second jobs on 3 devices: two rounds, never more than one job per device at a time
        assert elapsed >= 2.0
        for label in "abc":
            spans = sorted((f.record.started, f.record.finished) for f in futs if f.record.device == label)
            assert spans[0][1] <= spans[1][0]
    finally:
        e.close()


def test_crash_on_one_device_does_not_disturb_others():
    e = cpu(devices="a,b")
    try:
        slow = e.submit(Job(S + "sleep", {"seconds": 1.5, "value": "slow"}))
        time.sleep(0.3)
        bad = e.submit(Job(S + "abort"))
        with pytest.raises(JobError):
            bad.result(timeout=30)
        assert slow.result(timeout=30)["value"] == "slow"
        assert bad.record.device != slow.record.device
    finally:
        e.close()


def test_local_executor_on_fake_gpu_ids_sets_visible_devices():
    e = LocalExecutor(LocalExecutorOptions(devices="3,5", preload=[], health_check="", warm_cuda=False,
                                           warm_plugins=False, timeout=20, prestart=False))
    try:
        assert e.devices == ["3", "5"]
        futs = [e.submit(Job(S + "sleep", {"seconds": 0.5})) for _ in range(4)]
        results = [f.result(timeout=60) for f in futs]
        seen = {(r["worker"], r["visible"], r["device"]) for r in results}
        assert seen == {("3", "3", "cuda:0"), ("5", "5", "cuda:0")}
        # one fork server for both devices: each forked worker sets its own device's variables
        assert len([s for s in e.pool._fork_servers.values() if s is not None]) == 1
        assert e.stats()["fork_server"] == "on"
        err = run_err(e, "fake_cuda_error")
        assert err.reason == "cuda_error"
        assert e.run(Job(S + "echo"))["device"] == "cuda:0"
    finally:
        e.close()


def test_a_pool_starts_the_judges_candidate_process_ahead_of_each_job_unless_told_not_to():
    for prestart in (True, False):
        e = cpu(workers=1, prestart=prestart)
        try:
            assert e.run(Job(S + "prestarted")) is prestart
        finally:
            e.close()


def test_gpu_workers_import_inductor_while_they_wait_and_not_in_their_fork_server():
    """A baseline's compile finds inductor imported (by the worker, as a spare, after its CUDA
    context), while the fork server never imports it: its import initialises CUDA, after which
    no forked worker could use the GPU."""
    names = ["torch._dynamo", "torch._inductor.compile_fx", "cuda_agent.sandbox.judge.jobs"]
    e = LocalExecutor(LocalExecutorOptions(devices="3", health_check="", warm_cuda=False, warm_plugins=False,
                                           timeout=60, prestart=False))
    try:
        assert set(e.submit(Job(S + "imported", {"names": names})).result(timeout=180)) == set(names)
        assert e.stats()["fork_server"] == "on"
        kw = e.pool_kwargs()  # what the fork server imports, and what each worker runs after its fork
        assert "torch._dynamo" in kw["preload"] and not any("inductor" in m for m in kw["preload"])
        assert kw["init"][-1].endswith(":warm_inductor")
    finally:
        e.close()
    off = LocalExecutor(LocalExecutorOptions(devices="3", health_check="", warm_cuda=False, warm_plugins=False,
                                             timeout=60, prestart=False, warm_inductor=False))
    try:
        assert "torch._inductor.compile_fx" not in off.submit(Job(S + "imported", {"names": names})).result(timeout=180)
    finally:
        off.close()


def test_local_executor_device_options():
    e = LocalExecutor(LocalExecutorOptions(devices="0,1,2", device_count=2, preload=[]))
    assert e.devices == ["0", "1"]
    e = LocalExecutor(LocalExecutorOptions(devices="0,1", isolation="set_device", preload=[]))
    assert [d.device for d in e._devices] == ["cuda:0", "cuda:1"]
    with pytest.raises(ConfigError, match="device_count=3"):
        LocalExecutor(LocalExecutorOptions(devices="0,1", device_count=3))
    with pytest.raises(ConfigError, match="repeat"):
        LocalExecutor(LocalExecutorOptions(devices="0,0"))
    with pytest.raises(ConfigError, match="recycle"):
        CpuExecutor(CpuExecutorOptions(recycle="sometimes"))


def test_no_gpu_is_a_clear_error(monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    with pytest.raises(ConfigError, match="no GPU found"):
        LocalExecutor(LocalExecutorOptions())


def test_close_fails_queued_jobs_and_ends_workers():
    e = cpu(workers=1)
    running = e.submit(Job(S + "sleep", {"seconds": 30}))
    time.sleep(0.5)
    queued = e.submit(Job(S + "echo"))
    pids = [p for ps in e.pool.worker_pids().values() for p in ps]
    assert pids
    e.close()
    with pytest.raises(JobError) as info:
        queued.result(timeout=20)
    assert info.value.reason == "closed"
    with pytest.raises(JobError):
        running.result(timeout=20)
    time.sleep(0.2)
    for pid in pids:
        try:
            os.waitpid(pid, os.WNOHANG)
        except ChildProcessError:
            pass
        assert not os.path.exists(f"/proc/{pid}") or "zombie" in open(f"/proc/{pid}/status").read().lower()


def test_many_concurrent_submitters():
    e = cpu(devices="a,b")
    results = []
    try:
        def client(i):
            results.append(e.run(Job(S + "echo", {"value": i}, kind="verify" if i % 2 else "profile")))

        threads = [threading.Thread(target=client, args=(i,)) for i in range(12)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=60)
        assert sorted(r["value"] for r in results) == list(range(12))
    finally:
        e.close()


def test_plugin_registration_and_config():
    from cuda_agent.core.plugins import get_plugin_manager

    pm = get_plugin_manager()
    assert pm.get("executor", "local") is LocalExecutor
    assert pm.get("executor", "cpu") is CpuExecutor
    ex = pm.create("executor", {"name": "cpu", "options": {"workers": 2, "preload": []}})
    assert ex.devices == ["cpu0", "cpu1"]
    with pytest.raises(ConfigError, match="unknown option"):
        pm.create("executor", {"name": "cpu", "options": {"worker": 2}})


def test_error_descriptions():
    assert describe_exit(-11) == "crashed: segmentation fault (signal 11)"
    assert describe_exit(-9) == "crashed: killed (signal 9)"
    assert classify_exception("OutOfMemoryError", "CUDA out of memory. Tried to allocate 2 GiB") == "oom"
    assert classify_exception("RuntimeError", "CUDA error: device-side assert triggered") == "cuda_error"
    assert classify_exception("AcceleratorError", "anything") == "cuda_error"
    assert classify_exception("ValueError", "shapes differ") == "exception"


def test_spares_wait_warm_and_replace_used_workers():
    e = cpu(workers=1, spares=2)
    try:
        e.start()
        time.sleep(1.0)
        pids = e.pool.worker_pids()["cpu0"]
        assert len(pids) == 3  # the active worker and two spares
        r = e.run(Job(S + "echo"))
        assert r["pid"] == pids[0]
        time.sleep(0.5)
        after = e.pool.worker_pids()["cpu0"]
        assert len(after) == 3 and pids[0] not in after and after[0] == pids[1]
    finally:
        e.close()


def test_two_pools_never_share_a_device(tmp_path):
    """Exclusive device locks: pools of different executors (or processes) on one GPU queue."""
    locks = str(tmp_path / "locks")
    a = cpu(devices="gpu7", exclusive=True, lock_dir=locks)
    b = cpu(devices="gpu7", exclusive=True, lock_dir=locks)
    c = cpu(devices="gpu8", exclusive=True, lock_dir=locks)
    try:
        for e in (a, b, c):
            e.start()
        time.sleep(1.0)
        fa = a.submit(Job(S + "sleep", {"seconds": 1.0}))
        fb = b.submit(Job(S + "sleep", {"seconds": 1.0}))
        fc = c.submit(Job(S + "sleep", {"seconds": 1.0}))
        for f in (fa, fb, fc):
            f.result(timeout=60)
        ra, rb, rc = fa.record, fb.record, fc.record
        # a and b ran one after the other (the second waited for the lock); c overlapped freely
        spans = sorted([(ra.started, ra.finished), (rb.started, rb.finished)])
        first_end = min(ra.finished, rb.finished)
        second_run = max(ra.finished, rb.finished) - first_end
        assert second_run >= 0.9, spans
        assert rc.finished - rc.started < 1.9
    finally:
        for e in (a, b, c):
            e.close()


def test_executor_check_command(capsys):
    from cuda_agent.core.cli import main

    code = main(["executor", "check", "executor.name=cpu", "executor.options.preload=[]",
                 "executor.options.warm_plugins=false", "--hang-timeout", "1.5"])
    out = capsys.readouterr().out
    assert code == 0, out
    assert "segfault   crash      crash" in out and "timed out after 1.5 s" in out
    assert out.count("PASS") == 5


def test_workers_are_forked_from_the_pools_fork_server_and_each_job_gets_a_fresh_one():
    with cpu(workers=1, preload=["json"]) as e:
        first, second = e.run(Job(S + "echo")), e.run(Job(S + "echo"))
        servers = [s.proc.pid for s in e.pool._fork_servers.values() if s is not None]
        assert e.stats()["fork_server"] == "on"
    assert len(servers) == 1
    assert first["parent"] == second["parent"] == servers[0] != os.getpid()
    assert first["pid"] != second["pid"]
    assert first["visible"] == "" and first["worker"] == "cpu0"  # the slot's own environment
    with cpu(workers=1, fork_server=False) as e:
        direct = e.run(Job(S + "echo"))
        assert e.stats()["fork_server"] == "off"
    assert direct["parent"] == os.getpid()


def test_a_fork_server_that_cannot_fork_safely_leaves_the_pool_starting_workers_itself(tmp_path, monkeypatch):
    # a preloaded module that starts a thread: a fork would copy its memory but not the thread
    (tmp_path / "starts_a_thread.py").write_text(
        "import threading, time\nthreading.Thread(target=time.sleep, args=(60,), name='busy', daemon=True).start()\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with cpu(workers=1, preload=["starts_a_thread"]) as e:
        r = e.run(Job(S + "echo", {"value": 1}))
        why = e.stats()["fork_server"]
    assert r["value"] == 1 and r["parent"] == os.getpid()
    assert "the preloaded modules started threads (busy)" in why


def test_a_pool_started_from_a_thread_that_ended_keeps_its_fork_server():
    e = cpu(workers=1)
    starter = threading.Thread(target=e.start)
    starter.start()
    starter.join()
    try:
        time.sleep(1.0)  # a server that ended with its starting thread would take its workers along
        assert [e.run(Job(S + "echo", {"value": i}))["value"] for i in range(3)] == [0, 1, 2]
        assert e.stats()["fork_server"] == "on"
    finally:
        e.close()


def test_pools_made_one_after_another_share_one_fork_server_which_ends_after_its_linger(monkeypatch):
    from cuda_agent.sandbox.executors import fork_server

    monkeypatch.setenv(fork_server.LINGER_ENV, "60")
    with cpu(workers=1, preload=["json"]) as e:
        first = e.run(Job(S + "echo"))
        [server] = [s for s in e.pool._fork_servers.values() if s is not None]
    assert server.alive()  # no pool uses it now: it waits for the next one
    with cpu(workers=1, preload=["json"]) as e:
        second = e.run(Job(S + "echo"))
    assert first["parent"] == second["parent"] == server.proc.pid and first["pid"] != second["pid"]
    with cpu(workers=1, preload=["json", "csv"]) as e:  # other preload modules: a server of their own
        other = e.run(Job(S + "echo"))
    assert other["parent"] != server.proc.pid
    monkeypatch.setenv(fork_server.LINGER_ENV, "0")
    with cpu(workers=1, preload=["json"]) as e:
        assert e.run(Job(S + "echo"))["parent"] == server.proc.pid
    # its last pool closed with no linger: the server has ended
    assert server.proc.wait(timeout=10) is not None and not server.alive()
