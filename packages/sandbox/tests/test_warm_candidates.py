"""A candidate process warmed ahead of its job: already the job's own user, in its own mount
and network namespaces with a private /tmp, before the job exists; the job's files reach
it through its inbox, candidate code runs only after the job's load (after the integrity
snapshot), and nothing of the job's user outlives the job. Real candidate processes, as
root on Linux."""

from __future__ import annotations

import os
import sys
import uuid
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from cuda_agent.sandbox.judge import client, identity  # noqa: E402
from cuda_agent.sandbox.judge.session import JudgeSession  # noqa: E402

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux") or os.geteuid() != 0,
                                reason="a job's own user and namespaces need root on Linux")

MODEL = """import torch
import torch.nn as nn


class Model(nn.Module):
    def forward(self, x):
        return x * 2


def get_inputs():
    return [torch.ones(4)]


def get_init_inputs():
    return []
"""

# ModelNew reports what it sees: [its uid, a host file under /tmp readable?, the workspace
# is its current folder?, the prebuilt extension's marker]
PROBE = """import os
import torch
import torch.nn as nn

SECRET = {secret!r}


def _seen():
    try:
        open(SECRET).read()
        secret = 1.0
    except OSError:
        secret = 0.0
    try:
        marker = float(open("/tmp/cuda-agent-torch-extensions/probe_ext/marker.txt").read())
    except OSError:
        marker = -1.0
    here = 1.0 if os.path.exists(os.path.join(os.getcwd(), "model_new.py")) else 0.0
    return [float(os.getuid()), secret, here, marker]


SEEN = _seen()


class ModelNew(nn.Module):
    def forward(self, x):
        return torch.tensor(SEEN)
"""

TAMPER = """import torch
import torch.nn as nn

torch.allclose = lambda *a, **k: True


class ModelNew(nn.Module):
    def forward(self, x):
        return x * 2
"""


@pytest.fixture()
def job_process(monkeypatch):
    """Stands for an executor worker: the job-process mark set, a candidate process prestarted."""
    monkeypatch.setenv("CUDA_AGENT_JOB_PROCESS", str(os.getpid()))
    monkeypatch.setattr(client, "_prestarted", None)
    monkeypatch.setattr(client, "_spent", False)
    yield
    client.shutdown()


def workspace(tmp_path: Path, candidate: str) -> Path:
    ws = tmp_path / f"ws-{uuid.uuid4().hex[:6]}"
    ws.mkdir()
    os.chmod(tmp_path, 0o755)
    os.chmod(ws, 0o755)
    (ws / "model.py").write_text(MODEL)
    (ws / "model_new.py").write_text(candidate)
    return ws


def ns(pid: int | str, kind: str) -> str:
    return os.readlink(f"/proc/{pid}/ns/{kind}")


def test_a_warm_candidate_process_is_the_next_jobs_user_before_the_job(job_process, tmp_path):
    secret = Path("/tmp") / f"host-secret-{uuid.uuid4().hex}"
    secret.write_text("host only")
    os.chmod(secret, 0o644)  # readable by anyone who can see it
    client.prestart("cpu")
    proc = client._prestarted
    following = client.CandidateProcess("cpu")  # the worker's next one, warming meanwhile
    following.warm(background=True)
    uids = []
    try:
        assert proc.wait_warm(), proc.warm_error
        uid = proc.identity.uid
        uids.append(uid)
        assert proc.warmed["uid"] == uid and identity.JOB_UID_BASE <= uid < identity.JOB_UID_BASE + identity.JOB_UID_COUNT
        assert proc.warmed["job_mounts"] == "private" and proc.warmed["job_network"] == "none"
        with open(f"/proc/{proc.proc.pid}/status") as fh:
            assert next(line for line in fh if line.startswith("Uid:")).split()[1:] == [str(uid)] * 4
        for kind in ("mnt", "net"):  # namespaces of its own, made before any job
            assert ns(proc.proc.pid, kind) != ns("self", kind)

        # extension files built ahead: handed through the inbox, written by the job's user itself
        built = tmp_path / "built"
        (built / "probe_ext").mkdir(parents=True)
        (built / "probe_ext" / "marker.txt").write_text("7")
        ws = workspace(tmp_path, PROBE.format(secret=str(secret)))
        s = JudgeSession(ws, ws / "model_new.py", ws / "model.py", "cpu")
        try:
            assert s.proc is proc and s.snap.root.parent == proc.inbox  # the job's files go into its inbox
            s._prebuilt = lambda: {"prebuilt": str(built)}  # type: ignore[method-assign]
            assert s.load(1, True, "fp32-strict") is None
            assert s.meta["candidate_process"].startswith("warm") and s.meta["uid"] == uid
            assert s.meta["extensions"] == "prebuilt (1 files)"
            reply, out = s.fetch({"op": "run", "seed": 3, "guard": {"enabled": False}}, "output")
            assert out is not None, reply
            seen_uid, seen_secret, in_workspace, marker = out.tolist()
            assert seen_uid == uid and seen_secret == 0.0 and in_workspace == 1.0 and marker == 7.0
            assert s.meta["output_transfer"] == "host memory (memfd)"
        finally:
            info = s.close()
        assert info["left_running_after_end"] == 0 and identity.processes_of(uid) == []
        assert not proc.inbox.exists()

        # the next job: a user of its own; its candidate code still meets the integrity snapshot
        client._prestarted = following
        ws = workspace(tmp_path, TAMPER)
        with JudgeSession(ws, ws / "model_new.py", ws / "model.py", "cpu") as s:
            assert s.proc is following
            refusal = s.load(1, True, "fp32-strict")
            assert s.meta["candidate_process"].startswith("warm"), s.meta
            uids.append(following.identity.uid)
        assert uids[1] != uids[0]
        assert refusal is not None and "torch.allclose" in refusal.message and "rule no-tampering" in refusal.message
        assert identity.processes_of(uids[1]) == []
    finally:
        secret.unlink()
        following.close()


def test_a_warm_process_no_job_claims_ends_with_nothing_left(job_process, tmp_path):
    client.prestart("cpu")
    warm = client._prestarted
    ws = workspace(tmp_path, TAMPER)
    s = JudgeSession(ws, ws / "model_new.py", ws / "model.py", "cpu", drop=False)
    # a job that keeps its rights cannot use a process that gave them up: it is ended at once
    assert s.proc is None and warm.closed and not warm.inbox.exists()
    assert s.snap.root.parent != warm.inbox
    s.close()
    if warm.identity is not None:
        assert identity.processes_of(warm.identity.uid) == []


def test_a_candidate_process_is_forked_only_from_a_clean_job_worker(monkeypatch):
    # this test's own process is no job's worker: a fork would copy the test runner
    assert client._why_not_fork() == "not a job's worker process"
    monkeypatch.setenv("CUDA_AGENT_JOB_PROCESS", str(os.getpid()))
    import threading

    stop = threading.Event()
    busy = threading.Thread(target=stop.wait, name="busy-thread", daemon=True)
    busy.start()
    try:
        assert client._why_not_fork().startswith("threads running:")
    finally:
        stop.set()
        busy.join()
    monkeypatch.setenv(client.FORK_ENV, "0")
    assert client._why_not_fork() == "switched off"


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a device whose CUDA does not start (this host has CUDA)")
def test_a_process_warmed_in_a_thread_is_not_started_again_there_when_cuda_refuses_its_pid_namespace(
        tmp_path, monkeypatch):
    """A process forked by the warming thread would die with that thread (its parent-death
    signal follows the forking thread): where CUDA does not start in a PID namespace, the
    warm-up fails and the job starts its own process, outside one."""
    monkeypatch.setenv("CUDA_AGENT_LOCK_DIR", str(tmp_path / "locks"))  # the refusal is remembered there
    assert identity.pidns_wanted("cuda:0")
    proc = client.CandidateProcess("cuda:0")
    proc.warm(background=True)
    assert not proc.wait_warm()
    # refused, not started again in the thread (that one would say it failed to start)
    assert "CUDA does not start in a PID namespace" in proc.warm_error and not proc.alive()
    assert not identity.pidns_wanted("cuda:0") and identity.pidns_wanted("cpu")
    inbox = proc.inbox
    proc.close()  # as the job's claim does with a process that is not warm
    assert inbox is not None and not inbox.exists()


def test_a_standby_process_waits_without_cuda_until_a_job_needs_a_second_process(job_process, tmp_path, monkeypatch):
    """A job that ends its candidate process to measure baselines (evaluate, baselines not
    cached) takes the worker's standby for the timing: forked with the worker, its imports
    done, nothing started before the job activates it, then the job's own user like any."""
    import select

    from cuda_agent.sandbox.judge import jobs
    from cuda_agent.sandbox.judge.baselines import BaselineCache

    monkeypatch.setattr(client, "_standby", None)
    standby = client.CandidateProcess("cpu", standby=True)
    client._standby = standby
    try:
        # forked and importing, but it says nothing (no "ready", no device context) until activated
        readable, _, _ = select.select([standby.sock], [], [], 3.0)
        assert readable == [] and standby.alive() and standby._ready is None
        ws = workspace(tmp_path, MODEL.replace("class Model", "class ModelNew"))
        cache = tmp_path / "cache"
        popts = jobs.ProfileOptions(baseline_cache_dir=str(cache), compile_baseline=False, attempts=1,
                                    profiler_options={"warmup_ms": 1.0, "target_ms": 5.0, "min_iters": 5})
        v, p = jobs.evaluate_workspace(str(ws), "cpu", jobs.VerifyOptions(seed=5, rules="none"), popts)
        assert v.ok and p is not None and p.ok, (v.message, p.message if p else None)
        assert "after verification" in v.metadata["baselines_measured"] and len(BaselineCache(cache)) == 1
        # verified in a process started for the job, timed in the standby, now the job's user
        assert p.metadata["candidate_process"].startswith("standby"), p.metadata["candidate_process"]
        assert standby.identity is not None and p.metadata["uid"] == standby.identity.uid
        assert standby.closed and client._standby is None
        assert identity.processes_of(standby.identity.uid) == []
        # no standby left: the next such job starts its second process itself
        ws2 = workspace(tmp_path, MODEL.replace("class Model", "class ModelNew"))
        (ws2 / "model.py").write_text(MODEL.replace("x * 2", "x * 2 + 0"))  # another task: not cached
        v, p = jobs.evaluate_workspace(str(ws2), "cpu", jobs.VerifyOptions(seed=5, rules="none"), popts)
        assert v.ok and p.ok and p.metadata["candidate_process"].startswith("started for the job"), p.metadata
    finally:
        standby.close()


def test_a_standby_never_activated_ends_with_its_worker(job_process, monkeypatch):
    monkeypatch.setattr(client, "_standby", None)
    client.prestart("cpu")  # on the CPU a worker keeps no standby: a fork at need costs nothing there
    assert client._standby is None
    standby = client.CandidateProcess("cpu", standby=True)
    client._standby = standby
    assert client.standby_for("cuda:0") is None and standby.closed  # another device: ended, not handed on
    spare = client.CandidateProcess("cpu", standby=True)
    client._standby = spare
    client.shutdown()
    assert spare.closed and not spare.alive() and client._standby is None


def test_a_standby_that_dies_on_its_way_up_leaves_the_job_a_process_started_for_it(job_process, tmp_path, monkeypatch):
    import signal

    from cuda_agent.sandbox.judge import jobs, session as session_mod

    monkeypatch.setattr(client, "_standby", None)
    client._standby = client.CandidateProcess("cpu", standby=True)
    real = client.standby_for

    def dying(device: str):
        p = real(device)
        os.kill(p.proc.pid, signal.SIGKILL)  # activated, then gone before it said it was ready
        p.proc.wait()
        return p

    monkeypatch.setattr(session_mod, "standby_for", dying)
    ws = workspace(tmp_path, MODEL.replace("class Model", "class ModelNew"))
    popts = jobs.ProfileOptions(baseline_cache_dir=str(tmp_path / "cache"), compile_baseline=False, attempts=1,
                                profiler_options={"warmup_ms": 1.0, "target_ms": 5.0, "min_iters": 5})
    v, p = jobs.evaluate_workspace(str(ws), "cpu", jobs.VerifyOptions(seed=5, rules="none"), popts)
    assert v.ok and p is not None and p.ok, (v.message, p.message if p else None)
    assert p.metadata["candidate_process"].startswith("started for the job (the worker's standby")
